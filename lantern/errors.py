"""User-facing error types.

Every error a user can cause by bad input (config values, paths, files) is raised as a
:class:`LanternError` subclass with a one-line message that names the bad value and what is
allowed. The entry point prints that line and exits non-zero; anything else is a bug.
A file-system fault the user must fix (a full disk, a read-only or forbidden folder) is reported
the same way, naming the setting that chooses where the entry point writes (:func:`writes_under`).
"""

import errno
import functools
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
# The setting that chooses where run.py writes; other entry points name theirs with :func:`writes_under`.
DEFAULT_OUTPUT_KNOB = "hydra.run.dir"
_KNOB_ATTRIBUTE = "lantern_output_knob"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_MESSAGE = 400


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as one printable line: ANSI codes dropped, line breaks joined with "; ", at most ``limit`` chars."""
    text = _ANSI.sub("", str(text))
    text = "; ".join(part.strip() for part in text.splitlines() if part.strip())
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def writes_under(knob: str):
    """Decorator: a file-system fault raised by the function (or anywhere in its exception's chain) names
    ``knob`` (``out_dir``, ``--out``) in its hint, as the setting that chooses where to write instead;
    the innermost decorated function wins. Without one the hint names :data:`DEFAULT_OUTPUT_KNOB`."""

    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except BaseException as exc:
                fault = _fault_in(exc)
                if fault is not None and not hasattr(fault, _KNOB_ATTRIBUTE):
                    setattr(fault, _KNOB_ATTRIBUTE, knob)
                raise

        wrapper.output_knob = knob
        return wrapper

    return decorate


def _fault_in(exc: BaseException | None) -> OSError | None:
    """The first file-system fault (:data:`FAULT_ERRNOS`) in ``exc``'s cause chain, else ``None``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def fault_message(exc: BaseException) -> str | None:
    """One line for a file-system fault (:data:`FAULT_ERRNOS`) naming the file and the setting that chooses
    where to write (:func:`writes_under`), else ``None``."""
    if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:
        reason = exc.strerror or errno.errorcode.get(exc.errno, "file-system error")
        where = f": {str(exc.filename)!r}" if exc.filename else ""
        knob = getattr(exc, _KNOB_ATTRIBUTE, DEFAULT_OUTPUT_KNOB)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            hint = f"free some space or write elsewhere ({knob}=DIR)"
        elif exc.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
            hint = "a file stands where a folder is needed, or the other way round; choose another path"
        else:
            hint = f"check its permissions or write elsewhere ({knob}=DIR)"
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
