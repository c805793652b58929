"""Entry point: compose the configured model, decoder, prompts and job, then run the job.

    python run.py                                  # the default world
    python run.py num_images=16 temperature=0      # common knobs at top level
    python run.py model=llamagen_t2i_xl_256 model.gpt_ckpt=... model.vq_ckpt=... model.text_encoder_path=...
"""

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lantern.cli import run_or_exit


def generate(cfg: DictConfig, out_dir: Path) -> dict:
    """Compose the configured objects and run the generation job into ``out_dir``."""
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    decoder = instantiate(cfg.decoding)
    prompts = instantiate(cfg.prompts)
    bundle = instantiate(cfg.model.bundle)
    job = instantiate(cfg.job, _partial_=True)(bundle=bundle, decoder=decoder, prompts=prompts)
    return job.run(out_dir, config=resolved)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    metrics = run_or_exit(lambda: generate(cfg, out_dir), out_dir)
    speedup = f", {metrics['speedup']:.2f}x AR" if metrics.get("speedup") is not None else ""
    print(
        f"{metrics['num_images']} images, grid.png and metrics.json in {out_dir} "
        f"({metrics['latency_s_per_image'] * 1000:.1f} ms/image, {metrics['tokens_per_s']:.0f} tokens/s, "
        f"tau {metrics['mean_accepted_length']:.2f}{speedup})"
    )


if __name__ == "__main__":
    main()
