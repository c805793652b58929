"""EAGLE-3-style taps: the target returns the residual streams entering chosen layers, a drafter fuses them in
place of the final-norm state, speculative decoding hands them over wherever it handed that state (greedy equals
AR, sampling stays exact, compiled equals eager), and drafter files and folders carry the taps both ways."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from helpers import REPO, VOCAB, CountingBackend, text_condition, tiny_config
from helpers import chi2_statistic as _chi2
from helpers import exact_marginals as _exact_marginals
from safetensors.torch import load_file, save_file
from scipy.stats import chi2

from lantern.decoding.ar import ARDecoder
from lantern.decoding.batch import guided_inputs
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain, prior_tree
from lantern.errors import CheckpointError, ConfigError
from lantern.models.condition import ClassConditioner
from lantern.models.drafter import (
    FOLDER_TAPS_KEY,
    FUSE_KEY,
    TAPS_KEY,
    VOCAB_KEY,
    Drafter,
    DrafterConfig,
    drafter_metadata,
    save_drafter_folder,
)
from lantern.models.kv_cache import NoCache
from lantern.models.llamagen import reference_layout
from lantern.models.llamagen.bundle import random_bundle
from lantern.models.llamagen.drafter import load_drafter
from lantern.models.llamagen.gpt import Transformer, default_taps, gpt_config
from lantern.models.sampling import SamplingConfig
from lantern.models.target import prefix_causal_mask
from lantern.models.vq_model import vq_config
from lantern.rng import keys_tensor
from lantern.rules.exact import ExactDeterministic, ExactSampled

TAPS = default_taps(6)  # (2, 3): n_layer // 2 and n_layer - 3 coincide at 6 layers
# The tiny_random_c2i preset's nodes, and the same with its GPT-nano six layers deep.
TINY_C2I = {
    "preset": "GPT-nano",
    "model_type": "c2i",
    "image_size": 32,
    "overrides": {"vocab_size": 1024, "num_classes": 10},
}
C2I6 = {**TINY_C2I, "overrides": {**TINY_C2I["overrides"], "n_layer": 6}}
VQ = {"preset": "VQ-tiny", "overrides": {"codebook_size": 1024}}


def deep(model_type="t2i", taps=TAPS, vocab=VOCAB, seed=0) -> tuple[Transformer, Drafter]:
    """A six-layer GPT-nano over a small vocabulary (4x4 tokens) and a random drafter with ``taps`` for it."""
    torch.manual_seed(seed)
    cfg = tiny_config(model_type, vocab, n_layer=6)
    return Transformer(cfg).eval(), Drafter(DrafterConfig(cfg, taps=taps)).eval()


def node_config(node=C2I6):
    downsample = vq_config(VQ["preset"], **VQ["overrides"]).downsample
    return gpt_config(node["preset"], node["model_type"], node["image_size"], downsample, **node["overrides"])


def teacher_inputs(model: Transformer, seed: int = 5):
    """Caption embeddings (2, T, D), a left-padded mask (2, T) and codes (2, N) for teacher-forced passes."""
    cfg = model.config
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, cfg.vocab_size, (2, cfg.num_image_tokens), generator=generator)
    cond = model.embed_condition(torch.randn(2, cfg.cls_token_num, cfg.caption_dim, generator=generator))
    mask = torch.ones(2, cfg.cls_token_num, dtype=torch.bool)
    mask[0, :2] = False
    return cond, mask, codes


def hooked(model: Transformer, fn, *args):
    """``fn(*args)`` and what each block of ``model`` returned meanwhile (forward hooks)."""
    outputs: list[torch.Tensor] = []
    handles = [layer.register_forward_hook(lambda module, inputs, out: outputs.append(out)) for layer in model.layers]
    try:
        result = fn(*args)
    finally:
        for handle in handles:
            handle.remove()
    return result, outputs


# ----- the target ---------------------------------------------------------------------------------------
def test_default_taps_are_eagle3s_low_middle_and_high_layers():
    assert default_taps(24) == (2, 12, 21) and default_taps(36) == (2, 18, 33) and default_taps(7) == (2, 3, 4)
    assert default_taps(6) == (2, 3) and default_taps(5) == (2,) and default_taps(3) == (1, 2)
    assert default_taps(2) == (1,)  # GPT-nano
    with pytest.raises(ConfigError, match="n_layer=1: expected an integer >= 2"):
        default_taps(1)


@torch.no_grad()
def test_without_taps_the_target_returns_what_the_old_loop_computed_bit_for_bit():
    model, _ = deep()
    cond, mask, codes = teacher_inputs(model)
    x = torch.cat([cond, model.embed_tokens(codes[:, :-1])], dim=1)  # (2, T+N-1, D)
    positions = torch.arange(x.shape[1])
    full = prefix_causal_mask(mask, x.shape[1])
    state = x
    for index, layer in enumerate(model.layers):  # the layer loop as it was before taps
        state = layer(state, model.rope[positions], full, positions.expand(2, -1), NoCache().layer(index))
    expected = model.norm(state)
    assert torch.equal(model.forward_embeddings(x, positions, positions.expand(2, -1), full, NoCache()), expected)
    assert torch.equal(model.teacher_hidden(cond, codes, mask), expected)
    tapped, _ = model.teacher_hidden(cond, codes, mask, taps=(4, 1))
    assert torch.equal(tapped, expected)  # the final-norm state does not change with taps


@torch.no_grad()
def test_each_tap_is_the_state_entering_its_layer_in_the_given_order():
    model, _ = deep()
    cond, mask, codes = teacher_inputs(model)
    taps = (4, 1, 5)  # not sorted: the slices follow the given order
    (hidden, features), outputs = hooked(model, model.teacher_hidden, cond, codes, mask, taps)
    dim = model.config.dim
    assert features.shape == (2, hidden.shape[1], len(taps) * dim)
    for j, tap in enumerate(taps):
        assert torch.equal(features[..., j * dim : (j + 1) * dim], outputs[tap - 1])  # block tap-1's output


@torch.no_grad()
def test_forward_tokens_logits_do_not_change_with_taps_and_its_features_are_the_taps():
    model, _ = deep()
    cfg = model.config
    cond, mask, codes = teacher_inputs(model)
    length = cfg.cls_token_num + cfg.num_image_tokens
    full = prefix_causal_mask(mask, length)
    positions = 4 + torch.arange(3)
    runs, blocks = [], []
    for taps in ((), TAPS):  # the condition into a fresh cache, then three tokens
        cache = model.new_cache(2, length)
        model.forward_embeddings(cond, torch.arange(4), torch.arange(4).expand(2, -1), full[:, :, :4], cache)
        tokens = (codes[:, :3], positions, positions.expand(2, -1), full[:, :, 4:7], cache, taps)
        result, outputs = hooked(model, model.forward_tokens, *tokens)
        runs.append(result)
        blocks.append(outputs)
    (plain_logits, plain_features), (logits, features) = runs
    assert torch.equal(logits, plain_logits) and plain_features.shape == (2, 3, cfg.dim)
    assert torch.equal(plain_features, model.norm(blocks[0][-1]))  # without taps: the final-norm state
    assert torch.equal(features, torch.cat([blocks[1][tap - 1] for tap in TAPS], dim=-1))


@pytest.mark.parametrize(
    "taps, message",
    [
        ((0,), r"tap=0: expected an integer in \[1, 5\]"),
        ((2, 6), r"tap=6: expected an integer in \[1, 5\]"),
        ((3, 2, 3), r"taps=\[3, 2, 3\]: expected distinct layer indices \(tap 3 is repeated\)"),
        ((1.5,), r"tap=1.5"),
    ],
    ids=["embeddings", "past_the_last", "repeated", "fraction"],
)
def test_a_bad_tap_is_one_error_naming_it(taps, message):
    model, _ = deep(taps=())
    cond, mask, codes = teacher_inputs(model)
    with pytest.raises(ConfigError, match=message):
        model.teacher_hidden(cond, codes, mask, taps)
    with pytest.raises(ConfigError, match=message):
        DrafterConfig(model.config, taps=taps)


# ----- the drafter --------------------------------------------------------------------------------------
def test_a_drafter_with_taps_fuses_the_target_features_and_one_without_passes_them_through():
    model, drafter = deep()
    dim = model.config.dim
    assert tuple(drafter.fuse.weight.shape) == (dim, len(TAPS) * dim) and drafter.fuse.bias is None
    features = torch.randn(3, 5, len(TAPS) * dim)
    assert torch.equal(drafter.target_features(features), drafter.fuse(features))
    plain = Drafter(DrafterConfig(model.config))
    assert not hasattr(plain, "fuse") and "fuse.weight" not in plain.state_dict()
    hidden = torch.randn(3, 5, dim)
    assert plain.target_features(hidden) is hidden
    assert DrafterConfig(model.config, taps=[2, 3]).taps == (2, 3)  # a list from JSON or Hydra


def test_a_drafter_tapping_past_the_targets_layers_is_refused():
    model, _ = deep()
    drafter = Drafter(DrafterConfig(model.config, taps=(2, 5)))
    drafter.check_target(model.config)
    with pytest.raises(ConfigError, match=r"drafter taps the input of layer 5 \(taps \[2, 5\]\) but the target has 4"):
        drafter.check_target(replace(model.config, n_layer=4))


def test_the_authors_code_has_no_drafter_with_taps():
    model, drafter = deep()
    with pytest.raises(ConfigError, match=r"a drafter with taps \[2, 3\] cannot run in the authors' code"):
        reference_layout.drafter_config(drafter.config)
    assert "lantern_taps" not in reference_layout.drafter_config(DrafterConfig(model.config))


# ----- decoding -----------------------------------------------------------------------------------------
def fuse_inputs(drafter: Drafter) -> list[tuple[int, ...]]:
    """Records the shape of every input ``drafter.fuse`` is given (register before decoding)."""
    shapes: list[tuple[int, ...]] = []
    drafter.fuse.register_forward_hook(lambda module, args, out: shapes.append(tuple(args[0].shape)))
    return shapes


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize(
    "structure", [chain(4), prior_tree(4, 4, 12), DynamicTree(4, 3, 10)], ids=["chain", "static_tree", "dynamic_tree"]
)
def test_greedy_speculative_with_a_taps_drafter_reproduces_greedy_ar(structure, cfg_scale):
    model, drafter = deep()
    shapes = fuse_inputs(drafter)
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    result = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=ExactDeterministic()).generate(
        model, cond, keys
    )
    assert torch.equal(result.codes, expected)
    assert result.per_sample["histogram"][:, 1:].sum() > 0, "the test should exercise accepted drafts"
    rows, width = 4 * (2 if cfg_scale > 1 else 1), len(TAPS) * model.config.dim
    assert shapes[0] == (rows, model.config.cls_token_num, width)  # the drafter's prefill
    assert set(shapes[1:]) == {(rows, structure.depth + 1, width)}  # each step's accepted path, not its tree


@torch.no_grad()
def test_the_drafter_consumed_the_fused_taps_at_every_decided_position():
    """After decoding, the drafter's cache holds, at entry ``i``, the key and value of ``fc([e_{i+1}; fuse(taps_i)])``
    (one drafter layer: a key depends only on its entry's input), as a teacher-forced drafter pass over the decoded
    tokens and the target's teacher-forced taps computes them. A feature from the wrong position, or the final-norm
    state instead of the taps, shows here."""
    model, drafter = deep()
    cond, keys = text_condition(), keys_tensor(2, range(4))
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    caches = []
    original = drafter.new_cache

    def capture(batch, max_len):
        cache = original(batch, max_len)
        caches.append(cache)
        return cache

    drafter.new_cache = capture
    try:
        decoder = SpeculativeDecoder(
            sampling, drafter=drafter, draft=DynamicTree(3, 3, 8, "sampled"), acceptance=ExactSampled()
        )
        codes = decoder.generate(model, cond, keys).codes
    finally:
        del drafter.new_cache
    cfg = model.config
    emb, mask = guided_inputs(model, cond, sampling)  # (8, T, D), (8, T)
    _, taps = model.teacher_hidden(emb, codes.repeat(2, 1), mask, TAPS)  # (8, T+N-1, 2D)
    length = taps.shape[1]
    embeds = torch.cat([drafter.condition_inputs(model, emb), model.embed_tokens(codes.repeat(2, 1))], dim=1)
    reference = drafter.new_cache(8, length)
    entries = torch.arange(length)
    entry_mask = prefix_causal_mask(mask[:, 1:], length)
    drafter(embeds, drafter.target_features(taps), entries, entries.expand(8, -1), entry_mask, reference)
    assert length == cfg.cls_token_num + cfg.num_image_tokens - 1
    torch.testing.assert_close(caches[0].k[:, :, :, :length], reference.k, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(caches[0].v[:, :, :, :length], reference.v, atol=1e-5, rtol=1e-4)


SAMPLES = 2000


def test_exact_sampled_decoding_with_a_taps_drafter_preserves_the_target_marginals():
    model, drafter = deep("c2i", seed=1)
    sampling = SamplingConfig(temperature=1.0, cfg_scale=2.0)
    marginals = _exact_marginals(model, ClassConditioner(10).encode([3]), sampling)
    many = ClassConditioner(10).encode([3] * SAMPLES)
    decoder = SpeculativeDecoder(
        sampling, drafter=drafter, draft=prior_tree(3, 3, 8, candidates="sampled"), acceptance=ExactSampled()
    )
    result = decoder.generate(model, many, keys_tensor(9, range(SAMPLES)))
    assert result.per_sample["histogram"][:, 1:].sum() > SAMPLES // 2  # drafts were accepted along the way
    for position, marginal in zip((1, 2), marginals, strict=True):
        counts = torch.bincount(result.codes[:, position], minlength=VOCAB).double()
        stat, dof = _chi2(counts, marginal.double(), SAMPLES)
        assert stat < chi2.ppf(0.999, dof), f"token {position}: chi2 {stat:.1f} >= {chi2.ppf(0.999, dof):.1f}"


@pytest.mark.parametrize(
    "sampling, structure, rule",
    [
        (SamplingConfig(temperature=0, cfg_scale=3.0), chain(3, "sampled"), ExactDeterministic()),
        (SamplingConfig(temperature=1.0, cfg_scale=3.0), DynamicTree(3, 3, 8, "sampled"), ExactSampled()),
    ],
    ids=["chain-greedy", "dynamic-sampled"],
)
def test_a_taps_step_captures_as_one_graph_and_matches_eager(sampling, structure, rule):
    model, drafter = deep()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    eager = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = SpeculativeDecoder(
        sampling, drafter=drafter, draft=structure, acceptance=rule, compile="default", backend=backend
    )
    for _ in range(2):
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, eager.codes)
        assert torch.equal(result.per_sample["histogram"], eager.per_sample["histogram"])
    assert backend.graphs == 1  # fullgraph=True: one graph per decoder and batch shape


@pytest.mark.slow
def test_inductor_compiled_speculative_with_a_taps_drafter_equals_eager():
    model, drafter = deep()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    structure = DynamicTree(3, 3, 8, "sampled")
    eager = (
        SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=ExactSampled())
        .generate(model, cond, keys)
        .codes
    )
    decoder = SpeculativeDecoder(
        sampling, drafter=drafter, draft=structure, acceptance=ExactSampled(), compile="default"
    )
    assert torch.equal(decoder.generate(model, cond, keys).codes, eager)


# ----- files and folders ---------------------------------------------------------------------------------
def seeded_drafter(taps=TAPS, seed: int = 1) -> Drafter:
    """A drafter for :data:`C2I6` with every tensor drawn anew (a swapped or dropped one shows)."""
    drafter = Drafter(DrafterConfig(node_config(), taps=taps))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in drafter.state_dict().values():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + (tensor.dim() == 1))
    return drafter.eval()


@torch.no_grad()
def drafter_outputs(drafter: Drafter, seed: int = 3) -> torch.Tensor:
    """Drafter features on fixed random target features of the drafter's width (its taps', fused)."""
    cfg = drafter.config.target
    generator = torch.Generator().manual_seed(seed)
    length = cfg.cls_token_num + cfg.num_image_tokens - 1
    width = cfg.dim * max(1, len(drafter.config.taps))
    embeds = torch.randn(2, length, cfg.dim, generator=generator)
    features = drafter.target_features(torch.randn(2, length, width, generator=generator))
    entries = torch.arange(length)
    mask = prefix_causal_mask(torch.ones(2, cfg.cls_token_num, dtype=torch.bool), length)
    return drafter(embeds, features, entries, entries.expand(2, length), mask, NoCache())


def save_file_drafter(drafter: Drafter, path, metadata=None, state=None):
    tensors = {k: v.contiguous() for k, v in (state if state is not None else drafter.state_dict()).items()}
    save_file(tensors, str(path), metadata=metadata if metadata is not None else drafter_metadata(drafter))
    return path


def test_a_taps_drafter_file_loads_back_with_its_taps_and_identical_outputs(tmp_path):
    ours = seeded_drafter()
    assert drafter_metadata(ours)[TAPS_KEY] == "2,3"
    assert TAPS_KEY not in drafter_metadata(seeded_drafter(taps=()))  # no taps: the file as before
    loaded = load_drafter(save_file_drafter(ours, tmp_path / "drafter.safetensors"), C2I6, VQ)
    assert loaded.config.taps == TAPS and torch.equal(drafter_outputs(loaded), drafter_outputs(ours))


def test_a_taps_drafter_folder_loads_back_with_its_taps_and_identical_outputs(tmp_path):
    ours = seeded_drafter(taps=(4, 1, 3))
    folder = save_drafter_folder(ours, torch.randn(1024, 64), tmp_path / "drafter", dtype=torch.float32)
    assert json.loads((folder / "config.json").read_text())[FOLDER_TAPS_KEY] == [4, 1, 3]
    assert FUSE_KEY in load_file(str(folder / "model.safetensors"))
    loaded = load_drafter(folder, C2I6, VQ)
    assert loaded.config.taps == (4, 1, 3) and torch.equal(drafter_outputs(loaded), drafter_outputs(ours))
    plain = save_drafter_folder(seeded_drafter(taps=()), torch.randn(1024, 64), tmp_path / "plain")
    assert FOLDER_TAPS_KEY not in json.loads((plain / "config.json").read_text())  # the release layout, as before
    assert load_drafter(plain, C2I6, VQ).config.taps == ()


def rewrite_folder(folder, config=None, state=None):
    """Change a drafter folder's config.json (``config(dict)``) or tensors (``state(dict)``) in place."""
    if config is not None:
        values = json.loads((folder / "config.json").read_text())
        config(values)
        (folder / "config.json").write_text(json.dumps(values))
    if state is not None:
        tensors = load_file(str(folder / "model.safetensors"))
        state(tensors)
        save_file(tensors, str(folder / "model.safetensors"))


FILE_CASES = [
    (
        "fuse_without_taps",
        TAPS,
        {VOCAB_KEY: "1024"},
        CheckpointError,
        "has fuse.weight .* but no metadata lantern.taps",
    ),
    ("taps_without_fuse", (), {TAPS_KEY: "2,3"}, CheckpointError, "has metadata lantern.taps=2,3 but no fuse.weight"),
    ("tap_too_deep", TAPS, {TAPS_KEY: "2,9"}, ConfigError, r"tap=9: expected an integer in \[1, 5\]"),
    ("taps_unlike_fuse", TAPS, {TAPS_KEY: "1,2,3"}, CheckpointError, r"wrong shape 1: fuse.weight \(64, 128\)"),
    ("not_a_list", TAPS, {TAPS_KEY: "2;3"}, CheckpointError, "lantern.taps='2;3' is not a comma-separated list"),
]


@pytest.mark.parametrize("taps, metadata, error, message", [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_a_drafter_file_whose_tensors_and_taps_disagree_is_one_error(tmp_path, taps, metadata, error, message):
    path = save_file_drafter(seeded_drafter(taps=taps), tmp_path / "drafter.safetensors", metadata=metadata)
    with pytest.raises(error, match=message):
        load_drafter(path, C2I6, VQ)


def test_a_pt_drafter_file_cannot_carry_taps(tmp_path):
    torch.save(seeded_drafter().state_dict(), tmp_path / "drafter.pt")
    with pytest.raises(CheckpointError, match="has fuse.weight .* but no metadata lantern.taps"):
        load_drafter(tmp_path / "drafter.pt", C2I6, VQ)


FOLDER_CASES = [
    ("fuse_without_taps", TAPS, lambda c: c.pop(FOLDER_TAPS_KEY), None, CheckpointError, "has fuse.weight"),
    (
        "taps_without_fuse",
        (),
        lambda c: c.update({FOLDER_TAPS_KEY: [2, 3]}),
        None,
        CheckpointError,
        "has config.json lantern_taps=2,3 but no fuse.weight",
    ),
    ("fuse_dropped", TAPS, None, lambda s: s.pop(FUSE_KEY), CheckpointError, "but no fuse.weight"),
    (
        "not_a_list",
        TAPS,
        lambda c: c.update({FOLDER_TAPS_KEY: "2,3"}),
        None,
        ConfigError,
        "config.json lantern_taps='2,3': expected a list of layer indices",
    ),
    (
        "repeated",
        TAPS,
        lambda c: c.update({FOLDER_TAPS_KEY: [2, 2]}),
        None,
        ConfigError,
        r"lantern_taps=\[2, 2\]: expected distinct layer indices",
    ),
    ("tap_too_deep", TAPS, lambda c: c.update({FOLDER_TAPS_KEY: [2, 6]}), None, ConfigError, "tap=6"),
]


@pytest.mark.parametrize(
    "taps, config, state, error, message", [c[1:] for c in FOLDER_CASES], ids=[c[0] for c in FOLDER_CASES]
)
def test_a_drafter_folder_whose_tensors_and_taps_disagree_is_one_error(tmp_path, taps, config, state, error, message):
    folder = save_drafter_folder(seeded_drafter(taps=taps), torch.randn(1024, 64), tmp_path / "drafter")
    rewrite_folder(folder, config, state)
    with pytest.raises(error, match=message):
        load_drafter(folder, C2I6, VQ)


def test_run_py_with_a_taps_drafter_folder_equals_greedy_ar_png_for_png(tmp_path):
    """The tiny preset's GPT-nano has two layers: its one tap is the state between them."""
    bundle = random_bundle("tiny", TINY_C2I, VQ, functools.partial(ClassConditioner, num_classes=10))
    torch.manual_seed(4)
    drafter = Drafter(DrafterConfig(bundle.target.config, taps=default_taps(bundle.target.config.n_layer)))
    folder = save_drafter_folder(drafter, bundle.target.input_embeddings(), tmp_path / "drafter")
    assert json.loads((folder / "config.json").read_text())[FOLDER_TAPS_KEY] == [1]

    def run(name: str, *overrides: str):
        command = [sys.executable, "run.py", "model=tiny_random_c2i", "temperature=0", "num_images=4"]
        command += ["batch_size=2", "speedup_baseline=null", "wandb.mode=disabled", f"hydra.run.dir={tmp_path / name}"]
        proc = subprocess.run([*command, *overrides], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return [(tmp_path / name / f"{index:06d}.png").read_bytes() for index in range(4)]

    eagle = run("eagle", "decoding=eagle", f"model.drafter_ckpt={folder}")
    assert eagle == run("ar", "decoding=ar")
    record = json.loads((tmp_path / "eagle" / "metrics.json").read_text())
    assert record["inputs"][str(folder.resolve())]["role"] == "drafter"
