"""Checks of user-given values, with one message style: ``NAME=VALUE: expected WHAT IS ALLOWED``.

Each check returns the value in the type its callers use (an integral float from the command line
becomes an int, a path a :class:`~pathlib.Path`) or raises :class:`~lantern.errors.ConfigError`, which
the entry points print as one ``error:`` line. ``note`` adds what the value means, in parentheses:
``error: top_p=1.5: expected a number in (0, 1] (1 = off)``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

from lantern.errors import ConfigError


def shown(value, limit: int = 60) -> str:
    """A value as the message shows it: ``true``/``false``/``null`` as on the command line, else its repr
    (cut at ``limit`` characters)."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif value is None:
        text = "null"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse(name: str, value, expected: str, note: str = "", nullable: bool = False) -> ConfigError:
    """The error for ``name=value`` (raise it): ``NAME=VALUE: expected EXPECTED[ or null] (NOTE)``."""
    text = f"{name}={shown(value)}: expected {expected}" + (" or null" if nullable else "")
    return ConfigError(text + (f" ({note})" if note else ""))


def is_number(value) -> bool:
    """An int or float, not a bool (YAML and Hydra give ``true`` as a bool, which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def _inside(value: float, low, high, low_open: bool, high_open: bool) -> bool:
    if low is not None and (value <= low if low_open else value < low):
        return False
    return not (high is not None and (value >= high if high_open else value > high))


def integer(
    name: str, value, low: int | None = None, high: int | None = None, note: str = "", nullable: bool = False
) -> int:
    """``value`` as an int within [low, high]; an integral float (``5.0`` from the command line) is accepted."""
    ok = is_number(value) and math.isfinite(value) and float(value).is_integer()
    if not ok or not _inside(value, low, high, False, False):
        raise refuse(name, value, "an integer" + _bounds(low, high, False, False), note, nullable)
    return int(value)


def capped(name: str, value, low: int, high: int | None, note: str = "", nullable: bool = False) -> int:
    """:func:`integer` >= ``low`` (its message), then <= ``high``: the upper bound of a value that sets work or
    memory, named with both bounds."""
    value = integer(name, value, low, note=note, nullable=nullable)
    if high is not None and value > high:
        raise refuse(name, value, f"an integer in [{low}, {high}]", note, nullable)
    return value


def real(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    note: str = "",
    nullable: bool = False,
) -> float:
    """``value`` as a finite float within the bounds (``low_open``/``high_open``: the bound itself is excluded)."""
    if not (is_number(value) and math.isfinite(value)) or not _inside(value, low, high, low_open, high_open):
        kind = "a finite number" if low is None or high is None else "a number"
        raise refuse(name, value, kind + _bounds(low, high, low_open, high_open), note, nullable)
    return float(value)


def probability(name: str, value, zero: bool = True, one: bool = True, note: str = "", nullable: bool = False) -> float:
    """``value`` as a float in [0, 1]; ``zero``/``one``: whether that end is allowed."""
    return real(name, value, 0, 1, low_open=not zero, high_open=not one, note=note, nullable=nullable)


def choice(name: str, value, allowed: Iterable[str], note: str = "", nullable: bool = False) -> str:
    """``value`` if it is one of ``allowed`` (compared as given: ``1`` is not ``"1"``)."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise refuse(name, value, "one of " + ", ".join(allowed), note, nullable)
    return value


def flag(name: str, value, note: str = "") -> bool:
    """``value`` if it is a bool."""
    if not isinstance(value, bool):
        raise refuse(name, value, "true or false", note)
    return value


def optional(check, name: str, value, *args, **kwargs):
    """``None`` for ``None``, else ``check(name, value, ...)``, whose message then says ``or null``."""
    return None if value is None else check(name, value, *args, nullable=True, **kwargs)


def path(name: str, value, kind: str = "file", note: str = "") -> Path:
    """``value`` as a Path to an existing ``kind`` (``file`` or ``folder``)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise refuse(name, value, f"the path of a {kind}", note)
    found = Path(value)
    if not (found.is_file() if kind == "file" else found.is_dir()):
        there = "is a folder" if found.is_dir() else "is a file" if found.exists() else "does not exist"
        raise ConfigError(
            f"{name}={shown(os.fspath(value), 400)}: expected an existing {kind} (it {there})"
            + (f" ({note})" if note else "")
        )
    return found


def code_grid(codes, size: int):
    """Image codes (B, N) in raster order (N a perfect square) or (B, h, w) as a (B, h, w) grid, every id in
    ``[0, size)``; a ConfigError naming what is wrong otherwise (one device sync for the range)."""
    import torch  # a ground module: torch is imported only where a tensor is checked

    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ConfigError(f"codes must be an integer tensor, got {codes.dtype}")
    if codes.ndim == 2:
        side = math.isqrt(codes.shape[1])
        if side * side != codes.shape[1]:
            raise ConfigError(f"{codes.shape[1]} codes per image is not a perfect square; pass (B, h, w) codes")
        codes = codes.reshape(codes.shape[0], side, side)
    elif codes.ndim != 3:
        raise ConfigError(f"codes must be shaped (B, N) or (B, h, w), got {tuple(codes.shape)}")
    if codes.numel():
        lo, hi = codes.aminmax()
        if int(lo) < 0 or int(hi) >= size:
            raise ConfigError(f"code ids must lie in [0, {size}), got range [{int(lo)}, {int(hi)}]")
    return codes.long()
