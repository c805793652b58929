"""Hydra's command-line errors as one line each: unknown keys, unknown config options, unparsable overrides.

Hydra reports these with several lines (and suggests ``+key=value``, which silently adds a key nobody
reads). Here each becomes one sentence that names the key or option and lists what is allowed.
"""

from __future__ import annotations

from lantern.errors import one_line

MAX_LISTED = 40


def _listing(names) -> str:
    names = sorted(str(n) for n in names if str(n) not in ("_target_", "hydra", "defaults"))
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f", ... ({len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else "")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _unknown_key(exc: BaseException) -> str | None:
    """ "unknown key ..." when an OmegaConf key error in the chain names a missing key of a known node."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    for cause in _chain(exc):
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
            parent = getattr(cause, "parent_node", None)
            full_key = str(cause.full_key)
            where = full_key.rsplit(".", 1)[0] if "." in full_key else None
            keys = list(parent.keys()) if parent is not None and hasattr(parent, "keys") else []
            allowed = f"; the keys of {where} are: {_listing(keys)}" if where else f"; top-level keys: {_listing(keys)}"
            return f"unknown key {full_key!r}{allowed if keys else ''}"
    return None


def hydra_message(exc: BaseException) -> str | None:
    """One line for a Hydra command-line or composition error in ``exc``'s chain, else ``None``."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    for cause in _chain(exc):
        if isinstance(cause, MissingConfigException):
            missing = cause.missing_cfg_file or ""
            if cause.options and "/" in missing:
                group, option = missing.rsplit("/", 1)
                return one_line(f"{group}={option} is not an option; choose one of {_listing(cause.options)}")
            return one_line(str(cause))
        if isinstance(cause, OverrideParseException):
            reason = str(cause.message).strip().splitlines()[0] if str(cause.message).strip() else "syntax error"
            return one_line(
                f"cannot parse the override {cause.override!r}: {reason} "
                "(Hydra's override grammar: key=value, quote values with spaces)"
            )
        if isinstance(cause, ConfigCompositionException):
            return one_line(_unknown_key(cause) or str(cause))
    return None
