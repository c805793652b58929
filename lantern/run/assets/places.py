"""Where registry entries may point, checked once when the registry is read (one ``error:`` line each).

* ``dest`` (an asset's place under ``paths.assets``) and every file name inside a hub repo or a folder asset: a
  relative path of plain parts, no ``..``, no absolute path, no drive, no backslash. :func:`inside` then
  resolves a place under a root and refuses one that leaves it through a link.
* ``revision``: a branch or tag name (git's ref-name rules, the ones a path could abuse) or a 40-hex commit.
* pins: ``size``, ``sha256``, ``md5``, ``sha256_prefix``, and which of them were verified against a published
  source (``verified: true``, ``false`` or a list of pin names). A verified pin that a file contradicts is a
  refusal; an unverified one a warning (:mod:`lantern.run.assets.pins`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from lantern import checks
from lantern.errors import ConfigError

HEX = set("0123456789abcdef")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A branch or tag: path-like parts of safe characters (git check-ref-format's rules that matter here).
REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._\-]*(/[A-Za-z0-9_][A-Za-z0-9._\-]*)*$")
PIN_KEYS = ("size", "sha256", "md5", "sha256_prefix")
DIGEST_LENGTHS = {"sha256": 64, "md5": 32}


def is_commit(revision: str) -> bool:
    """A full 40-hex commit hash (what a pin or a lock entry holds)."""
    return bool(COMMIT.match(revision))


def check_revision(where: str, revision) -> str:
    """``revision`` when it is a branch, tag or 40-hex commit; ConfigError otherwise."""
    text = str(revision)
    bad = not REF.match(text) or ".." in text or text.endswith((".lock", ".")) or "@{" in text
    if bad and not is_commit(text):
        raise ConfigError(f"{where}: revision={checks.shown(revision)}: expected a branch, tag or 40-hex commit")
    return text


def check_relative(where: str, key: str, value) -> str:
    """``value`` as a relative POSIX path of plain parts (no ``..``, not absolute); ConfigError otherwise."""
    text = str(value)
    parts = PurePosixPath(text).parts
    absolute = text.startswith(("/", "\\")) or bool(re.match(r"^[A-Za-z]:", text))
    if not text or absolute or "\\" in text or any(p in ("..", ".") for p in parts) or "\0" in text:
        raise ConfigError(
            f"{where}: {key}={checks.shown(value)}: expected a relative path inside paths.assets "
            "(no '..', not absolute)"
        )
    return str(PurePosixPath(*parts))


def inside(root: str | os.PathLike, relative: str, what: str) -> Path:
    """``root / relative``, refused (ConfigError) when it resolves outside ``root`` (through a link on the way)."""
    base = Path(root).resolve()
    target = (Path(root) / relative).resolve()
    if target != base and base not in target.parents:
        raise ConfigError(f"{what}: {relative!r} resolves to {str(target)!r}, outside {str(base)!r}; refused")
    return Path(root) / relative


def _digest(where: str, key: str, value) -> str | None:
    if value is None:
        return None
    text = str(value).lower()
    length = DIGEST_LENGTHS.get(key)
    if not text or not set(text) <= HEX or (length is not None and len(text) != length):
        expected = f"{length} hex digits" if length else "hex digits"
        raise ConfigError(f"{where}: {key}={checks.shown(value)}: expected {expected} or null")
    return text


def pins_of(where: str, entry: dict) -> dict:
    """The pins of a registry entry or of one file of it: ``{size, sha256, md5, sha256_prefix, verified}``,
    ``verified`` as the set of pin names checked against a published source."""
    size = entry.get("size")
    pins = {
        "size": None if size is None else checks.integer(f"{where}: size", size, 0),
        **{key: _digest(where, key, entry.get(key)) for key in ("sha256", "md5", "sha256_prefix")},
    }
    verified = entry.get("verified", False)
    if isinstance(verified, bool):
        names = {k for k in PIN_KEYS if pins[k] is not None} if verified else set()
    elif isinstance(verified, (list, tuple)) and all(v in PIN_KEYS for v in verified):
        names = set(verified)
    else:
        raise ConfigError(f"{where}: verified={checks.shown(verified)}: expected true, false or a list of {PIN_KEYS}")
    return {**pins, "verified": frozenset(names)}
