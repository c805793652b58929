"""A run folder: who may write it, what config it holds, and which images in it are finished.

Layout of a run folder::

    .lock              the writer's lock (lantern.run.lock); the file stays, the lock goes with its process
    run_config.json    the resolved config the images are made with, written before the first image
    run_inputs.json    the sha256 of every file they are made from (weights, prompt files, ...), beside it
    tokens/000042.pt   image 42's tokens (N,) and per-sample decoder counters, written before its PNG
    000042.png         image 42; with its tokens file, the mark that image 42 is finished
    grid.png, metrics.json   written last; a complete metrics.json means the run is finished

Rerunning the same command into the folder skips a finished run (its record's config matches) and,
in an unfinished one, the finished images. A different config is refused with one line, so two
runs never mix in one folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from lantern.errors import ConfigError, LanternError
from lantern.files import note_input, remove_stale_temps, write_json_atomic
from lantern.results.images import TOKENS_DIR, ImageStore  # noqa: F401 - the run folder's per-image files
from lantern.results.record import RECORD_NAME, RunRecord, read_record
from lantern.run.distributed import World
from lantern.run.lock import LOCK_NAME, FolderLock

RUN_CONFIG = "run_config.json"
RUN_INPUTS = "run_inputs.json"  # every file the first images were made from: path -> role, sha256, bytes
# Config entries that change neither images nor records' meaning: where things are written, how runs are logged.
IGNORED_CONFIG_KEYS = ("wandb", "paths", "report")


def comparable(config: dict) -> dict:
    """``config`` without :data:`IGNORED_CONFIG_KEYS`, round-tripped through JSON (as it is stored)."""
    return json.loads(json.dumps({k: v for k, v in config.items() if k not in IGNORED_CONFIG_KEYS}, default=str))


def first_difference(old, new, prefix: str = "") -> str | None:
    """The first dotted key where ``old`` and ``new`` differ, as ``key: old -> new`` (None when equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            found = first_difference(old.get(key, "<absent>"), new.get(key, "<absent>"), f"{prefix}{key}.")
            if found:
                return found
        return None
    if old != new:
        shown = [repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..." for v in (old, new)]
        return f"{prefix.rstrip('.')}: {shown[0]} -> {shown[1]}"
    return None


@dataclass
class Claim:
    """What a writer found when it claimed a folder: a finished record, or the images already finished."""

    finished: RunRecord | None
    resumed: bool


class RunFolder:
    """Exclusive use of one run folder for one resolved ``config`` (a dict), as a context manager.

    Entering takes the lock (refusing a second writer with one line), then checks the folder: a
    finished record of the same config is returned in :attr:`claim`; a record or ``run_config.json``
    of another config, or files of something that is not a lantern run, are refused. Leaving after a
    failure removes what this writer added to a folder that was empty, so bad input leaves nothing.
    """

    def __init__(self, path: str | os.PathLike, config: dict):
        self.path = Path(path)
        self.config = comparable(config)
        self._lock = FolderLock(self.path, what="run folder")
        self._was_empty = False
        self._locked = False
        self.claim: Claim | None = None

    def __enter__(self) -> RunFolder:
        self._was_empty = not self.path.exists() or not any(self.path.iterdir())
        self._locked = False
        if (self.path / RECORD_NAME).is_file():
            # A finished run is only read (its record is written last, atomically): no lock, so it can be
            # reported from a read-only disk or beside a reader holding the lock.
            self.claim = self._finished()
            return self
        self._lock.acquire()
        self._locked = True
        try:
            self.claim = self._inspect()
        except BaseException:
            self._leave(failed=True)
            raise
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self._leave(failed=kind is not None)

    def _leave(self, failed: bool) -> None:
        if not self._locked:
            return
        if failed and self._was_empty:
            leftovers = {p.name for p in self.path.iterdir()} if self.path.exists() else set()
            if leftovers <= {LOCK_NAME, RUN_CONFIG, RUN_INPUTS, TOKENS_DIR} and not self.store().finished_any():
                for name in (RUN_CONFIG, RUN_INPUTS, TOKENS_DIR):
                    target = self.path / name
                    if target.is_dir():
                        for stale in target.iterdir():
                            stale.unlink()
                        target.rmdir()
                    else:
                        target.unlink(missing_ok=True)
                self._lock.release()
                (self.path / LOCK_NAME).unlink(missing_ok=True)
        self._lock.release()

    def _refuse(self, what: str, difference: str) -> ConfigError:
        return ConfigError(
            f"run folder {str(self.path)!r} holds {what} with another config ({difference}); "
            "rerun with the same config to resume, or choose another folder"
        )

    def _inspect(self) -> Claim:
        for folder in (self.path, self.path / TOKENS_DIR):
            if folder.is_dir():
                remove_stale_temps(folder)  # a killed writer's; no live writer holds the lock now
        if (self.path / RECORD_NAME).is_file():  # finished while this writer waited for the lock
            return self._finished()
        config_file = self.path / RUN_CONFIG
        if config_file.is_file():
            stored = json.loads(config_file.read_text(encoding="utf-8"))
            difference = first_difference(stored, self.config)
            if difference:
                raise self._refuse("an unfinished run", difference)
            self._check_inputs(self.stored_inputs(), "an unfinished run")
            return Claim(finished=None, resumed=True)
        strangers = sorted(p.name for p in self.path.iterdir() if not p.name.startswith(".") and p.name != TOKENS_DIR)
        if strangers:
            raise ConfigError(
                f"run folder {str(self.path)!r} holds files of something else ({', '.join(strangers[:3])}"
                f"{', ...' if len(strangers) > 3 else ''}) and no {RUN_CONFIG}; choose an empty or new folder"
            )
        return Claim(finished=None, resumed=False)

    def _finished(self) -> Claim:
        record = read_record(self.path)
        difference = first_difference(comparable(record.config), self.config)
        if difference:
            raise self._refuse("a finished run", difference)
        self._check_inputs(record.inputs or {}, "a finished run")
        return Claim(finished=record, resumed=False)

    def stored_inputs(self) -> dict:
        """The inputs ``run_inputs.json`` records (empty when there is none)."""
        try:
            stored = json.loads((self.path / RUN_INPUTS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return stored if isinstance(stored, dict) else {}

    def _check_inputs(self, stored: dict, what: str) -> None:
        """Refuse when a file the folder's images were made from now has other contents (or is gone):
        resume identity is contents, not paths. Hashes are checked against the files' content at each run."""
        for path, entry in stored.items():
            expected = entry.get("sha256") if isinstance(entry, dict) else None
            now = note_input(path, entry.get("role", "input")) if os.path.exists(path) else None
            if now != expected:
                state = "is gone" if now is None else f"now has sha256 {now[:12]}..."
                raise ConfigError(
                    f"run folder {str(self.path)!r} holds {what} made from {path!r} (sha256 {str(expected)[:12]}...), "
                    f"which {state}; restore that file to resume, or choose another folder"
                )

    def check_inputs(self, inputs: dict) -> None:
        """Refuse when this job reads a file the folder's first images were made from with other contents."""
        stored = self.stored_inputs()
        for path, entry in inputs.items():
            if path in stored and stored[path].get("sha256") != entry["sha256"]:
                raise ConfigError(
                    f"run folder {str(self.path)!r} holds images made from {path!r} with sha256 "
                    f"{str(stored[path].get('sha256'))[:12]}..., which now has {entry['sha256'][:12]}...; "
                    "restore that file to resume, or choose another folder"
                )

    def start(self, inputs: dict | None = None) -> None:
        """Write ``run_config.json`` and ``run_inputs.json`` (before the first image), so a rerun can tell
        it may resume from the same config and the same files."""
        if inputs is not None:
            self.check_inputs(inputs)
            write_json_atomic(self.path / RUN_INPUTS, {**self.stored_inputs(), **inputs})
        if not (self.path / RUN_CONFIG).is_file():
            write_json_atomic(self.path / RUN_CONFIG, self.config)

    def store(self) -> ImageStore:
        return ImageStore(self.path)


@contextmanager
def claim_run_folder(path: str | os.PathLike, config: dict, world: World | None = None) -> Iterator[RunFolder]:
    """Claim ``path`` for ``config`` on rank 0 of ``world`` and tell every rank what it found.

    Rank 0 holds the lock for the whole run; the other ranks write only their own images into the
    folder rank 0 has claimed, and learn its :class:`Claim` (or its refusal, raised on every rank).
    """
    world = world or World()
    folder = RunFolder(path, config)
    with ExitStack() as stack:
        outcome: tuple[str, object] = ("ok", None)
        if world.is_main:
            try:
                stack.enter_context(folder)
            except LanternError as exc:
                if not world.distributed:
                    raise
                outcome = ("refused", exc)
            else:
                finished = folder.claim.finished
                outcome = ("ok", (finished.to_json() if finished is not None else None, folder.claim.resumed))
        outcome = world.from_main(outcome)
        if outcome[0] == "refused":
            raise outcome[1]
        if not world.is_main:
            finished, resumed = outcome[1]
            folder.claim = Claim(
                finished=None if finished is None else RunRecord.model_validate(finished), resumed=resumed
            )
        yield folder
