"""HF-layout folders (LANTERN's releases): our models export to them and load back exactly, folders written the
way the release names its keys load like our own files, and every mismatch is one message naming the key."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, TINY, run_in_process
from safetensors.torch import load_file, save_file

from lantern.errors import CheckpointError, ConfigError
from lantern.files import png_bytes
from lantern.models.condition import ClassConditioner
from lantern.models.drafter import Drafter, DrafterConfig, save_drafter_folder
from lantern.models.kv_cache import NoCache
from lantern.models.llamagen.bundle import load_target, random_bundle, save_target_folder
from lantern.models.llamagen.drafter import load_drafter
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.target import prefix_causal_mask
from lantern.models.vq_model import vq_config

C2I = {
    "preset": "GPT-nano",
    "model_type": "c2i",
    "image_size": 32,
    "overrides": {"vocab_size": 1024, "num_classes": 10},
}
T2I = {
    "preset": "GPT-nano",
    "model_type": "t2i",
    "image_size": 32,
    "overrides": {"vocab_size": 1024, "caption_dim": 16, "cls_token_num": 6},
}
VQ = {"preset": "VQ-tiny", "overrides": {"codebook_size": 1024}}  # 32x32 -> 4x4 codes
NODES = {"c2i": C2I, "t2i": T2I}


def config_of(node):
    downsample = vq_config(VQ["preset"], **VQ["overrides"]).downsample
    return gpt_config(node["preset"], node["model_type"], node["image_size"], downsample, **node["overrides"])


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` with every tensor (norm weights and the null caption included) drawn anew, so a swapped or
    dropped tensor shows in the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in module.state_dict().values():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + (tensor.dim() == 1))
    return module.eval()


def target(kind: str, seed: int = 0) -> Transformer:
    return perturbed(Transformer(config_of(NODES[kind])), seed)


def target_logits(model: Transformer, seed: int = 5) -> torch.Tensor:
    """Teacher-forced logits (B, N, V) of ``model`` on fixed random conditions and codes."""
    cfg = model.config
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, cfg.vocab_size, (2, cfg.num_image_tokens), generator=generator)
    if cfg.model_type == "c2i":
        cond = model.embed_condition(torch.tensor([3, cfg.num_classes]))  # a class and the null class
        mask = torch.ones(2, 1, dtype=torch.bool)
    else:
        cond = model.embed_condition(torch.randn(2, cfg.cls_token_num, cfg.caption_dim, generator=generator))
        mask = torch.ones(2, cfg.cls_token_num, dtype=torch.bool)
        mask[0, :2] = False  # a left-padded caption
    with torch.no_grad():
        return model.head(model.forward_teacher(cond, codes, mask))


def drafter_outputs(drafter: Drafter, seed: int = 3) -> torch.Tensor:
    """Drafter features on fixed random inputs, through the condition embeddings the config says it reads."""
    cfg = drafter.config.target
    generator = torch.Generator().manual_seed(seed)
    length = cfg.cls_token_num + cfg.num_image_tokens - 1
    embeds = torch.randn(2, length, cfg.dim, generator=generator)
    features = torch.randn(2, length, cfg.dim, generator=generator)
    entries = torch.arange(length)
    mask = prefix_causal_mask(torch.ones(2, cfg.cls_token_num, dtype=torch.bool), length)
    with torch.no_grad():
        return drafter(embeds, features, entries, entries.expand(2, length), mask, NoCache())


def drafter_for(model: Transformer, seed: int = 1) -> Drafter:
    return perturbed(Drafter(DrafterConfig(model.config)), seed)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ----- round trips ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_a_target_exported_and_loaded_back_gives_identical_logits(tmp_path, kind):
    ours = target(kind)
    folder = save_target_folder(ours, tmp_path / "target")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["input_type"] == kind and config["block_size"] == ours.config.num_image_tokens
    assert config["cls_token_num"] == ours.config.cls_token_num and config["architectures"] == ["LlamaForCausalLM"]
    loaded = load_target(target(kind, seed=9), folder, "GPT-nano")
    assert same_weights(loaded, ours) and torch.equal(target_logits(loaded), target_logits(ours))


def test_the_random_preset_takes_a_folder_for_its_gpt(tmp_path):
    ours = target("c2i")
    folder = save_target_folder(ours, tmp_path / "target")
    conditioner = functools.partial(ClassConditioner, num_classes=10)
    bundle = random_bundle("tiny", C2I, VQ, conditioner, gpt_ckpt=str(folder))
    seeded = random_bundle("tiny", C2I, VQ, conditioner)
    assert torch.equal(target_logits(bundle.target), target_logits(ours))
    assert same_weights(bundle.vq, seeded.vq)  # the tokenizer stays the seeded random one


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_a_drafter_exported_and_loaded_back_gives_identical_outputs(tmp_path, kind):
    model = target(kind)
    ours = drafter_for(model)
    folder = save_drafter_folder(ours, model.input_embeddings(), tmp_path / "drafter", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["lantern_condition_input"] == "embedding" and config["bias"] is True
    assert (config["cls_token_num"], config["block_size"]) == (
        model.config.cls_token_num,
        model.config.num_image_tokens,
    )
    assert torch.equal(load_file(folder / "model.safetensors")["embed_tokens.weight"], model.input_embeddings())
    loaded = load_drafter(folder, NODES[kind], VQ, condition_input="token0")  # the folder's own key wins
    assert loaded.config.condition_input == "embedding"
    assert same_weights(loaded, ours) and torch.equal(drafter_outputs(loaded), drafter_outputs(ours))


def test_a_drafter_folder_is_fp16_by_default_and_replaced_whole(tmp_path):
    model = target("t2i")
    ours = drafter_for(model)
    folder = tmp_path / "drafter"
    save_drafter_folder(drafter_for(model, seed=7), model.input_embeddings(), folder)
    save_drafter_folder(ours, model.input_embeddings(), folder)  # over an earlier export
    assert {t.dtype for t in load_file(folder / "model.safetensors").values()} == {torch.float16}
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "float16"
    rounded = Drafter(DrafterConfig(model.config))
    rounded.load_state_dict({k: v.half().float() for k, v in ours.state_dict().items()})
    assert torch.equal(drafter_outputs(load_drafter(folder, T2I, VQ)), drafter_outputs(rounded))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]  # no staging or old folder left


def test_an_export_that_fails_midway_leaves_the_old_folder(tmp_path, monkeypatch):
    from lantern.models.llamagen import hf_layout

    model = target("c2i")
    folder = save_target_folder(model, tmp_path / "target")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", full_disk)
    with pytest.raises(OSError):
        hf_layout.save_target_folder(target("c2i", seed=4), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


# ----- folders as the release writes them ------------------------------------------------------------------
RELEASE_LAYER = {
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}


def release_names(state: dict, prefix: str) -> dict:
    """Our tensors under the names of LANTERN's HF releases, written out here independently of the loader."""
    out = {}
    for key, value in state.items():
        if key.startswith("layers."):
            _, index, rest = key.split(".", 2)
            head = f"{prefix}layers.{index}."
            if rest == "attention.wqkv.weight":
                q, k, v = value.chunk(3)
                out |= {head + "self_attn.q_proj.weight": q, head + "self_attn.k_proj.weight": k}
                out[head + "self_attn.v_proj.weight"] = v
            else:
                out[head + RELEASE_LAYER[rest]] = value
        elif key == "tok_embeddings.weight":
            out["model.embed_tokens.weight"] = value
        elif key == "norm.weight":
            out["model.norm.weight"] = value
        elif key == "output.weight":
            out["lm_head.weight"] = value
        elif key.startswith("cls_embedding."):
            out["model." + key] = value
        else:
            out[key] = value  # the drafter's fc.weight / fc.bias
    return {k: v.clone().contiguous() for k, v in out.items()}


def write_release_target(folder: Path, model: Transformer) -> Path:
    """A target folder as the release ships one: an HF config with LlamaGen's keys and two shards."""
    cfg = model.config
    folder.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head,
        "rms_norm_eps": 1e-05,
        "vocab_size": cfg.vocab_size,
        "block_size": cfg.num_image_tokens,
        "cls_token_num": cfg.cls_token_num,
        "caption_dim": cfg.caption_dim,
        "input_type": "t2i",
        "class_dropout_p": 0.1,
        "rope_base": 10000,
        "torch_dtype": "float32",
        "transformers_version": "4.45.2",
        "bos_token_id": 1,
    }
    (folder / "config.json").write_text(json.dumps(config))
    tensors = release_names(model.state_dict(), "model.")
    first = {k: v for k, v in tensors.items() if ".layers.1." not in k}
    second = {k: v for k, v in tensors.items() if ".layers.1." in k}
    save_file(first, str(folder / "model-00001-of-00002.safetensors"))
    save_file(second, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in second}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_a_release_style_target_folder_loads_like_our_file(tmp_path):
    model = target("t2i")
    torch.save({"model": model.state_dict()}, tmp_path / "gpt.pt")
    folder = write_release_target(tmp_path / "LlamaGen-T2I", model)
    from_file = load_target(target("t2i", seed=8), tmp_path / "gpt.pt", "GPT-nano t2i")
    from_folder = load_target(target("t2i", seed=9), folder, "GPT-nano t2i")
    assert same_weights(from_folder, from_file) and torch.equal(target_logits(from_folder), target_logits(from_file))


def test_a_release_style_drafter_folder_loads_like_our_file(tmp_path):
    model = target("t2i")
    ours = drafter_for(model)
    save_file({k: v.contiguous() for k, v in ours.state_dict().items()}, str(tmp_path / "drafter.safetensors"))
    folder = tmp_path / "llamagen_drafter"
    folder.mkdir()
    config = {  # the keys of their data/configs/llamagen_t2i_config.json: no cls_token_num, block_size or ours
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": model.config.ffn_hidden,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "vocab_size": 1024,
        "input_type": "t2i",
        "torch_dtype": "float16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {"embed_tokens.weight": model.input_embeddings().detach().clone(), **release_names(ours.state_dict(), "")}
    assert "layers.0.input_layernorm.weight" not in tensors  # neither side has a first-layer input norm
    save_file(tensors, str(folder / "model.safetensors"))
    from_file = load_drafter(tmp_path / "drafter.safetensors", T2I, VQ, condition_input="token0")
    from_folder = load_drafter(folder, T2I, VQ, condition_input="token0")  # no key of ours: the preset's value
    assert from_folder.config.condition_input == "token0"
    assert same_weights(from_folder, from_file) and torch.equal(
        drafter_outputs(from_folder), drafter_outputs(from_file)
    )


# ----- strict errors ---------------------------------------------------------------------------------------
def rewrite(folder: Path, tensors=None, config=None) -> Path:
    """Change an exported folder in place: ``tensors(dict)`` and ``config(dict)`` edit what was there."""
    if tensors is not None:
        state = load_file(folder / "model.safetensors")
        tensors(state)
        save_file(state, str(folder / "model.safetensors"))
    if config is not None:
        data = json.loads((folder / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data))
    return folder


LAYOUT = "LlamaGen's HF layout (LlamaForCausalLM, model_type 'llama')"


def family_faults(model_type: str, architecture: str, wanted: str) -> list[tuple]:
    """Another model's name in config.json over LlamaGen's tensors, by ``model_type`` or by ``architectures``:
    another model's folder whatever its sizes say, refused naming the value and ``wanted`` (what fits)."""
    return [
        (
            "model-type",
            None,
            lambda c: c.update(model_type=model_type),
            CheckpointError,
            f"holds LlamaForCausalLM (model_type {model_type!r}), not {wanted}",
        ),
        (
            "architecture",
            None,
            lambda c: c.update(architectures=[architecture]),
            CheckpointError,
            f"holds {architecture} (model_type 'llama'), not {wanted}",
        ),
    ]


TARGET_FAULTS = [
    (
        "missing",
        lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"),
        None,
        CheckpointError,
        "missing 1: model.layers.1.self_attn.k_proj.weight",
    ),
    (
        "unexpected",
        lambda s: s.update({"model.layers.0.self_attn.q_norm.weight": torch.ones(32)}),
        None,
        CheckpointError,
        "unexpected 1: model.layers.0.self_attn.q_norm.weight",
    ),
    (
        "wrong-shape",
        lambda s: s.update({"model.norm.weight": torch.ones(65)}),
        None,
        CheckpointError,
        "wrong shape 1: model.norm.weight (65,) != (64,)",
    ),
    ("width", None, lambda c: c.update(hidden_size=96), ConfigError, "config.json has hidden_size=96, expected 64"),
    ("grid", None, lambda c: c.update(block_size=64), ConfigError, "config.json has block_size=64, expected 16"),
    (
        "kind",
        None,
        lambda c: c.update(input_type="t2i"),
        ConfigError,
        "config.json has input_type='t2i', expected 'c2i'",
    ),
    ("eps", None, lambda c: c.update(rms_norm_eps=1e-6), ConfigError, "rms_norm_eps=1e-06, expected 1e-05"),
    ("no-grid", None, lambda c: c.pop("block_size"), ConfigError, "config.json has no 'block_size'; expected 16"),
    *family_faults("chameleon", "JanusForConditionalGeneration", "a GPT-nano c2i target in " + LAYOUT),
    (
        "no-names",
        None,
        lambda c: (c.pop("architectures"), c.pop("model_type")),
        CheckpointError,
        "holds no architecture (model_type None), not a GPT-nano c2i target in " + LAYOUT,
    ),
]


@pytest.mark.parametrize(
    "tensors, config, error, message", [f[1:] for f in TARGET_FAULTS], ids=[f[0] for f in TARGET_FAULTS]
)
def test_a_bad_target_folder_is_one_message_naming_the_key(tmp_path, tensors, config, error, message):
    folder = rewrite(save_target_folder(target("c2i"), tmp_path / "target"), tensors, config)
    with pytest.raises(error) as caught:
        load_target(target("c2i"), folder, "GPT-nano c2i")
    text = str(caught.value)
    assert message in text and "\n" not in text, text


DRAFTER_FAULTS = [
    ("missing", lambda s: s.pop("fc.bias"), None, CheckpointError, "missing 1: fc.bias"),
    ("no-table", lambda s: s.pop("embed_tokens.weight"), None, CheckpointError, "missing 1: embed_tokens.weight"),
    (
        "unexpected",
        lambda s: s.update({"layers.0.input_layernorm.weight": torch.ones(64)}),
        None,
        CheckpointError,
        "unexpected 1: layers.0.input_layernorm.weight",
    ),
    (
        "wrong-shape",
        lambda s: s.update({"fc.weight": torch.ones(64, 64)}),
        None,
        CheckpointError,
        "wrong shape 1: fc.weight (64, 64) != (64, 128)",
    ),
    ("grid", None, lambda c: c.update(block_size=256), ConfigError, "config.json has block_size=256, expected 16"),
    ("cond", None, lambda c: c.update(cls_token_num=120), ConfigError, "has cls_token_num=120, expected 6"),
    ("vocab", None, lambda c: c.update(vocab_size=16384), ConfigError, "has vocab_size=16384, expected 1024"),
    (
        "condition-input",
        None,
        lambda c: c.update(lantern_condition_input="zeros"),
        ConfigError,
        "config.json lantern_condition_input='zeros': expected one of embedding, token0",
    ),
    *family_faults("emu3", "ChameleonForConditionalGeneration", "a drafter for GPT-nano in " + LAYOUT),
]


@pytest.mark.parametrize(
    "tensors, config, error, message", [f[1:] for f in DRAFTER_FAULTS], ids=[f[0] for f in DRAFTER_FAULTS]
)
def test_a_bad_drafter_folder_is_one_message_naming_the_key(tmp_path, tensors, config, error, message):
    model = target("t2i")
    folder = save_drafter_folder(drafter_for(model), model.input_embeddings(), tmp_path / "drafter")
    rewrite(folder, tensors, config)
    with pytest.raises(error) as caught:
        load_drafter(folder, T2I, VQ)
    text = str(caught.value)
    assert message in text and "\n" not in text, text


def test_a_folder_without_config_or_weights_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is a folder without config.json"):
        load_target(target("c2i"), tmp_path / "empty", "GPT-nano c2i")
    folder = save_target_folder(target("c2i"), tmp_path / "target")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has config.json but no weights: expected model.safetensors"):
        load_target(target("c2i"), folder, "GPT-nano c2i")


# ----- the command line ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory) -> dict[str, Path]:
    """The tiny random preset's own GPT and drafter exported, plus broken copies of them."""
    from script_helpers import run_hydra_script

    root = tmp_path_factory.mktemp("tiny")
    run_hydra_script("export_hf", ["model=tiny_random_c2i", f"out_dir={root / 'good'}"])
    folders = {"good": root / "good"}
    for name, part, tensors, config in [
        ("wide", "target", None, lambda c: c.update(hidden_size=96)),
        ("no_head", "target", lambda s: s.pop("lm_head.weight"), None),
        ("no_fc", "drafter", lambda s: s.pop("fc.weight"), None),
        ("janus_type", "target", None, lambda c: c.update(model_type="janus")),
        ("emu3_drafter", "drafter", None, lambda c: c.update(architectures=["Emu3ForCausalLM"])),
    ]:
        copy = root / name / part
        copy.mkdir(parents=True)
        for file in (root / "good" / part).iterdir():
            (copy / file.name).write_bytes(file.read_bytes())
        folders[name] = rewrite(copy, tensors, config)
    (root / "empty").mkdir()
    folders["empty"] = root / "empty"
    # Drafter files, not folders: the target's weights (another architecture) and a drafter of another width.
    save_file(load_file(root / "good" / "target" / "model.safetensors"), str(root / "target.safetensors"))
    folders["target_file"] = root / "target.safetensors"
    drafter = load_file(root / "good" / "drafter" / "model.safetensors")
    save_file({**drafter, "fc.weight": torch.zeros(96, 192)}, str(root / "wide_drafter.safetensors"))
    folders["wide_drafter_file"] = root / "wide_drafter.safetensors"
    return folders


CLI_CASES = [
    ("wide", ["model.gpt_ckpt={wide}"], "config.json has hidden_size=96, expected 64 for GPT-nano c2i"),
    ("no-head", ["model.gpt_ckpt={no_head}"], "missing 1: lm_head.weight"),
    ("no-fc", ["decoding=eagle", "model.drafter_ckpt={no_fc}"], "missing 1: fc.weight"),
    ("empty", ["model.gpt_ckpt={empty}"], "is a folder without config.json"),
    ("model-type", ["model.gpt_ckpt={janus_type}"], "(model_type 'janus'), not a GPT-nano c2i target in " + LAYOUT),
    (
        "drafter-architecture",
        ["decoding=eagle", "model.drafter_ckpt={emu3_drafter}"],
        "holds Emu3ForCausalLM (model_type 'llama'), not a drafter for GPT-nano in " + LAYOUT,
    ),
    (
        "target-as-drafter",
        ["decoding=eagle", "model.drafter_ckpt={target_file}"],
        "does not match a 1-layer drafter for GPT-nano: missing 8: fc.bias, fc.weight",
    ),
    (
        "wide-drafter-file",
        ["decoding=eagle", "model.drafter_ckpt={wide_drafter_file}"],
        "has hidden size 96 (fc (96, 192)) but the target GPT-nano has hidden size 64",
    ),
]


@pytest.mark.parametrize("overrides, expected", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_a_bad_folder_on_the_command_line_is_one_error_line_and_writes_nothing(
    tmp_path, tiny_folders, monkeypatch, overrides, expected
):
    out = tmp_path / "run"
    filled = [o.format(**{k: str(v) for k, v in tiny_folders.items()}) for o in overrides]
    status, stdout, stderr = run_in_process(filled, out, monkeypatch)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], stderr
    assert stdout == "" and not out.exists()


def run_tiny(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    tiny = [o for o in TINY if not o.startswith("num_images=")]
    return subprocess.run(
        [sys.executable, "run.py", *tiny, "num_images=4", "batch_size=2", f"hydra.run.dir={out}", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_on_exported_folders_notes_them_and_a_changed_folder_refuses_the_resume(tmp_path, tiny_folders):
    good = tmp_path / "hf"
    shutil.copytree(tiny_folders["good"], good)  # changed below
    folders = [f"model.gpt_ckpt={good / 'target'}", f"model.drafter_ckpt={good / 'drafter'}"]
    loaded = run_tiny(tmp_path / "loaded", "decoding=eagle", *folders)
    assert loaded.returncode == 0, loaded.stderr
    record = json.loads((tmp_path / "loaded" / "metrics.json").read_text())
    assert record["inputs"][str((good / "target").resolve())]["role"] == "target"
    assert record["inputs"][str((good / "drafter").resolve())]["role"] == "drafter"
    # An interrupted run (no record, two images left), then the target folder's weights change.
    (tmp_path / "loaded" / "metrics.json").unlink()
    for index in (2, 3):
        (tmp_path / "loaded" / f"{index:06d}.png").unlink()
    rewrite(good / "target", lambda s: s["model.norm.weight"].mul_(2))  # the same path, other contents
    refused = run_tiny(tmp_path / "loaded", "decoding=eagle", *folders)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1 and str((good / "target").resolve()) in lines[0], refused.stderr
    assert lines[0].startswith("error: run folder") and "restore that file" in lines[0]


# ----- the world -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world_folders(tmp_path_factory) -> Path:
    from script_helpers import run_hydra_script

    out = tmp_path_factory.mktemp("world") / "hf"
    run_hydra_script("export_hf", [f"out_dir={out}", "weights_dtype=float16"])  # the world's files are fp16
    return out


def world_images(overrides: list[str], count: int = 4) -> dict[str, list[bytes]]:
    """PNG bytes of the world's first ``count`` prompts, decoded greedily by eagle and by AR."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from lantern.rng import keys_tensor
    from lantern.run.prompts import fashion_prompts

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("config", overrides=["decoding=eagle", "temperature=0", *overrides])
    bundle = instantiate(cfg.model.bundle)
    from lantern.run.compose import ModelParts, build_decoder

    decoders = {"eagle": build_decoder(cfg.decoding, ModelParts(cfg.model, bundle=bundle))}
    decoders["ar"] = instantiate(cfg.speedup_baseline)
    condition = bundle.conditioner.encode(list(fashion_prompts(count)))
    images = {}
    with torch.inference_mode():
        for name, decoder in decoders.items():
            codes = decoder.generate(bundle.target, condition, keys_tensor(0, range(count))).codes
            images[name] = [png_bytes(pixels.cpu().numpy()) for pixels in bundle.decode_images(codes)]
    return images


def test_greedy_eagle_on_the_worlds_exported_folders_equals_greedy_ar_png_for_png(world_folders):
    folders = [f"model.gpt_ckpt={world_folders / 'target'}", f"model.drafter_ckpt={world_folders / 'drafter'}"]
    exported = world_images(folders)
    shipped = world_images([])
    assert exported["eagle"] == exported["ar"] == shipped["ar"] == shipped["eagle"]
    assert len(set(exported["ar"])) == 4  # four different images, not one repeated


@pytest.mark.slow
def test_the_world_run_on_exported_folders_writes_the_same_pngs_at_default_sampling(tmp_path, world_folders):
    def run(out: Path, *overrides: str) -> None:
        command = [sys.executable, "run.py", "decoding=eagle", "num_images=4", "batch_size=2"]
        command += ["speedup_baseline=null", "wandb.mode=disabled", f"hydra.run.dir={out}", *overrides]
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr

    run(tmp_path / "shipped")
    run(
        tmp_path / "hf", f"model.gpt_ckpt={world_folders / 'target'}", f"model.drafter_ckpt={world_folders / 'drafter'}"
    )
    for index in range(4):
        name = f"{index:06d}.png"
        assert (tmp_path / "shipped" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes()


def test_a_config_is_one_family_by_both_its_names():
    from lantern.errors import CheckpointError
    from lantern.models.checkpoint import check_family

    arch = "ChameleonForConditionalGeneration"
    check_family({"model_type": "chameleon", "architectures": [arch]}, "chameleon", arch, "f")
    check_family({"model_type": "chameleon"}, "chameleon", arch, "f")
    check_family({"architectures": [arch]}, "chameleon", arch, "f")
    check_family(
        {"model_type": "chameleon", "architectures": ["ChameleonXLLMXForConditionalGeneration"]}, "chameleon", arch, "f"
    )
    for bad in (
        {"model_type": "janus", "architectures": [arch]},  # names that disagree: another model's folder
        {"model_type": "chameleon", "architectures": ["JanusForConditionalGeneration"]},
        {"architectures": ["LlamaForCausalLM"]},
        {},
    ):
        with pytest.raises(CheckpointError, match=f"not a {arch} \\(model_type 'chameleon'\\)"):
            check_family(bad, "chameleon", arch, "f")
