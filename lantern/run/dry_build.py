"""Building a run config's objects without reading a file: every knob checked before a model is loaded.

The preflight (:mod:`lantern.cli.preflight`, every job of a multirun too) and the benchmarks (:mod:`lantern.run.bench`)
build each job's or mode's sampling settings, draft structure and decoders with stand-ins for what they would read,
and the model's nodes (bundle, drafter, codebook, timing) and every metric through their dry twins
(:mod:`lantern.models.dry`): a loader's twin checks its knobs and reads no weights.
"""

from __future__ import annotations

from lantern.errors import ConfigError

# The model's nodes a dry build checks, by key; the drafter only when the decoder drafts, the codebook only when
# its rule reads neighbours (as lantern.run.compose.build_decoder hands them).
MODEL_NODES = ("bundle", "timing")


def stand_in_neighbours(k_max: int):
    """A neighbour table of the configured width with no codebook behind it (for :func:`dry_build`)."""
    import torch

    from lantern.rules.relaxation import NeighbourTable

    codes = k_max + 1
    order = (torch.arange(codes)[:, None] + torch.arange(1, codes)[None, :]) % codes  # (V, k_max) other codes
    return NeighbourTable(order)


def dry_build(resolved: dict) -> None:
    """Build a resolved config's sampling, draft and decoders (and the AR baseline) without reading a file:
    the drafter becomes None and the neighbour table a stand-in of the configured width. Their constructors
    check every knob, so a bad value is found here, before a model is loaded."""
    from hydra.utils import instantiate

    instantiate(resolved["sampling"])
    if isinstance(resolved.get("draft"), dict):
        instantiate(resolved["draft"])
    for key in ("decoding", "speedup_baseline"):
        node = resolved.get(key)
        if not isinstance(node, dict):
            continue
        node = {**node}
        if "drafter" in node:
            node["drafter"] = None
        acceptance = node.get("acceptance")
        if isinstance(acceptance, dict) and "neighbours" in acceptance:
            width = ((resolved.get("model") or {}).get("neighbours") or {}).get("k_max", 1024)
            stand_in = {"_target_": f"{__name__}.stand_in_neighbours", "k_max": int(width)}
            node["acceptance"] = {**acceptance, "neighbours": stand_in}
        instantiate(node, _convert_="partial")
    dry_model_and_metrics(resolved)


def dry_instantiate(node, key: str, twins_only: bool = False):
    """``node`` (a resolved config node at ``key``) built as Hydra builds it, but with each target that has a dry
    twin (``.dry``, :mod:`lantern.models.dry`) replaced by it: nothing read, no weights. ``twins_only`` (the model's
    nodes, whose loaders read weights): a target without a twin is not called at all (a loader a family added
    without one is checked when it loads, never run twice). A bad knob is the ConfigError its twin or
    constructor raises; a target that does not import is one naming its key."""
    import functools

    from hydra.utils import get_object

    if isinstance(node, list):
        return [dry_instantiate(value, f"{key}[{i}]", twins_only) for i, value in enumerate(node)]
    if not isinstance(node, dict):
        return node
    values = {
        name: dry_instantiate(value, f"{key}.{name}", twins_only) for name, value in node.items() if name[:1] != "_"
    }
    target = node.get("_target_")
    if target is None:
        return values
    try:
        found = get_object(str(target))
    except Exception:  # noqa: BLE001 - Hydra raises several kinds for a name that does not import
        raise ConfigError(f"{key}._target_={target!r}: not an importable class or function") from None
    build = getattr(found, "dry", None if twins_only else found)
    if build is None:
        return functools.partial(_unchecked) if node.get("_partial_") else None
    args = [dry_instantiate(value, f"{key}._args_", twins_only) for value in node.get("_args_") or ()]
    try:
        if not node.get("_partial_"):
            return build(*args, **values)
        if build is not found and _binds(build, args, values):  # a twin given all it needs checks now
            build(*args, **values)
    except ConfigError as exc:
        raise ConfigError(_qualified(str(exc), key, values)) from None
    return functools.partial(build, *args, **values)


def _unchecked(*args, **kwargs) -> None:
    """What a partial node without a dry twin becomes in a model's dry build: nothing is called."""
    return None


def _qualified(message: str, key: str, values: dict) -> str:
    """A message that names one of the node's own arguments (``path=...``) names it by its key in the config."""
    name = message.split("=", 1)[0]
    return f"{key}.{message}" if "=" in message and name in values else message


def _binds(function, args: list, values: dict) -> bool:
    """Whether ``function(*args, **values)`` names every argument ``function`` needs."""
    import inspect

    try:
        inspect.signature(function).bind(*args, **values)
    except TypeError:
        return False
    return True


def dry_model_and_metrics(resolved: dict) -> None:
    """The model's nodes and every metric of a resolved run config, built dry (:func:`dry_instantiate`)."""
    model = resolved.get("model") or {}
    decoders = [resolved.get(key) for key in ("decoding", "speedup_baseline")]
    nodes = [name for name in MODEL_NODES if isinstance(model.get(name), dict)]
    if any(isinstance(d, dict) and "drafter" in d for d in decoders) and isinstance(model.get("drafter"), dict):
        nodes.append("drafter")
    for name in nodes:
        dry_instantiate(model[name], f"model.{name}", twins_only=True)
    neighbours = model.get("neighbours") or {}
    reads = any(isinstance((d or {}).get("acceptance"), dict) and "neighbours" in d["acceptance"] for d in decoders)
    if reads and isinstance(neighbours.get("codebook"), dict):
        dry_instantiate(neighbours["codebook"], "model.neighbours.codebook", twins_only=True)
    count = resolved.get("num_images")
    for name, node in (resolved.get("metrics") or {}).items():
        if not isinstance(node, dict):
            continue
        least = getattr(dry_instantiate(node, f"metrics.{name}"), "min_images", 1)  # what the figure needs
        if isinstance(count, int) and count < least:
            raise ConfigError(f"num_images={count}: metrics.{name} needs at least {least} images (or metrics=none)")
