"""Bytes from the network into a staging file: hub files through ``huggingface_hub``, URLs by HTTP Range.

Nothing is written under an asset's own path here: a download lands in ``paths.assets/.partial/`` (kept
between runs, so a dropped connection, Ctrl-C or a full disk resumes where it stopped) and the caller
moves it into place once its sha256 is checked. Before the first byte, :func:`probe` tries each host
with a short timeout so that a machine without network fails in seconds, naming the source.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import urllib.parse
from pathlib import Path

from tqdm.auto import tqdm

from lantern.run.assets.registry import Source, hub_endpoint
from lantern.run.assets.store import AssetError

PARTIAL_DIR = ".partial"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
RETRIES = 5  # resumed attempts after a dropped connection, per file
CHUNK = 1 << 20


def offline() -> bool:
    """``HF_HUB_OFFLINE`` is set: no source is contacted."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def probe(source: Source) -> str | None:
    """Why the host of ``source`` cannot be reached (DNS or TCP within a few seconds), or None."""
    parts = urllib.parse.urlsplit(source.location())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{parts.hostname}:{port} does not answer ({exc.strerror or exc})"


def check_space(root: Path, needed: float, what: str) -> None:
    """AssetError when the file system of ``root`` has less than ``needed`` bytes free."""
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if needed > free:
        raise AssetError(
            f"{what} needs about {needed / 1e9:.2f} GB but {str(root)!r} has {free / 1e9:.2f} GB free; "
            "free some space or set paths.assets=DIR (or LANTERN_ASSETS) on a larger disk"
        )


def remote_size(source: Source) -> tuple[int | None, str | None, str | None]:
    """(bytes, revision, published sha256) of a source as its server states them, before downloading.

    A hub file's revision is the commit the hub resolved and its sha256 the LFS object id (null for
    small non-LFS files); a URL gives its Content-Length only.
    """
    if source.url is None:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(source.repo, source.file, revision=source.revision, endpoint=hub_endpoint())
        meta = _hub_call(source, lambda: get_hf_file_metadata(url))
        etag = (meta.etag or "").strip('"').lower()
        return meta.size, meta.commit_hash, etag if len(etag) == 64 and set(etag) <= set("0123456789abcdef") else None
    import requests

    try:
        with requests.head(source.url, allow_redirects=True, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)) as reply:
            length = reply.headers.get("Content-Length")
            return (int(length) if reply.ok and length and length.isdigit() else None), None, None
    except requests.RequestException as exc:
        raise AssetError(f"cannot reach {source.url} ({type(exc).__name__}); run where there is network") from exc


def _hub_call(source: Source, call):
    from huggingface_hub import errors

    try:
        return call()
    except (errors.GatedRepoError, errors.RepositoryNotFoundError) as exc:
        raise AssetError(
            f"{source.describe()}: the hub refuses the repository ({type(exc).__name__}); accept its licence on the "
            "hub and log in (`hf auth login`), or copy the file to its destination"
        ) from exc
    except (errors.EntryNotFoundError, errors.RevisionNotFoundError) as exc:
        raise AssetError(f"{source.describe()}: no such file or revision on the hub") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise AssetError(
                f"{source.describe()}: the disk refused the download ({exc.strerror}); free some space or set "
                "paths.assets=DIR, then rerun to resume"
            ) from exc
        raise AssetError(f"{source.describe()}: the download failed ({exc}); rerun to resume") from exc
    except (errors.HfHubHTTPError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AssetError(f"{source.describe()}: the download failed ({reason}); rerun to resume") from exc


def staging_path(root: Path, relative: str) -> Path:
    """Where a URL download of ``relative`` is staged (kept across runs for resuming)."""
    return root / PARTIAL_DIR / "url" / relative


def download(source: Source, root: Path, relative: str, progress: bool = True) -> Path:
    """Download ``source`` into its staging place under ``root``, resuming what is there; return the file."""
    if source.url is None:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

        (enable_progress_bars if progress else disable_progress_bars)()
        folder = root / PARTIAL_DIR / "hub" / source.repo / source.revision
        path = _hub_call(
            source,
            lambda: hf_hub_download(
                source.repo, source.file, revision=source.revision, local_dir=str(folder), endpoint=hub_endpoint()
            ),
        )
        return Path(path)
    staged = staging_path(root, relative)
    staged.parent.mkdir(parents=True, exist_ok=True)
    _http_resume(source.url, staged, progress)
    return staged


def _http_resume(url: str, staged: Path, progress: bool) -> None:
    """GET ``url`` into ``staged``, appending from its current size with ``Range`` and retrying a dropped
    connection up to :data:`RETRIES` times; a server that ignores ranges restarts the file."""
    import requests

    reason = "no attempt"
    for _ in range(RETRIES + 1):
        have = staged.stat().st_size if staged.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with requests.get(url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)) as reply:
                if reply.status_code == 416 and have:  # nothing past what is staged: complete
                    return
                if reply.status_code not in (200, 206):
                    raise AssetError(f"{url} answered HTTP {reply.status_code}; check the source or copy the file")
                if reply.status_code == 200:
                    have = 0  # the whole file again
                length = reply.headers.get("Content-Length")
                total = have + int(length) if length and length.isdigit() else None
                with (
                    open(staged, "ab" if have else "wb") as handle,
                    tqdm(
                        total=total, initial=have, unit="B", unit_scale=True, desc=staged.name, disable=not progress
                    ) as bar,
                ):
                    for chunk in reply.iter_content(CHUNK):
                        handle.write(chunk)
                        bar.update(len(chunk))
                    handle.flush()
                    os.fsync(handle.fileno())
            if total is None or staged.stat().st_size >= total:
                return
            reason = f"the connection ended at {staged.stat().st_size} of {total} bytes"
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
            reason = f"{type(exc).__name__} at {staged.stat().st_size if staged.exists() else 0} bytes"
    raise AssetError(f"{url}: the download kept failing ({reason}); rerun to resume from what was received")
