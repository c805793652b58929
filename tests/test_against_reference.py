"""scripts/bench_against_reference.py and the conversion to the authors' HF layout.

Under the project's venv (transformers 5.x, no snapshot of their code) the benchmark skips; these tests
check that skip, the bad-input refusals and the conversion's key mapping. The one test that needs their
code runs only where it can be imported (docs/against_reference.md's side environment).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lantern.models.drafter import Drafter, DrafterConfig
from lantern.models.llamagen import reference_code as theirs
from lantern.models.llamagen import reference_layout as convert
from lantern.models.llamagen.drafter import from_reference_keys
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.rules.api import PathChoice

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_against_reference.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_against_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main(monkeypatch, capsys, *argv) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    code = 0
    try:
        _script().main()
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _small_gpt(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(gpt_config("GPT-nano", "t2i", 64, 16, vocab_size=64, caption_dim=24, cls_token_num=6)).eval()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--images", "0"], "error: --images=0: expected an integer >= 1"),
        (["--runs", "x"], "error: --runs='x': expected an integer >= 0"),
        (["--deltas", "0.1,2"], "error: --deltas=2.0: expected a number in [0, 1]"),
        (["--threads", "0"], "error: --threads=0: expected an integer >= 1"),
    ],
)
def test_bad_option_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, argv, message):
    out = tmp_path / "res" / "against"
    code, stdout, stderr = _main(monkeypatch, capsys, *argv, "--out", str(out))
    assert code == 2
    assert stderr.splitlines() == [stderr.strip()] and stderr.startswith(message)
    assert not (tmp_path / "res").exists()


def test_reference_folder_without_their_code_is_bad_input(monkeypatch, capsys, tmp_path):
    for given in (tmp_path / "absent", tmp_path):
        code, _, stderr = _main(monkeypatch, capsys, "--reference", str(given), "--out", str(tmp_path / "o" / "x"))
        assert code == 2 and len(stderr.strip().splitlines()) == 1
        assert stderr.startswith(f"error: --reference={str(given)!r}: expected ")
    assert not (tmp_path / "o").exists()


def test_skips_without_reference(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(theirs.ENV_VAR, str(tmp_path / "no-lantern"))
    out = tmp_path / "res" / "against"
    code, stdout, stderr = _main(monkeypatch, capsys, "--images", "1", "--out", str(out))
    assert code == 0 and stderr == ""
    assert stdout.startswith("skipped: no reference code at ") and len(stdout.strip().splitlines()) == 1
    assert not (tmp_path / "res").exists()


def test_skips_with_wrong_transformers(monkeypatch, capsys, tmp_path):
    import transformers

    if transformers.__version__.startswith(theirs.TRANSFORMERS_SERIES + "."):
        pytest.skip("this Python has the reference's transformers")
    (tmp_path / "models").mkdir()
    (tmp_path / theirs.ENTRY).write_text("raise RuntimeError('never imported')\n")
    code, stdout, _ = _main(monkeypatch, capsys, "--reference", str(tmp_path), "--out", str(tmp_path / "o" / "x"))
    assert code == 0
    assert stdout.startswith(f"skipped: the reference code needs transformers {theirs.TRANSFORMERS_SERIES}")
    assert not (tmp_path / "o").exists()


def test_target_keys_map_to_their_layout():
    gpt = _small_gpt()
    cfg = gpt.config
    state = gpt.state_dict()
    converted = convert.target_state_dict(state, cfg)
    expected = {
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.cls_embedding.uncond_embedding",
        "model.cls_embedding.cap_proj.fc1.weight",
        "model.cls_embedding.cap_proj.fc2.weight",
    }
    for i in range(cfg.n_layer):
        expected |= {
            f"model.layers.{i}.{name}.weight"
            for name in (
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
                "input_layernorm",
                "post_attention_layernorm",
            )
        }
    assert set(converted) == expected
    layer = "model.layers.1.self_attn."
    qkv = torch.cat([converted[layer + f"{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv, state["layers.1.attention.wqkv.weight"])
    assert torch.equal(converted["model.layers.0.mlp.gate_proj.weight"], state["layers.0.feed_forward.w1.weight"])
    assert torch.equal(converted["model.layers.0.mlp.up_proj.weight"], state["layers.0.feed_forward.w3.weight"])
    assert torch.equal(converted["lm_head.weight"], state["output.weight"])
    uncond = converted["model.cls_embedding.uncond_embedding"]  # (120, C): ours last, zeros before
    assert uncond.shape == (convert.REFERENCE_COND_SLOTS, cfg.caption_dim)
    assert torch.equal(uncond[-cfg.cls_token_num :], state["cls_embedding.uncond_embedding"])
    assert not uncond[: -cfg.cls_token_num].any()
    hf = convert.target_config(cfg)
    assert (hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]) == (
        cfg.dim,
        cfg.ffn_hidden,
        cfg.n_layer,
    )
    assert hf["cls_token_num"] == 120 and hf["block_size"] == cfg.num_image_tokens


def test_drafter_keys_round_trip_through_our_reader():
    gpt = _small_gpt()
    torch.manual_seed(1)
    drafter = Drafter(DrafterConfig(gpt.config))
    state = drafter.state_dict()
    converted = convert.drafter_state_dict(state, gpt.tok_embeddings.weight)
    assert "layers.0.input_layernorm.weight" not in converted  # neither side has a first-layer input norm
    assert {"fc.weight", "fc.bias", "embed_tokens.weight", "layers.0.self_attn.q_proj.weight"} <= set(converted)
    back, embed = from_reference_keys(converted)  # the reader of EAGLE/LANTERN drafter files
    assert torch.equal(embed, gpt.tok_embeddings.weight)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    assert convert.drafter_config(drafter.config)["bias"] is True


def test_caption_layout_is_t5s():
    values = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])  # left-padded
    states, flags = convert.caption_inputs(values, mask)
    assert states.shape == (2, 120, 3) and flags.tolist()[0][:3] == [1, 1, 0]
    assert torch.equal(states[0, :2], values[0, 2:]) and not states[0, 2:].any()
    assert torch.equal(states[1, :4], values[1]) and int(flags[1].sum()) == 4


def test_logits_match_their_code_on_random_weights(tmp_path):
    """Needs their code and transformers 4.45 (skipped elsewhere, e.g. in CI)."""
    try:
        modules = theirs.import_reference(theirs.reference_folder(None))
    except theirs.ReferenceUnavailable as exc:
        pytest.skip(str(exc))
    from lantern.models.condition import Condition
    from lantern.rules.neighbours import neighbour_table

    gpt = _small_gpt(2)
    torch.manual_seed(3)
    drafter = Drafter(DrafterConfig(gpt.config)).eval()
    table = neighbour_table(torch.randn(gpt.config.vocab_size, 4), gpt.config.vocab_size - 1, normalize=False)
    bundle = SimpleNamespace(gpt=gpt)
    reference = theirs.build_reference(modules, bundle, drafter, table, depth=3, top_k=4, nodes=10)
    mask = torch.tensor([[False, False, True, True, True, True]])
    condition = Condition(torch.randn(1, gpt.config.cls_token_num, gpt.config.caption_dim), mask)
    diffs = theirs.check_logits(bundle, drafter, reference, condition)
    assert diffs["target_logits_max_abs_diff"] < 1e-4 and diffs["drafter_logits_max_abs_diff"] < 1e-4


def test_their_greedy_paths_are_listed_leaf_by_leaf():
    """retrieve_paths mirrors their EAGLE-2 ``retrieve_indices`` at temperature 0: leaves in increasing
    node index, each its node indices from the root, -1 padded."""
    parents, depth = [-1, 0, 0, 2, 1, 3], [0, 1, 1, 2, 2, 3]
    assert theirs.retrieve_paths(parents, depth).tolist() == [[0, 1, 4, -1], [0, 2, 3, 5]]


def test_our_reference_walk_equals_their_evaluate_posterior_on_random_trees():
    """Needs their code (skipped elsewhere). Random EAGLE-2-like trees (nodes of one depth in any parent
    order) and peaked target rows, so several paths often tie: our greedy reference walk
    (``leaf_order="index"``) accepts the same path and next token as their ``evaluate_posterior``."""
    try:
        modules = theirs.import_reference(theirs.reference_folder(None))
    except theirs.ReferenceUnavailable as exc:
        pytest.skip(str(exc))
    from helpers import greedy_draft as _draft

    from lantern.rules.reference import LanternReference

    vocab, k = 12, 3
    generator = torch.Generator().manual_seed(0)
    table = torch.stack([torch.randperm(vocab - 1, generator=generator) for _ in range(vocab)])
    table = torch.where(table >= torch.arange(vocab)[:, None], table + 1, table)  # (V, V-1) without self
    differs_from_node_order = 0
    for delta in (0.1, 0.4):
        ours = LanternReference(k, table, delta=delta, candidates="greedy")
        their_walk = theirs.their_greedy_walk(modules, table, k, delta)
        for _ in range(150):
            count = int(torch.randint(4, 14, (1,), generator=generator))
            parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, count)]
            order = sorted(
                range(1, count), key=lambda i: (_depth(parents, i), float(torch.rand(1, generator=generator)))
            )
            parents, tokens = _relabel(parents, order), torch.randint(0, 4, (count,), generator=generator).tolist()
            draft = _draft(tokens, parents)
            p = torch.softmax(3 * torch.randn(1, count, vocab, generator=generator, dtype=torch.float64), -1)
            p[..., :4] += 0.3 * torch.rand(1, count, 4, generator=generator, dtype=torch.float64)  # near ties
            p = p / p.sum(-1, keepdim=True)
            got, want = ours.walk(draft, p), PathChoice(*their_walk(draft, p))
            assert torch.equal(got.path, want.path) and torch.equal(got.next_token, want.next_token)
            ours.leaf_order = "sorted"
            differs_from_node_order += not torch.equal(ours.walk(draft, p).path, want.path)
            ours.leaf_order = "index"
    assert differs_from_node_order > 0  # the trees did exercise ties the orders break differently


def _depth(parents: list[int], node: int) -> int:
    return 0 if parents[node] < 0 else 1 + _depth(parents, parents[node])


def _relabel(parents: list[int], order: list[int]) -> list[int]:
    """Renumber nodes so ``order`` (by depth, shuffled within a depth) becomes 1, 2, ...: parents first."""
    new = {0: 0} | {old: i + 1 for i, old in enumerate(order)}
    out = [-1] * len(parents)
    for old, i in new.items():
        if old:
            out[i] = new[parents[old]]
    return out
