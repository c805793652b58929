"""Rows of the paper's table from run records: one row per run, speed-ups joined only between like runs.

A row's method, its place in the table and its ``delta`` come from the decoder's typed settings stored
in the record (:attr:`~lantern.results.record.RunRecord.decoder_settings`); no decoder is named here. Columns:
tau, latency with its interquartile range over batches, speed-up with its interquartile range, the AR
time the speed-up was measured against, FID, CLIP score, and the relaxation's promise (delta) beside
the realised total variation.

Speed-ups: a record's own (AR interleaved in the same run) is used when it has one; otherwise it is
computed against an AR record among the given ones whose :func:`~lantern.results.baselines.speed_setting`
equals the row's (model and input hashes, prompts, images, batch size, seed, sampling, dtype, compile,
attention, threads, machine). With no such run the cell stays empty and the table's notes name the key
that differed. Records are read through :class:`lantern.results.record.RunRecord`.

Latency from other runs: the papers time batch 1, while quality needs many images, which a large batch
decodes faster and (per-sample seeds) identically. ``build_table(records, latency=...)`` takes each
row's latency and speed-up from the latency run of the same method and setting (any image count and
batch size) and keeps the quality run's own speed-up as the throughput column.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lantern.decoding.api import DecoderSettings
from lantern.errors import ConfigError
from lantern.results.baselines import LATENCY_IGNORED, first_difference, model_inputs, record_setting
from lantern.results.batch_sweep import batch_cells
from lantern.results.published import PAPER
from lantern.results.record import RECORD_NAME, RunRecord, read_record
from lantern.results.spread import quartiles

FAILED_NAME = ".failed.json"  # beside a sweep job's images when the job raised (written by SweepTable)
COLUMNS = (
    "method",
    "tau",
    "latency_ms",
    "latency_iqr_ms",
    "speedup",
    "speedup_iqr",
    "baseline_ms",
    "speedup_reference",
    "speedup_reference_iqr",
    "reference_ms",
    "fid",
    "clip_score",
    "delta",
    "tv_realised",
    "tv_realised_max",
    "lossless",
    "baseline",
    "run",
    "latency_batch",
    "latency_run",
    "throughput_speedup",
    "throughput_batch",
    "fid_ci",
    "clip_score_ci",
    "prompt_accuracy",
    "prompt_accuracy_ci",
    "precision",
    "precision_ci",
    "recall",
    "recall_ci",
    "hps",
    "hps_ci",
    "inception_score",
    "inception_score_ci",
    "kid",
    "kid_ci",
    "protocol",
    "protocol_subset",
    "step_compression",
    "latency_per_step",
    "images_per_s",
    "peak_memory_mb",
    "decoder",
    *PAPER,
)
# Quality figures a record may carry, each with an optional ``{name}_ci`` interval (lantern.metrics.intervals),
# and whether a lower value is better (for the notes' comparisons).
QUALITY = {
    "fid": True,
    "clip_score": False,
    "prompt_accuracy": False,
    "precision": False,
    "recall": False,
    "hps": False,
    "inception_score": False,
    "kid": True,
}


@dataclass
class Table:
    """``rows`` (dicts with :data:`COLUMNS`) in table order, and ``notes`` (why a cell is empty, ...)."""

    rows: list[dict]
    notes: list[str] = field(default_factory=list)


def load_records(paths: Iterable[str | Path], repeated: list[str] | None = None) -> list[RunRecord]:
    """Every ``metrics.json`` under ``paths`` (files or folders), validated (:func:`read_record`).

    A record reached twice (the same run given twice, or inside two given folders) is read once; its
    path is appended to ``repeated`` when given, for the table's notes.
    """
    paths = list(paths)
    records, seen = [], set()
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"runs path not found: {str(path)!r}")
        for file in [path] if path.is_file() else sorted(path.rglob(RECORD_NAME)):
            key = file.resolve()
            if key in seen:
                if repeated is not None:
                    repeated.append(str(file))
                continue
            seen.add(key)
            records.append(read_record(file))
    if not records:
        raise ConfigError(f"no {RECORD_NAME} found under {', '.join(map(str, paths))}")
    return records


def failed_jobs(paths: Iterable[str | Path]) -> list[dict]:
    """Sweep jobs under ``paths`` that failed and have no record: ``{"run", "overrides", "error"}`` each."""
    failed = []
    for path in map(Path, paths):
        for marker in sorted(path.rglob(FAILED_NAME)) if path.is_dir() else []:
            if not (marker.parent / RECORD_NAME).is_file():
                try:
                    entry = json.loads(marker.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    entry = {}
                failed.append(
                    {
                        "run": str(marker.parent),
                        "overrides": entry.get("overrides", []),
                        "error": entry.get("error", "unknown"),
                    }
                )
    return failed


def _batch_ratios(baseline: RunRecord, record: RunRecord) -> list[float]:
    """Per-batch AR / decoder time over the batches (same indices) both runs decoded and timed."""
    times = {tuple(b["indices"]): b["seconds"] for b in baseline.per_batch or [] if b.get("seconds")}
    return [
        times[tuple(b["indices"])] / b["seconds"]
        for b in record.per_batch or []
        if b.get("seconds") and tuple(b["indices"]) in times
    ]


class _Runs:
    """Records with their settings and join keys, and the AR baselines among them."""

    def __init__(self, records: list[RunRecord], ignore=()):
        self.records = records
        self.settings = {id(r): r.decoder_settings for r in records}
        self.keys = {id(r): record_setting(r, ignore) for r in records}
        self.baselines = [r for r in records if self.settings[id(r)].baseline and r.latency_s_per_image]
        self.legacy = {id(r) for r in records if not r.get("settings")}

    def baseline_for(self, record: RunRecord) -> tuple[RunRecord | None, str | None]:
        """The AR run sharing ``record``'s join key, or None and why none does."""
        if id(record) in self.legacy:
            return None, "its record (schema version < 2) holds no decoder settings to join on"
        mine = self.keys[id(record)]
        candidates = [b for b in self.baselines if id(b) not in self.legacy]
        for baseline in candidates:
            if self.keys[id(baseline)] == mine:
                return baseline, None
        if not candidates:
            return None, "no AR run was given"
        differences = [first_difference(mine, self.keys[id(b)]) for b in candidates]
        return None, "no AR run of the same setting: " + "; ".join(
            f"{b.run_dir} differs in {d}" for b, d in zip(candidates, differences, strict=True)
        )


def _speed(record: RunRecord, settings: DecoderSettings, runs: _Runs, notes: list[str], method: str) -> dict:
    """Latency, speed-up (with its spread) and the AR time behind it: the record's own or a like AR run's."""
    latency = record.latency_s_per_image
    speedup, spread, baseline_s = record.speedup, record.speedup_iqr, record.baseline_latency_s_per_image
    source = record.speedup_baseline
    if settings.baseline:
        speedup, spread, baseline_s, source = 1.0, None, latency, f"itself ({record.run_dir})"
    elif speedup is None and latency:
        match, why = runs.baseline_for(record)
        if match is not None:
            speedup, baseline_s, source = match.latency_s_per_image / latency, match.latency_s_per_image, match.run_dir
            spread = quartiles(_batch_ratios(match, record))
        else:
            notes.append(f"{method} ({record.run_dir}): no speed-up: {why}")
    iqr = record.latency_s_iqr
    return {
        "latency_ms": None if latency is None else 1000 * latency,
        "latency_iqr_ms": None if iqr is None else [1000 * v for v in iqr],
        "speedup": speedup,
        "speedup_iqr": spread,
        "baseline_ms": None if baseline_s is None else 1000 * baseline_s,
        "baseline": source,
        "latency_batch": record.get("batch_size"),
        "latency_run": record.run_dir,
        **reference_cells(record),
    }


def reference_cells(record: RunRecord) -> dict:
    """The speed-up over the reference-grade AR (the papers' loop, timed in the same run; version 5 records),
    its spread and the reference's ms/image; None where the run timed no reference."""
    latency = record.get("reference_latency_s_per_image")
    return {
        "speedup_reference": record.get("speedup_reference"),
        "speedup_reference_iqr": record.get("speedup_reference_iqr"),
        "reference_ms": None if latency is None else 1000 * latency,
    }


def _differing(runs: _Runs) -> dict[int, str]:
    """For each record (by id), the join-key entries in which the records differ: `` [seed=1, batch_size=4]``."""
    keys = list(next(iter(runs.keys.values()))) if runs.keys else []
    differing = [k for k in keys if k != "inputs" and len({repr(v[k]) for v in runs.keys.values()}) > 1]
    if "protocol" in differing and "protocol_sha256" in differing:  # the name tells them apart already
        differing.remove("protocol_sha256")
    shown = lambda k, v: str(v)[:12] if k == "protocol_sha256" and v else v  # noqa: E731
    return {
        ident: (" [" + ", ".join(f"{k}={shown(k, v[k])}" for k in differing) + "]") if differing else ""
        for ident, v in runs.keys.items()
    }


def build_table(records: list[RunRecord], latency: list[RunRecord] | None = None, throughput: bool = True) -> Table:
    """One row per record in table order, with speed-up (and its spread) from the record or a like AR run.

    ``latency``: runs that time the same methods in another batch size (batch 1, as the papers do). A row
    whose method and setting one of them shares takes its latency and speed-up from it; the record's own
    speed-up becomes ``throughput_speedup`` at ``throughput_batch`` (left empty with ``throughput=False``: quality
    runs timed on a shared or loaded machine). Two latency runs of one method are refused.
    """
    runs, notes, throughput_on = _Runs(records), [], throughput
    timing: dict[str, dict] = {}
    if latency:
        timed = _Runs(latency, ignore=LATENCY_IGNORED)
        for record in latency:
            key = _method_key(timed, record)
            if key in timing:
                raise ConfigError(
                    f"two latency runs of {timed.settings[id(record)].method()}: "
                    f"{timing[key]['latency_run']} and {record.run_dir}"
                )
            timing[key] = _speed(record, timed.settings[id(record)], timed, notes, timed.settings[id(record)].method())
    suffix = _differing(runs)
    rows = []
    for record in records:
        settings = runs.settings[id(record)]
        method = settings.method() + suffix[id(record)]
        own = _speed(record, settings, runs, notes, method)
        speed, throughput = own, {"throughput_speedup": None, "throughput_batch": None}
        if latency:
            throughput = {
                "throughput_speedup": own["speedup"] if throughput_on else None,
                "throughput_batch": record.get("batch_size"),
            }
            matched = timing.get(_method_key(_Runs([record], ignore=LATENCY_IGNORED), record))
            if matched is None:
                notes.append(f"{method} ({record.run_dir}): no latency run of the same method and setting")
            speed = matched or {key: None for key in own}
        tv = (record.tv_realised_mean, record.tv_realised_max)
        rows.append(
            {
                "method": method,
                "tau": record.mean_accepted_length,
                **{
                    key: speed[key] for key in ("latency_ms", "latency_iqr_ms", "speedup", "speedup_iqr", "baseline_ms")
                },
                **{key: speed[key] for key in ("speedup_reference", "speedup_reference_iqr", "reference_ms")},
                **quality_cells(record),
                "protocol": record.protocol,
                "protocol_subset": record.protocol_subset,
                "delta": settings.columns().get("delta"),
                "tv_realised": tv[0],
                "tv_realised_max": tv[1],
                "lossless": settings.lossless() if record.lossless is None else record.lossless,
                "baseline": speed["baseline"],
                "run": record.run_dir,
                "latency_batch": speed["latency_batch"],
                "latency_run": speed["latency_run"],
                **throughput,
                **step_cells(record, speed["speedup"]),
                **batch_cells(record, settings),
                "_order": (settings.order(), record.run_dir),
            }
        )
    ordered = sorted(zip(records, rows, strict=True), key=lambda pair: _sortable(pair[1]["_order"]))
    notes += significance_notes(runs, ordered)
    rows = [row for _, row in ordered]
    for row in rows:
        del row["_order"]
    kinds = {runs.settings[id(record)].draft_kind() for record in records} - {None}
    return Table(rows=rows, notes=notes + draft_notes(kinds) + protocol_notes(records) + input_notes(records))


def draft_notes(kinds: set[str]) -> list[str]:
    """A line when rows draft in more than one way: a relaxed rule is compared with the exact row of its kind."""
    if len(kinds) < 2:
        return []
    return [
        "Draft kinds: rows marked deterministic draft the drafter's top-ranked candidates (the papers' convention), "
        "rows marked sampled draw their drafts from the drafter (where exact speculative sampling accepts most); "
        "compare each relaxed rule with the exact row of the same kind."
    ]


def step_compression(record: RunRecord) -> float | None:
    """AR's target forwards over the decoder's, per image: ``T / (S + 1)`` with ``T`` tokens per image and ``S``
    target steps per image after the prefill (which draws the first token in both), so AR's is exactly 1 and a
    decoder's is tau's ``(T - 1) / S`` counted the way the papers count steps. None without ``target_steps``."""
    steps, tokens, images = record.get("target_steps"), record.get("tokens_per_image"), record.get("num_images")
    if not (steps and tokens and images):
        return None
    return tokens * images / (steps + images)


def step_cells(record: RunRecord, speedup: float | None) -> dict:
    """Step compression and latency speed-up / step compression: AR's step time over this decoder's step
    time (above 1: a step of the decoder costs less than an AR step; its inverse is a step's cost in AR steps)."""
    steps = step_compression(record)
    return {"step_compression": steps, "latency_per_step": speedup / steps if speedup and steps else None}


def quality_cells(record: RunRecord) -> dict:
    """Each quality figure of ``record`` and its interval as ``[lo, hi]`` (None where absent)."""
    cells = {}
    for name in QUALITY:
        interval = record.get(name + "_ci")
        cells[name] = record.get(name)
        cells[name + "_ci"] = [interval["lo"], interval["hi"]] if isinstance(interval, dict) else None
    return cells


def significance_notes(runs: _Runs, ordered: list[tuple[RunRecord, dict]]) -> list[str]:
    """For each (record, row) with an AR run of the same setting (protocol included), in table order: the
    quality figures whose difference from AR's lies within the two intervals (they overlap), marked as not
    significant."""
    lines = []
    for record, row in ordered:
        if runs.settings[id(record)].baseline:
            continue
        baseline, _ = runs.baseline_for(record)
        if baseline is None:
            continue
        mine, theirs = quality_cells(record), quality_cells(baseline)
        close = [
            f"{name} {mine[name]:.4g} vs {theirs[name]:.4g}"
            for name in QUALITY
            if mine[name + "_ci"]
            and theirs[name + "_ci"]
            and mine[name + "_ci"][0] <= theirs[name + "_ci"][1]
            and theirs[name + "_ci"][0] <= mine[name + "_ci"][1]
        ]
        if close:
            lines.append(f"{row['method']} vs AR: {', '.join(close)}: not significant (their 95% intervals overlap).")
    return lines


def protocol_notes(records: list[RunRecord]) -> list[str]:
    """The protocols of the rows (runs of two protocols are never joined), and the rows that ran a subset."""
    named = sorted({r.protocol for r in records if r.protocol})
    if not named:
        return []
    subsets = [r for r in records if r.protocol_subset]
    line = f"Protocol: {', '.join(named)}" + (
        " (runs of different protocols are never joined)" if len(named) > 1 else ""
    )
    if subsets:
        line += f"; {len(subsets)} of {len(records)} runs used the first N prompts only (marked subset)"
    return [line + "."]


def input_notes(records: list[RunRecord]) -> list[str]:
    """One line per distinct set of joined inputs (model weights, tokenizer, text encoder, prompt files) with
    their short sha256, so a reader sees which files the rows were made from (runs join only within a set)."""
    sets: dict[str, list[RunRecord]] = {}
    for record in records:
        hashes = model_inputs(record.inputs)
        if hashes:
            sets.setdefault(json.dumps(hashes, sort_keys=True), []).append(record)
    lines = []
    for key, members in sets.items():
        named = sorted((Path(path).name, str(digest)) for path, digest in json.loads(key).items())  # by file name
        shown = ", ".join(f"{name} {digest[:12]}" for name, digest in named)
        who = f" ({len(members)} of {len(records)} runs, first {members[0].run_dir})" if len(sets) > 1 else ""
        lines.append(f"Inputs (sha256): {shown}{who}.")
    return lines


def _method_key(runs: _Runs, record: RunRecord) -> str:
    """A method under one setting, whatever the image count and batch size (matches quality and latency runs)."""
    settings = runs.settings[id(record)].to_json()
    return json.dumps([settings, runs.keys[id(record)]], sort_keys=True, default=str)


def _sortable(value):
    """``value`` with None and mixed types made comparable (None first, numbers before text)."""
    if isinstance(value, (tuple, list)):
        return tuple(_sortable(v) for v in value)
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, (int, float)):
        return (1, value)
    return (2, str(value))


def table_rows(records: list[RunRecord], latency: list[RunRecord] | None = None) -> list[dict]:
    """The rows of :func:`build_table`."""
    return build_table(records, latency).rows
