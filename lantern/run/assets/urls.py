"""Plain HTTP(S) downloads: timeouts a user can set, redirects checked hop by hop, resume by ``Range``.

Every request goes out with ``allow_redirects=False`` and each redirect is followed here, at most
:data:`MAX_REDIRECTS` hops: one to another scheme (``file://``, or https down to http), to a host the registry
does not name for that source, or back to an address already visited is refused in one line. A server that
accepts and never answers fails within the read timeout; a download that stops mid-file is resumed while it
progresses and given up, with "rerun to resume", once an attempt brings no byte.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from lantern.run.assets.store import AssetError

MAX_REDIRECTS = 5
RETRIES = 5  # resumed attempts after a dropped connection, per file, while each one brings bytes
CHUNK = 1 << 16  # written as it comes, so a drop mid-file keeps what arrived


@dataclass(frozen=True)
class Timeouts:
    """Seconds to wait for a connection and, once connected, for each answer or block of bytes."""

    connect: float = 10.0
    read: float = 30.0

    def pair(self) -> tuple[float, float]:
        return (self.connect, self.read)


TIMEOUTS = Timeouts()


def set_timeouts(connect: float | None = None, read: float | None = None) -> Timeouts:
    """Set the timeouts every later request uses (``scripts/fetch.py --connect-timeout/--read-timeout``)."""
    global TIMEOUTS
    TIMEOUTS = Timeouts(
        connect if connect is not None else TIMEOUTS.connect, read if read is not None else TIMEOUTS.read
    )
    return TIMEOUTS


def host_of(url: str) -> str:
    return (urllib.parse.urlsplit(url).hostname or "").lower()


def _next(url: str, location: str, allowed: set[str], seen: set[str]) -> str:
    """The redirect target of ``url``, or AssetError when it must not be followed."""
    target = urllib.parse.urljoin(url, location)
    old, new = urllib.parse.urlsplit(url).scheme, urllib.parse.urlsplit(target).scheme
    if new not in ("http", "https") or (old == "https" and new == "http"):
        raise AssetError(
            f"{url} redirects to {target!r}: another scheme ({new or 'none'}) is refused; check the source"
        )
    if host_of(target) not in allowed:
        raise AssetError(
            f"{url} redirects to {host_of(target)!r}, a host the registry does not name for it "
            f"({', '.join(sorted(allowed))}); refused"
        )
    if target in seen or len(seen) > MAX_REDIRECTS:
        raise AssetError(f"{url}: a redirect loop ({len(seen)} hops, back to {target}); check the source")
    return target


def request(method: str, url: str, hosts: Iterable[str], headers: dict | None = None, stream: bool = False):
    """``requests`` response of ``method url`` after the allowed redirects (the caller closes it)."""
    import requests

    allowed = {host_of(url), *(h.lower() for h in hosts)}
    seen: set[str] = set()
    current = url
    while True:
        seen.add(current)
        reply = requests.request(
            method, current, headers=headers, stream=stream, timeout=TIMEOUTS.pair(), allow_redirects=False
        )
        if reply.status_code not in (301, 302, 303, 307, 308) or "Location" not in reply.headers:
            return reply
        reply.close()
        current = _next(current, reply.headers["Location"], allowed, seen)


def network_reason(exc: Exception) -> str:
    """A short reason for a ``requests`` failure (a timeout says how long nothing came)."""
    import requests

    if isinstance(exc, requests.ConnectTimeout):
        return f"no connection within {TIMEOUTS.connect:g} s"
    if isinstance(exc, (requests.ReadTimeout, requests.Timeout)) or _timed_out(exc):
        return f"no answer for {TIMEOUTS.read:g} s (--read-timeout)"
    return type(exc).__name__


def head_size(url: str, hosts: Iterable[str]) -> int | None:
    """Content-Length of ``url`` (None when the server does not say), or AssetError in one line."""
    import requests

    try:
        with request("HEAD", url, hosts) as reply:
            length = reply.headers.get("Content-Length")
            return int(length) if reply.ok and length and length.isdigit() else None
    except requests.RequestException as exc:
        raise AssetError(
            f"cannot reach {url} ({network_reason(exc)}); rerun to resume, or run where there is network"
        ) from exc


def _timed_out(exc: BaseException) -> bool:
    import requests
    import urllib3

    inner = exc.args[0] if exc.args else None
    return isinstance(exc, (requests.Timeout, urllib3.exceptions.TimeoutError)) or isinstance(
        inner, urllib3.exceptions.TimeoutError
    )


def get_resume(url: str, hosts: Iterable[str], staged: Path, progress: bool) -> None:
    """GET ``url`` into ``staged``, appending from its size with ``Range``; retries while attempts bring bytes."""
    import requests
    import urllib3

    reason = "no attempt"
    for _ in range(RETRIES + 1):
        have = staged.stat().st_size if staged.exists() else 0
        stalled = False
        try:
            done = _attempt(url, hosts, staged, have, progress)
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            done, reason = False, f"{network_reason(exc)} at {_size(staged)} bytes"
            stalled = _timed_out(exc)
        else:
            reason = f"the connection ended at {_size(staged)} bytes"
        if done:
            return
        if stalled and _size(staged) <= have:  # a whole read timeout brought nothing: the server stalls
            break
    raise AssetError(f"{url}: the download stopped ({reason}); rerun to resume from what was received")


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _attempt(url: str, hosts: Iterable[str], staged: Path, have: int, progress: bool) -> bool:
    """One GET from byte ``have``; True once the file is complete."""
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={have}-"} if have else {})}  # the bytes as stored
    with request("GET", url, hosts, headers=headers, stream=True) as reply:
        if reply.status_code == 416 and have:  # nothing past what is staged: complete
            return True
        if reply.status_code not in (200, 206):
            raise AssetError(f"{url} answered HTTP {reply.status_code}; check the source or copy the file")
        if reply.status_code == 200:
            have = 0  # the whole file again
        length = reply.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        with (
            open(staged, "ab" if have else "wb") as handle,
            tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=staged.name, disable=not progress) as bar,
        ):
            while chunk := reply.raw.read1(CHUNK):  # what has arrived, so a stall keeps every byte received
                handle.write(chunk)
                bar.update(len(chunk))
            handle.flush()
            os.fsync(handle.fileno())
    return total is None or staged.stat().st_size >= total
