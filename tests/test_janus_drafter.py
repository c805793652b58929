"""Drafters for the Janus family: the drafter's layer computes transformers' LlamaDecoderLayer on the same weights;
our export (EAGLE's layout over a LlamaConfig, the aligned code table as embed_tokens) reads back identically and
misfits are refused naming the key; the drafter factory trains one for tiny_random_janus that run.py loads
(greedy eagle writes AR's PNGs, tau > 1); sampled exact eagle keeps the target's law (PIT)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from family_helpers import tiny_preset
from helpers import FAIL, PASS, SAMPLING, ks_pvalue

from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain
from lantern.errors import CheckpointError, ConfigError
from lantern.models.drafter import Drafter, DrafterConfig, load_drafter_for, save_drafter_folder
from lantern.models.janus import bundle as janus
from lantern.models.janus.model import JanusDrafterArch
from lantern.models.kv_cache import NoCache
from lantern.models.llama_parts import inv_freq, rope_angles
from lantern.rules.exact import ExactSampled
from lantern.rules.factory import lantern

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny_random_janus preset's bundle, drafter and codebook neighbours, and its prompts."""
    return tiny_preset("tiny_random_janus", janus, tmp_path_factory.mktemp("neighbours"))


@torch.no_grad()
def test_the_drafters_layer_is_transformers_llama_decoder_layer(tiny):
    model_bundle, _, _, _ = tiny
    config = model_bundle.target.config
    torch.manual_seed(2)
    drafter = Drafter(DrafterConfig(config)).eval()
    llama = transformers.LlamaConfig(
        hidden_size=config.dim, intermediate_size=config.ffn_hidden, num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head, rms_norm_eps=config.norm_eps, num_hidden_layers=1,
    )  # fmt: skip
    llama._attn_implementation = "eager"
    theirs = modeling_llama.LlamaDecoderLayer(llama, 0).eval()
    layer = drafter.layers[0]
    for param in layer.parameters():
        param.add_(0.1 * torch.randn_like(param))
    theirs.load_state_dict(layer.state_dict(), strict=True)  # the same names: layers.{i}.* is Llama's
    x = torch.randn(2, 7, config.dim)
    entries = torch.arange(7)
    rope = drafter.rope[entries]
    mask = torch.ones(7, 7, dtype=torch.bool).tril()[None, None].expand(2, 1, 7, 7)
    mine = layer(x, rope, mask, entries.expand(2, -1), NoCache())
    cos, sin = rope_angles(
        entries + 1, inv_freq(config.head_dim, config.rope_theta), torch.float32
    )  # entry i at position i + 1
    additive = torch.zeros(2, 1, 7, 7).masked_fill(~mask, float("-inf"))
    out = theirs(x, attention_mask=additive, position_embeddings=(cos[None], sin[None]))
    out = out[0] if isinstance(out, tuple) else out
    assert (mine - out).abs().max() <= 1e-5


@torch.no_grad()
def test_our_export_reads_back_identically_and_misfits_are_refused(tmp_path, tiny):
    model_bundle, _, _, _ = tiny
    target = model_bundle.target
    torch.manual_seed(4)
    drafter = Drafter(DrafterConfig(target.config, n_layer=2)).eval()
    arch = drafter.config.arch
    assert isinstance(arch, JanusDrafterArch)
    table = arch.folder_embeddings(target)
    # aligner(gen_embed(c)); the whole table is one matmul over every code, so its fp32 rounding may differ
    assert torch.allclose(table[:3], target.embed_tokens(torch.arange(3)[None])[0], atol=1e-6)
    folder = save_drafter_folder(drafter, table, tmp_path / "drafter", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    their = transformers.LlamaConfig(**config)
    assert (their.num_hidden_layers, their.hidden_size, their.vocab_size) == (2, 64, target.config.num_codes)
    back = load_drafter_for(folder, target.config, "tiny")
    assert back.config == drafter.config
    state, reread = drafter.state_dict(), back.state_dict()
    assert state.keys() == reread.keys() and all(torch.equal(state[k], reread[k]) for k in state)
    for key, value, error, message in (
        ("hidden_size", 32, ConfigError, "hidden_size=32, expected 64"),
        ("model_type", "chameleon", CheckpointError, "not a drafter for a Janus target"),
    ):
        bad = tmp_path / f"bad_{key}"
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**config, key: value}))
        (bad / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
        with pytest.raises(error, match=message):
            load_drafter_for(bad, target.config, "tiny")


def run(*command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def decode(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    common = ("model=tiny_random_janus", "temperature=0", "num_images=4", "batch_size=4", "speedup_baseline=null")
    return run("run.py", f"hydra.run.dir={out}", "wandb.mode=disabled", "warmup=0", *common, *overrides)


@pytest.mark.slow
def test_the_factory_trains_a_drafter_that_run_py_loads_greedy_eagle_writes_ars_pngs(tmp_path):
    out = tmp_path / "factory"
    proc = run(
        "scripts/train_drafter.py", "model=tiny_random_janus", "num_samples=64", "steps=40",
        f"out_dir={out}", "progress=false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "drafter" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    for name, overrides in (
        ("ar", ("decoding=ar",)),
        ("eagle", ("decoding=eagle", f"model.drafter_ckpt={out}/drafter")),
    ):
        proc = decode(tmp_path / name, *overrides)
        assert proc.returncode == 0, proc.stderr
    pngs = {name: [p.read_bytes() for p in sorted((tmp_path / name).glob("0*.png"))] for name in ("ar", "eagle")}
    assert len(pngs["ar"]) == 4 and pngs["eagle"] == pngs["ar"]
    tau = json.loads((tmp_path / "eagle" / "metrics.json").read_text())["mean_accepted_length"]
    assert tau > 1, tau  # the random drafter's greedy tau is 1.00 (test_janus_run)


@pytest.mark.slow
def test_sampled_exact_eagle_keeps_the_janus_targets_law_and_lantern_far_off_does_not(tiny):
    _, drafter, neighbours, _ = tiny
    for structure in (chain(3, "sampled"), DynamicTree(3, 8, 16, "sampled")):
        p = ks_pvalue(tiny, SpeculativeDecoder(SAMPLING, drafter=drafter, draft=structure, acceptance=ExactSampled()))
        assert p > PASS, f"sampled exact eagle ({type(structure).__name__}): KS p = {p:.2e}"
    bad = ks_pvalue(
        tiny,
        SpeculativeDecoder(
            SAMPLING, drafter=drafter, draft=chain(3, "sampled"), acceptance=lantern(1000, 0.4, neighbours)
        ),
    )
    assert bad < FAIL and not math.isnan(bad), f"LANTERN delta=0.4 passed as lossless: KS p = {bad:.2e}"
