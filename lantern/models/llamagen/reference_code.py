"""Import the authors' LANTERN code from a local snapshot and build it on our weights.

Their LlamaGen path wants transformers 4.45 (its Llama port subclasses that release's classes); the
benchmark runs under a side environment that has it (docs/against_reference.md). Three things of
theirs are worked around from outside, none of their lines is changed:

- ``models/__init__.py`` imports the Lumina-mGPT stack, which the LlamaGen path never uses; the
  ``models`` package is registered without running it, so only the LlamaGen modules are imported.
- ``LlamaForCausalLM.__init__`` builds FLAN-T5 on CUDA (``T5Embedder``); a stand-in is put in its
  place whose ``get_text_embeddings(prompt)`` returns the prompt itself: the world's MiniLM caption,
  already laid out as T5's output by :func:`lantern.models.llamagen.reference_layout.caption_inputs`.
- Their drafter (``cnets_llamagen.Model``) hard-codes a 16 x 16 grid for t2i; its RoPE table is
  rebuilt with their own ``precompute_freqs_cis_2d`` for the world's grid (same 119 condition
  entries). ``EaModel.__init__`` reads the neighbour table from ``ckpts/llamagen/vq_distances/
  top_16383_indices.npy`` relative to the working directory; it is built in a temporary folder
  from the world's codebook (raw rows, as their ``generate_codebook``) and the constructor runs there.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from lantern import REPO_ROOT, checks
from lantern.errors import ConfigError
from lantern.models.kv_cache import NoCache
from lantern.models.llamagen import reference_layout as convert

ENV_VAR = "LANTERN_REFERENCE"
DEFAULT_FOLDER = REPO_ROOT.parent / "ref" / "LANTERN"
ENTRY = Path("models") / "ea_model_llamagen.py"
TRANSFORMERS_SERIES = "4.45"


class ReferenceUnavailable(Exception):
    """Their code cannot be used here (absent, or the wrong transformers): the benchmark skips."""


def reference_folder(given: str | None) -> Path:
    """The snapshot folder: ``given`` (bad input unless it holds their LlamaGen code), else
    ``$LANTERN_REFERENCE``, else ``../ref/LANTERN`` beside the repository (ReferenceUnavailable when absent)."""
    note = f"a snapshot of jadohu/LANTERN, holding {ENTRY}"
    if given is not None:
        folder = checks.path("--reference", given, "folder", note)
        if not (folder / ENTRY).is_file():
            shown = checks.shown(os.fspath(given), 400)
            raise ConfigError(f"--reference={shown}: expected a folder holding {ENTRY} (a snapshot of jadohu/LANTERN)")
        return folder
    default = Path(os.environ.get(ENV_VAR) or DEFAULT_FOLDER)
    if not (default / ENTRY).is_file():
        raise ReferenceUnavailable(
            f"no reference code at {default} (no {ENTRY}); pass --reference PATH or set {ENV_VAR} "
            "(docs/against_reference.md says how to get it)"
        )
    return default


def check_transformers() -> str:
    """transformers' version; ReferenceUnavailable unless it is the 4.45 series their code needs."""
    try:
        import transformers
    except ImportError as exc:
        raise ReferenceUnavailable(f"transformers is not importable ({exc})") from exc
    version = transformers.__version__
    if not version.startswith(TRANSFORMERS_SERIES + "."):
        raise ReferenceUnavailable(
            f"the reference code needs transformers {TRANSFORMERS_SERIES}, this Python ({sys.executable}) has "
            f"{version}; run under the side environment of docs/against_reference.md"
        )
    return version


@dataclass
class Modules:
    """Their three LlamaGen modules."""

    folder: Path
    ea: types.ModuleType  # models.ea_model_llamagen (EaModel)
    kv: types.ModuleType  # models.kv_variants.modeling_llamagen_kv (LlamaForCausalLM)
    cnets: types.ModuleType  # models.drafters.cnets_llamagen (Model, precompute_freqs_cis_2d)


def import_reference(folder: Path) -> Modules:
    """Import their LlamaGen modules from ``folder`` (ReferenceUnavailable when that fails)."""
    check_transformers()
    models_dir = str((folder / "models").resolve())
    present = sys.modules.get("models")
    if present is not None and list(getattr(present, "__path__", [])) != [models_dir]:
        raise ReferenceUnavailable(f"another package named 'models' is already imported ({present!r})")
    if present is None:
        package = types.ModuleType("models")
        package.__path__ = [models_dir]  # a namespace for their modules; its __init__ (Lumina-mGPT) is skipped
        sys.modules["models"] = package
    if str(folder.resolve()) not in sys.path:
        sys.path.insert(0, str(folder.resolve()))
    try:
        import models.drafters.cnets_llamagen as cnets
        import models.ea_model_llamagen as ea
        import models.kv_variants.modeling_llamagen_kv as kv
    except Exception as exc:  # noqa: BLE001 - whatever their import chain raises, the benchmark skips
        raise ReferenceUnavailable(
            f"cannot import the reference code from {folder}: {type(exc).__name__}: {exc}"
        ) from exc
    return Modules(folder, ea, kv, cnets)


class CaptionStandIn:
    """In place of their ``T5Embedder``: ``get_text_embeddings(prompt)`` returns ``prompt``, a pair
    (states (B, 120, C), mask (B, 120)) from :func:`lantern.models.llamagen.reference_layout.caption_inputs`."""

    def __init__(self, *args, **kwargs):
        pass

    def get_text_embeddings(self, prompt):
        return prompt


@contextlib.contextmanager
def _working_dir(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@dataclass
class Reference:
    """Their target (``LlamaForCausalLM``) and ``EaModel`` (the same target inside) on our weights."""

    modules: Modules
    target: torch.nn.Module
    eagle: torch.nn.Module
    num_tokens: int

    def ar(self, caption, temperature: float, top_k: int, top_p: float, cfg: float) -> torch.Tensor:
        """Their plain AR ``generate()``: codes (1, N)."""
        # The target is shared with their EaModel, whose generate() leaves its tree mask set (their AR and
        # EAGLE scripts never share a model); AR runs without one.
        self.target.model.tree_mask = None
        with torch.no_grad():
            codes, _, _ = self.target.generate(
                prompt=caption, max_length=self.num_tokens, temperature=temperature, top_k=top_k, top_p=top_p, cfg=cfg
            )
        return codes

    def speculative(
        self, caption, temperature: float, top_k: int, top_p: float, cfg: float, lantern: bool, k: int, delta: float
    ) -> tuple[torch.Tensor, float]:
        """Their EAGLE-2 dynamic-tree ``generate()`` (LANTERN's rule when ``lantern``): codes (1, N) and
        their mean accepted length (tokens per target forward, the pending one included)."""
        with torch.no_grad():
            codes, tau, _ = self.eagle.generate(
                prompt=caption,
                max_length=self.num_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                cfg=cfg,
                lantern=lantern,
                lantern_k=k,
                lantern_delta=delta,
                static_tree=False,
            )
        return codes, float(tau)


def seed_reference(seed: int) -> None:
    """Their sampling draws from torch's global generator and Python's ``random`` (acceptance tests)."""
    torch.manual_seed(seed)
    random.seed(seed)


def build_reference(
    modules: Modules, bundle, drafter, neighbours: torch.Tensor, depth: int, top_k: int, nodes: int
) -> Reference:
    """Their models on our weights. ``drafter`` is our :class:`lantern.models.drafter.Drafter`;
    ``neighbours`` (V, V - 1) int64 the world's codebook neighbours, nearest first; ``depth``/``top_k``/
    ``nodes`` our dynamic tree's (their ``depth`` counts expansions: ours minus one; ``total_token`` counts
    the root: ``nodes + 1``)."""
    from transformers import LlamaConfig

    gpt = bundle.target
    config = gpt.config
    dtype = gpt.tok_embeddings.weight.dtype
    modules.kv.T5Embedder = CaptionStandIn  # their LlamaForCausalLM.__init__ builds one
    target = modules.kv.LlamaForCausalLM(LlamaConfig(**convert.target_config(config)))
    target.load_state_dict(convert.target_state_dict(gpt.state_dict(), config), strict=True)
    target = target.to(dtype=dtype).eval()
    state = convert.drafter_state_dict(drafter.state_dict(), gpt.tok_embeddings.weight.detach())
    with tempfile.TemporaryDirectory(prefix="lantern-reference-") as tmp:
        root = Path(tmp)
        config_path = root / "config.json"
        config_path.write_text(json.dumps(convert.drafter_config(drafter.config)), encoding="utf-8")
        table_dir = root / "ckpts" / "llamagen" / "vq_distances"
        table_dir.mkdir(parents=True)
        np.save(table_dir / "top_16383_indices.npy", neighbours.cpu().numpy().astype(np.int64))
        with _working_dir(root):
            eagle = modules.ea.EaModel(target, "world", str(config_path), nodes + 1, depth - 1, top_k, 1.0, state)
    layer = eagle.ea_layer
    table = modules.cnets.precompute_freqs_cis_2d(
        config.grid_size, config.head_dim, config.rope_base, convert.REFERENCE_COND_SLOTS - 1
    )
    layer.freqs_cis = torch.cat([table, torch.zeros_like(table[:10])]).to(gpt.tok_embeddings.weight.device)
    return Reference(modules, target, eagle.eval(), config.num_image_tokens)


@torch.inference_mode()
def check_logits(bundle, drafter, reference: Reference, condition, seed: int = 0) -> dict[str, float]:
    """Largest absolute differences between our and their target logits and drafter logits on the same
    inputs (teacher-forced random image tokens after the caption ``condition`` (one prompt))."""
    gpt, config = bundle.target, bundle.target.config
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (1, config.num_image_tokens), generator=generator)
    tokens = tokens.to(condition.values.device)
    # Ours: hidden states (1, N, D) where row n predicts token n.
    cond_emb = gpt.embed_condition(condition.values)
    ours_hidden = gpt.forward_teacher(cond_emb, tokens, condition.mask)
    ours = gpt.head(ours_hidden)  # (1, N, V)
    # Theirs: their generate()'s layout: 120 left-padded slots, then the image tokens.
    states, flags = convert.caption_inputs(condition.values, condition.mask)
    valid = int(flags.sum())
    states = torch.cat([states[:, valid:], states[:, :valid]], dim=1)  # rotate to left padding, as generate()
    flags = torch.flip(flags, dims=[-1])
    slots = convert.REFERENCE_COND_SLOTS
    mask = torch.cat([flags, torch.ones_like(tokens[:, :-1])], dim=1)  # (1, 120 + N - 1)
    model = reference.target.model
    model.tree_mask = None
    out = model(input_ids=tokens[:, :-1], cond_idx=states.to(gpt.tok_embeddings.weight.dtype), attention_mask=mask)
    theirs_hidden = out[0][:, slots - 1 :]  # (1, N, D)
    theirs = reference.target.lm_head(theirs_hidden).float()
    # Drafters on image entries only (their drafter reads 119 condition entries, ours T - 1: the entries
    # are aligned by the RoPE row of the token they read). Inputs: token n's embedding and f_{n-1}.
    features = ours_hidden[:, :-1]  # (1, N - 1, D): f at the entries reading tokens 1..N-1
    count = features.shape[1]
    embeds = gpt.embed_tokens(tokens[:, 1:])
    entries = config.cls_token_num + torch.arange(count, device=tokens.device)  # token n+1's entry
    causal = torch.ones(count, count, dtype=torch.bool, device=tokens.device).tril()[None, None]
    ours_draft = gpt.head(drafter(embeds, features, entries, entries[None], causal, NoCache()))
    positions = (slots + torch.arange(count, device=tokens.device))[None]
    layer = reference.eagle.ea_layer
    layer.tree_mask = None
    theirs_draft = reference.target.lm_head(layer(features, input_ids=tokens[:, 1:], position_ids=positions)).float()
    return {
        "target_logits_max_abs_diff": float((ours - theirs).abs().max()),
        "target_logits_scale": float(ours.abs().max()),
        "drafter_logits_max_abs_diff": float((ours_draft - theirs_draft).abs().max()),
        "drafter_logits_scale": float(ours_draft.abs().max()),
    }


def retrieve_paths(parents: list[int], depth: list[int]) -> torch.Tensor:
    """Their EAGLE-2 ``retrieve_indices`` at temperature 0 for one tree given by ``parents`` (-1 at the
    root) and ``depth``: one row per leaf, leaves in increasing node index (their ``topK_genrate`` lists
    them so and sorts only when sampling), each the node indices from the root, padded with -1."""
    count = len(parents)
    inner = set(parents[1:])
    width = max(depth) + 1
    rows = []
    for leaf in (i for i in range(count) if i not in inner):
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = parents[node]
        rows.append(path[::-1] + [-1] * (width - len(path)))
    return torch.tensor(rows, dtype=torch.long)


def their_greedy_walk(modules: Modules, nearest: torch.Tensor, k: int, delta: float):
    """A walk hook (``rule.walk``) that asks THEIR greedy LANTERN (``EaModel.evaluate_posterior``, their
    function run as released) which path of our draft to accept, on our target's rows ``p``.

    Their function softmaxes logits itself, so it gets ``log p`` (softmax(log p) = p). ``nearest`` (V, >= k)
    int64 is their neighbour table. The records' ``tv``/``merged`` are zeros (only the path and the next
    token are compared). Eager only (host loops over rows).
    """
    host = SimpleNamespace(nearest_latents=nearest)

    def walk(draft, p: torch.Tensor, *_) -> tuple:  # the fields of lantern.rules.api.PathChoice, in order
        batch, _, _ = p.shape
        depth_max = draft.max_depth
        path = torch.full((batch, depth_max), -1, dtype=torch.long, device=p.device)
        next_token = torch.zeros(batch, dtype=torch.long, device=p.device)
        for row in range(batch):
            retrieve = retrieve_paths(draft.parents[row].tolist(), draft.depth[row].tolist()).to(p.device)
            tokens = torch.cat([draft.tokens[row], torch.full((1,), -1, dtype=torch.long, device=p.device)])
            logits = torch.log(p[row].clamp_min(1e-38))[retrieve]  # (paths, D+1, V); -1 rows are masked
            best, length, chosen = modules.ea.EaModel.evaluate_posterior(
                host, logits, tokens[retrieve], None, lantern=True, lantern_k=k, lantern_delta=delta
            )
            length = int(length)
            path[row, :length] = retrieve[int(best), 1 : length + 1]
            next_token[row] = chosen.argmax()
        zeros = torch.zeros(batch, depth_max, dtype=p.dtype, device=p.device)
        return path, next_token, torch.cat([zeros, zeros[:, :1]], dim=1), zeros  # (B, D), (B,), (B, D+1), (B, D)

    return walk
