"""Train the prompt-faithfulness classifier of the embedded world on Fashion-MNIST in one command.

    python scripts/train_classifier.py                                  # 60k train split, 3 epochs
    python scripts/train_classifier.py epochs=1 out_dir=outputs/train/classifier_try

The train split comes from ``data_root`` (default ``/usr/share/datasets/fashion-mnist``, apt
package ``dataset-fashion-mnist``); the test accuracy is measured on the shipped 10k test split
(``test_root`` to override), fed exactly as generated images arrive: uint8 (N, 32, 32, 3).
Rerunning the same command resumes from ``out_dir/checkpoint.pt``. At the end ``out_dir`` holds
``classifier.safetensors`` (fp16 weights), ``classifier_report.json`` (test accuracy of the
exported fp16 weights, per class, the config and the environment), ``config.yaml`` and
``log.jsonl``. User errors (missing data, bad values) print one line and exit with status 2.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from lantern import REPO_ROOT
from lantern.cli.main import run_hydra, run_or_exit
from lantern.training.jobs.classifier import REPORT_NAME, train


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="train_classifier")
def main(cfg: DictConfig) -> int:
    """Entry point: train, report, print a one-line summary; user errors print one line and exit 2."""
    report = run_or_exit(lambda: train(cfg), cfg.out_dir)
    test = report["test"]
    print(
        f"{report['weights']}: test accuracy {100 * test['accuracy']:.2f}% on {test['images']} images "
        f"({report['weights_bytes'] / 1024:.0f} KiB fp16); report in {Path(cfg.out_dir) / REPORT_NAME}"
    )
    return 0


if __name__ == "__main__":
    run_hydra(main)
