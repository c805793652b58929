"""User-facing error types.

Every error a user can cause by bad input (config values, paths, files) is raised as a
:class:`LanternError` subclass with a one-line message that names the bad value and what is
allowed. The entry point prints that line and exits non-zero; anything else is a bug.
A file-system fault the user must fix (a full disk, a read-only or forbidden folder) is reported
the same way.
"""

import errno
import re


class LanternError(Exception):
    """Base class of errors caused by user input; the message is shown as-is."""


class ConfigError(LanternError):
    """A configuration value is out of range or inconsistent."""


class CheckpointError(LanternError):
    """A checkpoint file is missing, unreadable, or does not match the expected architecture."""


# File-system faults that are the user's to fix, not bugs: no space, no permission, a read-only
# file system, a file over the size limit, a path of the wrong kind (a file where a folder is needed).
FAULT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EFBIG,
        errno.ENOTDIR,
        errno.EEXIST,
        errno.EISDIR,
    }
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_MESSAGE = 400


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as one printable line: ANSI codes dropped, line breaks joined with "; ", at most ``limit`` chars."""
    text = _ANSI.sub("", str(text))
    text = "; ".join(part.strip() for part in text.splitlines() if part.strip())
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fault_message(exc: BaseException) -> str | None:
    """One line for a file-system fault (:data:`FAULT_ERRNOS`) naming the file, else ``None``."""
    if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:
        reason = exc.strerror or errno.errorcode.get(exc.errno, "file-system error")
        where = f": {str(exc.filename)!r}" if exc.filename else ""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            hint = "free some space or write elsewhere (hydra.run.dir=DIR)"
        elif exc.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
            hint = "a file stands where a folder is needed, or the other way round; choose another path"
        else:
            hint = "check its permissions or write elsewhere (hydra.run.dir=DIR)"
        return f"{reason}{where}; {hint}"
    return None


def user_message(exc: BaseException) -> str | None:
    """The one-line message for a user error anywhere in ``exc``'s cause chain, else ``None``.

    Hydra wraps errors raised while instantiating configs; OmegaConf raises on missing mandatory
    values (``???``). Both are unwrapped to the user's own mistake. File-system faults
    (:func:`fault_message`) count as user errors.
    """
    from omegaconf.errors import MissingMandatoryValue

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, LanternError):
            return one_line(str(exc))
        if isinstance(exc, MissingMandatoryValue):
            key = getattr(exc, "full_key", None) or str(exc).splitlines()[0]
            return one_line(f"{key} is required: set it on the command line, e.g. {key}=PATH")
        fault = fault_message(exc)
        if fault is not None:
            return one_line(fault)
        exc = exc.__cause__ or exc.__context__
    return None
