"""Copy trained world files into a shipped world folder and write its manifest.

    python scripts/ship_world.py --world worlds/fashion_mnist \
        --file vq.safetensors=outputs/train/vq/vq.safetensors="python scripts/train_vq.py" \
        --file gpt.safetensors=outputs/train/gpt/gpt.safetensors="python scripts/train_gpt.py"

Each ``--file NAME=SOURCE=COMMAND`` copies SOURCE to WORLD/NAME and records its sha256, size, the
command that produced it, the data, the commit and, when SOURCE's folder has one, the training
config and report. Files already in the manifest and not named again are kept as they are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lantern.files import copy_atomic, sha256_file, write_json_atomic
from lantern.models.world.load import MANIFEST_NAME
from lantern.results.provenance import git_commit

DATA = "Fashion-MNIST (Zalando Research, MIT licence): 60k train split from the Debian package dataset-fashion-mnist"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", required=True, help="the shipped world folder")
    parser.add_argument("--file", action="append", default=[], help="NAME=SOURCE=COMMAND")
    parser.add_argument("--data", default=DATA)
    args = parser.parse_args()
    world = Path(args.world)
    world.mkdir(parents=True, exist_ok=True)
    manifest_path = world / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"files": {}}
    commit = git_commit()
    for spec in args.file:
        name, source, command = spec.split("=", 2)
        source = Path(source)
        target = world / name
        copy_atomic(source, target)
        entry = {
            "sha256": sha256_file(target),
            "bytes": target.stat().st_size,
            "command": command,
            "data": args.data,
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


if __name__ == "__main__":
    main()
