"""Bytes from the network into a staging file: hub files through ``huggingface_hub``, URLs by HTTP Range.

Nothing is written under an asset's own path here: a download lands in ``paths.assets/.partial/`` (kept
between runs, so a dropped connection, Ctrl-C or a full disk resumes where it stopped) and the caller
moves it into place once its pins are checked. Before the first byte, :func:`probe` dials every host the
bytes may come from (the hub and, on huggingface.co, its LFS/Xet content hosts; a URL, its mirrors and the
hosts it may redirect to) within the connect timeout, so that a machine without network fails in seconds.
Every network fault is one :class:`AssetError` line; a fault a rerun can get past says "rerun to resume".
"""

from __future__ import annotations

import errno
import fnmatch
import os
import shutil
import socket
import urllib.parse
from pathlib import Path

from lantern.run.assets import places, urls
from lantern.run.assets.registry import Source, hub_endpoint
from lantern.run.assets.store import AssetError

PARTIAL_DIR = ".partial"
DEFAULT_HUB = "https://huggingface.co"
# Where huggingface.co serves LFS and Xet content from (its download guide's host list); probed only when the
# endpoint is huggingface.co. LANTERN_HUB_CONTENT_HOSTS="a,b" replaces the list ("" probes none).
HUB_CONTENT_HOSTS = ("cas-server.xethub.hf.co", "transfer.xethub.hf.co", "cdn-lfs-us-1.hf.co")
NETWORK_MODULES = ("httpx", "httpx2", "requests", "urllib3", "h11", "httpcore")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` is set: no source is contacted."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def content_hosts() -> tuple[str, ...]:
    """The hosts a hub file's bytes may come from besides the endpoint."""
    if hub_endpoint() != DEFAULT_HUB:
        return ()
    given = os.environ.get("LANTERN_HUB_CONTENT_HOSTS")
    return HUB_CONTENT_HOSTS if given is None else tuple(h.strip() for h in given.split(",") if h.strip())


def hosts_of(source: Source) -> list[tuple[str, int]]:
    """(host, port) of every address ``source``'s bytes may come from, in the order they are tried."""
    found = []
    for url in source.urls():
        parts = urllib.parse.urlsplit(url)
        found.append((parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)))
    extra = content_hosts() if source.url is None else source.hosts
    found += [(host, 443) for host in extra]
    return list(dict.fromkeys(found))


def dial(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be reached (DNS or TCP within the connect timeout), or None."""
    try:
        with socket.create_connection((host, port), timeout=urls.TIMEOUTS.connect):
            return None
    except OSError as exc:
        return f"{host}:{port} does not answer ({exc.strerror or exc})"


def probe(source: Source, seen: dict[tuple[str, int], str | None]) -> str | None:
    """Why ``source`` cannot be fetched from here (None when it can): a hub file needs its endpoint and its
    content hosts; a URL needs one of its addresses (mirrors are alternatives) and the hosts it names."""
    for address in hosts_of(source):
        if address not in seen:
            seen[address] = dial(*address)
    if source.url is None:
        down = [seen[a] for a in hosts_of(source) if seen[a]]
        return down[0] if down else None
    tried = [urllib.parse.urlsplit(u) for u in source.urls()]
    addresses = [(p.hostname or "", p.port or (443 if p.scheme == "https" else 80)) for p in tried]
    if all(seen[a] for a in addresses):
        return seen[addresses[0]]
    return None


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
    """(bytes, commit, published sha256) of a hub file as the hub states them (one HEAD, no retries, within the
    read timeout); the sha256 is the LFS object id (null for small non-LFS files)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(source.repo, source.file, revision=source.revision, endpoint=hub_endpoint())
    meta = hub_call(source, lambda: get_hf_file_metadata(url, timeout=urls.TIMEOUTS.read))
    etag = (meta.etag or "").strip('"').lower()
    return meta.size, meta.commit_hash, etag if len(etag) == 64 and set(etag) <= places.HEX else None


def list_matching(source: Source, patterns: tuple[str, ...]) -> list[tuple[str, int | None, str | None]]:
    """(name, size, LFS sha256) of every file of ``source.repo`` at ``source.revision`` matching ``patterns``
    (``huggingface_hub``'s tree listing, the one ``snapshot_download(allow_patterns=...)`` filters)."""
    from huggingface_hub import HfApi

    def listing():
        api = HfApi(endpoint=hub_endpoint())
        return list(api.list_repo_tree(source.repo, revision=source.revision, recursive=True))

    found = []
    for entry in hub_call(source, listing):
        name = getattr(entry, "path", "")
        if hasattr(entry, "size") and any(fnmatch.fnmatch(name, p) for p in patterns):
            lfs = getattr(entry, "lfs", None)
            found.append((name, entry.size, getattr(lfs, "sha256", None) if lfs else None))
    return found


def _network(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in NETWORK_MODULES


def hub_call(source: Source, call):
    """``call()``, its hub and network failures turned into one AssetError line."""
    from huggingface_hub import errors

    try:
        return call()
    except (errors.GatedRepoError, errors.RepositoryNotFoundError) as exc:
        raise AssetError(
            f"{source.describe()}: the hub refuses the repository ({type(exc).__name__}); accept its licence on the "
            "hub and log in (`hf auth login`), or copy the file to its destination"
        ) from exc
    except errors.LocalEntryNotFoundError as exc:  # huggingface_hub's name for "the HEAD failed": the network
        raise AssetError(f"{source.describe()}: the hub did not answer; rerun to resume") from exc
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
    except Exception as exc:
        if not _network(exc):
            raise
        raise AssetError(
            f"{source.describe()}: the hub did not answer ({type(exc).__name__}, timeouts {urls.TIMEOUTS.connect:g} s "
            f"to connect, {urls.TIMEOUTS.read:g} s to read); rerun to resume"
        ) from exc


def staging_path(root: Path, relative: str) -> Path:
    """Where a URL download of ``relative`` is staged (kept across runs for resuming)."""
    return root / PARTIAL_DIR / "url" / relative


def download(source: Source, root: Path, relative: str, progress: bool = True) -> Path:
    """Download ``source`` (a URL: ``source.url`` itself, mirrors are the caller's) into its staging place
    under ``root``, resuming what is there; return the file."""
    if source.url is None:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

        (enable_progress_bars if progress else disable_progress_bars)()
        folder = root / PARTIAL_DIR / "hub" / source.repo / source.revision
        constants.HF_HUB_DOWNLOAD_TIMEOUT = urls.TIMEOUTS.read  # read at each call by its downloader
        path = hub_call(
            source,
            lambda: hf_hub_download(
                source.repo,
                source.file,
                revision=source.revision,
                local_dir=str(folder),
                endpoint=hub_endpoint(),
                etag_timeout=urls.TIMEOUTS.read,
            ),
        )
        return Path(path)
    staged = staging_path(root, relative)
    staged.parent.mkdir(parents=True, exist_ok=True)
    urls.get_resume(source.url, named_hosts(source), staged, progress)
    return staged


def named_hosts(source: Source) -> tuple[str, ...]:
    """The hosts the registry names for a URL source: its URLs' and those of ``hosts:`` (redirects may go there)."""
    return tuple(urls.host_of(u) for u in source.urls()) + source.hosts
