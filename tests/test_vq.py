"""Tests of the VQ tokenizer: official state-dict layouts, quantisation, shapes, losses and strict loading."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.models.bundle import to_uint8
from lantern.models.checkpoint import load_weights
from lantern.models.vq_model import CODEBOOK_USED_SIZE, VQ_PRESETS, Downsample, VQConfig, VQModel, vq_config

KEYS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "llamagen_keys"


def read_layout(name: str) -> list[tuple[str, tuple[int, ...], str]]:
    """Rows (key, shape, dtype) of ``shared/llamagen_keys/vq_<name>.tsv``, in file order; skips if absent."""
    path = KEYS_DIR / f"vq_{name}.tsv"
    if not path.is_file():
        pytest.skip(f"official key layout {path} not found (the shared/llamagen_keys folder sits next to the repo)")
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        key, shape, dtype = line.split("\t")
        rows.append((key, tuple(int(s) for s in shape.split(",")), dtype))
    return rows


@pytest.fixture(scope="module")
def tiny() -> VQModel:
    torch.manual_seed(0)
    return VQModel(vq_config("VQ-tiny")).eval()


@pytest.mark.parametrize("name", ["VQ-16", "VQ-8"])
def test_state_dict_matches_official_layout(name: str) -> None:
    expected = read_layout(name)
    with torch.device("meta"):
        model = VQModel(vq_config(name))  # no memory: meta tensors only carry shapes
    got = [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in model.state_dict().items()]
    assert [k for k, _, _ in got] == [k for k, _, _ in expected]  # same names in the same order
    assert got == expected


def test_presets_and_config_validation() -> None:
    assert VQ_PRESETS["VQ-16"].downsample == 16 and VQ_PRESETS["VQ-8"].downsample == 8
    assert VQ_PRESETS["VQ-tiny"].downsample == 8 and VQ_PRESETS["VQ-tiny16"].downsample == 16
    cfg = vq_config("VQ-tiny", codebook_size=512, ch_mult=[1, 2])
    assert cfg.codebook_size == 512 and cfg.ch_mult == (1, 2) and hash(cfg)
    with pytest.raises(ConfigError, match=r"VQ preset='VQ-99': expected one of VQ-16, VQ-8, VQ-tiny"):
        vq_config("VQ-99")
    with pytest.raises(ConfigError, match="unknown VQConfig field"):
        vq_config("VQ-16", channels=3)
    with pytest.raises(ConfigError, match="divisible by norm_groups=32"):
        VQConfig(ch=48)
    with pytest.raises(ConfigError, match="codebook_size"):
        VQConfig(codebook_size=1)
    with pytest.raises(ConfigError, match="dropout"):
        VQConfig(dropout=1.5)


@pytest.mark.parametrize("size", [32, 64])
def test_tiny_encode_decode_shapes(tiny: VQModel, size: int) -> None:
    images = torch.rand(2, 3, size, size) * 2 - 1
    codes = tiny.encode(images)
    side = size // tiny.config.downsample
    assert codes.shape == (2, side, side) and codes.dtype == torch.int64
    assert 0 <= int(codes.min()) and int(codes.max()) < tiny.config.codebook_size
    with torch.no_grad():
        decoded = tiny.decode_codes(codes)
        flat = tiny.decode_codes(codes.reshape(2, -1).to(torch.int32))  # (B, N) raster form, int32 like the GPT
    assert decoded.shape == (2, 3, size, size) and decoded.dtype == torch.float32
    torch.testing.assert_close(flat, decoded)
    pixels = to_uint8(decoded)
    assert pixels.shape == (2, size, size, 3) and pixels.dtype == torch.uint8


def test_encode_rejects_bad_sizes(tiny: VQModel) -> None:
    with pytest.raises(ConfigError, match="not divisible by the VQ downsample factor 8"):
        tiny.encode(torch.zeros(1, 3, 36, 32))
    with pytest.raises(ConfigError, match=r"\(B, 3, H, W\)"):
        tiny.encode(torch.zeros(3, 32, 32))
    with pytest.raises(ConfigError, match="not a perfect square"):
        tiny.decode_codes(torch.zeros(1, 15, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"\[0, 2048\)"):
        tiny.decode_codes(torch.full((1, 2, 2), 2048))


def test_codebook_rows_are_unit_norm(tiny: VQModel) -> None:
    book = tiny.codebook()  # (K, D)
    assert book.shape == (tiny.config.codebook_size, tiny.config.codebook_embed_dim)
    torch.testing.assert_close(book.norm(dim=-1), torch.ones(book.shape[0]))
    raw = tiny.raw_codebook()
    assert raw is tiny.quantize.embedding.weight
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(raw.shape[0]))  # the uniform init is far from unit norm


def test_encode_picks_nearest_normalised_code(tiny: VQModel) -> None:
    torch.manual_seed(1)
    images = torch.rand(4, 3, 32, 32) * 2 - 1
    codes = tiny.encode(images).reshape(-1)  # (B*h*w,)
    with torch.no_grad():
        z = tiny.latents(images)  # (B, D, h, w)
    z = torch.nn.functional.normalize(z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]).double(), dim=-1)
    book = torch.nn.functional.normalize(tiny.raw_codebook().detach().double(), dim=-1)
    dist = torch.cdist(z, book)  # (B*h*w, K) brute-force Euclidean distances
    chosen = dist.gather(1, codes[:, None]).squeeze(1)
    torch.testing.assert_close(chosen, dist.min(dim=1).values, atol=1e-6, rtol=0)
    assert (codes == dist.argmin(dim=1)).float().mean() > 0.95  # only exact near-ties may differ


def test_unnormalised_quantizer_uses_raw_distances() -> None:
    torch.manual_seed(2)
    model = VQModel(vq_config("VQ-tiny", l2_norm=False, codebook_size=64))
    z = torch.randn(2, 8, 3, 3) * 0.01
    codes = model.quantize.nearest(z).reshape(-1)
    dist = torch.cdist(z.permute(0, 2, 3, 1).reshape(-1, 8), model.raw_codebook().detach())
    assert torch.equal(codes, dist.argmin(dim=1))


def test_downsample_pads_bottom_right_only() -> None:
    down = Downsample(2)
    for size, expected in [(8, 4), (7, 3), (5, 2), (2, 1)]:
        assert down(torch.zeros(1, 2, size, size)).shape[-2:] == (expected, expected)
    with torch.no_grad():
        down.conv.weight.zero_()
        down.conv.bias.zero_()
        down.conv.weight[0, 0, 2, 2] = 1.0  # output (i, j) reads padded input (2i+2, 2j+2)
        down.conv.weight[1, 1, 0, 0] = 1.0  # output (i, j) reads padded input (2i, 2j)
    x = torch.arange(1.0, 65.0).reshape(1, 1, 8, 8).repeat(1, 2, 1, 1)
    out = down(x)  # (1, 2, 4, 4)
    torch.testing.assert_close(out[0, 1], x[0, 1, 0::2, 0::2])  # no padding on the top/left
    torch.testing.assert_close(out[0, 0, :3, :3], x[0, 0, 2::2, 2::2])
    assert out[0, 0, 3].abs().sum() == 0 and out[0, 0, :, 3].abs().sum() == 0  # the zero row/column at the end


def test_forward_losses_and_backward() -> None:
    torch.manual_seed(3)
    model = VQModel(vq_config("VQ-tiny")).train()
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    recon, losses = model(images)
    assert recon.shape == images.shape
    assert set(losses) == {"reconstruction", "codebook", "commitment"}
    assert all(torch.isfinite(v) and v.ndim == 0 for v in losses.values())
    torch.testing.assert_close(losses["commitment"], 0.25 * losses["codebook"].detach())
    sum(losses.values()).backward()
    for name in ("encoder.conv_in.weight", "quant_conv.weight", "quantize.embedding.weight", "decoder.conv_out.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    used = model.quantize.codebook_used
    assert used.shape == (CODEBOOK_USED_SIZE,) and "quantize.codebook_used" in model.state_dict()
    assert used[-8:].tolist() == model.encode(images).reshape(-1)[-8:].float().tolist()


def test_eval_forward_equals_encode_then_decode(tiny: VQModel) -> None:
    torch.manual_seed(4)
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    before = tiny.quantize.codebook_used.clone()
    with torch.no_grad():
        recon, _ = tiny(images)
        decoded = tiny.decode_codes(tiny.encode(images))
    torch.testing.assert_close(recon, decoded)
    assert torch.equal(tiny.quantize.codebook_used, before)  # usage is only recorded in training mode


def test_to_uint8_formula() -> None:
    x = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0]).reshape(1, 1, 1, 6).repeat(1, 3, 1, 1)
    pixels = to_uint8(x)  # (1, 1, 6, 3)
    assert pixels.shape == (1, 1, 6, 3)
    assert pixels[0, 0, :, 0].tolist() == [0, 0, 128, 191, 255, 255]


@pytest.fixture(scope="module")
def vq16_checkpoint(tmp_path_factory) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    """A random file in the official VQ-16 format, built from the TSV layout alone."""
    layout = read_layout("VQ-16")
    gen = torch.Generator().manual_seed(5)
    # Small zero-mean values keep activations finite through the ~50 random layers.
    sd = {key: 0.02 * torch.randn(shape, generator=gen) for key, shape, _ in layout}
    path = tmp_path_factory.mktemp("vq16") / "vq_ds16_random.pt"
    torch.save({"model": sd}, path)
    yield path, sd
    path.unlink()  # pytest keeps old temp dirs; do not leave 290 MB behind per run


@pytest.fixture(scope="module")
def vq16_model() -> VQModel:
    with torch.device("meta"):
        model = VQModel(vq_config("VQ-16"))
    return model.to_empty(device="cpu").eval()  # skip random init: every tensor is loaded below


def test_load_random_vq16_checkpoint(vq16_checkpoint, vq16_model: VQModel) -> None:
    path, sd = vq16_checkpoint
    load_weights(vq16_model, path, expected="VQ-16")
    for key in ("quantize.embedding.weight", "quantize.codebook_used", "decoder.conv_blocks.0.upsample.conv.bias"):
        assert torch.equal(vq16_model.state_dict()[key], sd[key])
    with torch.no_grad():
        images = vq16_model.decode_codes(torch.tensor([[0, 16383, 5, 7]]))  # 2x2 codes -> 32x32
    assert images.shape == (1, 3, 32, 32) and torch.isfinite(images).all()


def test_corrupt_vq16_checkpoint_is_refused(vq16_checkpoint, vq16_model: VQModel, tmp_path: Path) -> None:
    # One file with three faults (one key renamed, one missing, one wrongly shaped) saves two 290 MB writes.
    _, sd = vq16_checkpoint
    bad = dict(sd)
    bad["encoder.mid.1.query.weight"] = bad.pop("encoder.mid.1.q.weight")
    del bad["decoder.conv_blocks.2.res.1.conv2.bias"]
    bad["quant_conv.weight"] = torch.zeros(8, 512, 1, 1)
    path = tmp_path / "corrupt.pt"
    torch.save({"model": bad}, path)
    try:
        with pytest.raises(CheckpointError) as info:
            load_weights(vq16_model, path, expected="VQ-16")
    finally:
        path.unlink()
    message = str(info.value)
    assert "does not match VQ-16" in message
    assert "unexpected 1: encoder.mid.1.query.weight" in message
    assert "missing 2: decoder.conv_blocks.2.res.1.conv2.bias, encoder.mid.1.q.weight" in message
    assert "wrong shape 1: quant_conv.weight (8, 512, 1, 1) != (8, 256, 1, 1)" in message


def test_non_checkpoint_file_is_refused(vq16_model: VQModel, tmp_path: Path) -> None:
    path = tmp_path / "notes.pt"
    path.write_text("not a checkpoint\n")
    with pytest.raises(CheckpointError, match="notes.pt"):
        load_weights(vq16_model, path, expected="VQ-16")
    with pytest.raises(CheckpointError, match="not found"):
        load_weights(vq16_model, tmp_path / "absent.pt", expected="VQ-16")
