"""When two runs' timings may be compared: the join key, and a named baseline run checked against it.

A speed-up divides an AR run's time by a decoder's. It means something only when the two runs differ in
the decoder alone, so every join compares :func:`speed_setting`: what changes speed or quality besides
the decoder (model and the hashes of its inputs, prompts, images, batch size, seeds, sampling, dtype,
compile mode, attention kernel, threads and machine). Tables join only runs whose settings are equal and
say which key differed otherwise (:func:`first_difference`); a job's ``speedup_baseline_run=PATH`` is
refused at once when that run differs (:func:`read_baseline_run`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lantern.decoding.api import settings_from_record
from lantern.errors import ConfigError
from lantern.results.record import RECORD_NAME, RecordError, RunRecord, read_record

# (key, where it lives): "record" entries, "config" entries (the resolved run config), "environment" entries.
JOIN_KEYS = (
    ("protocol", "record"),  # runs of two protocols are never joined or compared
    ("protocol_sha256", "record"),
    ("model", "record"),
    ("inputs", "record"),
    ("prompts", "record"),
    ("num_images", "record"),
    ("batch_size", "record"),
    ("seed", "record"),
    ("temperature", "record"),
    ("top_k", "record"),
    ("top_p", "record"),
    ("cfg_scale", "record"),
    ("cfg_interval", "record"),
    ("entropy_temperature", "record"),  # null or absent: off
    ("dtype", "record"),
    ("compile", "record"),
    ("attention", "config"),
    ("device", "environment"),
    ("device_name", "environment"),
    ("num_threads", "environment"),
)
# A latency run lends its timing to a quality run of the same method at any image count, batch size and thread
# count: those change how long the quality run took, which a joined table does not show, not what it measured.
LATENCY_IGNORED = ("num_images", "batch_size", "num_threads")


# Inputs that make two runs' images comparable: the model's weights and the prompts (a drafter, neighbour
# table or metric weights belong to one decoder or metric, not to the setting).
JOIN_ROLES = ("target", "tokenizer", "text_encoder", "prompts")


def model_inputs(inputs: Mapping | None) -> dict | None:
    """``{"role/file name": sha256}`` of the inputs in :data:`JOIN_ROLES` (None when the record lists no
    inputs). Keyed by role and file name, not by folder: the same files in another checkout, or in a
    moved one, are the same inputs."""
    if not inputs:
        return None
    return {
        f"{entry.get('role')}/{Path(path).name}": entry.get("sha256")
        for path, entry in sorted(inputs.items())
        if isinstance(entry, Mapping) and entry.get("role") in JOIN_ROLES
    }


def speed_setting(fields: Mapping, environment: Mapping | None, config: Mapping | None, ignore=()) -> dict:
    """The join key of a run from its record entries, environment and config (absent entries are None)."""
    sources = {"record": fields, "environment": environment or {}, "config": config or {}}
    key = {key: sources[where].get(key) for key, where in JOIN_KEYS if key not in ignore}
    if "inputs" in key:
        key["inputs"] = model_inputs(key["inputs"])
    return key


def record_setting(record: RunRecord, ignore=()) -> dict:
    """:func:`speed_setting` of a record."""
    return speed_setting(record, record.environment, record.config, ignore)


def first_difference(mine: dict, theirs: dict) -> str | None:
    """``key (mine X, theirs Y)`` for the first key whose values differ, or None when all agree."""
    for key, value in mine.items():
        if theirs.get(key) != value:
            return f"{key} (this run {_short(value)}, the other {_short(theirs.get(key))})"
    return None


def _short(value) -> str:
    if isinstance(value, dict):  # file hashes: the first 12 hex digits of each
        return "{" + ", ".join(f"{k}: {str(v)[:12]}" for k, v in value.items()) + "}"
    return repr(value)


def read_baseline_run(path: str | Path, setting: dict) -> RunRecord:
    """The baseline run's record at ``path`` (a run folder or its ``metrics.json``), checked against this run.

    ``setting`` is this run's :func:`speed_setting`. Raises ConfigError naming the first difference, or
    when the file is missing, is not a valid record or is not a baseline's.
    """
    file = Path(path)
    file = file / RECORD_NAME if file.is_dir() else file
    if not file.is_file():
        raise ConfigError(f"speedup_baseline_run={str(path)!r}: no metrics.json there")
    try:
        record = read_record(file)
    except RecordError as exc:
        raise ConfigError(f"speedup_baseline_run={str(path)!r}: {exc}") from None
    if not settings_from_record(record).baseline:
        raise ConfigError(f"speedup_baseline_run={str(path)!r} is a {record.decoding} run, not a baseline (AR) run")
    difference = first_difference(setting, record_setting(record))
    if difference is not None:
        raise ConfigError(f"speedup_baseline_run={str(path)!r} differs from this run in {difference}")
    if record.latency_s_per_image is None or record.latency_s_per_image <= 0:
        raise ConfigError(f"speedup_baseline_run={str(path)!r} records latency {record.latency_s_per_image!r}")
    return record


def recorded_speedup(record: RunRecord, path: str | Path, latency_s_per_image: float | None) -> dict:
    """The record entries of a speed-up against the checked baseline ``record`` read from ``path``.

    ``latency_s_per_image`` is None when this process decoded no image (all were finished before).
    """
    described = (
        f"{record.decoding} run {path} (commit {str(record.environment.get('commit'))[:7]}, "
        f"{record.environment.get('device_name')}), same setting and machine"
    )
    if latency_s_per_image is None:
        return {"baseline_latency_s_per_image": record.latency_s_per_image, "speedup_baseline": described}
    return {
        "speedup": record.latency_s_per_image / latency_s_per_image,
        "baseline_latency_s_per_image": record.latency_s_per_image,
        "speedup_baseline": described,
    }
