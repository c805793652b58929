"""Entry point: compose the configured model, decoder, prompts and job, then run the job.

python run.py                                  # the default world
python run.py num_images=16 temperature=0      # common knobs at top level
python run.py model=llamagen_t2i_xl_256 model.gpt_ckpt=... model.vq_ckpt=... model.text_encoder_path=...
torchrun --nproc_per_node=2 run.py hydra.run.dir=outputs/run/two   # images sharded over 2 processes
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from lantern.cli.knobs import drop_foreign, forced
from lantern.cli.main import run_hydra, run_or_exit, use_cache_folder
from lantern.cli.preflight import check_run_config
from lantern.files import forget_inputs
from lantern.metrics.protocol import Protocol
from lantern.run.compose import ModelParts, build_decoder
from lantern.run.distributed import World, check_world, rank_device, world_from_env
from lantern.run.rundir import claim_run_folder
from lantern.run.tracking import run_identity


def generate(cfg: DictConfig, out_dir: Path, world: World) -> dict | None:
    """Claim ``out_dir``, compose the configured objects and run the generation job into it.

    Returns the record (rank 0), or None on the other ranks of a torchrun job. A folder that already
    holds a finished run of this config is returned as it is, without loading a model.
    """
    hydra = HydraConfig.get()
    use_cache_folder(cfg)  # every cache under paths.cache, before the preflight hashes the files it checks
    resolved = check_run_config(cfg, hydra.overrides.task)  # before anything is built or written
    # A sweep across decoders: a knob this job's decoder does not define is left out (once checked), and recorded.
    dropped = drop_foreign(cfg, hydra.overrides.task, hydra.runtime.choices.get("decoding"))
    if dropped:
        for key in dropped:
            del resolved[key]
        resolved["dropped_overrides"] = list(dropped.values())
        choice = hydra.runtime.choices.get("decoding")
        print(f"decoding={choice} has no such knob: {' '.join(dropped.values())} left out of this job", file=sys.stderr)
    forget_inputs()  # this job's inputs: what the loaders below read (a multirun runs jobs in one process)
    check_world(world, cfg.num_images)
    prompts = instantiate(cfg.prompts)
    protocol = Protocol.from_config(resolved.get("protocol"))  # pinned prompts, metrics and files, before any write
    pinned = protocol.check(resolved, prompts, cfg.num_images) if protocol is not None else None
    group, name = run_identity()  # a sweep's runs share a W&B group and are named from their overrides
    tracker = instantiate(cfg.job.tracker, group=group, name=name)
    if world.is_main:
        tracker.check()  # wandb.mode=online: key and server, before any work
    with claim_run_folder(out_dir, resolved, world) as folder:
        if folder.claim.finished is not None:
            print(f"already finished: {out_dir} holds a complete record of this config; nothing to do")
            return folder.claim.finished.to_json()
        cfg.device = rank_device(cfg.device, world)  # cuda -> cuda:LOCAL_RANK; the recorded config keeps "cuda"
        bundle = instantiate(cfg.model.bundle)
        decoder = build_decoder(
            cfg.decoding, ModelParts(cfg.model, bundle=bundle)
        )  # the model's drafter and neighbours
        job = instantiate(cfg.job, _partial_=True)(
            bundle=bundle, decoder=decoder, prompts=prompts, tracker=tracker, protocol=pinned
        )
        return job.run(folder, config=resolved, world=world)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    world = run_or_exit(lambda: world_from_env(cfg.device), out_dir)
    try:
        metrics = run_or_exit(lambda: generate(cfg, out_dir, world), out_dir)
    finally:
        world.close()
    if metrics is None:
        return
    timing = "no image decoded by this process"
    if metrics.get("latency_s_per_image") is not None:
        timing = f"{metrics['latency_s_per_image'] * 1000:.1f} ms/image, {metrics['tokens_per_s']:.0f} tokens/s"
    speedup = f", {metrics['speedup']:.2f}x AR" if metrics.get("speedup") is not None else ""
    tv = ""
    if metrics.get("tv_realised_mean") is not None:  # relaxed decoders: the law tokens were drawn from vs the target's
        tv = f", realised TV mean {metrics['tv_realised_mean']:.3f} max {metrics['tv_realised_max']:.3f}"
    print(
        f"{metrics['num_images']} images, grid.png and metrics.json in {out_dir} "
        f"({timing}, tau {metrics['mean_accepted_length']:.2f}{speedup}{tv})"
    )


if __name__ == "__main__":
    sys.argv = forced(sys.argv)  # another decoder's knob in a sweep across decoders (lantern.cli.knobs)
    run_hydra(main)
