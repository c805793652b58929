"""Shipping trained files into a world folder: copy each one and pin it in the manifest by sha256.

Each file is recorded with its size, the command that produced it, the data, the commit and, when its
source folder has one, the training config and report. Files already in the manifest and not named again
are kept as they are. ``scripts/ship_world.py`` is its command line.
"""

from __future__ import annotations

import json
from pathlib import Path

from lantern import checks
from lantern.files import copy_atomic, sha256_file, write_json_atomic
from lantern.models.world.load import MANIFEST_NAME
from lantern.results.provenance import git_commit

DATA = "Fashion-MNIST (Zalando Research, MIT licence): 60k train split from the Debian package dataset-fashion-mnist"


def ship(world: str, specs: list[str], data: str = DATA) -> Path:
    """Copy every ``NAME=SOURCE=COMMAND`` of ``specs`` into the folder ``world`` and update its manifest."""
    parsed = []
    for spec in specs:  # every file checked before anything is copied
        parts = spec.split("=", 2)
        if len(parts) != 3 or not all(parts):
            raise checks.refuse("--file", spec, "NAME=SOURCE=COMMAND")
        parsed.append((parts[0], checks.path("--file SOURCE", parts[1]), parts[2]))
    world = Path(world)
    if world.exists() and not world.is_dir():
        raise checks.refuse("--world", str(world), "a folder")
    if not parsed and not world.is_dir():  # nothing to ship: only an existing world's manifest is rewritten
        raise checks.refuse("--world", str(world), "an existing world folder (or a --file to ship into a new one)")
    world.mkdir(parents=True, exist_ok=True)
    manifest_path = world / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"files": {}}
    commit = git_commit()
    for name, source, command in parsed:
        target = world / name
        copy_atomic(source, target)
        entry = {
            "sha256": sha256_file(target),
            "bytes": target.stat().st_size,
            "command": command,
            "data": data,
            "commit": commit["commit"],
            "commit_dirty": commit["dirty"],
        }
        for extra in ["config.yaml", *sorted(p.name for p in source.parent.glob("*report.json"))]:
            if (source.parent / extra).is_file():
                text = (source.parent / extra).read_text()
                entry.setdefault("records", {})[extra] = json.loads(text) if extra.endswith(".json") else text
        manifest["files"][name] = entry
        print(f"{target}: {entry['bytes'] / 2**20:.2f} MiB, sha256 {entry['sha256'][:16]}...")
    total = sum(e["bytes"] for e in manifest["files"].values())
    manifest["total_bytes"] = total
    write_json_atomic(manifest_path, manifest)
    print(f"{manifest_path}: {len(manifest['files'])} files, {total / 2**20:.2f} MiB in all")
    return manifest_path
