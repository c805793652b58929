"""Nearest-neighbour tables over a VQ codebook, for LANTERN's latent proximity sets.

Row ``i`` of a table lists the ``k_max`` codes nearest to code ``i`` (itself excluded) by
Euclidean distance, nearest first, ties broken by the smaller index. Distances are taken on the
l2-normalised rows (the space the VQ-16 tokenizer quantises in) or on the raw rows (what the
reference implementation does); which one was used is part of the cache key.

Tables are built a chunk of rows at a time, so a 16384 x 16384 distance matrix never exists at once,
and cached on disk keyed by a hash of the codebook, so a table built for one codebook (say a
stage-I tokenizer) is never used with another. Each file stores the digest of its own content
(:func:`lantern.files.content_digest`); a cached file that does not match it is reported on stderr and
rebuilt, a prebuilt file (``model.neighbours.path``) that does not match it is refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from lantern.errors import CheckpointError, ConfigError
from lantern.files import cache_mismatch, content_digest, note_input, save_torch_atomic
from lantern.models.checkpoint import read_state_dict
from lantern.rules.relaxation import NeighbourTable

CODEBOOK_KEY = "quantize.embedding.weight"

# Distances held per chunk (chunk rows x V), in float64: 2**24 entries = 128 MiB.
_CHUNK_ENTRIES = 1 << 24


def _prepared(codebook: torch.Tensor, normalize: bool) -> torch.Tensor:
    """The rows distances are measured on, as float64 on the codebook's device."""
    if codebook.ndim != 2:
        raise ConfigError(f"codebook must be a (V, D) matrix, got shape {tuple(codebook.shape)}")
    rows = codebook.detach().to(torch.float64)  # (V, D)
    if normalize:
        rows = F.normalize(rows, p=2.0, dim=1)
    return rows


def neighbour_table(
    codebook: torch.Tensor, k_max: int, normalize: bool = True, chunk_size: int | None = None
) -> torch.Tensor:
    """The ``k_max`` nearest other codes of every code, as a (V, k_max) int64 table.

    Distances are Euclidean, on l2-normalised rows when ``normalize`` is true and on raw rows
    otherwise, computed pairwise by differences (not through a Gram matrix) so that a row's result
    does not depend on how rows are chunked. Each row is sorted by increasing distance with a stable
    sort, so equal distances keep index order. ``chunk_size`` rows are processed at a time (default:
    as many as fit in 2**24 distances).
    """
    rows = _prepared(codebook, normalize)  # (V, D)
    num_codes = rows.shape[0]
    if not (isinstance(k_max, int) and 1 <= k_max <= num_codes - 1):
        raise ConfigError(
            f"k_max={k_max!r} must be an integer in [1, {num_codes - 1}] for a codebook of {num_codes} codes"
        )
    if chunk_size is None:
        chunk_size = max(1, _CHUNK_ENTRIES // num_codes)
    if chunk_size < 1:
        raise ConfigError(f"chunk_size={chunk_size!r} must be >= 1")
    table = torch.empty(num_codes, k_max, dtype=torch.int64, device=rows.device)  # (V, k_max)
    for start in range(0, num_codes, chunk_size):
        stop = min(start + chunk_size, num_codes)
        dist = torch.cdist(rows[start:stop], rows, compute_mode="donot_use_mm_for_euclid_dist")  # (c, V)
        own = torch.arange(start, stop, device=rows.device)  # (c,)
        dist[own - start, own] = float("inf")
        order = torch.sort(dist, dim=1, stable=True).indices  # (c, V)
        table[start:stop] = order[:, :k_max]
    return table


def to_storage(table: torch.Tensor) -> torch.Tensor:
    """The table in the smallest integer type that holds its indices (int16 up to 32767, else int32)."""
    largest = int(table.max()) if table.numel() else 0
    dtype = torch.int16 if largest <= torch.iinfo(torch.int16).max else torch.int32
    return table.to(dtype)


def codebook_hash(codebook: torch.Tensor, normalize: bool) -> str:
    """sha256 (hex) of the codebook's shape, its fp32 bytes, and the normalise flag."""
    data = codebook.detach().to(device="cpu", dtype=torch.float32).contiguous()
    digest = hashlib.sha256()
    digest.update(repr(tuple(data.shape)).encode())
    digest.update(data.numpy().tobytes())
    digest.update(b"norm" if normalize else b"raw")
    return digest.hexdigest()


def table_path(cache_dir: str | os.PathLike, digest: str, k_max: int, normalize: bool) -> Path:
    """Where the table for a codebook hash, ``k_max`` and distance space is cached."""
    return Path(cache_dir) / f"{digest}_{k_max}_{'norm' if normalize else 'raw'}.pt"


def table_digest(payload: dict) -> str:
    """The digest of a table file's content: codebook hash, distance space and the table itself."""
    return content_digest({name: payload.get(name) for name in ("hash", "normalize", "table")})


def _intact(payload) -> bool:
    """Whether a loaded table file holds a table and the digest of its own content."""
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("table"), torch.Tensor)
        and payload.get("digest") == table_digest(payload)
    )


def _read_cached(path: Path, digest: str, normalize: bool, k_max: int) -> torch.Tensor | None:
    """The cached table at ``path`` sliced to ``k_max`` columns, or ``None`` if it is unusable.

    A file that cannot be read or whose content differs from its stored digest (altered, cut short, or
    written before digests) is reported on stderr; one made for another codebook or space is skipped."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any unreadable file is a damaged cache
        payload = None
    if not _intact(payload):
        cache_mismatch(path)
        return None
    if payload.get("hash") != digest or payload.get("normalize") != normalize:
        return None
    table = payload["table"]
    if table.ndim != 2 or table.shape[1] < k_max:
        return None
    return table[:, :k_max].to(torch.int64)


def load_or_build_table(
    codebook: torch.Tensor, k_max: int, normalize: bool, cache_dir: str | os.PathLike
) -> torch.Tensor:
    """The (V, k_max) int64 neighbour table of ``codebook``, from ``cache_dir`` when possible.

    A cached file is used only if the hash stored inside it equals this codebook's hash (with the
    same normalise flag) and its content matches the digest stored with it (else a line on stderr); a
    cached table with more columns than ``k_max`` is sliced. Otherwise the table is built and written
    atomically (temporary file, then ``os.replace``) with its digest as ``<hash>_<k_max>_<norm|raw>.pt``.
    The result lives on the CPU.
    """
    digest = codebook_hash(codebook, normalize)
    cache = Path(cache_dir)
    tag = "norm" if normalize else "raw"
    exact = table_path(cache, digest, k_max, normalize)
    candidates = [exact] if exact.is_file() else []
    if cache.is_dir():
        wider = []
        for path in cache.glob(f"{digest}_*_{tag}.pt"):
            width = path.name[len(digest) + 1 : -len(f"_{tag}.pt")]
            if width.isdigit() and int(width) > k_max:
                wider.append((int(width), path))
        candidates += [path for _, path in sorted(wider)]
    for path in candidates:
        table = _read_cached(path, digest, normalize, k_max)
        if table is not None and table.shape[0] == codebook.shape[0]:
            return table
    if not (isinstance(k_max, int) and 1 <= k_max <= codebook.shape[0] - 1):
        raise ConfigError(
            f"k_max={k_max!r} must be an integer in [1, {codebook.shape[0] - 1}] for a codebook of {codebook.shape[0]} codes"
        )
    table = neighbour_table(codebook, k_max, normalize).cpu()  # (V, k_max)
    cache.mkdir(parents=True, exist_ok=True)
    payload = {
        "hash": digest,
        "normalize": normalize,
        "k_max": k_max,
        "num_codes": int(codebook.shape[0]),
        "table": to_storage(table),
    }
    save_torch_atomic(exact, payload | {"digest": table_digest(payload)})
    return table


def check_table(table: torch.Tensor, codebook: torch.Tensor) -> None:
    """Raise :class:`ConfigError` if ``table`` cannot have been built from ``codebook``.

    Catches the classic mistake of reusing a neighbour table made for another tokenizer (e.g. a
    stage-I table with a stage-II model): the number of rows must equal the codebook size and every
    index must be a valid code.
    """
    num_codes = codebook.shape[0]
    if table.ndim != 2 or table.shape[0] != num_codes:
        raise ConfigError(
            f"neighbour table of shape {tuple(table.shape)} was built for another codebook: "
            f"this model's codebook has {num_codes} codes; rebuild the table from this model's tokenizer"
        )
    if table.numel() and (int(table.min()) < 0 or int(table.max()) >= num_codes):
        raise ConfigError(
            f"neighbour table holds indices outside [0, {num_codes - 1}]: it was built for another codebook"
        )


def _codebook_from(vq_ckpt: str | os.PathLike) -> torch.Tensor:
    state = read_state_dict(vq_ckpt, "tokenizer")
    if CODEBOOK_KEY not in state:
        raise CheckpointError(f"{os.fspath(vq_ckpt)!r} has no {CODEBOOK_KEY!r}: is it a VQ tokenizer checkpoint?")
    return state[CODEBOOK_KEY].float()  # (V, D)


def read_table_file(path: str | os.PathLike, codebook: torch.Tensor, normalize: bool, k_max: int) -> torch.Tensor:
    """A prebuilt table file (the cache's format) checked against the codebook and the requested distance space."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model.neighbours.path={os.fspath(path)!r} is not a file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        note_input(path, "neighbours")
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise ConfigError(
            f"model.neighbours.path={os.fspath(path)!r} is not a neighbour table file ({type(error).__name__})"
        ) from None
    if (
        not isinstance(payload, dict)
        or not isinstance(payload.get("table"), torch.Tensor)
        or "normalize" not in payload
    ):
        raise ConfigError(
            f"model.neighbours.path={os.fspath(path)!r} is not a neighbour table file (no table/normalize entries)"
        )
    if not _intact(payload):
        raise ConfigError(
            f"model.neighbours.path={os.fspath(path)!r}: its content does not match the digest stored with it "
            "(altered, or written before digests); expected a table file as the cache writes it"
        )
    if bool(payload["normalize"]) != normalize:
        built = "l2-normalised" if payload["normalize"] else "raw"
        wanted = "l2-normalised" if normalize else "raw"
        raise ConfigError(
            f"neighbour table {os.fspath(path)!r} was built on {built} codebook rows but {wanted} rows were requested "
            f"(model.neighbours.normalize={str(normalize).lower()}); set model.neighbours.normalize="
            f"{str(bool(payload['normalize'])).lower()} or use a table built in the requested space"
        )
    if payload.get("hash") != codebook_hash(codebook, normalize):
        raise ConfigError(f"neighbour table {os.fspath(path)!r} was built for another codebook (its hash differs)")
    table = payload["table"]
    if table.ndim != 2 or table.shape[1] < k_max:
        raise ConfigError(
            f"neighbour table {os.fspath(path)!r} has shape {tuple(table.shape)}; k_max={k_max} columns are needed"
        )
    return table[:, :k_max].to(torch.int64)


class CodebookNeighbours:
    """The neighbour table of a tokenizer's codebook, built when a rule asks for it.

    ``normalize``: True (l2-normalised rows), False (raw rows) or None: what the acceptance semantics
    implies (bounded: normalised, the space the tokenizer quantises in; reference: raw, as the authors'
    code). The table is cached in ``cache_dir`` keyed by the codebook's hash, or read from ``path`` (a
    file in the cache's format), which must have been built in the requested space.
    """

    def __init__(
        self,
        vq_ckpt: str | os.PathLike | None = None,
        k_max: int = 1024,
        normalize: bool | None = None,
        cache_dir: str | os.PathLike = "outputs/neighbours",
        path: str | os.PathLike | None = None,
        codebook: torch.Tensor | None = None,
    ):
        if (vq_ckpt is None) == (codebook is None):
            raise ConfigError("neighbours need exactly one of vq_ckpt (a tokenizer checkpoint) or codebook")
        if normalize is not None and not isinstance(normalize, bool):
            raise ConfigError(
                f"model.neighbours.normalize={normalize!r} must be true, false or null (as the semantics implies)"
            )
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
            raise ConfigError(f"model.neighbours.k_max={k_max!r} must be an integer >= 1")
        self.vq_ckpt, self.k_max, self.normalize, self.cache_dir, self.path = vq_ckpt, k_max, normalize, cache_dir, path
        self._codebook = codebook
        self._tables: dict[bool, NeighbourTable] = {}

    def codebook(self) -> torch.Tensor:
        if self._codebook is None:
            self._codebook = _codebook_from(self.vq_ckpt)
        return self._codebook

    def table(self, default_normalize: bool = True) -> NeighbourTable:
        """The (V, k_max) table in the requested distance space (``default_normalize`` when ``normalize`` is None)."""
        normalize = self.normalize if self.normalize is not None else default_normalize
        if normalize not in self._tables:
            codebook = self.codebook()
            k_max = min(self.k_max, codebook.shape[0] - 1)  # a small codebook has fewer other codes
            if self.path is not None:
                indices = read_table_file(self.path, codebook, normalize, k_max)
            else:
                indices = load_or_build_table(codebook, k_max, normalize, self.cache_dir)
            check_table(indices, codebook)
            self._tables[normalize] = NeighbourTable(indices, normalize)
        return self._tables[normalize]
