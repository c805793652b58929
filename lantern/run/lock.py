"""One writer per folder: an OS-level lock the kernel releases on any exit (Ctrl-C, kill -9, a crash).

The lock is ``flock`` on ``<folder>/.lock``. The file itself stays (removing it would let a third
writer lock a fresh inode while a second still holds the old one); only the lock matters. It holds the
holder's host and pid, so the refusal can name who is writing. Local file systems and NFSv4 honour
``flock`` across processes; on other network file systems give each run its own folder.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from lantern.errors import ConfigError

LOCK_NAME = ".lock"


class FolderLock:
    """An exclusive lock on ``folder`` (created if missing). Use as a context manager or acquire/release.

    ``wait=False`` refuses at once with a one-line :class:`ConfigError` when another process holds it;
    ``wait=True`` blocks until it is free (for short critical sections such as writing a sweep table).
    """

    def __init__(self, folder: str | os.PathLike, wait: bool = False, what: str = "folder"):
        self.folder, self.wait, self.what = Path(folder), wait, what
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def holder(self) -> str:
        """Who the lock file says holds it (``host pid N``), or ``unknown`` when it cannot be read."""
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            return "unknown"
        return text or "unknown"

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"{self.what} {str(self.folder)!r} is being written by another process ({self.holder()}); "
                "wait for it to finish or choose another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} pid {os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
