"""Drafters for the Chameleon family: LANTERN's ``jadohu/anole_drafter`` layout (a folder made here in that format,
its layer from transformers' ChameleonForConditionalGeneration modules) loads strictly and computes what their
layer computes; our exports are that layout; the drafter factory trains one for tiny_random_chameleon that
run.py loads (greedy eagle writes AR's PNGs, tau > 1); sampled exact eagle keeps the target's law (PIT)."""

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
from helpers_chameleon import GRID, SLOTS, VQ, hf_model, save_folder

from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain
from lantern.errors import CheckpointError, ConfigError
from lantern.models.chameleon import bundle as chameleon
from lantern.models.chameleon import hf
from lantern.models.chameleon.model import ChameleonDrafterArch, DrafterLayer
from lantern.models.drafter import Drafter, DrafterConfig, load_drafter_for, save_drafter_folder
from lantern.models.kv_cache import NoCache
from lantern.models.llama_parts import inv_freq, rope_angles
from lantern.models.llamagen.gpt import LlamaGenArch, gpt_config
from lantern.models.target import prefix_causal_mask
from lantern.rules.exact import ExactSampled
from lantern.rules.factory import lantern

transformers = pytest.importorskip("transformers")
from transformers import ChameleonForConditionalGeneration  # noqa: E402, F401 - the architecture the layout is of
from transformers.models.chameleon import modeling_chameleon  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TARGET = {"image_size": 16, "cls_token_num": SLOTS}
VQ_NODE = dict(VQ, channel_multiplier=[1, 1, 2], num_res_blocks=1)  # 16 px, 4x down: the 4 x 4 grid


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(a tiny ChameleonForConditionalGeneration folder, its HF model, our target loaded from it)."""
    reference = hf_model(seed=3)
    folder = save_folder(reference, tmp_path_factory.mktemp("target") / "hf")
    ours, _ = hf.load_target(folder, GRID, SLOTS)
    return folder, reference, ours.eval()


def release_config(reference, n_layer: int = 1) -> dict:
    """The drafter's config.json as the release ships it (LANTERN's data/configs/anole_config.json: the base
    model's config with num_hidden_layers set, transformers 4.43 keys: rope_theta, rope_scaling null)."""
    cfg = reference.config
    return {
        "architectures": ["ChameleonForConditionalGeneration"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "model_parallel_size": 1,
        "model_type": "chameleon",
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": n_layer,
        "num_key_value_heads": cfg.num_key_value_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "swin_norm": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": cfg.vocab_size,
    }


def release_drafter(reference, seed: int = 0) -> tuple[dict[str, torch.Tensor], list]:
    """The tensors of their ``Model`` (cnets_anole.py), built from transformers' own ChameleonDecoderLayer: the
    frozen full-vocabulary table, ``fc`` with bias, then ``layers.0.*`` (every weight perturbed); and the layers."""
    torch.manual_seed(seed)
    cfg = reference.config
    layer = modeling_chameleon.ChameleonDecoderLayer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for param in layer.parameters():
            param.add_(0.1 * torch.randn_like(param))
    fc = torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=True)
    state = {"embed_tokens.weight": reference.model.embed_tokens.weight.detach().clone()}
    state.update({"fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach()})
    state.update({f"layers.0.{k}": v.detach().clone() for k, v in layer.state_dict().items()})
    return state, (fc, layer)


def write_release_folder(folder: Path, reference, state: dict, config: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config or release_config(reference)), encoding="utf-8")
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def load(folder, target_folder):
    return chameleon.load_drafter(folder and str(folder), str(target_folder), TARGET, VQ_NODE)


@torch.no_grad()
def test_the_release_layout_loads_strictly_and_computes_their_layer(tmp_path, target):
    target_folder, reference, ours = target
    state, (fc, layer) = release_drafter(reference)
    drafter = load(write_release_folder(tmp_path / "anole_drafter", reference, state), target_folder)
    assert isinstance(drafter.layers[0], DrafterLayer) and drafter.config.n_layer == 1
    assert drafter.config.norm_eps == reference.config.rms_norm_eps  # their RMSNorm takes the config's eps
    own = {f"layers.0.{k}": v for k, v in drafter.layers[0].state_dict().items()}
    assert all(torch.equal(own[k], state[k]) for k in own) and len(own) == len(state) - 3
    drafter.check_target(ours.config)
    # Their drafter over S entries: fc, then the layer at positions 0 .. S-1 (ours: 1 .. S), causal.
    batch, seq, dim = 2, 9, reference.config.hidden_size
    generator = torch.Generator().manual_seed(1)
    embeds, features = (
        torch.randn(batch, seq, dim, generator=generator),
        torch.randn(batch, seq, dim, generator=generator),
    )
    causal = prefix_causal_mask(torch.ones(batch, 1, dtype=torch.bool), seq)  # (B, 1, S, S)
    entries = torch.arange(seq)
    mine = drafter(embeds, features, entries, entries.expand(batch, -1), causal, NoCache())
    layer.self_attn.config._attn_implementation = "eager"
    x = fc(torch.cat([embeds, features], dim=-1))
    positions = entries[None].expand(batch, -1)
    rotary = modeling_chameleon.ChameleonRotaryEmbedding(reference.config)
    additive = torch.zeros(batch, 1, seq, seq).masked_fill(~causal, torch.finfo(torch.float32).min)
    out = layer(x, attention_mask=additive, position_ids=positions, position_embeddings=rotary(x, positions))
    theirs = out[0] if isinstance(out, tuple) else out
    assert (mine - theirs).abs().max().item() < 1e-5  # 1D RoPE: positions shifted by one, rounding only


def test_the_drafters_positions_are_the_targets_1d_rope_of_its_input_token(target):
    _, _, ours = target
    arch = DrafterConfig(ours.config).arch
    assert isinstance(arch, ChameleonDrafterArch)
    table = arch.rope_table()  # (T + N - 1, hd, 2)
    cos, sin = rope_angles(
        torch.arange(ours.config.max_seq_len), inv_freq(ours.config.head_dim, ours.config.rope_theta), torch.float32
    )
    assert table.shape == (ours.config.max_seq_len - 1, ours.config.head_dim, 2)
    assert torch.equal(table[..., 0], cos[1:]) and torch.equal(table[..., 1], sin[1:])  # entry i: position i + 1
    # LlamaGen's drafter is described as before: its 2D table and no input norm on layer 0.
    llamagen = DrafterConfig(gpt_config("GPT-nano", "c2i", 32, 4, vocab_size=1024, num_classes=10))
    assert isinstance(llamagen.arch, LlamaGenArch) and llamagen.norm_eps == 1e-6
    assert isinstance(Drafter(llamagen).layers[0].attention_norm, torch.nn.Identity)


def test_release_folders_that_do_not_fit_are_refused_naming_what(tmp_path, target):
    target_folder, reference, _ = target
    state, _ = release_drafter(reference)
    missing = {k: v for k, v in state.items() if k != "layers.0.self_attn.q_norm.bias"}
    with pytest.raises(CheckpointError, match="layers.0.self_attn.q_norm.bias"):
        load(write_release_folder(tmp_path / "missing", reference, missing), target_folder)
    extra = dict(state, **{"layers.0.self_attn.rotary.scale": torch.ones(1)})
    with pytest.raises(CheckpointError, match="rotary.scale"):
        load(write_release_folder(tmp_path / "extra", reference, extra), target_folder)
    wide = dict(release_config(reference), hidden_size=2 * reference.config.hidden_size)
    with pytest.raises(ConfigError, match="hidden_size=128, expected 64"):
        load(write_release_folder(tmp_path / "wide", reference, state, wide), target_folder)
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
    with pytest.raises(CheckpointError, match="LlamaForCausalLM .* not a drafter for a Chameleon target"):
        load(write_release_folder(tmp_path / "llama", reference, state, llama), target_folder)
    with pytest.raises(ConfigError, match="no drafter checkpoint given"):
        load(None, target_folder)


@torch.no_grad()
def test_our_export_is_the_release_layout_and_reads_back_identically(tmp_path, target):
    _, reference, ours = target
    torch.manual_seed(4)
    drafter = Drafter(DrafterConfig(ours.config, n_layer=2)).eval()
    arch = drafter.config.arch
    with pytest.raises(ConfigError, match="whole vocabulary's table"):
        save_drafter_folder(drafter, ours.input_embeddings(), tmp_path / "codes_only")  # (K, D): not their layout
    assert not (tmp_path / "codes_only").exists()
    folder = save_drafter_folder(drafter, arch.folder_embeddings(ours), tmp_path / "drafter", dtype=torch.float32)
    from safetensors.torch import load_file

    written = load_file(str(folder / "model.safetensors"))
    release, _ = release_drafter(reference)
    layer1 = {k.replace("layers.0.", "layers.1."): v for k, v in release.items() if k.startswith("layers.0.")}
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in {**release, **layer1}.items()}
    config = json.loads((folder / "config.json").read_text())
    their = transformers.ChameleonConfig(**config)  # their EConfig is a PretrainedConfig over these keys
    assert (their.num_hidden_layers, their.hidden_size, their.vocab_size) == (2, 64, ours.config.text_vocab_size)
    back = load_drafter_for(folder, ours.config, "tiny")
    assert back.config == drafter.config
    state, reread = drafter.state_dict(), back.state_dict()
    assert state.keys() == reread.keys() and all(torch.equal(state[k], reread[k]) for k in state)


def run(*command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def decode(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    common = ("model=tiny_random_chameleon", "temperature=0", "num_images=4", "batch_size=4", "speedup_baseline=null")
    return run("run.py", f"hydra.run.dir={out}", "wandb.mode=disabled", "warmup=0", *common, *overrides)


def test_the_factory_trains_a_drafter_that_run_py_loads_greedy_eagle_writes_ars_pngs(tmp_path):
    out = tmp_path / "factory"
    proc = run(
        "scripts/train_drafter.py", "model=tiny_random_chameleon", "num_samples=64", "steps=40",
        f"out_dir={out}", "progress=false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "drafter" / "config.json").read_text())
    assert config["architectures"] == ["ChameleonForConditionalGeneration"] and config["num_hidden_layers"] == 1
    assert json.loads((out / "report.json").read_text())["held_out"]["rows"] == 4
    for name, overrides in (
        ("ar", ("decoding=ar",)),
        ("eagle", ("decoding=eagle", f"model.drafter_ckpt={out}/drafter")),
    ):
        proc = decode(tmp_path / name, *overrides)
        assert proc.returncode == 0, proc.stderr
    pngs = {name: [p.read_bytes() for p in sorted((tmp_path / name).glob("0*.png"))] for name in ("ar", "eagle")}
    assert len(pngs["ar"]) == 4 and pngs["eagle"] == pngs["ar"]
    tau = json.loads((tmp_path / "eagle" / "metrics.json").read_text())["mean_accepted_length"]
    assert tau > 1, tau  # the random drafter's greedy tau is 1.00 (test_chameleon_run)
    # A drafter folder for another target: one error line, exit 2, nothing written.
    (tmp_path / "narrow").mkdir()
    config["hidden_size"] = 32
    (tmp_path / "narrow" / "config.json").write_text(json.dumps(config))
    (tmp_path / "narrow" / "model.safetensors").write_bytes((out / "drafter" / "model.safetensors").read_bytes())
    proc = decode(tmp_path / "bad", "decoding=eagle", f"model.drafter_ckpt={tmp_path / 'narrow'}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "hidden_size=32, expected 64" in lines[0] and not (tmp_path / "bad").exists()


# ----- the target's law under sampled exact eagle (randomised PIT, Kolmogorov-Smirnov) --------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny_random_chameleon preset's bundle, drafter and codebook neighbours, and its prompts."""
    return tiny_preset("tiny_random_chameleon", chameleon, tmp_path_factory.mktemp("neighbours"))


def test_sampled_exact_eagle_keeps_the_chameleon_targets_law_and_lantern_far_off_does_not(tiny):
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
