"""Provenance: every file a run reads is hashed into its record, and a resume compares contents, not paths."""

import json
import os
import subprocess
import sys

from helpers import REPO

from lantern import files


def run(tmp_path, out, *overrides):
    return subprocess.run(
        [
            sys.executable,
            "run.py",
            "num_images=4",
            "batch_size=2",
            "warmup=0",
            "speedup_baseline=null",
            "wandb.mode=disabled",
            *overrides,
            f"hydra.run.dir={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_record_holds_the_sha256_of_every_file_read_and_a_changed_prompt_file_refuses_the_resume(tmp_path):
    prompts = tmp_path / "captions.txt"
    prompts.write_text("a white sneaker\na long dress\n")
    out = tmp_path / "run"
    first = run(tmp_path, out, "prompts=caption_file", f"prompts.path={prompts}")
    assert first.returncode == 0, first.stderr
    record = json.loads((out / "metrics.json").read_text())
    gpt = str((REPO / "worlds" / "fashion_mnist" / "gpt.safetensors").resolve())
    assert record["inputs"][gpt] == {"role": "target", "sha256": files.sha256_file(gpt), "bytes": os.path.getsize(gpt)}
    assert record["inputs"][str(prompts.resolve())]["role"] == "prompts"
    # An interrupted run: images 0 and 1 finished, no record yet.
    (out / "metrics.json").unlink()
    for index in (2, 3):
        (out / f"00000{index}.png").unlink()
    kept = {p.name: p.read_bytes() for p in out.glob("*.png")}
    prompts.write_text("a bag\na coat\n")  # rewritten in place, same path
    again = run(tmp_path, out, "prompts=caption_file", f"prompts.path={prompts}")
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert again.returncode == 2 and len(lines) == 1 and str(prompts.resolve()) in lines[0], again.stderr
    assert lines[0].startswith("error: run folder") and "restore that file" in lines[0]
    assert {p.name: p.read_bytes() for p in out.glob("*.png")} == kept and not (out / "metrics.json").exists()


def test_a_finished_run_whose_weights_changed_is_not_reported_as_done(tmp_path):
    world = tmp_path / "world"
    world.mkdir()
    source = REPO / "worlds" / "fashion_mnist"
    for path in source.iterdir():
        (world / path.name).write_bytes(path.read_bytes())
    out = tmp_path / "run"
    first = run(tmp_path, out, f"model.bundle.folder={world}")
    assert first.returncode == 0, first.stderr
    inputs = json.loads((out / "metrics.json").read_text())["inputs"]
    assert str((world / "vq.safetensors").resolve()) in inputs
    data = bytearray((world / "classifier.safetensors").read_bytes())
    data[-1] ^= 1
    (world / "classifier.safetensors").write_bytes(bytes(data))  # a world file the record lists
    again = run(tmp_path, out, f"model.bundle.folder={world}")
    assert again.returncode == 2 and "classifier.safetensors" in again.stderr and "already finished" not in again.stdout


def test_hashes_are_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(files, "HASH_FULL_BYTES", 1 << 20)  # 1 MiB and more: remembered on disk
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * (1 << 20))
    first = files.sha256_cached(path)
    assert first == files.sha256_file(path) and (tmp_path / "cache" / "sha256.json").is_file()
    files.forget_inputs()  # the next run
    calls = []
    monkeypatch.setattr(files, "sha256_file", lambda p: calls.append(p) or "0" * 64)
    assert files.sha256_cached(path) == first and not calls  # read from the disk cache, not rehashed
    path.write_bytes(b"y" * (1 << 20 + 1))
    assert files.sha256_cached(path) == "0" * 64 and calls  # another size: hashed again


def test_an_altered_hash_cache_is_recomputed_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(files, "HASH_FULL_BYTES", 1 << 20)
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * (1 << 20))
    clean = files.sha256_cached(path)
    cache = tmp_path / "cache" / "sha256.json"
    saved = json.loads(cache.read_text())
    saved["entries"] = {entry: "0" * 64 for entry in saved["entries"]}  # the wrong hash, digest kept
    cache.write_text(json.dumps(saved))
    files.forget_inputs()  # the next run
    capsys.readouterr()
    assert files.sha256_cached(path) == clean
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not match the digest" in lines[0] and "sha256.json" in lines[0]
    files.forget_inputs()  # the next run
    assert files.sha256_cached(path) == clean and not capsys.readouterr().err  # rewritten clean
