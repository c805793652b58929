"""Train the embedded world's small CLIP on Fashion-MNIST in one command.

    python scripts/train_clip.py                                        # 60k train split
    python scripts/train_clip.py steps=50 out_dir=outputs/train/clip_try

The train split comes from ``data_root`` (default ``/usr/share/datasets/fashion-mnist``, apt
package ``dataset-fashion-mnist``); the evaluation uses the shipped 10k test split (``test_root``
to override). The model, its batches and its objective are described in
:mod:`lantern.training.clip`. Rerunning the same command resumes from ``out_dir/checkpoint.pt``.
At the end ``out_dir`` holds ``clip.safetensors`` (fp16 open_clip state dict, loadable with
``open_clip.create_model_and_transforms("lantern-fashion-clip", pretrained=FILE)`` once the config
is registered), ``lantern-fashion-clip.json`` (the open_clip architecture; register it with
``open_clip.add_model_config``), ``clip_report.json`` (zero-shot accuracy over the 7 caption
templates per class and matched/mismatched cosines under both CLIP-score conventions, measured on
the exported file through :class:`lantern.metrics.clip.CLIPScore`'s own loading path, plus the
config and the environment), ``config.yaml`` and ``log.jsonl``. User errors (missing data, bad
values) print one line and exit with status 2.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from lantern import REPO_ROOT
from lantern.cli.main import run_hydra, run_or_exit
from lantern.training.jobs.clip import REPORT_NAME, train


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="train_clip")
def main(cfg: DictConfig) -> int:
    """Entry point: train, report, print a one-line summary; user errors print one line and exit 2."""
    report = run_or_exit(lambda: train(cfg), cfg.out_dir)
    lantern = report["test"]["conventions"]["lantern"]
    print(
        f"{report['weights']}: zero-shot accuracy {100 * lantern['zero_shot_accuracy']:.2f}% on "
        f"{report['test']['images']} test images, cosine matched {lantern['matched_cosine']:.3f} / mismatched "
        f"{lantern['mismatched_cosine']:.3f} ({report['weights_bytes'] / 2**20:.2f} MiB fp16); "
        f"report in {Path(cfg.out_dir) / REPORT_NAME}"
    )
    return 0


if __name__ == "__main__":
    run_hydra(main)
