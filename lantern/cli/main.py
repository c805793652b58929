"""Shared behaviour of the command-line entry points."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from lantern.cli.hydra_errors import hydra_message
from lantern.errors import ConfigError, one_line, user_message
from lantern.files import use_hash_cache_folder

T = TypeVar("T")


class Terminated(BaseException):
    """SIGTERM (what SLURM sends a job before killing it), raised like Ctrl-C's KeyboardInterrupt."""


def _terminate(signum, frame):
    raise Terminated()


def run_or_exit(task: Callable[[], T], out_dir: str | Path | None = None) -> T:
    """Run ``task``; on a user error print ``error: <one line>`` to stderr and exit with status 2.

    ``out_dir``, when given, is removed if the failed task left it empty, so bad input writes nothing.
    Ctrl-C (SIGINT) or SIGTERM print one line and exit with 130 or 143; writers are atomic, so what was
    finished stays and nothing is half-written. Under torchrun only rank 0 prints. Any other exception is
    a bug and propagates with its traceback.
    """
    speaks = os.environ.get("RANK", "0") == "0"  # one line per run, not one per torchrun process
    previous = (
        signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        return task()
    except (KeyboardInterrupt, Terminated) as exc:
        _remove_if_empty(out_dir)
        if speaks:
            where = f"; finished images in {out_dir} are kept, rerun the same command to resume" if out_dir else ""
            print(
                f"interrupted by {'Ctrl-C' if isinstance(exc, KeyboardInterrupt) else 'SIGTERM'}{where}",
                file=sys.stderr,
            )
        sys.exit(130 if isinstance(exc, KeyboardInterrupt) else 143)
    except Exception as exc:
        message = hydra_message(exc) or user_message(exc)
        if message is None:
            raise
        _remove_if_empty(out_dir)
        if speaks:
            print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _remove_if_empty(out_dir: str | Path | None) -> None:
    if out_dir is not None:
        folder = Path(out_dir)
        if folder.is_dir() and not any(folder.iterdir()):
            try:
                folder.rmdir()
            except OSError:  # a read-only parent: the error being reported says so already
                pass


# Caches of the libraries a run uses that would otherwise go under the home folder: variable -> folder in
# paths.cache. W&B's service writes its logs to WANDB_CACHE_DIR (else ~/.cache/wandb), matplotlib its font list
# to MPLCONFIGDIR (else ~/.cache/matplotlib or ~/.matplotlib). A variable the user has set is kept.
LIBRARY_CACHES = {"WANDB_CACHE_DIR": "wandb", "WANDB_DATA_DIR": "wandb_data", "MPLCONFIGDIR": "matplotlib"}


def use_cache_folder(cfg) -> None:
    """Keep every cache of this process under the config's ``paths.cache`` (a run config, resolved or not): the
    sha256 cache (:func:`lantern.files.use_hash_cache_folder`) and the libraries' (:data:`LIBRARY_CACHES`). A
    ``paths.cache`` that does not resolve is left to the preflight to report."""
    from omegaconf import OmegaConf

    try:
        folder = (
            (cfg.get("paths") or {}).get("cache") if isinstance(cfg, dict) else OmegaConf.select(cfg, "paths.cache")
        )
    except Exception:  # noqa: BLE001 - an unresolvable value is bad input, named by the checks that follow
        return
    if not isinstance(folder, str) or not folder:
        return
    use_hash_cache_folder(folder)
    for variable, name in LIBRARY_CACHES.items():
        os.environ.setdefault(variable, os.path.join(folder, name))


def run_hydra(main: Callable[[], None]) -> None:
    """Call a ``@hydra.main`` function so that a command-line mistake is one ``error:`` line and exit 2.

    Hydra reports unknown keys, unknown options and unparsable overrides over several lines and exits
    with 1, unless HYDRA_FULL_ERROR is set, in which case it re-raises them: it is set here so they reach
    :func:`lantern.cli.hydra_errors.hydra_message`. Anything it does not recognise (a bug) keeps its traceback.
    """
    os.environ["HYDRA_FULL_ERROR"] = "1"
    task = getattr(getattr(main, "__wrapped__", None), "__code__", None)
    try:
        main()
    except Exception as exc:
        message = hydra_message(exc) or user_message(exc)
        if message is None and task is not None and not _raised_in(exc, task):
            # Hydra failed before the task started: composing the command line's overrides.
            overrides = " ".join(sys.argv[1:])
            message = one_line(
                f"cannot compose the config from the overrides {overrides!r}: {type(exc).__name__}: {exc}"
            )
        if message is None:
            raise
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _raised_in(exc: BaseException, code) -> bool:
    """Whether ``exc`` passed through a frame running ``code``."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def flag_number(text: str):
    """A flag's text as a number where it is one (the checks then say what is allowed), else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            continue
    return text


class ArgumentParser(argparse.ArgumentParser):
    """argparse for the scripts that take files and flags (make_tables, the benchmarks, ...): a bad flag is one
    :class:`ConfigError` (``error: ...`` and exit 2 through :func:`run_or_exit`), not argparse's usage lines.
    ``--help`` prints the script's docstring."""

    def __init__(self, doc: str | None = None, **kwargs):
        if doc is not None:  # the script's docstring (subparsers pass argparse's own keywords instead)
            kwargs.update(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str):
        raise ConfigError(f"{message} (see --help)")

    def parse(self, argv=None) -> argparse.Namespace:
        """:meth:`parse_args` with its refusal as one ``error:`` line and exit 2."""
        return run_or_exit(lambda: self.parse_args(argv))
