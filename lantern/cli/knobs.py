"""Decoder knobs on the command line: a knob that one decoder defines, given to a run of another.

Each ``conf/decoding/<name>.yaml`` defines its own top-level knobs (LANTERN's ``k`` and ``delta``, LANTERN++'s
``lambda``, SJD's ``window``, ...) and no decoder carries another's. A sweep across decoders may still set one
for all of them (``python run.py -m decoding=ar,eagle,lantern delta=0.2``): :func:`forced` writes such an
override ``++delta=0.2`` (set where the decoder defines it, added where it does not) so that every job
composes; then each job whose decoder does not define the knob leaves it out (:func:`drop_foreign`), says so on
stderr and keeps it in its record's config as ``dropped_overrides``. A knob the chosen decoder defines is
used as always, and a bad value is bad input whichever decoder runs (:mod:`lantern.cli.preflight`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from omegaconf import DictConfig, OmegaConf, open_dict

from lantern import REPO_ROOT

CONF = REPO_ROOT / "conf"
FORCED = "++"


@cache
def decoder_knobs() -> dict[str, frozenset[str]]:
    """Each decoder's own top-level knobs (decoder name -> keys), read from ``conf/decoding/*.yaml``."""
    return {
        path.stem: frozenset(OmegaConf.load(path)) - {"defaults", "decoding"}
        for path in sorted((CONF / "decoding").glob("*.yaml"))
    }


@cache
def _shared_knobs() -> frozenset[str]:
    """Knobs some decoder defines that the run config itself does not (those :func:`forced` rewrites)."""
    every = frozenset().union(*decoder_knobs().values())
    return every - frozenset(OmegaConf.load(CONF / "config.yaml"))


def forced(argv: Sequence[str]) -> list[str]:
    """``argv`` with each plain ``KNOB=VALUE`` (or a sweep ``KNOB=V1,V2``) of a decoder knob written
    ``++KNOB=VALUE``, so Hydra composes it for a decoder that lacks the knob too."""
    out = []
    for arg in argv:
        key, sep, _ = arg.partition("=")
        out.append(f"{FORCED}{arg}" if sep and key in _shared_knobs() else arg)
    return out


def drop_foreign(cfg: DictConfig, overrides: Sequence[str], decoder: str | None) -> dict[str, str]:
    """Remove from ``cfg`` every knob a :func:`forced` override added that ``decoder`` does not define;
    returns them (key -> its override as given, ``delta=0.2``), which the caller records."""
    own = decoder_knobs().get(decoder or "", frozenset())
    dropped = {}
    for override in overrides:
        if not override.startswith(FORCED):
            continue
        key = override[len(FORCED) :].partition("=")[0]
        if key in _shared_knobs() and key not in own and key in cfg:
            with open_dict(cfg):
                del cfg[key]
            dropped[key] = override[len(FORCED) :]
    return dropped
