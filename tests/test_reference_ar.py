"""The reference-grade AR of every family (lantern/models/*/reference_ar.py): for the HF families it is
transformers' own generate() (checked by spying on it) with the family's logits processors, and its greedy codes
equal our AR's; for LlamaGen and the world it is LlamaGen's own generate() from a local checkout, eager, greedy
equal to ours (skipped where no checkout is found: docs/speed.md says how to get one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lantern.decoding.ar import ARDecoder
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor

transformers = pytest.importorskip("transformers")


def greedy_pair(bundle, reference, cfg_scale: float, prompts, monkeypatch, model_class):
    """(our greedy AR codes, the reference's) for ``prompts``; asserts ``model_class.generate`` ran per prompt."""
    condition = bundle.conditioner.encode(prompts)
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    ours = ARDecoder(sampling).generate(bundle.target, condition, keys_tensor(0, range(len(prompts)))).codes
    calls = []
    original = model_class.generate

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("generation_mode", "text"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(model_class, "generate", spy)
    theirs = reference.generate(condition, sampling, seed=0)
    assert len(calls) == len(prompts)  # transformers' own generate(), one prompt at a time
    assert theirs.shape == ours.shape and len(set(ours.flatten().tolist())) > 4
    return ours, theirs


@pytest.fixture(scope="module")
def lumina(tmp_path_factory):
    from helpers_chameleon import save_folder
    from helpers_lumina import TARGET, VQ, hf_model

    from lantern.models.chameleon.lumina_bundle import random_bundle

    folder = save_folder(hf_model(), tmp_path_factory.mktemp("lumina") / "hf", shard="200KB")
    return random_bundle("tiny_random_lumina", TARGET, VQ, gpt_ckpt=str(folder)), folder


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
def test_lumina_reference_is_transformers_generate_and_greedy_equal(lumina, cfg_scale, monkeypatch):
    from helpers_lumina import PROMPTS

    from lantern.models.chameleon.reference_ar import LuminaReference

    bundle, folder = lumina
    reference = LuminaReference(bundle, folder=folder)
    ours, theirs = greedy_pair(bundle, reference, cfg_scale, PROMPTS, monkeypatch, type(reference.model))
    assert torch.equal(ours, theirs), (ours != theirs).sum().item()


def test_lumina_reference_from_the_random_preset_writes_its_weights_back(lumina, monkeypatch):
    """No folder: the bundle is written back as one (save_target) and read by transformers: the same codes."""
    from helpers_lumina import PROMPTS

    from lantern.models.chameleon.reference_ar import LuminaReference

    bundle, _ = lumina
    reference = LuminaReference(bundle)
    ours, theirs = greedy_pair(bundle, reference, 4.0, PROMPTS[:2], monkeypatch, type(reference.model))
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_anole_reference_is_transformers_generate_and_greedy_equal(tmp_path, cfg_scale, monkeypatch):
    from helpers_chameleon import GRID, PROMPTS, SLOTS, hf_model, save_folder

    from lantern.models.chameleon import hf
    from lantern.models.chameleon.condition import ChameleonConditioner
    from lantern.models.chameleon.reference_ar import AnoleReference
    from lantern.models.chameleon.vocab import word_tokenizer

    reference_model = hf_model()
    folder = save_folder(reference_model, tmp_path / "hf")
    target, _ = hf.load_target(folder, GRID, SLOTS)
    conditioner = ChameleonConditioner.for_model(word_tokenizer(reference_model.config.vocabulary_map), target.config)
    bundle = SimpleNamespace(name="anole", target=target.eval(), conditioner=conditioner)
    reference = AnoleReference(bundle, folder=folder)
    ours, theirs = greedy_pair(bundle, reference, cfg_scale, PROMPTS, monkeypatch, type(reference.model))
    assert torch.equal(ours, theirs), (ours != theirs).sum().item()


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_emu3_reference_is_transformers_generate_and_greedy_equal(tmp_path, cfg_scale, monkeypatch):
    from helpers_emu3 import PROMPTS, TARGET, VQ, hf_model, save_folder

    from lantern.models.emu3 import bundle as emu3_bundle
    from lantern.models.emu3.reference_ar import Emu3Reference

    folder = save_folder(hf_model(), tmp_path / "hf")
    bundle = emu3_bundle.random_bundle("tiny_random_emu3", TARGET, VQ, gpt_ckpt=str(folder))
    reference = Emu3Reference(bundle, folder=folder)
    ours, theirs = greedy_pair(bundle, reference, cfg_scale, PROMPTS, monkeypatch, type(reference.model))
    assert torch.equal(ours, theirs), (ours != theirs).sum().item()


def test_janus_reference_is_transformers_image_generate_and_greedy_equal(tmp_path, monkeypatch):
    from helpers_janus import PROMPTS, hf_model, load, save_folder

    from lantern.models.janus.condition import JanusConditioner, tiny_vocabulary, word_tokenizer
    from lantern.models.janus.reference_ar import JanusReference

    folder = save_folder(hf_model(), tmp_path / "hf")
    target, _ = load(folder)
    conditioner = JanusConditioner.for_model(word_tokenizer(tiny_vocabulary()), target.config)
    bundle = SimpleNamespace(name="janus", target=target.eval(), conditioner=conditioner)
    reference = JanusReference(bundle, folder=folder)
    ours, theirs = greedy_pair(bundle, reference, 5.0, PROMPTS, monkeypatch, type(reference.model))
    assert torch.equal(ours, theirs), (ours != theirs).sum().item()
    with pytest.raises(ConfigError, match="cfg_scale=1.0: transformers' Janus generate\\(\\) always guides"):
        reference.generate(conditioner.encode(PROMPTS[:1]), SamplingConfig(temperature=0, cfg_scale=1.0), seed=0)


def test_janus_reference_without_a_folder_is_one_error():
    from lantern.models.janus.reference_ar import JanusReference

    class Refusing:
        name = "tiny_random_janus"
        target = SimpleNamespace(input_embeddings=lambda: torch.zeros(1))

        def save_target(self, folder, dtype):
            raise ConfigError("model=tiny_random_janus: a Janus target cannot be written back as a folder")

    with pytest.raises(ConfigError, match="reads the model's folder: pass model.gpt_ckpt=FOLDER"):
        JanusReference(Refusing())


def llamagen_checkout():
    from lantern.models.llamagen.reference_ar import llamagen_folder

    try:
        return llamagen_folder()
    except ConfigError as exc:
        pytest.skip(f"no LlamaGen checkout: {exc}")


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_the_worlds_reference_is_llamagens_own_generate_eager_and_greedy_equal(cfg_scale, monkeypatch):
    llamagen_checkout()
    from hydra.utils import instantiate

    from lantern.models.llamagen.reference_ar import LlamaGenReference
    from lantern.run.compose import compose_config

    cfg = compose_config([])
    bundle = instantiate(cfg.model.bundle)
    reference = LlamaGenReference(bundle)
    assert type(reference.model).__module__ == "autoregressive.models.gpt"  # their Transformer, not ours
    called = []
    original = reference._generate
    reference._generate = lambda *args, **kwargs: called.append(kwargs) or original(*args, **kwargs)
    prompts = instantiate(cfg.prompts).for_images(2)
    condition = bundle.conditioner.encode(prompts)
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    ours = ARDecoder(sampling).generate(bundle.target, condition, keys_tensor(0, range(2))).codes
    theirs = reference.generate(condition, sampling, seed=0)
    assert called and called[0]["sample_logits"] is False and original.__module__ == "autoregressive.models.generate"
    assert torch.equal(ours, theirs), (ours != theirs).sum().item()


def test_a_missing_llamagen_checkout_is_one_error(tmp_path, monkeypatch):
    from lantern.models.llamagen.reference_ar import ENV_VAR, llamagen_folder

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="expected a local checkout of FoundationVision/LlamaGen"):
        llamagen_folder()
    with pytest.raises(ConfigError, match="speedup_reference.code="):
        llamagen_folder(str(tmp_path))
