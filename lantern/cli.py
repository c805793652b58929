"""Shared behaviour of the command-line entry points."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from lantern.errors import user_message

T = TypeVar("T")


def run_or_exit(task: Callable[[], T], out_dir: str | Path | None = None) -> T:
    """Run ``task``; on a user error print ``error: <one line>`` to stderr and exit with status 2.

    ``out_dir``, when given, is removed if the failed task left it empty, so bad input writes nothing.
    Any other exception is a bug and propagates with its traceback.
    """
    try:
        return task()
    except Exception as exc:
        message = user_message(exc)
        if message is None:
            raise
        if out_dir is not None:
            folder = Path(out_dir)
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
