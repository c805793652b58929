"""Train an EAGLE-style drafter for the embedded Fashion-MNIST world's GPT in one command.

    python scripts/train_drafter.py                                  # self-distillation on the shipped world
    python scripts/train_drafter.py data=images out_dir=outputs/train/drafter_images
    python scripts/train_drafter.py steps=20 num_samples=256 out_dir=outputs/train/drafter_try

The target (the world's GPT) is frozen; only the drafter (``fc`` and one decoder layer) trains, with
the EAGLE loss of :mod:`lantern.training.drafter`. Data, chosen by ``data``:

* ``self`` (default): ``num_samples`` token sequences the target samples itself at the world's
  recommended settings (CFG 3.0, temperature 1.0), sample ``i`` for class ``i % 10`` with caption
  template ``(i // 10) % 7``, seeded per sample; cached in ``out_dir/codes_self.pt`` (keyed by the
  GPT file's sha256 and the settings) and resumed if interrupted;
* ``images``: the 60k train split tokenised by the world's VQ (cached in ``out_dir/codes_train.pt``),
  each image drawing one of its class's 7 captions per step.

The objective and the drafter are generic over the target's condition (caption states or class
ids); this script is specific to the Fashion-MNIST world where data is concerned (its captions,
its train and test splits). Rerunning the same command resumes from ``out_dir/checkpoint.pt``. At
the end ``out_dir`` holds ``drafter.safetensors`` (fp16, with the metadata ``load_drafter`` checks),
``drafter_report.json`` (held-out top-1 agreement with the target on test images tokenised by the
VQ, the last training logs, wall times), ``config.yaml`` and ``log.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from lantern import REPO_ROOT
from lantern.cli.main import run_hydra, run_or_exit
from lantern.training.jobs.drafter import REPORT_NAME, train


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="train_drafter")
def main(cfg: DictConfig) -> None:
    """Entry point: train, report, print a one-line summary; user errors exit 2 with one line."""
    report = run_or_exit(lambda: train(cfg), cfg.out_dir)
    held_out = report["held_out"]
    print(
        f"{report['weights']}: held-out top-1 agreement {held_out['top1']:.4f} (loss {held_out['loss']:.4f}) on "
        f"{held_out['images']} test images; report in {Path(cfg.out_dir) / REPORT_NAME}"
    )


if __name__ == "__main__":
    run_hydra(main)
