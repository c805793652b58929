"""Train the embedded world's VQ tokenizer on Fashion-MNIST in one command.

    python scripts/train_vq.py                                   # 60k train split, writes outputs/train/vq
    python scripts/train_vq.py steps=300 out_dir=outputs/train/vq_try num_threads=1

Rerunning the same command resumes from ``out_dir/checkpoint.pt`` and ends in the same state as an
uninterrupted run. At the end ``out_dir`` holds ``vq.safetensors`` (fp16 weights, including the
``quantize.codebook_used`` buffer so the file loads strictly into :class:`VQModel`; its ids are
below 2048 and exact in fp16), ``vq_report.json`` (reconstruction MSE and codebook usage of the
exported fp16 weights on the shipped test split, the config and the environment),
``config.yaml``, ``log.jsonl`` and ``recon.png`` (test images above their reconstructions).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from lantern import REPO_ROOT
from lantern.cli.main import run_hydra, run_or_exit
from lantern.training.jobs.vq import REPORT_NAME, train


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="train_vq")
def main(cfg: DictConfig) -> None:
    """Entry point: train, report, print a one-line summary; user errors exit 2 with one line."""
    report = run_or_exit(lambda: train(cfg), cfg.out_dir)
    test = report["test"]
    print(
        f"{report['weights']}: test MSE {test['mse']:.5f} (PSNR {test['psnr']:.2f} dB), "
        f"{test['codes_used']} codes used ({100 * test['codebook_usage']:.1f}%), "
        f"perplexity {test['perplexity']:.0f}; report in {Path(cfg.out_dir) / REPORT_NAME}"
    )


if __name__ == "__main__":
    run_hydra(main)
