"""The knobs every metric shares, checked by its constructor (which reads nothing), and the metrics' dry twins.

The preflight builds every configured metric through its dry twin (:func:`dry_metric`, ``lantern.run.dry_build``):
the constructor checks each knob with its key, then each path knob that is given must exist. The weights themselves
are loaded by the metric's ``check`` before the first image, or when it is first computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from lantern import checks

MAX_BATCH = 4096  # images per forward of a metric's network: far above what fits any accelerator at 299 px
NAME_MAX = 128


def batch_size(owner: str, value) -> int:
    """``metrics.<owner>.batch_size`` in [1, :data:`MAX_BATCH`]."""
    return checks.capped(f"metrics.{owner}.batch_size", value, 1, MAX_BATCH, note="images per forward")


def name(key: str, value) -> str:
    """A set's or a network's name (a cache key, an open_clip architecture): 1 to 128 printable characters, no
    ``/`` or ``\\``, not starting with ``.``."""
    text = value if isinstance(value, str) else ""
    if not text or len(text) > NAME_MAX or not text.isprintable() or "/" in text or "\\" in text or text[0] == ".":
        raise checks.refuse(
            key, value, f"a name of 1 to {NAME_MAX} printable characters, no / or \\, not starting with '.'"
        )
    return text


def dry_metric(cls, owner: str, files: Iterable[str] = (), folders: Iterable[str] = ()) -> Callable:
    """The dry twin of metric class ``cls`` at ``metrics.<owner>``: its constructor, then each of ``files`` /
    ``folders`` that is given (not null) exists (a stat; nothing is read)."""

    def dry(*args, **knobs):
        metric = cls(*args, **knobs)
        for kind, keys in (("file", files), ("folder", folders)):
            for key in keys:
                if knobs.get(key) is not None:
                    checks.path(f"metrics.{owner}.{key}", knobs[key], kind)
        return metric

    return dry
