"""Train the embedded world's text-to-image GPT on Fashion-MNIST in one command.

    python scripts/train_gpt.py                          # needs outputs/train/vq/vq.safetensors
    python scripts/train_gpt.py steps=200 out_dir=outputs/train/gpt_try

The 60k train split is tokenised once by the trained VQ (cached in ``out_dir/codes_train.pt``, keyed
by the tokenizer file's sha256); the 70 caption templates are encoded once by all-MiniLM-L6-v2.
Rerunning the same command resumes from ``out_dir/checkpoint.pt``. At the end ``out_dir`` holds
``gpt.safetensors`` (fp16), ``config.yaml`` and ``log.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from lantern import REPO_ROOT
from lantern.cli.main import run_hydra, run_or_exit
from lantern.training.jobs.gpt import WEIGHTS_NAME, train


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="train_gpt")
def main(cfg: DictConfig) -> None:
    """Entry point: train and print a summary; user errors exit 2 with one line."""
    summary = run_or_exit(lambda: train(cfg), cfg.out_dir)
    print(f"{Path(cfg.out_dir) / WEIGHTS_NAME}: {summary['steps']} steps, last logs {summary['logs']}")


if __name__ == "__main__":
    run_hydra(main)
