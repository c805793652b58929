"""User-facing error types.

Every error a user can cause by bad input (config values, paths, files) is raised as a
:class:`LanternError` subclass with a one-line message that names the bad value and what is
allowed. The entry point prints that line and exits non-zero; anything else is a bug.
"""


class LanternError(Exception):
    """Base class of errors caused by user input; the message is shown as-is."""


class ConfigError(LanternError):
    """A configuration value is out of range or inconsistent."""


class CheckpointError(LanternError):
    """A checkpoint file is missing, unreadable, or does not match the expected architecture."""


def user_message(exc: BaseException) -> str | None:
    """The one-line message for a user error anywhere in ``exc``'s cause chain, else ``None``.

    Hydra wraps errors raised while instantiating configs; OmegaConf raises on missing mandatory
    values (``???``). Both are unwrapped to the user's own mistake.
    """
    from omegaconf.errors import MissingMandatoryValue

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, LanternError):
            return str(exc)
        if isinstance(exc, MissingMandatoryValue):
            key = getattr(exc, "full_key", None) or str(exc).splitlines()[0]
            return f"{key} is required: set it on the command line, e.g. {key}=PATH"
        exc = exc.__cause__ or exc.__context__
    return None
