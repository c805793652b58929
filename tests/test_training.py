"""The generic training loop (resume, atomic checkpoints, schedule) and the VQ objective."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from lantern.errors import ConfigError
from lantern.models.vq_model import VQConfig, VQModel, vq_config
from lantern.training import loop as loop_module
from lantern.training.loop import CHECKPOINT_NAME, CONFIG_NAME, EpochBatches, Trainer, warmup_cosine
from lantern.training.vq import VQObjective, evaluate_vq

TINY_VQ = VQConfig(
    codebook_size=64, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), z_channels=8, num_res_blocks=1, norm_groups=4
)


def _images(n: int = 8, size: int = 8, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=gen) * 2 - 1  # (n, 3, size, size)


def _vq_trainer(out_dir, max_steps: int, ckpt_every: int = 100, restart_every: int = 2, lr: float = 3e-3):
    """A tiny VQ trainer over 8 random 8x8 images (batches of 4, dropout on so RNG state matters)."""
    torch.manual_seed(0)
    model = VQModel(VQConfig(**{**TINY_VQ.__dict__, "dropout": 0.1}))
    images = _images()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    objective = VQObjective(model, restart_every=restart_every, buffer_size=64)
    batches = EpochBatches(len(images), 4, seed=1, load=lambda idx: images[idx])
    config = {"lr": lr, "steps": max_steps, "nested": {"a": 1}}
    return Trainer(
        model,
        optimizer,
        objective,
        batches,
        max_steps=max_steps,
        out_dir=out_dir,
        ckpt_every=ckpt_every,
        log_every=2,
        progress=False,
        grad_clip=1.0,
        lr_schedule=warmup_cosine(2, 6, 0.1),
        config=config,
    )


def test_warmup_cosine_shape():
    sched = warmup_cosine(4, 14, min_ratio=0.1)
    assert sched(0) == pytest.approx(0.25)
    assert sched(3) == pytest.approx(1.0)
    assert sched(4) == pytest.approx(1.0)
    assert sched(9) == pytest.approx(0.1 + 0.9 * 0.5)
    assert sched(14) == pytest.approx(0.1)
    assert sched(100) == pytest.approx(0.1)
    with pytest.raises(ConfigError):
        warmup_cosine(-1, 10)


def test_epoch_batches_deterministic_and_resumable():
    batches = EpochBatches(10, 3, seed=5, load=lambda idx: idx.clone())
    assert len(batches) == 3
    first = list(batches(0))
    assert [b.tolist() for b in first] == [b.tolist() for b in batches(0)]
    assert [b.tolist() for b in batches(0, 2)] == [first[2].tolist()]
    assert torch.cat(list(batches(1))).tolist() != torch.cat(first).tolist()
    with pytest.raises(ConfigError):
        EpochBatches(2, 3, seed=0, load=lambda idx: idx)


def test_loss_goes_down(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(16, 4)
    y = x.sum(dim=1, keepdim=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step_fn(batch):
        loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        return loss, {}

    batches = EpochBatches(16, 8, seed=0, load=lambda idx: (x[idx], y[idx]))
    trainer = Trainer(model, optimizer, step_fn, batches, max_steps=20, out_dir=tmp_path, log_every=1, progress=False)
    trainer.fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(losses) == 20
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])


def test_vq_loss_goes_down(tmp_path):
    trainer = _vq_trainer(tmp_path, max_steps=20, restart_every=0, lr=1e-2)
    trainer.lr_schedule = None
    trainer.fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.8 * losses[0]


def test_resume_matches_uninterrupted_run(tmp_path):
    full = _vq_trainer(tmp_path / "full", max_steps=6, ckpt_every=3)
    full.fit()
    part = _vq_trainer(tmp_path / "split", max_steps=3, ckpt_every=3)
    part.fit()
    assert torch.load(tmp_path / "split" / CHECKPOINT_NAME, weights_only=True)["step"] == 3
    resumed = _vq_trainer(tmp_path / "split", max_steps=6, ckpt_every=3)
    summary = resumed.fit()
    assert summary["resumed_from"] == 3 and summary["steps"] == 6 and summary["train_wall_s"] > 0
    want, got = full.model.state_dict(), resumed.model.state_dict()
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    assert torch.equal(full.step_fn.buffer, resumed.step_fn.buffer)
    exported = load_file(tmp_path / "split" / "model.safetensors")
    assert torch.equal(exported["quantize.embedding.weight"], got["quantize.embedding.weight"])
    assert (tmp_path / "split" / CONFIG_NAME).read_text().startswith("lr:")


def test_a_resumed_log_lists_every_step_once(tmp_path):
    """The killed run logged steps after its last checkpoint (and a line cut short); the resumed run logs
    them again, so the log is cut back to the checkpoint's step first."""
    full = _vq_trainer(tmp_path / "full", max_steps=6, ckpt_every=3)
    full.fit()
    part = _vq_trainer(tmp_path / "split", max_steps=3, ckpt_every=3)
    part.fit()
    log = tmp_path / "split" / loop_module.LOG_NAME
    log.write_text(log.read_text() + json.dumps({"step": 4, "loss": 1.0}) + "\n" + '{"step": 5, "lo')
    _vq_trainer(tmp_path / "split", max_steps=6, ckpt_every=3).fit()

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 3, 4, 6]  # 3: the first run's last step, logged as it ended
    assert lines[2]["loss"] != 1.0  # step 4 is the resumed run's line, not the killed run's


def test_resume_refuses_a_checkpoint_trained_from_a_file_that_changed_since(tmp_path):
    """Kill, change the tokenizer in place, rerun: continuing would train on codes of two tokenizers."""
    from lantern import files

    vq = tmp_path / "vq.safetensors"
    vq.write_bytes(b"first tokenizer")
    files.note_input(vq, "tokenizer")  # what load_weights does for the job's inputs
    _vq_trainer(tmp_path / "run", max_steps=2, ckpt_every=2).fit()
    vq.write_bytes(b"another tokenizer")
    files.note_input(vq, "tokenizer")
    with pytest.raises(ConfigError, match=r"was trained from .*vq\.safetensors.* which now has"):
        _vq_trainer(tmp_path / "run", max_steps=4, ckpt_every=2).fit()
    files.forget_inputs()


def test_resume_refuses_a_changed_config(tmp_path):
    _vq_trainer(tmp_path, max_steps=2, ckpt_every=1).fit()
    other = _vq_trainer(tmp_path, max_steps=4, lr=1e-3)
    with pytest.raises(ConfigError, match="different config"):
        other.fit()
    beyond = _vq_trainer(tmp_path, max_steps=1)
    with pytest.raises(ConfigError, match="beyond max_steps"):
        beyond.fit()


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    trainer = _vq_trainer(tmp_path, max_steps=2, ckpt_every=1)
    trainer.fit()
    path = tmp_path / CHECKPOINT_NAME
    before = path.read_bytes()

    def full_disk(fd):  # the bytes went to the temporary file, the disk refuses to keep them
        raise OSError(errno.ENOSPC, "No space left on device")

    import errno

    from lantern import files

    monkeypatch.setattr(files.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        trainer.save_checkpoint()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == sorted(["checkpoint.pt", "config.yaml", "log.jsonl", "model.safetensors"])


def test_dead_code_restart_increases_usage():
    torch.manual_seed(0)
    model = VQModel(TINY_VQ)
    images = _images(16, seed=3)
    with torch.no_grad():
        # Collapse the codebook onto one direction: nearly every code is dead.
        model.quantize.embedding.weight.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(64, 4) * 0.01)
        model.quantize.embedding.weight[0] = torch.tensor([0.0, 1.0, 0.0, 0.0]) * 0.01
    before = evaluate_vq(model, images)["codes_used"]
    objective = VQObjective(model, restart_every=1, buffer_size=1024)
    objective(images)
    restarted = objective.after_step(1)["restarted"]
    after = evaluate_vq(model, images)["codes_used"]
    assert before <= 2
    assert restarted > 10
    assert after > 4 * before


def test_evaluate_vq_reports_usage_and_mse():
    torch.manual_seed(0)
    model = VQModel(TINY_VQ)
    images = _images(4)
    metrics = evaluate_vq(model, images, batch_size=3)
    # The same figures computed directly, in one batch.
    with torch.no_grad():
        codes = model.encode(images)  # (4, 4, 4)
        recon = model.decode_codes(codes)  # (4, C, H, W)
    mse = float((recon - images).pow(2).mean())
    counts = torch.bincount(codes.flatten(), minlength=64).double()
    freq = counts[counts > 0] / counts.sum()
    assert metrics["num_images"] == 4 and metrics["num_tokens"] == 4 * 16
    assert metrics["codes_used"] == int((counts > 0).sum()) and metrics["codebook_usage"] == metrics["codes_used"] / 64
    assert metrics["mse"] == pytest.approx(mse, rel=1e-5)
    assert metrics["psnr"] == pytest.approx(10 * math.log10(4.0 / mse), rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(float((-(freq * freq.log()).sum()).exp()), rel=1e-6)


def test_fashion_preset_fits_the_world():
    cfg = vq_config("VQ-fashion")
    assert cfg.downsample == 4 and cfg.codebook_size == 2048 and cfg.codebook_embed_dim == 8 and cfg.l2_norm
    model = VQModel(cfg)
    assert sum(p.numel() for p in model.parameters()) * 2 < 4e6  # fp16 bytes
    with torch.no_grad():
        codes = model.encode(_images(1, size=32))
    assert codes.shape == (1, 8, 8)
