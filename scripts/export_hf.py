"""Write a model preset's target GPT and drafter in the HF layout of LANTERN's releases.

    python scripts/export_hf.py out_dir=outputs/export/world             # the embedded world
    python scripts/export_hf.py model=tiny_random_c2i out_dir=DIR parts=[target]
    python scripts/export_hf.py model=llamagen_c2i_xl_384 model.gpt_ckpt=c2i_XL_384.pt \
        model.vq_ckpt=vq_ds16_c2i.pt parts=[target] out_dir=DIR

``DIR/target`` holds the target as their ``LlamaForCausalLM`` port names it and ``DIR/drafter`` the drafter
as their EAGLE ``Model`` does (``config.json`` + ``model.safetensors``, written atomically). Both load
back with ``python run.py model=<preset> model.gpt_ckpt=DIR/target model.drafter_ckpt=DIR/drafter``.
The layout and its checks: :mod:`lantern.models.llamagen.hf_layout` and docs/models.md.

A Chameleon-family preset (``anole_7b``, ``lumina_mgpt_7b_*``, their tiny random presets) writes its target
as an HF ``ChameleonForConditionalGeneration`` folder with its tokenizer (:mod:`lantern.models.chameleon.folder`;
transformers loads it) and its drafter in ``jadohu/anole_drafter``'s layout. A Janus target keeps only a
folder's generation path and is refused; ``parts=[drafter]`` exports a Janus drafter.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from lantern import REPO_ROOT
from lantern.cli.main import run_hydra, run_or_exit, use_cache_folder
from lantern.run.export import export


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="export_hf")
def main(cfg: DictConfig) -> None:
    """Entry point: export, then one line naming the folders; user errors exit 2 with one line."""
    use_cache_folder(cfg)  # the hashes of what it reads under paths.cache
    written = run_or_exit(lambda: export(cfg))  # nothing is made before every check (conf: hydra.run.dir=.)
    folders = ", ".join(f"{part} {path}" for part, path in written.items())
    print(f"HF layout ({cfg.weights_dtype}): {folders}")


if __name__ == "__main__":
    run_hydra(main)
