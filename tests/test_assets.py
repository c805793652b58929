"""The asset registry and the presets: every real-weights model preset and every COCO/Parti protocol names
its assets and points its path defaults at them; a run checks them against the lock before any work; the
world ships its FID reference statistics, so its first FID run extracts no reference features."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from lantern.run.assets import fetching
from lantern.run.assets.check import check_assets
from lantern.run.assets.registry import load_registry, needed
from lantern.run.assets.store import AssetError

REPO = Path(__file__).resolve().parents[1]
PATH_KEYS = ("gpt_ckpt", "vq_ckpt", "text_encoder_path", "drafter_ckpt")
NO_FILES = {"fashion_t2i"}  # the shipped world; tiny_random_* read no files


def presets(group: str) -> dict[str, dict]:
    return {p.stem: yaml.safe_load(p.read_text()) for p in sorted((REPO / "conf" / group).glob("*.yaml"))}


def test_the_registry_loads_and_every_entry_has_a_source_and_a_licence():
    registry = load_registry(str(REPO / "conf/assets"))
    assert len(registry) >= 40
    for asset in registry.values():
        assert asset.licence != "unknown" and not asset.dest.startswith("/"), asset.name
        assert asset.kind == "derived" or asset.source.url or asset.source.repo, asset.name
        assert asset.approx_bytes or asset.kind == "derived", asset.name  # the README's sizes come from these
    assert registry["openai_clip_vit_b32"].sha256.startswith("40d36571")


def test_every_real_weights_preset_names_its_assets_and_defaults_to_them():
    registry = load_registry(str(REPO / "conf/assets"))
    for name, node in presets("model").items():
        if name.startswith("tiny_random") or name in NO_FILES:
            continue
        named = node.get("assets") or {}
        assert "gpt_ckpt" in named, f"model preset {name} reads real weights but names no assets"
        for key in PATH_KEYS:
            if node.get(key) == "???":
                pytest.fail(f"model preset {name}: {key} has no default; point it at an asset")
            for asset in [named[key]] if isinstance(named.get(key), str) else named.get(key) or []:
                assert node[key] == "${paths.assets}/" + registry[asset].dest, (name, key)


def test_every_coco_or_parti_protocol_names_its_assets():
    registry = load_registry(str(REPO / "conf/assets"))
    for name, node in presets("protocol").items():
        protocol = node.get("protocol") or {}
        source = str((protocol.get("prompts") or {}).get("source", ""))
        if "COCO" not in source and "Parti" not in source:
            continue
        named = (node.get("assets") or {}).get("protocol") or {}
        assert "prompts/path" in named, f"protocol {name} reads {source} but names no asset for it"
        for key, asset in named.items():
            value = node
            for part in key.split("/"):
                value = value[part]
            assert value == "${paths.assets}/" + registry[asset].dest, (name, key)
        for asset in (node.get("assets") or {}).get("extra") or ():
            assert asset in registry


def test_a_run_needs_the_drafter_only_when_its_decoder_drafts():
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch import compose_run_config

    lantern = {a.name for _, a in needed(compose_run_config(["model=llamagen_t2i_xl_256"]))}
    ar = {a.name for _, a in needed(compose_run_config(["model=llamagen_t2i_xl_256", "decoding=ar"]))}
    assert lantern - ar == {"lantern_llamagen_drafter"}
    given = compose_run_config(["model=llamagen_t2i_xl_256", "decoding=ar", "model.gpt_ckpt=/elsewhere/gpt.pt"])
    assert "llamagen_t2i_xl_stage1_256" not in {a.name for _, a in needed(given)}  # the user's own file


@pytest.fixture
def local(tmp_path, monkeypatch):
    """A registry of one unpinned file, placed by hand (as the offline error says) and locked by a fetch."""
    folder = tmp_path / "registry"
    folder.mkdir()
    (folder / "one.yaml").write_text(
        "fake_gpt: {dest: fake/gpt.pt, url: 'https://example.invalid/gpt.pt', licence: test, approx_bytes: 10}\n"
    )
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "assets"
    (root / "fake").mkdir(parents=True)
    (root / "fake/gpt.pt").write_bytes(b"weights")
    resolved = {
        "paths": {"assets": str(root)},
        "model": {"name": "tiny_random_c2i", "gpt_ckpt": str(root / "fake/gpt.pt"), "assets": {"gpt_ckpt": "fake_gpt"}},
    }
    resolved["model"]["bundle"] = {"gpt_ckpt": resolved["model"]["gpt_ckpt"]}
    return root, resolved


def test_a_run_refuses_an_unlocked_then_accepts_a_locked_then_refuses_a_changed_file(local):
    root, resolved = local
    with pytest.raises(AssetError, match="is not verified yet; fetch it with `python scripts/fetch.py"):
        check_assets(resolved)
    fetching.fetch(resolved, say=lambda _: None)  # offline: the file is there, so it is only verified and locked
    check_assets(resolved)
    (root / "fake/gpt.pt").write_bytes(b"w3ights")
    with pytest.raises(AssetError, match="changed since it was fetched"):
        check_assets(resolved)
    (root / "fake/gpt.pt").unlink()
    with pytest.raises(AssetError, match="model.gpt_ckpt is required: .* is not there"):
        check_assets(resolved)


def test_run_py_refuses_a_file_changed_after_locking_before_any_work(local, tmp_path):
    root, resolved = local
    fetching.fetch(resolved, say=lambda _: None)
    (root / "fake/gpt.pt").write_bytes(b"w3ights")
    out = tmp_path / "run"
    env = dict(os.environ, LANTERN_ASSETS=str(root), PYTHONPATH=str(REPO))
    args = [sys.executable, str(REPO / "run.py"), "model=tiny_random_c2i", "decoding=ar", "num_images=1"]
    args += ["model.gpt_ckpt=${paths.assets}/fake/gpt.pt", "+model.assets={gpt_ckpt: fake_gpt}", f"hydra.run.dir={out}"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "gpt.pt' (asset fake_gpt) has sha256" in proc.stderr and not out.exists()


class NoExtraction:
    """A feature network that must not run: the world's reference statistics are shipped."""

    net_id = "inception-2015-12-05_clean-pil-bicubic-299"

    def features(self, *args, **kwargs):
        raise AssertionError("reference features were extracted")


def test_the_world_ships_its_fid_reference_statistics(tmp_path):
    from lantern.metrics.classifier import fashion_test_images
    from lantern.metrics.fid import FEATURE_NET_ID, FID

    assert NoExtraction.net_id == FEATURE_NET_ID
    fid = FID(
        "fashion_mnist_test_32", lambda: fashion_test_images(None), cache_dir=str(tmp_path), extractor=NoExtraction()
    )
    stats = fid.reference_stats()
    assert stats.count == 10000 and stats.mu.shape == (2048,) and stats.sigma.shape == (2048, 2048)
    assert np.allclose(stats.sigma, stats.sigma.T) and not list(tmp_path.iterdir())  # nothing computed or cached
    shipped = [p for p in (REPO / "worlds/fashion_mnist").glob("*.npz")]
    assert len(shipped) == 1 and shipped[0].stat().st_size < 20 << 20
    with np.load(shipped[0]) as data:
        assert data["mu"].dtype == np.float32 and data["sigma"].dtype == np.float32


def test_an_altered_shipped_statistics_file_is_refused(tmp_path, monkeypatch):
    import shutil

    from lantern.errors import CheckpointError
    from lantern.metrics import fid, fid_stats
    from lantern.metrics.classifier import fashion_test_images

    world = tmp_path / "worlds/fashion_mnist"
    world.mkdir(parents=True)
    (shipped,) = (REPO / "worlds/fashion_mnist").glob("*.npz")
    shutil.copy(REPO / "worlds/fashion_mnist/manifest.json", world / "manifest.json")
    data = bytearray(shipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of sigma flipped
    (world / shipped.name).write_bytes(bytes(data))
    monkeypatch.setattr(fid_stats, "REPO_ROOT", tmp_path)
    metric = fid.FID("fashion_mnist_test_32", lambda: fashion_test_images(None), extractor=NoExtraction())
    with pytest.raises(CheckpointError, match="was altered"):
        metric.reference_stats()
