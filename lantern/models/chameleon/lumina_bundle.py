"""Lumina-mGPT bundles: the prompt template, the random preset's vocabulary, folders, drafters.

Prompts (the reference's ``generate_examples/generate.py`` question through ``data/convertsation.py`` and
``xllmx/model/tokenizer.py``): ``[BOS] + encode("Generate an image of {W}x{H} according to the following
prompt:\\n{caption}" + "<reserved08706>")``; the end-of-turn ``<reserved08706>`` is one added token, so that is
``[BOS] + encode(question) + [EOT]``. The model then writes ``[BOI, H, W]`` itself in the reference; here they are
fixed and end the condition (:mod:`lantern.models.chameleon.lumina`), left-padded to the condition slots.
"""

from __future__ import annotations

from collections.abc import Mapping

from lantern.models.bundle import ModelBundle, family_drafter, timing_parts
from lantern.models.chameleon import bundle as chameleon
from lantern.models.chameleon.condition import ChameleonConditioner
from lantern.models.chameleon.lumina import EOL, LuminaConfig, LuminaTarget, lumina_config, size_token
from lantern.models.chameleon.vocab import TINY_WORDS
from lantern.models.dry import dry_twin, family_twin

TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{caption}"
# The random preset's words beyond Chameleon's: the template's (its tokenizer splits on whitespace and punctuation).
TEMPLATE_WORDS = ("Generate", "image", "according", "to", "following", "prompt", ":")
SIZE_UNITS = range(1, 65)  # resolution tokens the random vocabulary holds (32 .. 2048 px)


class LuminaConditioner(ChameleonConditioner):
    """Captions -> left-padded ``[BOS] question [EOT, BOI, H, W]`` (B, T) and their mask (module docstring)."""

    templates = ("lumina",)
    special = ("bos_id", "pad_id", "eot_id", "boi_id", "size_id", "image_pixels")

    def question(self, caption: str) -> str:
        return TEMPLATE.format(width=self.image_pixels, height=self.image_pixels, caption=caption)

    def ids(self, prompt: str) -> list[int]:
        text = self.tokenizer.encode(self.question(prompt), add_special_tokens=False).ids
        return [self.bos_id, *text, self.eot_id, self.boi_id, self.size_id, self.size_id]


def tiny_words(pixels: int, words=()) -> tuple[str, ...]:
    """The random vocabulary's words after Chameleon's specials: EOL, the resolution tokens, the template's
    words (the size ``{pixels}x{pixels}`` one word) and ``words`` (default Chameleon's tiny words)."""
    sizes = tuple(size_token(units) for units in SIZE_UNITS)
    return (EOL, *sizes, f"{pixels}x{pixels}", *TEMPLATE_WORDS, *(words or TINY_WORDS))


def converter(pixels: int):
    """``convert`` for :func:`lantern.models.chameleon.hf.check_folder`: a folder's config as Lumina's."""

    def convert(base, config_json: Mapping, source: str) -> LuminaConfig:
        return lumina_config(base, config_json["vocabulary_map"], pixels, source)

    return convert


def random_config(target: Mapping, vq: Mapping) -> tuple[LuminaConfig, dict[str, int]]:
    """The random preset's :class:`LuminaConfig` and vocabulary (Chameleon's tiny one with Lumina's tokens)."""
    pixels = int(target["image_size"])
    base, vocab = chameleon.random_config({**target, "words": tiny_words(pixels, target.get("words"))}, vq)
    return lumina_config(base, vocab, pixels, "the random preset's vocabulary"), vocab


def _random(node: Mapping) -> LuminaConfig:
    """``config_of`` of the random preset's dry twins: its config, nothing built."""
    return random_config(node["target"], chameleon.vq_config(node["vq"]))[0]


@dry_twin(family_twin("model.bundle", _random, paths=("gpt_ckpt",)))
def random_bundle(
    name: str, target: Mapping, vq: Mapping, init_seed=0, device="cpu", dtype="float32", gpt_ckpt=None
) -> ModelBundle:
    """The seeded random tiny Lumina-mGPT (no files); ``gpt_ckpt`` (an HF folder of the same architecture and
    vocabulary) replaces the target."""
    return chameleon.random_bundle(
        name,
        target,
        vq,
        init_seed,
        "lumina",
        device,
        dtype,
        gpt_ckpt,
        config_of=random_config,
        convert=converter(int(target["image_size"])),
        target_class=LuminaTarget,
        conditioner_class=LuminaConditioner,
    )


@dry_twin(family_twin("model.bundle", chameleon._slots, paths=("gpt_ckpt", "vq_ckpt")))
def load_bundle(
    name: str, gpt_ckpt: str | None, vq_ckpt: str | None, target: Mapping, vq: Mapping, device="cpu", dtype="float32"
) -> ModelBundle:
    """Lumina-mGPT from an HF ``ChameleonForConditionalGeneration`` folder with Chameleon's VQGAN, as
    :func:`lantern.models.chameleon.bundle.load_bundle` with Lumina's ids, target and prompt template."""
    convert = converter(int(target["image_size"]))
    return chameleon.load_bundle(
        name, gpt_ckpt, vq_ckpt, target, vq, "lumina", device, dtype, convert, LuminaTarget, LuminaConditioner
    )


@dry_twin(family_twin("model.drafter", _random, paths=("path",)))
def random_drafter(target, vq, init_seed=0, device="cpu", dtype="float32", path=None, name="tiny_random_lumina"):
    """The random preset's seeded one-layer drafter (Chameleon's layer), or the one at ``path``."""
    return family_drafter(random_config(target, chameleon.vq_config(vq))[0], path, name, init_seed, device, dtype)


# ----- timing (scripts/gpu_check.py) ------------------------------------------------------------------------
def timing_config(architecture: Mapping | None, target: Mapping, vq: Mapping) -> LuminaConfig:
    """The config :func:`timing` builds its target of: ``architecture`` the fields of :class:`LuminaConfig` but
    ``grid_size``, ``cls_token_num`` and ``image_pixels`` (from ``target`` and ``vq``); null: the random preset's own."""
    vq_cfg = chameleon.vq_config(vq)
    if architecture is None:
        return random_config(target, vq_cfg)[0]
    grid, pixels = chameleon._grid(target, vq_cfg), int(target["image_size"])
    return LuminaConfig.for_architecture(architecture, target, grid, image_pixels=pixels)


@dry_twin(family_twin("model.timing", lambda node: timing_config(node.get("architecture"), node["target"], node["vq"])))
def timing(architecture: Mapping | None, target: Mapping, vq: Mapping, device="cpu", dtype="float32", init_seed=0):
    """Random-weight parts of a Lumina preset for the GPU check, as :func:`lantern.models.chameleon.bundle.timing`
    (its target's config: :func:`timing_config`)."""
    config = timing_config(architecture, target, vq)
    return timing_parts(LuminaTarget, config, LuminaConditioner, device, dtype, init_seed)
