"""The run record (``metrics.json``): one typed, versioned schema, built in one place, validated when read.

A record is built only by :func:`build_record` (from the generation job's results) and read only by
:func:`read_record`, which checks every typed field (numbers are numbers, not strings; lists are
lists) and the ``schema_version``. Baselines and tables read records through :class:`RunRecord`.
Decoder- and metric-specific entries (``candidates`` settings, ``acceptance_histogram``,
``prompt_accuracy``, ...) are kept as extra top-level keys beside the typed ones; the file stays flat.

Versions: 1 is the first versioned record; 2 adds the decoder's typed ``settings`` (what tables label
rows and join runs by, :mod:`lantern.decoding.api`) and the weights' ``dtype``. Records written before
versioning carry no ``schema_version``; they are read as version 0 when their typed fields validate
(they lack the timing spread, ``world_size`` and ``timing`` entries, which then read as absent).
Records of versions 0 and 1 carry no ``settings``: tables label them from their flat entries and never
join them with another run. Version 3 adds the evaluation protocol (``protocol``, ``protocol_sha256``,
``protocol_subset``, ``protocol_inputs``; :mod:`lantern.metrics.protocol`) and the intervals of quality
figures: ``{name}_ci`` beside ``{name}`` (:mod:`lantern.metrics.intervals`), checked here wherever they appear.
Version 4 requires ``settings`` and checks it against its decoder's settings class when read
(:attr:`RunRecord.decoder_settings`); the flat copies of a decoder's knobs (``acceptance``, ``draft``,
``candidates``, ``semantics``, ``k``, ``delta``, ``lambda``) are no longer typed columns nor written: they
live in ``settings`` alone. Older records keep them as extra entries, which tables read when a record has no
``settings``.
Version 5 adds the reference-grade AR beside the engine-grade one (:mod:`lantern.run.bench.baselines`):
``speedup_reference`` with its median, interquartile range, the reference's latency and what it was
(``speedup_reference_baseline``), ``reference_greedy_check`` (greedy: its images against ours) and
``baseline_cost_s`` (what timing each baseline cost outside the decoder's steps). ``speedup`` stays the
speed-up over the engine-grade AR (ours, compiled like the decoder), as in every earlier version; a record
of an older version reads with these fields absent.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from lantern.decoding.api import DecoderSettings, settings_from_json, settings_from_record
from lantern.errors import LanternError
from lantern.files import write_json_atomic

SCHEMA_VERSION = 5
KNOWN_VERSIONS = (0, 1, 2, 3, 4, 5)
SETTINGS_REQUIRED = 4  # the first version whose records must carry the decoder's typed settings
LOSSY_UNMEASURED = "lossy, TV not measured"  # the record's and tables' words for a lossy run without a TV
RECORD_NAME = "metrics.json"
CI_SUFFIX = "_ci"  # a figure's interval entry (lantern.metrics.intervals writes them; wings do not import each other)


class RecordError(LanternError):
    """A run record is missing, unreadable, malformed or of an unknown schema version."""


class RunRecord(BaseModel):
    """One finished run. Typed fields are checked strictly (no string numbers); others ride along as extras."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)

    schema_version: int = 0
    # What ran: the decoder's name, how its steps ran, and its typed settings (lantern.decoding.api): every
    # knob (draft, rule, k, delta...) is there, checked against the settings class when the record is read.
    decoding: str
    compile: str | None = None  # torch.compile mode of the decoders, where they were compiled
    settings: dict[str, Any] | None = None  # version 2 on; required from version 4
    # The setting: what makes two runs' images and latencies comparable (with the machine).
    model: str
    prompts: str
    num_images: int
    batch_size: int
    seed: int
    temperature: float
    top_k: int
    top_p: float
    cfg_scale: float
    cfg_interval: float | None = None
    dtype: str | None = None  # the target's weights
    inputs: dict[str, dict[str, Any]] | None = None  # every file read: path -> role, sha256, bytes
    tokens_per_image: int | None = None
    # Timing (of the images decoded by the last process; ``timing`` says how many that was).
    latency_s_per_image: float | None = None
    latency_s_median: float | None = None
    latency_s_iqr: list[float] | None = None  # [q1, q3] of per-image latency over batches
    tokens_per_s: float | None = None
    peak_memory_mb: float | None = None
    phase_times: dict[str, Any] | None = None  # seconds per decode phase (prefill, draft, verify, ...), where measured
    timing: dict[str, Any] | None = None
    world_size: int = 1
    ranks: list[dict[str, Any]] | None = None  # per rank: images, decode and wall seconds
    # Speed-up against AR, and the AR time behind it.
    speedup: float | None = None
    speedup_baseline: str | None = None
    baseline_latency_s_per_image: float | None = None
    compared_latency_s_per_image: float | None = None
    speedup_median: float | None = None
    speedup_iqr: list[float] | None = None  # [q1, q3] of the per-batch speed-up
    # Version 5: the speed-up over the reference-grade AR (the papers' loop, eager), timed on the same batches.
    speedup_reference: float | None = None
    speedup_reference_baseline: str | None = None
    reference_latency_s_per_image: float | None = None
    speedup_reference_median: float | None = None
    speedup_reference_iqr: list[float] | None = None
    reference_greedy_check: dict[str, Any] | None = None  # greedy: its images against ours ("checked", "equal", ...)
    baseline_cost_s: dict[str, dict[str, float]] | None = None  # per baseline: setup, warm-up and timed seconds
    # Acceptance and quality.
    mean_accepted_length: float = 1.0
    # Whether the decoder's rule draws every token from the target's law (DecoderSettings.lossless); None:
    # a record written before the field existed.
    lossless: bool | None = None
    tv_realised_note: str | None = None  # "lossy, TV not measured" where a lossy decoder measures no TV
    tv_realised_mean: float | None = None
    tv_realised_max: float | None = None
    fid: float | None = None
    clip_score: float | None = None
    fid_ci: dict[str, Any] | None = None  # {"lo", "hi", "level", "resamples", "seed", "method"} (version 3 on)
    clip_score_ci: dict[str, Any] | None = None
    # The evaluation protocol (version 3 on; null: none was chosen).
    protocol: str | None = None
    protocol_sha256: str | None = None
    protocol_subset: bool | None = None  # fewer images than the protocol's prompts (its first N, in order)
    protocol_part: str | None = None  # "quality" or "speed" (the timing sub-protocol)
    protocol_inputs: dict[str, str] | None = None  # sha256 of what the protocol pins: prompts, weights, reference
    # Details.
    decode_stats: dict[str, float] = Field(default_factory=dict)
    per_image: list[dict[str, Any]] = Field(default_factory=list)
    per_batch: list[dict[str, Any]] | None = None
    environment: dict[str, Any]
    config: dict[str, Any] = Field(default_factory=dict)

    _source: Path | None = PrivateAttr(default=None)
    _settings: DecoderSettings | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _meaningful(self) -> RunRecord:
        """Values a run can produce: a record that passes the types but not this (``num_images=-5``, a NaN or
        negative latency, tau < 1, a TV outside [0, 1]) was edited or corrupted, and no table may show it."""
        for name in ("num_images", "batch_size", "world_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected an integer >= 1")
        positive = (
            "latency_s_per_image",
            "latency_s_median",
            "tokens_per_s",
            "speedup",
            "speedup_median",
            "baseline_latency_s_per_image",
            "compared_latency_s_per_image",
            "speedup_reference",
            "speedup_reference_median",
            "reference_latency_s_per_image",
        )
        for name in positive:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value}: expected a finite number > 0 or null")
        for name in ("latency_s_iqr", "speedup_iqr", "speedup_reference_iqr"):
            pair = getattr(self, name)
            if pair is not None and (len(pair) != 2 or not all(math.isfinite(v) and v > 0 for v in pair)):
                raise ValueError(f"{name}={pair}: expected [q1, q3] of finite numbers > 0 or null")
        if not (math.isfinite(self.mean_accepted_length) and self.mean_accepted_length >= 1):
            raise ValueError(f"mean_accepted_length={self.mean_accepted_length}: expected a finite number >= 1")
        self._settings = self._typed_settings()
        for name in ("tv_realised_mean", "tv_realised_max"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and -1e-6 <= value <= 1 + 1e-6):
                raise ValueError(f"{name}={value}: expected a number in [0, 1] or null")
        for name in ("fid", "clip_score"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name}={value}: expected a finite number or null")
        for name, interval in self.intervals().items():
            _check_interval(name, interval, self.get(name[: -len(CI_SUFFIX)]))
        return self

    def _typed_settings(self) -> DecoderSettings | None:
        """``settings`` as its decoder's settings object (checked field by field), None when absent."""
        if self.settings is None:
            if self.schema_version >= SETTINGS_REQUIRED:
                raise ValueError(f"settings: required from schema version {SETTINGS_REQUIRED} (the decoder's settings)")
            return None
        typed = settings_from_json(self.settings)  # a ValueError names the bad field
        delta = typed.columns().get("delta")
        if delta is not None and not (math.isfinite(delta) and 0 <= delta <= 1):
            raise ValueError(f"settings delta={delta}: expected a number in [0, 1] or null")
        return typed

    @property
    def decoder_settings(self) -> DecoderSettings:
        """The decoder's typed settings: those stored (validated when the record was read), or for a record
        without them (versions 0 and 1) what its flat entries say (:func:`settings_from_record`)."""
        return self._settings if self._settings is not None else settings_from_record(self)

    def intervals(self) -> dict[str, Any]:
        """Every ``{name}_ci`` entry, typed or extra (null ones left out)."""
        entries = {name: getattr(self, name) for name in type(self).model_fields if name.endswith(CI_SUFFIX)}
        entries.update({k: v for k, v in (self.model_extra or {}).items() if k.endswith(CI_SUFFIX)})
        return {k: v for k, v in entries.items() if v is not None}

    @property
    def source(self) -> Path | None:
        """The ``metrics.json`` this record was read from (None for a record built in this process)."""
        return self._source

    @property
    def run_dir(self) -> str:
        return str(self._source.parent) if self._source is not None else ""

    def get(self, key: str, default=None):
        """A typed field or an extra entry by its JSON name (``acceptance_histogram``, an older record's ``delta``...)."""
        if key in type(self).model_fields:
            return getattr(self, key)
        return (self.model_extra or {}).get(key, default)

    def to_json(self) -> dict:
        """The flat JSON object written to ``metrics.json``."""
        return self.model_dump(by_alias=True, mode="json")


def _check_interval(name: str, interval, value) -> None:
    """An interval entry: a dict with finite ``lo <= hi``, a level in (0, 1), resamples >= 2, beside its figure."""
    if not isinstance(interval, dict):
        raise ValueError(f"{name}={interval!r}: expected an object with lo, hi, level, resamples, seed, method")
    missing = [key for key in ("lo", "hi", "level", "resamples", "seed", "method") if key not in interval]
    if missing:
        raise ValueError(f"{name} has no {missing[0]!r}")
    lo, hi, level, resamples = (interval[key] for key in ("lo", "hi", "level", "resamples"))
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi, level, resamples))
    if not numbers or not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"{name}=[{lo}, {hi}]: expected finite numbers lo <= hi")
    if not 0 < level < 1 or resamples < 2:
        raise ValueError(f"{name}: level {level} / resamples {resamples}: expected a level in (0, 1), resamples >= 2")
    if value is None:
        raise ValueError(f"{name} has no figure {name[: -len(CI_SUFFIX)]!r} beside it")


def build_record(fields: dict) -> RunRecord:
    """The one constructor of records: validate ``fields`` (typed entries plus extras) as the current version."""
    try:
        return RunRecord.model_validate({**fields, "schema_version": SCHEMA_VERSION})
    except ValidationError as exc:  # a bug in the job, not user input: keep the traceback
        raise ValueError(f"the run record does not match its schema: {_first_problem(exc)}") from exc


def write_record(record: RunRecord, run_dir: str | os.PathLike) -> Path:
    """Write ``record`` as ``run_dir/metrics.json`` atomically."""
    return write_json_atomic(Path(run_dir) / RECORD_NAME, record.to_json())


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    if not error["loc"] and error["type"] == "value_error":  # a meaning check (RunRecord._meaningful)
        return str(error.get("ctx", {}).get("error", error["msg"]))
    field = ".".join(str(part) for part in error["loc"]) or "(top level)"
    shown = repr(error.get("input"))
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"field {field!r}: {error['msg'].lower()} (got {shown})"


def read_record(path: str | os.PathLike) -> RunRecord:
    """The record at ``path`` (a run folder or its ``metrics.json``), validated.

    Raises :class:`RecordError` with one line naming the file and the first bad field.
    """
    file = Path(path)
    file = file / RECORD_NAME if file.is_dir() else file
    try:
        payload = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{str(file)!r}: no run record there") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"{str(file)!r} is not readable JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(payload, dict):
        raise RecordError(f"{str(file)!r} is not a run record: a JSON object is expected, not {type(payload).__name__}")
    version = payload.get("schema_version", 0)
    if isinstance(version, bool) or version not in KNOWN_VERSIONS:
        raise RecordError(
            f"{str(file)!r} has schema_version={version!r}; this lantern reads versions "
            f"{', '.join(map(str, KNOWN_VERSIONS))} (a newer lantern wrote it?)"
        )
    try:
        record = RunRecord.model_validate(payload)
    except ValidationError as exc:
        raise RecordError(f"{str(file)!r} is not a valid run record: {_first_problem(exc)}") from None
    record._source = file
    return record


def json_schema() -> dict:
    """The JSON Schema of the current record version (what ``docs/run_record.schema.json`` holds)."""
    schema = RunRecord.model_json_schema(by_alias=True)
    schema["$id"] = f"lantern-run-record-v{SCHEMA_VERSION}"
    return schema
