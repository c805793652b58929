"""A file is trusted by its content, not its timestamps (issue 56, item 2): weights, a fetched asset and a
protocol's prompt file edited in place with their size and mtime kept give the new sha256 in the record or a
refusal. The sha256 cache lives under ``paths.cache``; a large file's entry is checked at each run against a
sampled-block digest of its bytes, and a small file is hashed in full at each run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_in_process
from hydra.utils import instantiate
from PIL import Image

from lantern import files
from lantern.files import forget_inputs, inputs_read, sha256_cached, sha256_file


def edit_in_place(path: Path, offset: int) -> None:
    """Flip one byte of ``path`` at ``offset``, then set its mtime back: size and mtime are those of before."""
    before = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 1]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """Every file goes through the on-disk cache (as files of HASH_FULL_BYTES or more do), kept in tmp_path."""
    monkeypatch.setattr(files, "HASH_FULL_BYTES", 0)
    files.use_hash_cache_folder(tmp_path / "cache")
    forget_inputs()
    yield tmp_path / "cache" / "sha256.json"
    files.use_hash_cache_folder(None)
    forget_inputs()


@pytest.mark.parametrize("large", [False, True], ids=["hashed-in-full", "cached-on-disk"])
def test_a_file_edited_in_place_with_size_and_mtime_kept_gets_its_new_hash(tmp_path, monkeypatch, large):
    if large:
        monkeypatch.setattr(files, "HASH_FULL_BYTES", 0)
    files.use_hash_cache_folder(tmp_path / "cache")
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    forget_inputs()
    first = sha256_cached(path)
    assert (tmp_path / "cache" / "sha256.json").is_file() == large
    edit_in_place(path, 300_000)  # in no sampled block: the stat key (ctime) finds it
    forget_inputs()  # the next run
    assert sha256_cached(path) == sha256_file(path) != first
    files.use_hash_cache_folder(None)


def test_an_unchanged_large_file_is_read_from_the_cache_with_its_sampled_blocks(cached, monkeypatch):
    path = cached.parent.parent / "big.bin"
    path.write_bytes(os.urandom(1 << 20))
    first = sha256_cached(path)
    entry = next(iter(json.loads(cached.read_text())["entries"].values()))
    assert entry == {"sha256": first, "sample": files.sampled_digest(path, 1 << 20)}
    forget_inputs()
    calls = []
    monkeypatch.setattr(files, "sha256_file", lambda p: calls.append(p) or "0" * 64)
    assert sha256_cached(path) == first and not calls  # read from the disk cache, not rehashed


def test_the_sampled_blocks_catch_an_edit_that_keeps_every_stat_field(cached, monkeypatch):
    """A file system whose ctime did not move (a restored backup, a copy tool that sets times): the sampled
    digest is what finds the edit, within any sampled block (the first, the last and 62 spread between)."""
    path = cached.parent.parent / "big.bin"
    path.write_bytes(os.urandom(1 << 20))
    monkeypatch.setattr(files, "_stat_key", lambda real: (real, os.path.getsize(real)))  # blind to times
    first = sha256_cached(path)
    for offset in (0, (1 << 20) - 1, (1 << 19) + 10):
        edit_in_place(path, offset)
        forget_inputs()
        assert sha256_cached(path) == sha256_file(path) != first
        first = sha256_file(path)


def test_the_hash_cache_goes_to_the_folder_it_is_given_and_never_home(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "HASH_FULL_BYTES", 0)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LANTERN_CACHE")
    files.use_hash_cache_folder(tmp_path / "paths_cache")
    path = tmp_path / "w.bin"
    path.write_bytes(b"w" * 1000)
    forget_inputs()
    sha256_cached(path)
    assert (tmp_path / "paths_cache" / "sha256.json").is_file() and not (tmp_path / "home").exists()
    files.use_hash_cache_folder(None)
    forget_inputs()


def tiny_target_file(path: Path) -> Path:
    """The seeded random tiny_random_c2i target, saved as a LlamaGen file (``{"model": state_dict}``)."""
    from lantern.run.compose import compose_config

    bundle = instantiate(compose_config(["model=tiny_random_c2i"]).model.bundle)
    torch.save({"model": bundle.target.state_dict()}, path)
    return path


def test_weights_edited_in_place_give_the_new_sha256_in_the_record_or_a_refusal(tmp_path, monkeypatch, cached):
    gpt = tiny_target_file(tmp_path / "gpt.pt")
    overrides = [f"model.gpt_ckpt={gpt}", f"paths.cache={cached.parent}", "num_images=1"]
    status, _, err = run_in_process(overrides, tmp_path / "a", monkeypatch)
    assert status == 0, err
    before = json.loads((tmp_path / "a" / "metrics.json").read_text())["inputs"][str(gpt.resolve())]["sha256"]
    assert before == sha256_file(gpt)
    edit_in_place(gpt, gpt.stat().st_size - 3)  # the last tensor's last bytes: it still loads
    status, out, err = run_in_process(overrides, tmp_path / "a", monkeypatch)  # the finished run, rerun
    assert status == 2 and "already finished" not in out and "gpt.pt" in err, err
    status, _, err = run_in_process(overrides, tmp_path / "b", monkeypatch)  # a new run records the new hash
    assert status == 0, err
    after = json.loads((tmp_path / "b" / "metrics.json").read_text())["inputs"][str(gpt.resolve())]["sha256"]
    assert after == sha256_file(gpt) != before


def test_a_fetched_asset_edited_in_place_is_refused_before_any_work(tmp_path, monkeypatch, cached):
    from lantern.run.assets import fetching
    from lantern.run.assets.check import check_assets
    from lantern.run.assets.store import AssetError

    folder = tmp_path / "registry"
    folder.mkdir()
    (folder / "one.yaml").write_text(
        "fake_gpt: {dest: fake/gpt.pt, url: 'https://example.invalid/gpt.pt', licence: test, approx_bytes: 10}\n"
    )
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "assets"
    (root / "fake").mkdir(parents=True)
    (root / "fake/gpt.pt").write_bytes(os.urandom(1 << 16))
    model = {"name": "tiny_random_c2i", "gpt_ckpt": str(root / "fake/gpt.pt"), "assets": {"gpt_ckpt": "fake_gpt"}}
    resolved = {"paths": {"assets": str(root)}, "model": {**model, "bundle": {"gpt_ckpt": model["gpt_ckpt"]}}}
    fetching.fetch(resolved, say=lambda _: None)  # offline: the file is there, so it is verified and locked
    forget_inputs()
    check_assets(resolved)
    edit_in_place(root / "fake/gpt.pt", 1000)
    forget_inputs()
    with pytest.raises(AssetError, match="gpt.pt"):
        check_assets(resolved)


def test_a_protocols_prompt_file_edited_in_place_is_refused_or_recorded_anew(tmp_path, cached):
    from lantern.cli.preflight import resolve
    from lantern.errors import ConfigError
    from lantern.metrics.protocol import Protocol, prompt_list_sha256
    from lantern.run.compose import compose_config

    captions = tmp_path / "captions_val2017_longest.json"  # LANTERN's published list: a JSON list of captions
    captions.write_text(json.dumps([f"a photo of thing {i}" for i in range(4)]))
    reference = tmp_path / "reference"
    reference.mkdir()
    for i in range(3):
        Image.fromarray(np.full((256, 256, 3), 40 * i, np.uint8)).save(reference / f"{i:06d}.png")
    clip = tmp_path / "clip.pt"
    clip.write_bytes(b"stand-in weights")
    overrides = [
        "protocol=lantern_coco17_5k",
        "model=llamagen_t2i_xl_256",
        *(f"model.{key}=unused" for key in ("gpt_ckpt", "vq_ckpt", "text_encoder_path", "drafter_ckpt")),
        f"prompts.path={captions}",
        f"metrics.fid.reference.path={reference}",
        *(f"metrics.{key}={clip}" for key in ("precision_recall.weights", "hps.checkpoint", "clip.pretrained")),
        "protocol.metrics.clip.sha256=null",
        "protocol.reference.count=3",
        "protocol.prompts.count=4",
        "protocol.speed.prompts=4",
        "num_images=4",
    ]
    pinned = prompt_list_sha256([f"a photo of thing {i}" for i in range(4)])

    def check(*extra: str) -> str:
        """What run.py reads and checks before its folder: the prompt file's sha256 as the record lists it."""
        forget_inputs()
        resolved = resolve(compose_config([*overrides, *extra]))
        prompts = instantiate(resolved["prompts"])
        Protocol.from_config(resolved["protocol"]).check(resolved, prompts, resolved["num_images"])
        return inputs_read()[str(captions.resolve())]["sha256"]

    before = check(f"protocol.prompts.sha256={pinned}")
    assert before == sha256_file(captions)
    edit_in_place(captions, captions.read_bytes().index(b"thing 2") + 2)  # "thing" -> "thhng"
    with pytest.raises(ConfigError, match=f"protocol lantern_coco17_5k pins {pinned[:16]}"):
        check(f"protocol.prompts.sha256={pinned}")  # pinned: refused
    assert check("protocol.prompts.sha256=null") == sha256_file(captions) != before  # unpinned: the new hash
