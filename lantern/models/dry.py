"""Dry twins of the families' loaders: every knob of a preset's node checked before any model loads.

A loader (a bundle's, a drafter's, a codebook's, the GPU check's ``timing``) names its twin with :func:`dry_twin`.
The twin takes the loader's arguments, reads no weights and builds no module: it bounds every size the node states
(:data:`SIZES`), checks that the paths it is given exist, refuses a missing drafter where one is needed, and builds
the family's config dataclasses, so the relations between sizes (heads that split the width, a grid that divides
the image, a vocabulary that matches the codebook) are checked as the loader would check them.
``lantern.run.dry_build`` calls the twins of a run's model and metric nodes from the preflight. A model node whose
loader has no twin is not called there at all (its knobs are then checked only when it loads): a new family's
loaders declare theirs, as the families here do (a class that reads nothing, like ``ClassConditioner``, is its own).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from lantern import checks
from lantern.errors import ConfigError

MAX_TOKENS, MAX_CODES, MAX_PIXELS, MAX_WIDTH = 16384, 65536, 8192, 65536
# What a family's node may state: knob name -> (low, high), far above every preset (Emu3's 720 px, 32768 codes and
# 184622-token vocabulary; a 7B's 32 layers of width 4096). A larger value is a typo that would allocate past any memory.
SIZES = {
    "n_layer": (1, 1024),
    "n_head": (1, 1024),
    "n_kv_head": (0, 1024),  # 0: as many as query heads
    "dim": (1, MAX_WIDTH),
    "ffn_hidden": (1, 4 * MAX_WIDTH),
    "num_codes": (1, MAX_CODES),
    "vocab_size": (1, MAX_CODES),
    "codebook_size": (1, MAX_CODES),
    "num_embeddings": (1, MAX_CODES),
    "text_vocab_size": (1, 1 << 22),
    "num_classes": (1, 1 << 20),
    "image_size": (1, MAX_PIXELS),
    "resolution": (1, MAX_PIXELS),
    "cls_token_num": (1, MAX_TOKENS),
    "max_length": (1, MAX_TOKENS),
    "caption_dim": (1, MAX_WIDTH),
    "code_dim": (1, MAX_WIDTH),
    "embed_dim": (1, MAX_WIDTH),
    "z_channels": (1, MAX_WIDTH),
    "base_channels": (1, MAX_WIDTH),
    "latent_channels": (1, MAX_WIDTH),
    "hidden_size": (1, MAX_WIDTH),
    "num_attention_heads": (1, 1024),
    "num_res_blocks": (1, 64),
    "temporal_downsample_factor": (1, 64),
    "init_seed": (0, 2**63 - 1),
}
ID_BOUND = (0, 1 << 22)  # a special token's id (``*_id``): inside any vocabulary


def dry_twin(twin: Callable) -> Callable:
    """Decorator: ``twin`` is the decorated loader's dry twin (called with the loader's arguments)."""

    def attach(loader: Callable) -> Callable:
        loader.dry = twin
        return loader

    return attach


def check_sizes(prefix: str, node) -> None:
    """Every integer a node states within its bound (:data:`SIZES`; ``*_id``: :data:`ID_BOUND`), nested nodes and
    lists too: one ConfigError naming ``prefix.key``."""
    items = node.items() if isinstance(node, Mapping) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        name = f"{prefix}.{key}"
        if isinstance(value, (Mapping, list)):
            check_sizes(name, value)
            continue
        bound = SIZES.get(str(key)) or (ID_BOUND if str(key).endswith("_id") else None)
        if bound is not None and value is not None:
            checks.capped(name, value, *bound)


def check_paths(prefix: str, node: Mapping, keys: Iterable[str], kind: str = "file or folder") -> None:
    """Each of ``keys`` that ``node`` gives (not null) names something that exists (a stat, nothing read)."""
    for key in keys:
        value = node.get(key)
        if value is not None and not os.path.exists(os.fspath(value)):
            shown = checks.shown(os.fspath(value), 400)  # a path is shown whole: its end is what tells it apart
            raise ConfigError(f"{prefix}.{key}={shown}: expected an existing {kind} (no such path)")


def check_choices(prefix: str, node: Mapping, choices: Mapping[str, Iterable[str]]) -> None:
    """Each of ``choices``' keys that ``node`` gives is one of its allowed names."""
    for key, allowed in choices.items():
        if node.get(key) is not None:
            checks.choice(f"{prefix}.{key}", node[key], tuple(allowed))


def family_twin(
    prefix: str,
    config_of: Callable[[Mapping], object] | None = None,
    paths: Iterable[str] = (),
    choices: Mapping[str, Iterable[str]] | None = None,
    drafter: str | None = None,
) -> Callable:
    """A dry twin for a loader whose node sits at ``prefix`` (``model.bundle``, ``model.drafter``, ...): sizes
    bounded, ``paths`` that are given exist, ``choices`` among their names, a null ``path`` refused where ``drafter``
    (what ``model.drafter_ckpt`` may be) is given, then ``config_of(node)`` builds the family's configs; a
    ``conditioner`` (its own twin, or a class that builds no weights) is made and checked against that config."""
    from lantern.models.bundle import require_drafter

    def dry(**node):
        check_sizes(prefix, node)
        check_choices(prefix, node, choices or {})
        if drafter is not None:
            require_drafter(node.get("path"), drafter)
        check_paths(prefix, node, paths)
        try:
            config = config_of(node) if config_of is not None else None
        except TypeError as exc:  # a config dataclass given a key it does not have
            raise ConfigError(f"{prefix}: {exc}") from None
        conditioner = node.get("conditioner")
        made = conditioner(device="cpu") if callable(conditioner) else None
        if config is not None and hasattr(made, "check_model"):
            made.check_model(config)

    return dry


def overrides_of(prefix: str, node: Mapping, fields: Iterable[str]) -> dict:
    """A preset node's ``overrides`` (null: none), each naming a field of the config it overrides."""
    overrides = dict(node.get("overrides") or {})
    known = set(fields)
    for key in overrides:
        if key not in known:
            raise ConfigError(
                f"{prefix}.overrides.{key}: not a field of the config (one of {', '.join(sorted(known))})"
            )
    return overrides
