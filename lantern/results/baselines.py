"""Speed-up against a named baseline run: a finished run's record on the same machine and setting.

The default is the AR baseline interleaved in the same run (``GenerationJob(baseline=...)``). With
``speedup_baseline_run=PATH`` a job instead divides the latency recorded in ``PATH/metrics.json`` by
its own, after checking before it generates anything that both runs share the setting (model,
prompts, images, seed, sampling, batch size) and the machine (device and its name).
"""

from __future__ import annotations

from pathlib import Path

from lantern.errors import ConfigError
from lantern.results.record import RECORD_NAME, RecordError, RunRecord, read_record

SETTING_KEYS = ("model", "prompts", "num_images", "batch_size", "seed", "temperature", "top_k", "top_p", "cfg_scale")
MACHINE_KEYS = ("device", "device_name")


def read_baseline_run(path: str | Path, setting: dict, machine: dict) -> RunRecord:
    """The baseline run's record at ``path`` (a run folder or its ``metrics.json``), checked against this run.

    ``setting`` holds this run's :data:`SETTING_KEYS`, ``machine`` its :data:`MACHINE_KEYS`. Raises
    ConfigError naming the first difference, or when the file is missing or is not a valid record.
    """
    file = Path(path)
    file = file / RECORD_NAME if file.is_dir() else file
    if not file.is_file():
        raise ConfigError(f"speedup_baseline_run={str(path)!r}: no metrics.json there")
    try:
        record = read_record(file)
    except RecordError as exc:
        raise ConfigError(f"speedup_baseline_run={str(path)!r}: {exc}") from None
    for key in SETTING_KEYS:
        if record.get(key) != setting[key]:
            raise ConfigError(
                f"speedup_baseline_run={str(path)!r} has {key}={record.get(key)!r}, this run {key}={setting[key]!r}"
            )
    for key in MACHINE_KEYS:
        if record.environment.get(key) != machine[key]:
            raise ConfigError(
                f"speedup_baseline_run={str(path)!r} ran on {key}={record.environment.get(key)!r}, this run on {machine[key]!r}"
            )
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
