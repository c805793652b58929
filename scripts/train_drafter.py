"""The drafter factory: train an EAGLE-style drafter for any target in one command.

    python scripts/train_drafter.py                                        # the world's target
    python scripts/train_drafter.py model=tiny_random_c2i num_samples=64 steps=40 out_dir=DIR
    python scripts/train_drafter.py model=llamagen_c2i_b_256 model.gpt_ckpt=... model.vq_ckpt=... data=images data_root=IMAGENET/train
    python scripts/train_drafter.py stage=features out_dir=DIR             # one stage
    torchrun --nproc_per_node=2 scripts/train_drafter.py stage=train out_dir=DIR

Stages ``data`` (self-distilled or tokenised sequences), ``features`` (the target's states, in shards),
``train`` (resumable; DDP under torchrun) and ``export`` (``out_dir/drafter``: ``config.json`` +
``model.safetensors``, then ``out_dir/report.json`` with held-out agreement); see
:mod:`lantern.training.jobs.drafter` and ``conf/train_drafter.yaml``. Rerunning the same command resumes.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from lantern import REPO_ROOT
from lantern.cli.main import run_hydra, run_or_exit, use_cache_folder
from lantern.run.distributed import rank_device, world_from_env
from lantern.run.lock import FolderLock
from lantern.training.jobs.drafter import REPORT_NAME, run

BARRIER_TIMEOUT_S = 7 * 24 * 3600.0  # under torchrun the other ranks wait while rank 0 makes data and features


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="train_drafter")
def main(cfg: DictConfig) -> None:
    """Entry point: run the stages, print a one-line summary; user errors exit 2 with one line."""
    # nothing is made before every check passes (conf: hydra.run.dir=.; the lock then makes out_dir)
    use_cache_folder(cfg)  # the shards' hashes under paths.cache
    world = run_or_exit(lambda: world_from_env(cfg.device, BARRIER_TIMEOUT_S))
    cfg.device = rank_device(cfg.device, world)  # cuda -> cuda:LOCAL_RANK under torchrun
    hold = (lambda folder: FolderLock(folder, what="drafter factory folder")) if world.is_main else None
    try:
        report = run_or_exit(lambda: run(cfg, world, hold))
    finally:
        world.close()
    if not world.is_main:
        return
    if "held_out" in report:
        held = report["held_out"]
        print(
            f"{report['drafter']}: held-out top-1 agreement {held['top1']:.4f}, top-{cfg.top_k} "
            f"{held[f'top{cfg.top_k}']:.4f} on {held['rows']} sequences; report in {cfg.out_dir}/{REPORT_NAME}"
        )
    else:
        done = ", ".join(f"{name} ({seconds:.0f} s)" for name, seconds in report["stages"].items())
        print(f"stages {done} done in {report['out_dir']}")


if __name__ == "__main__":
    run_hydra(main)
