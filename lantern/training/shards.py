"""Append-only tensor shards on disk: how drafter training data streams from disk instead of RAM.

A store is a folder of ``shard_NNNNN.safetensors`` files and an ``index.json`` holding the store's
``key`` (what the rows depend on: the target's weight hash, the settings) and the list of finished
shards with their row count, byte size and sha256 (checked on open through
:func:`lantern.files.sha256_cached`, so a shard is hashed once per version, not at every open). Rows are numbered in shard order. Every shard is written
atomically (temporary file, fsync, rename) and only then entered in the index (also atomic), so a
kill at any moment leaves either a shard the index lists whole, a whole shard the index does not list yet
(overwritten under the same name), or a temporary file that is ignored (the factory removes those once it
holds the folder's lock): a rerun resumes after the last listed shard. A listed shard whose size no longer
matches, whose content differs from its listed sha256 (altered, or listed before shard digests), a store
with another key, or a shard with other tensor names is refused with one message naming the file; nothing
is deleted on the user's behalf (rows can take hours to make: the user chooses to make them again).
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.files import sha256_cached, write_atomic, write_json_atomic

INDEX_NAME = "index.json"
FORMAT = "lantern-shards/1"


def _describe(key: Mapping) -> str:
    return json.dumps(key, sort_keys=True, default=str)


class ShardStore:
    """The shards in ``folder``, for rows that depend on ``key`` (a JSON-able mapping).

    ``what`` names the store in messages (``"drafter features"``). Opening never writes: the folder
    and its index are made by the first :meth:`append`.
    """

    def __init__(self, folder: str | os.PathLike, key: Mapping, what: str):
        self.folder = Path(folder)
        self.key = json.loads(_describe(key))  # as it will read back from JSON
        self.what = what
        self.shards: list[dict] = []
        self._offsets: list[int] = [0]
        index = self.folder / INDEX_NAME
        if index.is_file():
            self._read_index(index)

    @property
    def index_path(self) -> Path:
        return self.folder / INDEX_NAME

    def _read_index(self, path: Path) -> None:
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{str(path)!r} is not a readable shard index ({exc})") from exc
        if not isinstance(saved, dict) or saved.get("format") != FORMAT or not isinstance(saved.get("shards"), list):
            raise CheckpointError(f"{str(path)!r} is not a {FORMAT} index")
        if saved.get("key") != self.key:
            old, new = saved.get("key") or {}, self.key
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            shown = ", ".join(f"{k}: {str(old.get(k))[:40]!r} (stored) vs {str(new.get(k))[:40]!r}" for k in diff[:3])
            raise ConfigError(
                f"{str(self.folder)!r} holds {self.what} made for other inputs ({shown}); "
                "use another out_dir, or delete that folder to make them again"
            )
        for entry in saved["shards"]:
            self._check_shard(entry)
            self.shards.append(entry)
            self._offsets.append(self._offsets[-1] + int(entry["rows"]))

    def _check_shard(self, entry: Mapping) -> None:
        path = self.folder / str(entry.get("name"))
        size = path.stat().st_size if path.is_file() else None
        listed = entry.get("sha256")
        if size is None:
            state = "is missing"
        elif size != entry.get("bytes"):
            state = f"has {size} bytes, the index says {entry.get('bytes')} (cut short or altered)"
        elif not listed:
            state = "has no sha256 in the index (listed before shard digests)"
        elif sha256_cached(path) != listed:
            state = f"does not match the sha256 the index lists ({str(listed)[:12]}...; altered)"
        else:
            return
        raise CheckpointError(
            f"{self.what} shard {str(path)!r} {state}; delete it and its later "
            f"shards and {INDEX_NAME}'s entries, or the folder, and rerun to make them again"
        )

    @property
    def rows(self) -> int:
        """Rows in finished shards."""
        return self._offsets[-1]

    def append(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Write one shard of rows (every tensor's first dimension) and list it in the index."""
        from safetensors.torch import save_file

        sizes = {t.shape[0] for t in tensors.values()}
        if len(sizes) != 1:
            raise ValueError(f"a shard's tensors must share their first dimension, got {sorted(sizes)}")
        if self.shards and set(tensors) != set(self.shards[0]["tensors"]):
            raise CheckpointError(
                f"{str(self.index_path)!r} lists shards of tensors {self.shards[0]['tensors']}, "
                f"not {sorted(tensors)}; use another out_dir"
            )
        rows = sizes.pop()
        name = f"shard_{len(self.shards):05d}.safetensors"
        path = self.folder / name
        payload = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        write_atomic(path, lambda tmp: save_file(payload, tmp))
        entry = {"name": name, "rows": rows, "bytes": path.stat().st_size, "sha256": sha256_cached(path)}
        entry["tensors"] = sorted(payload)
        self.shards.append(entry)
        self._offsets.append(self._offsets[-1] + rows)
        self._write_index()

    def _write_index(self) -> None:
        write_json_atomic(self.index_path, {"format": FORMAT, "key": self.key, "shards": self.shards})

    def bytes(self) -> int:
        return sum(int(entry["bytes"]) for entry in self.shards)

    def read(self, rows: torch.Tensor, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """The given ``rows`` (R,) int64, in that order, of the tensors ``names`` (all when None).

        Shards are memory-mapped (``safe_open``) and only the requested rows are read (a shard of
        GPT-XL features is hundreds of MB; a batch needs a few rows of many shards).
        """
        from safetensors import safe_open

        rows = [int(r) for r in torch.as_tensor(rows, dtype=torch.int64).flatten()]
        if rows and (min(rows) < 0 or max(rows) >= self.rows):
            raise IndexError(f"rows outside 0 .. {self.rows - 1} of {str(self.folder)!r}")
        names = list(names or self.shards[0]["tensors"])
        by_shard: dict[int, list[tuple[int, int]]] = {}  # shard -> [(position in the output, local row)]
        for position, row in enumerate(rows):
            shard = bisect.bisect_right(self._offsets, row) - 1
            by_shard.setdefault(shard, []).append((position, row - self._offsets[shard]))
        out: dict[str, list] = {name: [None] * len(rows) for name in names}
        for shard, wanted in by_shard.items():
            with safe_open(str(self.folder / self.shards[shard]["name"]), framework="pt") as handle:
                for name in names:
                    column = handle.get_slice(name)
                    for position, local in wanted:
                        out[name][position] = column[local : local + 1]
        return {name: torch.cat(parts) if parts else torch.empty(0) for name, parts in out.items()}
