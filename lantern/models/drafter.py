"""The EAGLE-style drafter: one decoder layer over [token embedding; target feature].

Alignment (the drafter runs one position behind the target's input): drafter entry ``i`` reads
``fc([e_{i+1}; f_i])`` where ``f_i`` is the target's final-norm hidden state at sequence position
``i`` and ``e_{i+1}`` is the embedding of the target's input at position ``i + 1`` (a condition
embedding for ``i + 1 < T``, else the token embedding of image token ``i + 1 - T``). Its output
``f_hat_{i+1}`` estimates ``f_{i+1}``; the target's frozen head turns it into next-token logits.
RoPE follows the input token: entry ``i`` uses the target's table row ``i + 1``, so a drafter entry
and the target position of its input token share the same 2D coordinates.

The drafter owns only ``fc`` and its layers. Token embeddings and the output head belong to the
target and are passed in or applied by the caller, so they stay frozen and shared. The first layer
has no input norm (the features it reads are already normalised). ``condition_input`` says what
the condition entries read as ``e``: the condition embeddings (this project's drafters) or the
embedding of code 0 (the LANTERN release for LlamaGen feeds zero token ids there).

EAGLE-3-style drafters (``taps``, arXiv 2503.01840) read a fusion of the target's low, middle and high
layers instead of its final-norm state: ``f_i`` is then ``fuse`` (Linear ``len(taps) * D -> D``, no bias)
over the residual streams entering the tapped layers at position ``i``
(:meth:`~lantern.models.target.Target.forward_embeddings`). Only the target's features go
through ``fuse`` (:meth:`Drafter.target_features`); ``forward`` always reads D-wide features, fused
target features or the drafter's own previous outputs, so drafting a tree is the same either way. The
fused features are not normalised (EAGLE-3's own layer norms them first); the first layer stays without
an input norm so that a drafter with and without taps differ only in ``fuse``.

Families: the drafter reads its target only through a :class:`DrafterArch`, the family's description of
what a drafter for it is: width, heads, vocabulary, grid and condition slots, the decoder layer it stacks
(the target's own kind of layer), the RoPE table its entries read (the target's own position scheme), and
its HF folder layout. Every target config gives its arch with a ``drafter_arch()`` method (LlamaGen's
:class:`~lantern.models.llamagen.gpt.LlamaGenArch`: its blocks, 2D RoPE and the LANTERN release's layout;
the Llama-style families' share :class:`~lantern.models.llama_drafter.LlamaDrafterArch`). Nothing here names
a family; a family's own loaders (its preset nodes -> a target config) live in its folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.models.checkpoint import check_shapes, check_state_dict, read_folder, read_state_dict, write_folder
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.kv_cache import KVCache
from lantern.models.target import check_taps

VOCAB_KEY = "lantern.vocab_size"
# What the drafter reads as the "next input" at condition entries: the target's condition embeddings
# (this project), or the image-token embedding of code 0 (how the LANTERN release was trained).
CONDITION_INPUTS = ("embedding", "token0")
DIM_KEY = "lantern.dim"
# The target layers an EAGLE-3-style drafter taps, comma-separated ("2,12,21"); absent or empty: none.
TAPS_KEY = "lantern.taps"
FUSE_KEY = "fuse.weight"
# Our own keys of a drafter folder's config.json (the releases' loaders ignore both): what condition entries
# read (a folder that states it overrides the preset), and the tapped target layers (a list of ints; absent:
# none, as every release). EMBED_KEY: the frozen copy of the target's token table a drafter folder keeps.
CONDITION_KEY = "lantern_condition_input"
FOLDER_TAPS_KEY = "lantern_taps"
EMBED_KEY = "embed_tokens.weight"


def own_keys(config: dict, condition_input: str, taps: tuple[int, ...]) -> dict:
    """A drafter folder's ``config`` with our own keys (condition entries' input, taps) where they are set."""
    if condition_input:
        config[CONDITION_KEY] = condition_input
    if taps:
        config[FOLDER_TAPS_KEY] = [int(tap) for tap in taps]
    return config


def split_folder(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """A drafter folder's tensors under our names, and its frozen table (or None), which is only checked."""
    return {k: v for k, v in state_dict.items() if k != EMBED_KEY}, state_dict.get(EMBED_KEY)


class DrafterArch(Protocol):
    """A family's description of its target for the EAGLE drafter (see the module docstring).

    Shapes: ``dim`` D, ``n_head`` / ``n_kv_head`` heads of ``head_dim``, ``vocab_size`` V image codes,
    ``grid_size`` and ``cls_token_num`` T (the drafter has ``T + N - 1`` entries), ``n_layer`` the
    *target's* layers (taps must lie inside it), ``embedding_rows`` the rows of the token table an HF
    drafter folder keeps a copy of.
    """

    dim: int
    n_head: int
    n_kv_head: int
    head_dim: int
    vocab_size: int
    grid_size: int
    cls_token_num: int
    n_layer: int
    embedding_rows: int
    norm_eps: float  # the drafter's RMSNorm epsilon unless one is given
    first_norm: str  # the input norm layer 0 drops ("": kept, as the release of that family)

    def block(self, norm_eps: float) -> nn.Module:
        """One decoder layer, called ``layer(x, rope, mask, slots, kv)`` with ``rope`` rows of :meth:`rope_table`."""
        ...

    def rope_table(self) -> torch.Tensor:
        """(T + N - 1, ...) fp32: row ``i`` is what drafter entry ``i`` (input token at position ``i + 1``) reads."""
        ...

    def folder_config(self, n_layer: int, norm_eps: float, condition_input: str, taps: tuple[int, ...]) -> dict: ...

    def check_folder_config(self, config: Mapping, norm_eps: float, source: str, what: str) -> None: ...

    def to_folder(self, state_dict: Mapping[str, torch.Tensor], embeddings: torch.Tensor) -> dict: ...

    def from_folder(
        self, state_dict: Mapping[str, torch.Tensor], source: str
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]: ...

    def folder_embeddings(self, target) -> torch.Tensor:
        """The table (``embedding_rows``, D) of ``target`` that an HF drafter folder keeps a copy of."""
        ...


def drafter_arch(target) -> DrafterArch:
    """The :class:`DrafterArch` of a target config (its own ``drafter_arch()``), or an arch as given."""
    make = getattr(target, "drafter_arch", None)
    if callable(make):
        return make()
    if callable(getattr(target, "block", None)):
        return target
    raise ConfigError(
        f"no EAGLE drafter is described for a target config of type {type(target).__name__} "
        "(its family gives none: no drafter_arch())"
    )


@dataclass(frozen=True)
class DrafterConfig:
    """Drafter architecture: the target's width and heads, ``n_layer`` decoder layers of its own.

    ``target`` is the target's config (or a :class:`DrafterArch`); ``arch`` is its description
    (:func:`drafter_arch`). ``norm_eps`` None: the family's (LlamaGen 1e-6, Chameleon the target's).
    ``taps`` (layer indices of the target, e.g. LlamaGen's ``default_taps``): the
    drafter reads the fused inputs of those layers instead of the final-norm state; empty (the default,
    and every drafter before EAGLE-3) reads the final-norm state.
    """

    target: object
    n_layer: int = 1
    norm_eps: float | None = None
    condition_input: str = "embedding"
    taps: tuple[int, ...] = ()
    arch: DrafterArch = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        arch = drafter_arch(self.target)
        object.__setattr__(self, "arch", arch)
        if self.norm_eps is None:
            object.__setattr__(self, "norm_eps", float(arch.norm_eps))
        checks.integer("drafter n_layer", self.n_layer, 1)
        checks.choice("drafter condition_input", self.condition_input, CONDITION_INPUTS)
        object.__setattr__(self, "taps", check_taps(self.taps, arch.n_layer))  # a list from JSON -> tuple

    @property
    def dim(self) -> int:
        return self.arch.dim

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size


class Drafter(nn.Module):
    """``fc`` (2D -> D, with bias) then ``n_layer`` decoder layers of the target's family, and with taps
    ``fuse`` (``len(taps) * D -> D``, no bias) over the target's tapped states; no I/O in the constructor."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        arch = config.arch
        self.fc = nn.Linear(2 * arch.dim, arch.dim, bias=True)
        if config.taps:
            self.fuse = nn.Linear(len(config.taps) * arch.dim, arch.dim, bias=False)
        self.layers = nn.ModuleList(arch.block(config.norm_eps) for _ in range(config.n_layer))
        if arch.first_norm:
            setattr(self.layers[0], arch.first_norm, nn.Identity())
        self.register_buffer("rope", self._rope_table(), persistent=False)

    def _rope_table(self) -> torch.Tensor:
        return self.config.arch.rope_table()  # (T + N - 1, ...) fp32

    def _apply(self, fn, recurse=True):
        # The RoPE table stays fp32 whatever dtype the weights are cast to (as in the target).
        super()._apply(fn, recurse)
        self.rope = self._rope_table().to(self.rope.device)
        return self

    def condition_inputs(self, target, cond_emb: torch.Tensor) -> torch.Tensor:
        """The inputs ``e_1 .. e_{T-1}`` of the condition entries (B, T-1, D), from condition embeddings (B, T, D)."""
        if self.config.condition_input == "embedding":
            return cond_emb[:, 1:]
        zeros = torch.zeros(cond_emb.shape[0], cond_emb.shape[1] - 1, dtype=torch.long, device=cond_emb.device)
        return target.embed_tokens(zeros)

    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features as :meth:`forward` reads them, (..., D): ``fuse`` over the tapped states
        (..., len(taps) * D) that the target returns for ``config.taps``, or, without taps, its final-norm
        states unchanged. Callers fuse only the positions they feed (a step's accepted path, not its tree)."""
        return self.fuse(features) if self.config.taps else features

    @property
    def max_entries(self) -> int:
        """Number of drafter entries with a RoPE row: ``T + N - 1``."""
        return self.rope.shape[0]

    def forward(self, embeds, features, entries, slots, mask, cache) -> torch.Tensor:
        """Drafter features ``f_hat`` (B, S, D) for inputs ``embeds``, ``features`` (B, S, D).

        ``entries`` (S,) or (B, S) are drafter entry indices (clamped into the RoPE table; entries past
        the end only occur for discarded overshoot); ``slots`` (B, S) the cache slots written;
        ``mask`` (B, 1, S, L) bool over the first L cache slots; ``cache`` a 1-layer-per-block
        :class:`KVCache` or ``NoCache``.
        """
        embeds = embeds if embeds.dtype == features.dtype else embeds.to(features.dtype)
        x = self.fc(torch.cat([embeds, features], dim=-1))  # (B, S, D)
        rope = self.rope[entries.clamp(0, self.max_entries - 1)]
        for index, layer in enumerate(self.layers):
            x = layer(x, rope, mask, slots, cache.layer(index))
        return x

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A zeroed cache for ``batch`` rows and ``max_len`` slots."""
        arch = self.config.arch
        weight = self.fc.weight
        return KVCache.allocate(
            self.config.n_layer, batch, arch.n_kv_head, max_len, arch.head_dim, weight.dtype, weight.device
        )

    def check_target(self, target_config) -> None:
        """ConfigError unless this drafter's width, vocabulary, grid and taps fit ``target_config``."""
        mine, taps = self.config.arch, self.config.taps
        if mine.dim != target_config.dim or mine.vocab_size != target_config.vocab_size:
            raise ConfigError(
                f"drafter (hidden size {mine.dim}, vocabulary {mine.vocab_size}) does not match the target "
                f"(hidden size {target_config.dim}, vocabulary {target_config.vocab_size})"
            )
        if mine.grid_size != target_config.grid_size or mine.cls_token_num != target_config.cls_token_num:
            raise ConfigError(
                f"drafter was built for a {mine.grid_size}x{mine.grid_size} grid with {mine.cls_token_num} condition "
                f"tokens, the target has {target_config.grid_size}x{target_config.grid_size} and {target_config.cls_token_num}"
            )
        deep = [tap for tap in taps if tap >= target_config.n_layer]
        if deep:
            raise ConfigError(
                f"drafter taps the input of layer {deep[0]} (taps {list(taps)}) but the target has "
                f"{target_config.n_layer} layers: taps must be in 1..{target_config.n_layer - 1}"
            )


def _layer_count(state_dict: Mapping[str, torch.Tensor]) -> int:
    indices = {int(k.split(".")[1]) for k in state_dict if k.startswith("layers.") and k.split(".")[1].isdigit()}
    return max(indices) + 1 if indices else 1


def load_drafter_for(
    path: str | os.PathLike,
    target,
    label: str,
    device: str = "cpu",
    dtype: str = "float32",
    norm_eps: float | None = None,
    condition_input: str = "embedding",
) -> Drafter:
    """The drafter at ``path`` for the target whose config is ``target`` (any family: see :class:`DrafterArch`);
    ``label`` names the target in messages.

    ``path`` is a file (this project's, or the release format of the family's folders) or an HF-layout folder
    (:func:`load_drafter_folder`). A file for another hidden size or vocabulary is refused with one message
    naming both. A file's taps are its :data:`TAPS_KEY` metadata; a ``fuse.weight`` without them (a ``.pt``
    file cannot carry them), or the reverse, is one error.
    """
    device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    arch = drafter_arch(target)
    if os.path.isdir(path):
        drafter = load_drafter_folder(path, target, f"a drafter for {label}", norm_eps, condition_input)
        return drafter.to(device=device, dtype=torch_dtype).eval()
    state_dict, embed = arch.from_folder(read_state_dict(path, "drafter"), "drafter")
    fc = state_dict.get("fc.weight")
    if fc is not None and tuple(fc.shape) != (arch.dim, 2 * arch.dim):
        raise ConfigError(
            f"drafter {os.fspath(path)!r} has hidden size {fc.shape[0]} (fc {tuple(fc.shape)}) but the target "
            f"{label} has hidden size {arch.dim}"
        )
    if embed is not None and embed.shape[0] != arch.embedding_rows:
        raise ConfigError(
            f"drafter {os.fspath(path)!r} was trained for a vocabulary of {embed.shape[0]} codes but the target has {arch.embedding_rows}"
        )
    metadata = _file_metadata(path)
    vocab = metadata.get(VOCAB_KEY)
    if vocab is not None and int(vocab) != arch.vocab_size:
        raise ConfigError(
            f"drafter {os.fspath(path)!r} was trained for a vocabulary of {vocab} codes but the target has {arch.vocab_size}"
        )
    source = f"drafter {os.fspath(path)!r}"
    taps = check_taps(_parse_taps(metadata.get(TAPS_KEY), source), arch.n_layer, f"{source}: {TAPS_KEY}")
    _check_fuse(taps, FUSE_KEY in state_dict, source, f"metadata {TAPS_KEY}")
    drafter = Drafter(DrafterConfig(target, _layer_count(state_dict), norm_eps, condition_input, taps))
    check_state_dict(drafter, state_dict, f"a 1-layer drafter for {label}", os.fspath(path))
    drafter.load_state_dict(state_dict, strict=True)
    return drafter.to(device=device, dtype=torch_dtype).eval()


def load_drafter_folder(
    folder: str | os.PathLike,
    target,
    what: str = "a drafter",
    norm_eps: float | None = None,
    condition_input: str = "embedding",
) -> Drafter:
    """A drafter for ``target`` (a target config) from an HF-layout folder (the family's release layout or
    :func:`save_drafter_folder`), fp32 on CPU.

    Strict, in the folder's own names: ``config.json`` must fit the target (the arch's
    ``check_folder_config``), then
    every tensor must be there with its shape and nothing else (``embed_tokens.weight`` included: the
    releases' loaders require it too). What the drafter reads at condition entries is ``condition_input``
    (the preset's) unless the folder's ``config.json`` carries
    :data:`CONDITION_KEY`, which was written with the drafter and wins.
    The drafter's taps are ``config.json``'s :data:`FOLDER_TAPS_KEY` (absent:
    none, as in LANTERN's releases); ``fuse.weight`` without them, or the reverse, is one error.
    """
    arch = drafter_arch(target)
    norm_eps = arch.norm_eps if norm_eps is None else norm_eps
    config, given = read_folder(folder, "drafter")
    source = f"HF folder {os.fspath(folder)!r}"
    arch.check_folder_config(config, norm_eps, source, what)
    n_layer = config.get(
        "num_hidden_layers", _layer_count({k: v for k, v in given.items() if k != "embed_tokens.weight"})
    )
    n_layer = checks.integer(f"{source}: config.json num_hidden_layers", n_layer, 1)
    if CONDITION_KEY in config:
        key = f"{source}: config.json {CONDITION_KEY}"
        condition_input = checks.choice(key, config[CONDITION_KEY], CONDITION_INPUTS)
    taps = _folder_taps(config, arch.n_layer, source)
    _check_fuse(taps, FUSE_KEY in given, source, f"config.json {FOLDER_TAPS_KEY}")
    drafter = Drafter(DrafterConfig(target, n_layer, norm_eps, condition_input, taps))
    table = torch.empty(arch.embedding_rows, arch.dim, device="meta")  # (V, D): only its shape is compared
    own = arch.to_folder(drafter.state_dict(), table)
    check_shapes({k: tuple(v.shape) for k, v in own.items()}, given, what, os.fspath(folder))
    state_dict, _ = arch.from_folder(given, source)
    drafter.load_state_dict(state_dict, strict=True)
    return drafter


def save_drafter_folder(
    drafter: Drafter, embeddings: torch.Tensor, folder: str | os.PathLike, dtype: torch.dtype = torch.float16
) -> Path:
    """Write ``drafter`` as an HF-layout folder (``config.json`` + ``model.safetensors``) that
    :func:`load_drafter_for` reads and the authors' ``EaModel`` loads; ``embeddings`` (``embedding_rows``, D)
    is the target's token table (their drafter keeps a copy; see :meth:`DrafterArch.folder_embeddings`). The
    config carries the target's condition slots and image tokens, the drafter's ``condition_input`` and, for
    a drafter with taps, ``lantern_taps`` (with ``fuse.weight`` beside the tensors; the authors' loaders know
    neither). Written atomically: an interrupted export leaves no folder that loads. Returns ``folder``."""
    config = drafter.config
    layout = config.arch.folder_config(config.n_layer, config.norm_eps, config.condition_input, config.taps)
    state = config.arch.to_folder(drafter.state_dict(), embeddings)
    return write_folder(folder, layout, state, dtype)


def drafter_metadata(drafter: Drafter) -> dict[str, str]:
    """Metadata stored in a drafter's safetensors file, checked on load; :data:`TAPS_KEY` only for a drafter
    with taps (so a drafter without them writes the same file as before taps existed)."""
    config = drafter.config
    metadata = {VOCAB_KEY: str(config.vocab_size), DIM_KEY: str(config.dim)}
    if config.taps:
        metadata[TAPS_KEY] = ",".join(str(tap) for tap in config.taps)
    return metadata


def _parse_taps(value: str | None, source: str) -> tuple[int, ...]:
    """The taps a file's :data:`TAPS_KEY` metadata names ("2,12,21"; absent or empty: none)."""
    if not value:
        return ()
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        raise CheckpointError(
            f"{source}: metadata {TAPS_KEY}={value!r} is not a comma-separated list of layer indices"
        ) from None


def _folder_taps(config: Mapping, n_layer: int, source: str) -> tuple[int, ...]:
    """The taps a folder's ``config.json`` states (a list of ints under ``lantern_taps``; absent: none), for a
    target of ``n_layer`` layers."""
    key = f"{source}: config.json {FOLDER_TAPS_KEY}"
    value = config.get(FOLDER_TAPS_KEY, [])
    if not isinstance(value, list):
        raise checks.refuse(key, value, "a list of layer indices")
    return check_taps(value, n_layer, key)


def _check_fuse(taps: tuple[int, ...], has_fuse: bool, source: str, where: str) -> None:
    """One error when a drafter's tensors and its stated taps disagree: a ``fuse.weight`` is a drafter over
    tapped layers, and which layers it read is known only from ``where``."""
    if has_fuse and not taps:
        raise CheckpointError(
            f"{source} has {FUSE_KEY} (a drafter over tapped target layers) but no {where} saying which layers it reads"
        )
    if taps and not has_fuse:
        raise CheckpointError(
            f"{source} has {where}={','.join(map(str, taps))} but no {FUSE_KEY} to fuse those layers with"
        )


def _file_metadata(path) -> dict[str, str]:
    if not os.fspath(path).endswith(".safetensors"):
        return {}
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt") as handle:
        return dict(handle.metadata() or {})
