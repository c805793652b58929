"""Checks of a composed run config that need no model and no file: they run before anything is built.

* Every interpolation resolves (``temperature=${nope}`` is one line, not an OmegaConf traceback).
* No number anywhere is ``inf`` or ``nan``.
* A command-line value has the kind of its default: text where the default is a number
  (``top_k=abc``) or a bool is refused with the key, the value and the default. Ranges stay with
  the code that uses each value (e.g. :class:`lantern.models.sampling.SamplingConfig`).
* LANTERN's top-level knobs ``k``, ``delta`` and ``lambda`` are valid whichever decoder runs (a sweep
  across decoders leaves them out of the jobs of a decoder that does not define them, :mod:`lantern.cli.knobs`,
  but a bad value is still bad input), and so are the job's integers (``num_images``, ``batch_size``, ...).
* ``+key=value`` for a top-level key nothing reads is refused (Hydra would add it silently).

A multirun checks every job this way before the first job starts (:func:`check_sweep_jobs`), and also
builds each job's sampling settings, draft structure and decoder with stand-ins for the files they read
(:func:`dry_build`), so a range error in any job stops the sweep before anything is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.decoding.ar import ATTENTION
from lantern.decoding.compile import COMPILE_MODES
from lantern.errors import ConfigError
from lantern.metrics.protocol import Protocol
from lantern.results.report import parse_prompts
from lantern.run import tracking
from lantern.run.assets.check import check_assets
from lantern.run.dry_build import dry_build

# Upper bounds on what sets work or memory, far above every preset's need: the largest grid (Emu3 at 720 px,
# 90 x 90 = 8100 tokens) and codebook (Emu3: 32768 codes) any model here decodes; a million images (a protocol
# pins at most 30k). A larger value is a typo that would run for days or allocate past any memory.
MAX_TOKENS = 16384
MAX_CODES = 65536
MAX_IMAGES = 1_000_000

# LANTERN's knobs, checked where a decoder lacks them too (no default there to take a kind from): name -> check.
NULLABLE_KNOBS = {
    "k": lambda v: checks.optional(checks.capped, "k", v, 1, MAX_CODES, note="LANTERN's neighbours"),
    "delta": lambda v: checks.optional(checks.probability, "delta", v, note="LANTERN's TV budget"),
    "lambda": lambda v: checks.optional(checks.real, "lambda", v, 1, note="LANTERN++'s cap"),
}

# Knobs of more than one kind (so their default's kind does not bind them): name -> check.
OWN_KIND = {"report.prompts": parse_prompts}  # a count or image indices

# Top-level integers of every run, checked here so the first message about them is about them: name -> (low, high).
TOP_LEVEL_INTEGERS = {
    "num_images": (1, MAX_IMAGES),
    "batch_size": (1, 4096),
    "seed": (0, 2**63 - 1),  # the key of image i is (seed, i) in an int64
    "warmup": (0, 1000),  # untimed batches before the timed ones
    "speedup_every": (1, None),  # a larger value only times the baseline less often
}

# Decoder knobs (top-level, from conf/decoding) that size each step's work: name -> (low, high, what), checked
# whenever present (a null keeps its decoder's default). The decoders check their own relations (a tree that
# fits its window); these bounds come first so no constructor meets a value it would allocate or loop on.
WORK_KNOBS = {
    "window": (1, MAX_TOKENS, "draft tokens per target forward"),
    "tree_width": (1, MAX_TOKENS, "SJD-PAC's children per node"),
    "tree_depth": (1, MAX_TOKENS, "SJD-PAC's tree levels"),
    "gsd_radius": (0, MAX_CODES, "GSD's ranks either side of a draft"),
}

# Prompt counts (a prompt set builds its list when instantiated): dotted key -> its low bound.
PROMPT_COUNTS = ("prompts.count", "model.default_prompts.count", "model.train_prompts.count")

NAME_MAX = 128
DTYPES = ("float32", "bfloat16", "float16")

# The bounded rule's search (conf/semantics/bounded.yaml): dotted key -> (low, high); null keeps its default.
# and the neighbour table's width (a table of V x k_max entries).
RULE_KNOBS = {
    "decoding.acceptance.scan": (1, MAX_CODES),
    "decoding.acceptance.rounds": (1, 1000),
    "model.neighbours.k_max": (1, MAX_CODES),
}

# The draft structure's sizes (conf/draft): key -> (low, high).
DRAFT_KNOBS = {"depth": (1, MAX_TOKENS), "top_k": (1, MAX_CODES), "nodes": (1, MAX_TOKENS)}


def resolve(cfg: DictConfig) -> dict:
    """``cfg`` resolved to plain containers; an interpolation that does not resolve is one ConfigError.

    A mandatory value left as ``???`` propagates as OmegaConf's MissingMandatoryValue (the entry point
    turns it into "KEY is required").
    """
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        for key in cfg:  # top-level knobs first, so an error names the key the user set
            if not OmegaConf.is_config(cfg._get_node(key)):
                cfg[key]
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue:
        raise
    except OmegaConfBaseException as exc:  # an interpolation to a missing key, an unknown resolver, ...
        key = getattr(exc, "full_key", None) or "a config value"
        reason = str(getattr(exc, "msg", None) or exc).strip().splitlines()[0]
        raise ConfigError(f"{key} cannot be resolved: {reason}") from exc


def non_finite(tree, prefix: str = "") -> list[tuple[str, float]]:
    """Every (dotted key, value) in a resolved config whose value is an infinite or NaN float."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return [(prefix.rstrip("."), tree)] if isinstance(tree, float) and not math.isfinite(tree) else []
    return [found for key, value in items for found in non_finite(value, f"{prefix}{key}.")]


def check_kind(key: str, value, default) -> None:
    """Raise ConfigError when ``value`` (from the command line) is not of the kind of ``default``."""
    if value is None or default is None:
        return
    if isinstance(default, bool):
        checks.flag(key, value, note=f"default {checks.shown(default)}")
    elif checks.is_number(default) and not checks.is_number(value):
        raise checks.refuse(key, value, "a number", note=f"default {default!r}")


def named(tree, prefix: str = "") -> list[tuple[str, object]]:
    """Every (dotted key, value) of a key called ``name`` in a resolved config."""
    if not isinstance(tree, dict):
        return []
    found = [(f"{prefix}name", tree["name"])] if "name" in tree else []
    return found + [hit for key, value in tree.items() for hit in named(value, f"{prefix}{key}.")]


def check_names(resolved: dict) -> None:
    """A knob called ``name`` (a model's, a prompt set's, a decoder's, a file of the world folder) names a thing,
    never a path: 1 to 128 printable characters, no ``/`` or ``\\``, not starting with ``.`` (so never ``..``)."""
    for key, value in named(resolved):
        text = value if isinstance(value, str) else ""
        if value is not None and (
            not text or len(text) > NAME_MAX or not text.isprintable() or "/" in text or "\\" in text or text[0] == "."
        ):
            expected = f"a name of 1 to {NAME_MAX} printable characters, no / or \\, not starting with '.'"
            raise checks.refuse(key, value, expected, "a name, not a path")


def check_knobs(resolved: dict) -> None:
    """Raise ConfigError for a non-finite number anywhere or a bad top-level ``k``/``delta``/``lambda``."""
    found = non_finite(resolved)
    if found:
        key, value = min(found, key=lambda item: item[0].count("."))  # a top-level knob before its copies
        raise checks.refuse(key, value, "a finite number")
    for name, (low, high) in TOP_LEVEL_INTEGERS.items():
        checks.capped(name, resolved.get(name, low), low, high)
    for name, check in NULLABLE_KNOBS.items():
        check(resolved.get(name))
    # Whatever decoder and baseline are built (an AR decoder reads them; LANTERN with speedup_baseline=null
    # builds none), a run records them: a value no decoder accepts is refused here.
    checks.choice("attention", resolved.get("attention", ATTENTION[0]), ATTENTION)
    checks.choice("compile", resolved.get("compile", COMPILE_MODES[0]), COMPILE_MODES)
    checks.choice("dtype", resolved.get("dtype", DTYPES[0]), DTYPES, note="the model's weights and activations")
    check_device(resolved.get("device", "cpu"))


def check_work(resolved: dict) -> None:
    """Upper bounds on the knobs that size work or memory (after the kind check of command-line values, so
    ``draft.depth=deep`` is named as a word where a number belongs) and every ``name`` knob."""
    for name, (low, high, what) in WORK_KNOBS.items():
        checks.optional(checks.capped, name, resolved.get(name), low, high, note=what)
    bounds = {**dict.fromkeys(PROMPT_COUNTS, (1, MAX_IMAGES)), **RULE_KNOBS}
    for key, (low, high) in bounds.items():
        value = resolved
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        checks.optional(checks.capped, key, value, low, high)
    check_names(resolved)
    draft = resolved.get("draft")
    for name, (low, high) in DRAFT_KNOBS.items():
        if isinstance(draft, dict) and draft.get(name) is not None:
            checks.capped(f"draft.{name}", draft[name], low, high)


def check_device(value) -> None:
    """``value`` as a torch device name (``cpu``, ``cuda``, ``cuda:1``, ``mps``), before a model is built."""
    import torch

    try:
        torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise checks.refuse("device", value, "a torch device such as cpu, cuda, cuda:0 or mps") from None


def value_overrides(overrides: Sequence[str], groups: set[str]) -> tuple[list[str], list[str]]:
    """Split command-line ``overrides`` into (group choices, value overrides); hydra.* ones are dropped."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices, values = [], []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if override.is_hydra_override():
            continue
        if "." not in key and key.split("/")[0] in groups:
            choices.append(override.input_line)
        elif override.is_add() and "." not in key:
            # Hydra adds any top-level key given as +key=value, and nothing reads it: refuse it here.
            raise ConfigError(f"unknown key {key!r} (added with +{key}=...): no part of a run reads it")
        elif not override.is_delete():
            values.append(key)
    return choices, values


def check_overrides(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Compare every value set on the command line with its default (the config composed with the same
    group choices but no values) and refuse one of another kind (:func:`check_kind`).

    Runs inside a Hydra app (it composes through Hydra's global state).
    """
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    loader = GlobalHydra.instance().config_loader()
    # Config groups: those of the primary search path and those this run chose (searchpath ones included).
    groups = set(loader.list_groups("")) | {group.split("/")[0] for group in HydraConfig.get().runtime.choices}
    choices, keys = value_overrides(overrides, groups)
    if not keys:
        return
    defaults = compose(config_name=HydraConfig.get().job.config_name, overrides=choices)
    for key in keys:
        try:
            default = OmegaConf.select(defaults, key, throw_on_missing=False)
        except Exception:  # noqa: BLE001 - a default that does not resolve on its own has no kind to compare
            continue
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        if key in OWN_KIND:
            OWN_KIND[key](OmegaConf.to_object(value) if OmegaConf.is_config(value) else value)
            continue
        check_kind(key, value, default)


def check_pins(tree, prefix: str = "protocol.") -> None:
    """Every ``sha256`` pin of a protocol: null or 64 hex digits, as text, before its file is read."""
    for key, value in (tree or {}).items() if isinstance(tree, dict) else ():
        if key == "sha256" and value is not None and not re.fullmatch(r"[0-9a-f]{64}", str(value)):
            raise checks.refuse(prefix + key, value, "64 lowercase hex digits or null", "a file's sha256 pin")
        check_pins(value, f"{prefix}{key}.")


def check_run_config(cfg: DictConfig, overrides: Sequence[str] = ()) -> dict:
    """All the checks above, for a run's composed ``cfg`` and its command-line ``overrides``, then every
    object a run builds from knobs alone built with stand-ins for its files (:func:`dry_build`), whichever
    decoder and baseline run; returns the resolved config."""
    resolved = resolve(cfg)
    check_knobs(resolved)
    check_pins(resolved.get("protocol"))
    protocol = Protocol.from_config(resolved.get("protocol"))
    if protocol is not None:  # what the config alone must agree on; its files are hashed before the folder is claimed
        protocol.check_config(resolved, resolved.get("num_images", 1))
    tracking.check_tracker((resolved.get("job") or {}).get("tracker"))  # W&B names, before any work
    check_assets(resolved)  # files a preset reads from paths.assets: there, and as pinned or locked
    if overrides:
        check_overrides(cfg, overrides)
    check_work(resolved)
    try:
        dry_build(resolved)
    except ConfigError as exc:
        raise ConfigError(named_as_set(cfg, str(exc))) from None
    return resolved


def named_as_set(cfg: DictConfig, message: str) -> str:
    """``message`` naming the knob a user sets: a key that (or a node above which) only interpolates another
    (``model.bundle.conditioner.dtype: ${model.text_encoder_dtype}``) is named by that one, followed to the end."""
    found = re.match(r"([A-Za-z_][\w.]*)=", message)
    if found is None:
        return message
    parts, raw = found.group(1).split("."), OmegaConf.to_container(cfg, resolve=False)
    for _ in range(8):  # an interpolation chain of a few links at most
        value, link = raw, None
        for depth, part in enumerate(parts):
            value = value.get(part) if isinstance(value, dict) else None
            link = re.fullmatch(r"\$\{([A-Za-z_][\w.]*)\}", value) if isinstance(value, str) else None
            if link is not None:
                parts = link.group(1).split(".") + parts[depth + 1 :]
                break
        if link is None:
            break
    return ".".join(parts) + message[found.end(1) :]


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override list of every job of a multirun, as Hydra's basic sweeper will launch them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.get("sweeper", {}).get("params") or {}
    given = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(given), None)[0]


def check_sweep_jobs(config: DictConfig) -> None:
    """Compose and check every job of a multirun (:func:`check_run_config` and :func:`dry_build`) before any
    runs; the first bad one is one ConfigError naming the job and its overrides."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from lantern.cli.hydra_errors import hydra_message
    from lantern.errors import user_message

    jobs = sweep_jobs(config)
    values: dict[str, set] = {}
    for job in jobs:
        for override in job:
            values.setdefault(override.split("=", 1)[0], set()).add(override)
    swept = {key for key, seen in values.items() if len(seen) > 1}  # what tells the jobs apart
    for number, job in enumerate(jobs):
        try:
            cfg = compose(config_name=config.hydra.job.config_name, overrides=job, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)  # what check_overrides reads, as in a job
            with open_dict(cfg):
                del cfg["hydra"]
            check_run_config(cfg, [o for o in job if not o.startswith("hydra")])
        except Exception as exc:  # noqa: BLE001 - user errors become one line; anything else is a bug
            message = hydra_message(exc) or user_message(exc)
            if message is None:
                raise
            shown = " ".join(o.removeprefix("++") for o in job if o.split("=", 1)[0] in swept) or " ".join(job)
            raise ConfigError(f"sweep job {number} ({shown}): {message}") from None
