"""Building a run config's decoders without reading a file: every knob checked before a model is loaded.

Multirun preflight (:mod:`lantern.cli.preflight`) and the benchmarks (:mod:`lantern.run.bench`) build each
job's or mode's sampling settings, draft structure and decoders with stand-ins for what they would read.
"""

from __future__ import annotations


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
    if isinstance(resolved.get("tv_audit"), dict):  # the TV audit's knobs (lantern.decoding.audit.MonteCarlo)
        instantiate(resolved["tv_audit"])
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
