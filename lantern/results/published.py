"""Published figures beside ours: a "paper" column block read from a shipped CSV that names its source.

The CSV (e.g. ``results/published/sjd_pac_readme.csv``) starts with ``#`` lines naming where its figures were
transcribed from, then one row per (benchmark, model, method) with ``label`` (the row label our decoders
carry, e.g. ``SJD-PAC``), ``lossless`` as claimed, ``step_compression``, ``latency_speedup``, ``fid`` and
``clip``. A table row takes the figures of the published row of the same label, of the chosen ``model`` and
of its benchmark: ``benchmark`` when given, else its protocol's entry in ``benchmarks``. Nothing is matched on
a decoder's or family's name in code: labels and the protocol map are data.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lantern.errors import ConfigError

# Our column -> the CSV's column.
PAPER = {
    "paper_step_compression": "step_compression",
    "paper_speedup": "latency_speedup",
    "paper_fid": "fid",
    "paper_clip": "clip",
    "paper_lossless": "lossless",
}
NEEDED = ("benchmark", "model", "method", "label", *PAPER.values())


def read_published(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """The CSV's rows and its ``#`` source lines (a file without a source line is refused)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"published figures not found: {str(path)!r}")
    text = path.read_text(encoding="utf-8")
    source = [line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")]
    if not any("source" in line for line in source):
        raise ConfigError(f"{path}: no '# source: ...' line naming where its figures come from")
    data = pd.read_csv(path, comment="#", dtype={"benchmark": str, "model": str, "label": str})
    missing = [c for c in NEEDED if c not in data.columns]
    if missing:
        raise ConfigError(f"{path}: missing columns {', '.join(missing)}")
    return data, source


def check_published(published: dict) -> tuple[pd.DataFrame, list[str]]:
    """The CSV of ``published`` and its source lines, refused (ConfigError) when it is missing or malformed or
    holds no row of ``published['model']`` (a sweep checks this before its first job)."""
    data, source = read_published(published["path"])
    model = published.get("model")
    if model not in set(data["model"]):
        raise ConfigError(f"published.model={model!r}: expected one of {', '.join(sorted(set(data['model'])))}")
    return data, source


def _matches(method: str, label: str) -> bool:
    """Whether a row's method is a setting of ``label`` (``SJD W=16`` is SJD's, ``SJD-PAC L=64`` is not)."""
    return method == label or method.startswith(label + " ")


def _value(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def attach_published(table, published: dict) -> None:
    """Fill each row's ``paper_*`` cells of ``table`` (a :class:`~lantern.results.tables.Table`) in place and
    add notes: the source, the published rows no run of ours matched, and ``published['notes']`` lines.

    ``published``: ``path`` (the CSV), ``model`` (which published target), ``benchmark`` (or None: each row's
    protocol through ``benchmarks``), ``benchmarks`` (protocol name -> benchmark), ``notes`` (more lines).
    """
    data, source = check_published(published)
    model = published["model"]
    mine = data[data["model"] == model]
    benchmarks = dict(published.get("benchmarks") or {})
    used = set()
    for row in table.rows:
        benchmark = published.get("benchmark") or benchmarks.get(row.get("protocol"))
        labelled = [_matches(row["method"], label) for label in mine["label"]]
        hits = mine[(mine["benchmark"] == benchmark).to_numpy() & labelled]
        first = hits.iloc[0].to_dict() if len(hits) else {}
        used |= set(hits.index)
        for ours, theirs in PAPER.items():
            row[ours] = _value(first.get(theirs))
    shown = {published.get("benchmark") or benchmarks.get(r.get("protocol")) for r in table.rows} - {None}
    unmatched = mine[mine["benchmark"].isin(shown) & ~mine.index.isin(used)]
    table.notes.append(
        f"Paper columns: {model} on {', '.join(sorted(shown)) or 'no benchmark (no protocol of the rows maps to one)'}, "
        + "; ".join(line for line in source if line.startswith("source"))
        + " (transcribed by hand). Its lossless claims are the paper's, not measurements."
    )
    if len(unmatched):
        named = ", ".join(f"{r.method} ({r.benchmark})" for r in unmatched.itertuples())
        table.notes.append(f"Published rows with no run here: {named}.")
    table.notes.extend(str(line) + "." for line in published.get("notes") or [])
