"""``scripts/fetch.py --list`` of every real preset and protocol names only files that upstream holds, as the
listings in ``tests/fixtures/hub/listings/`` record them (revision, file names; no network), and every source
of the registry has a listing."""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

import pytest
import yaml

from lantern.run.assets.fetching import plan
from lantern.run.assets.listing import rows
from lantern.run.assets.registry import load_registry

REPO = Path(__file__).resolve().parents[1]
LISTINGS = REPO / "tests/fixtures/hub/listings"
WORLD = {"fashion_t2i"}  # ships with the repository


def listings() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(LISTINGS.glob("*.json"))]


def real_models() -> list[str]:
    names = sorted(p.stem for p in (REPO / "conf/model").glob("*.yaml"))
    return [n for n in names if not n.startswith("tiny_random") and n not in WORLD]


def protocols_with_assets() -> list[str]:
    found = []
    for path in sorted((REPO / "conf/protocol").glob("*.yaml")):
        if (yaml.safe_load(path.read_text()) or {}).get("assets"):
            found.append(path.stem)
    return found


def composed(*overrides: str) -> dict:
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch import compose_run_config

    return compose_run_config(list(overrides))


def _hub_listing(repo: str) -> dict:
    found = [entry for entry in listings() if entry.get("repo") == repo]
    assert len(found) == 1, f"no listing of hf://{repo} in {LISTINGS}"
    return found[0]


def _check_row(row) -> None:
    if row.source.startswith("recipe "):
        return
    if row.repo is None:  # a URL and its mirrors
        urls = row.source.split(" | ")
        found = [entry for entry in listings() if entry["kind"] == "url" and entry["urls"] == urls]
        assert found, f"{row.asset}: no listing holds the URLs {urls}"
        assert row.name in {f["name"] for f in found[0]["files"]}, (row.asset, row.name)
        return
    entry = _hub_listing(row.repo)
    names = {f["name"] for f in entry["files"]}
    if entry["revision"] is not None and len(row.revision) == 40:
        assert row.revision == entry["revision"], f"{row.asset}: pins {row.revision}, the listing {entry['revision']}"
    if row.name.startswith("<files matching "):
        pattern = row.name[len("<files matching ") : -1]
        layouts = [name for layout in entry.get("layouts", []) for name in layout.get("weights", [])]
        assert any(fnmatch.fnmatch(n, pattern) for n in names | set(layouts)), (row.asset, pattern)
    elif row.name.startswith("<weights named by "):
        assert row.name[len("<weights named by ") : -1] in names, (row.asset, row.name)
    else:
        assert row.name in names, f"{row.asset}: hf://{row.repo} holds no {row.name!r} ({sorted(names)})"


@pytest.mark.parametrize("model", real_models())
def test_every_real_model_preset_lists_only_files_upstream_holds(model, tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_ASSETS", str(tmp_path / "assets"))
    monkeypatch.delenv("LANTERN_ASSET_REGISTRY", raising=False)
    found = rows(*plan(composed(f"model={model}")))
    assert found, f"model={model} reads no asset"
    for row in found:
        _check_row(row)


@pytest.mark.parametrize("protocol", protocols_with_assets())
def test_every_protocol_lists_only_files_upstream_holds(protocol, tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_ASSETS", str(tmp_path / "assets"))
    monkeypatch.delenv("LANTERN_ASSET_REGISTRY", raising=False)
    found = rows(*plan(composed("model=llamagen_t2i_xl_256", "decoding=ar", f"protocol={protocol}")))
    assert {row.asset for row in found} - {"llamagen_t2i_xl_stage1_256", "llamagen_vq_ds16_t2i", "flan_t5_xl"}
    for row in found:
        _check_row(row)


def test_every_registry_source_has_a_listing_and_every_listing_a_reader():
    registry = load_registry(str(REPO / "conf/assets"))
    read = {name for entry in listings() for name in entry["read_by"]}
    sourced = {name for name, asset in registry.items() if asset.kind != "derived"}
    assert sourced <= read, f"no listing for {sorted(sourced - read)}"
    assert read <= set(registry), f"listings name assets the registry lacks: {sorted(read - set(registry))}"
    for entry in listings():
        assert entry["format"] == 1 and entry["kind"] in ("hub", "url") and entry["evidence"], entry
        for file in entry["files"]:
            assert file["sha256"] is None or len(file["sha256"]) == 64, file
        if entry["kind"] == "hub":
            assert entry["revision"] is None or len(entry["revision"]) == 40, entry["repo"]
            for name in entry["read_by"]:
                assert registry[name].source.repo == entry["repo"], (name, entry["repo"])
        else:
            for name in entry["read_by"]:
                assert list(registry[name].source.urls()) == entry["urls"], name


def test_published_pins_in_the_registry_match_the_listings():
    """A sha256, md5 or size the registry pins is the one the listing records (one place for each fact)."""
    registry = load_registry(str(REPO / "conf/assets"))
    for entry in listings():
        by_name = {f["name"]: f for f in entry["files"]}
        for name in entry["read_by"]:
            asset = registry[name]
            if asset.kind != "file":
                continue
            file = by_name[asset.source.file if asset.source.url is None else entry["files"][0]["name"]]
            for key in ("sha256", "md5", "size"):
                pinned = asset.pinned[key]
                assert pinned is None or pinned == file[key], (name, key, pinned, file[key])
