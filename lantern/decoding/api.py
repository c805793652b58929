"""What every decoder is: the protocol a job drives, the result it returns, and its typed settings.

A decoder describes itself with a small frozen :class:`DecoderSettings` object. Records store it
(``settings`` in ``metrics.json``, with its ``kind`` and defining ``module``), and tables rebuild it to
label a row, order rows and find which runs share a method (:func:`settings_from_record`); so adding a
decoder means adding its settings class, never editing table code.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from pydantic import TypeAdapter, ValidationError

from lantern.decoding.stats import DecodeStats
from lantern.models.condition import Condition


@dataclass
class DecodeResult:
    """Image token codes (B, N) in raster order, per-batch counters (e.g. target forwards, phase times)
    and the per-image statistics (:class:`~lantern.decoding.stats.DecodeStats`)."""

    codes: torch.Tensor
    stats: dict[str, float]
    per_sample: DecodeStats


class Decoder(Protocol):
    """What the generation job and the benchmarks drive."""

    name: str
    sampling: Any  # lantern.models.sampling.SamplingConfig

    @property
    def settings(self) -> DecoderSettings: ...

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder runs on ``device`` as configured (before any work)."""
        ...

    def generate(self, model, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """All image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        ...


SETTINGS: dict[str, type[DecoderSettings]] = {}
LOSSLESS_ACCEPTANCE = ("exact", "greedy")  # the rules that test drafts against the target's law exactly


def register(cls: type[DecoderSettings]) -> type[DecoderSettings]:
    """Class decorator: make a settings class known to :func:`settings_from_record` by its ``kind``."""
    SETTINGS[cls.kind] = cls
    return cls


@dataclass(frozen=True)
class DecoderSettings:
    """A decoder's identity: ``name`` (the record's ``decoding``), ``label`` (its name in tables) and how
    its steps run (``compile``). Subclasses add their knobs as fields and say how a table shows them."""

    kind: ClassVar[str] = "decoder"
    baseline: ClassVar[bool] = False  # plain AR: what speed-ups are measured against

    name: str
    label: str
    compile: str = "none"

    def method(self) -> str:
        """The table row's method: the label and what tells this setting apart."""
        return self.label

    def order(self) -> tuple:
        """Where the row sits in a table (baselines first, then families as their classes say)."""
        return (0 if self.baseline else 9, self.method())

    def draft_kind(self) -> str | None:
        """How the rows' drafts are drawn (``deterministic``: the drafter's top candidates, ``sampled``: draws
        from it), for decoders that draft with a drafter; None otherwise."""
        return None

    def lossless(self) -> bool:
        """Whether every token is drawn from the target's own law (the record's ``lossless``): plain AR, or a
        rule that is an exact test (``acceptance`` exact or greedy in :meth:`record`). Relaxed rules (LANTERN,
        LANTERN++, GSD, SJD++) and decoders without a rule (ZipAR) are lossy; a subclass that commits tokens
        no rule tested (VVS's skips) says so. A window-test scheme other than ``token`` (SJD-SV's ``sv``,
        :mod:`lantern.rules.window`) makes an exact rule lossy except when greedy. Tests hold every ``True`` to
        the PIT test (tests/test_lossless.py)."""
        record = self.record()
        per_token = record.get("window_test") in (None, "token") or record.get("acceptance") == "greedy"
        return self.baseline or (record.get("acceptance") in LOSSLESS_ACCEPTANCE and per_token)

    def columns(self) -> dict:
        """Values of the table's own columns this decoder fills (``delta``: LANTERN's promise)."""
        return {}

    def record(self) -> dict:
        """The flat entries that describe this decoder (``decoding``, ``compile`` and its knobs), as records
        before version 4 carried them and benchmark rows still show them."""
        return {"decoding": self.name, "compile": self.compile}

    def to_json(self) -> dict:
        """JSON of the settings with their ``kind`` and ``module`` (where the class is defined)."""
        return {"kind": self.kind, "module": type(self).__module__, **dataclasses.asdict(self)}


@register
@dataclass(frozen=True)
class UnknownSettings(DecoderSettings):
    """Settings of a record whose decoder class is not known here (an older record): its flat entries."""

    kind: ClassVar[str] = "unknown"
    entries: dict = field(default_factory=dict)

    def method(self) -> str:
        shown = [f"{key}={value}" for key, value in self.entries.items() if value is not None]
        return f"{self.label}" + (f" ({', '.join(shown)})" if shown else "")


def settings_from_json(data: dict) -> DecoderSettings:
    """The settings object a record stored (``to_json``), each field checked against its class's annotation
    (strictly: no string numbers); its class is found by ``kind``, importing the defining ``module`` first
    when it is a lantern module not imported yet. A ValueError names the first bad field."""
    kind, module = data.get("kind"), data.get("module")
    if kind not in SETTINGS and isinstance(module, str) and module.split(".")[0] == "lantern":
        importlib.import_module(module)
    cls = SETTINGS.get(kind)
    if cls is None:
        raise ValueError(f"unknown decoder settings kind {kind!r} (module {module!r})")
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {key: value for key, value in data.items() if key in names}
    try:
        return _adapter(cls).validate_json(json.dumps(fields), strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        raise ValueError(f"{kind} settings, field {where!r}: {error['msg'].lower()}") from None


@functools.cache
def _adapter(cls: type[DecoderSettings]) -> TypeAdapter:
    return TypeAdapter(cls)


# Flat record entries an older record (without ``settings``) may carry about its decoder.
LEGACY_KEYS = ("draft", "candidates", "acceptance", "semantics", "k", "delta", "lambda", "window", "init")


def settings_from_record(record) -> DecoderSettings:
    """The settings of a run record (a :class:`~lantern.results.record.RunRecord` or its JSON dict)."""
    get = record.get
    stored = get("settings")
    if stored:
        return settings_from_json(stored)
    entries = {key: get(key) for key in LEGACY_KEYS}
    return UnknownSettings(name=str(get("decoding")), label=str(get("decoding")).upper(), entries=entries)
