"""Run records the results-table tests share: the common setting, AR and tree decoder settings, a record writer."""

from __future__ import annotations

import json

from lantern.decoding.ar import ARSettings
from lantern.decoding.tree.decoder import TreeSettings

SETTING = {
    "model": "m",
    "prompts": "p",
    "num_images": 4,
    "batch_size": 2,
    "seed": 0,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "cfg_scale": 3.0,
    "environment": {"device": "cpu", "device_name": "cpu A (2 cores)"},
}
AR = ARSettings(name="ar", label="AR")


def tree(
    name="lantern",
    label=None,
    draft="chain",
    candidates="deterministic",
    k=None,
    delta=None,
    lam=None,
    semantics=None,
    acceptance=None,
):
    family = acceptance or ("exact" if k is None else name)
    bound = "" if k is None else f"k={k} " + (f"d={delta}" if lam is None else f"l={lam}")
    rule = {
        "acceptance": family,
        "candidates": candidates,
        "semantics": semantics,
        "k": k,
        "delta": delta,
        "lambda": lam,
        "label": bound or "exact",
    }
    return TreeSettings(
        name=name, label=label or name.upper(), draft={"draft": draft, "candidates": candidates}, rule=rule
    )


def record(tmp_path, name, settings, **fields):
    folder = tmp_path / name
    folder.mkdir()
    exact = {"tv_realised_mean": 0.0, "tv_realised_max": 0.0} if settings.baseline else {}  # AR samples p itself
    payload = {**SETTING, **settings.record(), "settings": settings.to_json(), "schema_version": 2, **exact, **fields}
    (folder / "metrics.json").write_text(json.dumps(payload))
    return folder
