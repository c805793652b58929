"""Helpers the tests share: a test file imports these (or fixtures from conftest.py), never another test file."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from scipy.stats import kstest

from lantern.decoding.api import settings_from_record
from lantern.decoding.batch import guided_inputs
from lantern.decoding.tree.draft import finish_draft
from lantern.models.condition import TextConditioner
from lantern.models.drafter import Drafter, DrafterConfig
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.sampling import SamplingConfig, guided_logits, guided_logits_at, probabilities
from lantern.models.text.base import TextEmbedding, TextEncoder
from lantern.rng import keys_tensor

REPO = Path(__file__).resolve().parents[1]


def run(
    tmp_path: Path, *overrides: str, name: str = "run", wandb_off: bool = True
) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / name
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "model=tiny_random_c2i",
            f"hydra.run.dir={out}",
            *(("wandb.mode=disabled",) if wandb_off else ()),
            *overrides,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, out


class FakeEncoder(TextEncoder):
    """Deterministic caption states from the prompt text, left-padded like T5."""

    max_length, dim = 4, 8

    def encode(self, prompts):
        states = torch.zeros(len(prompts), 4, 8)
        mask = torch.zeros(len(prompts), 4, dtype=torch.bool)
        for i, text in enumerate(prompts):
            n = min(4, len(text.split()))
            g = torch.Generator().manual_seed(sum(map(ord, text)))
            states[i, 4 - n :] = torch.randn(n, 8, generator=g)
            mask[i, 4 - n :] = True
        return TextEmbedding(states, mask)


VOCAB = 8


def tiny_config(model_type="t2i", vocab=VOCAB, **overrides):
    """A GPT-nano config over a small vocabulary (4x4 tokens)."""
    cls_token_num = 4 if model_type == "t2i" else 1
    return gpt_config(
        "GPT-nano", model_type, 64, vocab_size=vocab, num_classes=10, caption_dim=8, cls_token_num=cls_token_num,
        **overrides,
    )  # fmt: skip


def tiny(model_type="t2i", vocab=VOCAB, seed=0):
    """A GPT-nano target over a small vocabulary (4x4 tokens) and a random drafter for it."""
    torch.manual_seed(seed)
    cfg = tiny_config(model_type, vocab)
    return Transformer(cfg).eval(), Drafter(DrafterConfig(cfg)).eval()


def text_condition(prompts=("a red shirt", "b", "two words here now", "x y")):
    return TextConditioner(FakeEncoder()).encode(list(prompts))


def neighbours_of(vocab):
    """A valid neighbour table: code i's neighbours are i+1, i+2, ... (mod V)."""
    return torch.stack([(torch.arange(vocab) + s) % vocab for s in range(1, vocab)], dim=1)


def exact_marginals(model, condition, sampling):
    """The AR distribution of image tokens 1 and 2 (V,) each, by enumerating tokens 0 and 1."""
    vocab = model.config.vocab_size
    with torch.no_grad():
        values = torch.cat([condition.values, model.null_condition(1)]) if sampling.uses_cfg else condition.values
        mask = condition.mask.repeat(values.shape[0], 1)
        emb = model.embed_condition(values)
        prefixes = torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab))  # (V*V, 2)
        tokens = torch.cat([prefixes, torch.zeros(vocab * vocab, 1, dtype=torch.long)], dim=1)  # (V*V, 3)
        rows = values.shape[0]
        hidden = model.forward_teacher(
            emb.repeat_interleave(vocab * vocab, 0), tokens.repeat(rows, 1), mask.repeat_interleave(vocab * vocab, 0)
        )  # (rows * V*V, 3, D)
        logits = model.head(hidden)
        dist = probabilities(guided_logits(logits, sampling, 1), sampling)  # (V*V, 3, V)
    p0 = dist[0, 0]  # (V,)
    p1 = dist[::vocab, 1]  # (V, V): p(x1 | x0)
    p2 = dist[:, 2].view(vocab, vocab, vocab)  # p(x2 | x0, x1)
    joint01 = p0[:, None] * p1
    return joint01.sum(0), (joint01[:, :, None] * p2).sum((0, 1))


def chi2_statistic(counts, probs, n):
    expected = probs * n
    support = expected > 0
    assert counts[~support].sum() == 0
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum()), int(support.sum()) - 1


class CountingBackend:
    """A torch.compile backend that runs graphs eagerly and counts how many it was given."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


WORDS = ["a", "red", "cat", "sits", "on", "the", "mat", "blue", "dog", "runs", "in", "park", "big", "small"]


T5_DIM = 16


def tiny_t5_folder(folder):
    """Save a random 2-layer T5 encoder and a WordLevel tokenizer appending ``</s>`` to ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({word: index + 3 for index, word in enumerate(WORDS)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(vocab),
        d_model=T5_DIM,
        d_kv=4,
        d_ff=32,
        num_layers=2,
        num_heads=4,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    T5EncoderModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def expected(law: torch.Tensor, draws: int):
    """Expected counts (V,) of ``draws`` draws from ``law`` (V,), summing to ``draws`` in float64."""
    law = law.double()
    return (law / law.sum() * draws).numpy()


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def run_images(tmp_path, name: str, *overrides: str) -> tuple[dict, list[bytes]]:
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "run.py", "model=fashion_t2i", f"hydra.run.dir={out}", "wandb.mode=disabled",
         "num_images=4", "batch_size=2", "speedup_baseline=null", "warmup=0", *overrides],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    return metrics, [(out / f"{i:06d}.png").read_bytes() for i in range(4)]


TINY = (
    "model=tiny_random_c2i",
    "decoding=ar",
    "wandb.mode=disabled",
    "speedup_baseline=null",
    "warmup=0",
    "num_images=2",
)


def run_in_process(overrides: list[str], out: Path, monkeypatch, base=TINY) -> tuple[int, str, str]:
    """``python run.py BASE... overrides`` (``TINY`` unless given) in this process: (exit status, stdout, stderr)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    argv = ["run.py", *base, f"hydra.run.dir={out}", *overrides]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(REPO)
    stdout, stderr = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(str(REPO / "run.py"), run_name="__main__")
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
    return status, stdout.getvalue(), stderr.getvalue()


PASS, FAIL = 1e-3, 1e-6  # a lossless decoder's p-value stays above PASS; the negative control falls below FAIL


SAMPLING = SamplingConfig(temperature=1.0, cfg_scale=3.0)  # the preset's recommended sampling


def pit_values(probs: torch.Tensor, codes: torch.Tensor, seed: int = 7) -> torch.Tensor:
    """Per token, the mass the target puts on tokens it ranks above the drawn one, plus a uniform share of the
    drawn token's own mass: iid uniform on (0, 1) exactly when the codes follow the target's joint law
    (Rosenblatt). ``probs`` (B, N, V) teacher-forced, ``codes`` (B, N) -> (B, N) float64."""
    order = probs.argsort(dim=-1, descending=True, stable=True)
    ranked = probs.gather(-1, order)  # (B, N, V) by descending probability
    place = order.argsort(dim=-1).gather(-1, codes[..., None])  # (B, N, 1) rank of the drawn code
    above = (ranked.cumsum(-1) - ranked).gather(-1, place)[..., 0].double()
    own = probs.gather(-1, codes[..., None])[..., 0].double()
    share = torch.rand(codes.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (above + share * own).clamp(0.0, 1.0)


def ks_pvalue(tiny, decoder, images: int = 64) -> float:
    model_bundle, _, _, captions = tiny
    model = model_bundle.target
    condition = model_bundle.conditioner.encode([captions[i % len(captions)] for i in range(images)])
    codes = decoder.generate(model, condition, keys_tensor(11, range(images))).codes  # (B, N)
    with torch.inference_mode():
        emb, mask = guided_inputs(model, condition, SAMPLING)
        hidden = model.forward_teacher(emb, codes.repeat(emb.shape[0] // images, 1), mask)  # (rows, N, D)
        steps = torch.arange(codes.shape[1]).expand(images, -1)
        probs = probabilities(guided_logits_at(model.head(hidden), SAMPLING, steps), SAMPLING)  # (B, N, K)
    values = pit_values(probs, codes)[:, 1:].flatten()  # token 0 comes from the target's own prefill
    return float(kstest(values.numpy(), "uniform").pvalue)


V = 6


def greedy_draft(tokens: list[int], parents: list[int]):
    """A greedy draft (batch 1) from node tokens and parents (node 0 the root, parents before children)."""
    count = len(tokens)
    depth = [0] * count
    for i in range(1, count):
        depth[i] = depth[parents[i]] + 1
    kids = [[i for i in range(1, count) if parents[i] == n] for n in range(count)]
    width = max(len(k) for k in kids)
    draws = torch.full((1, count, width), -1)
    slots = torch.zeros(1, count, dtype=torch.long)
    for node, children in enumerate(kids):
        for slot, child in enumerate(children):
            draws[0, node, slot], slots[0, child] = tokens[child], slot
    return finish_draft(
        torch.tensor([tokens]),
        torch.tensor([parents]),
        torch.tensor([depth]),
        torch.zeros(1, count, V),
        draws,
        slots,
        max(depth),
        "greedy",
    )


METRIC_CASES = {
    "world": ({}, {"fid": "FID", "faithfulness": "PromptFaithfulness", "clip": "CLIPScore"}),
    "precision_recall": (
        {"metrics.precision_recall.weights": "v.pth", "metrics.precision_recall.reference.path": "REF"},
        {"precision_recall": "PrecisionRecall"},
    ),
    "hps": ({"metrics.hps.checkpoint": "h.pt"}, {"hps": "HPSv2"}),
    "kid": ({"metrics.kid.reference.path": "REF"}, {"kid": "KID"}),
    "inception_score": ({"metrics.inception_score.logits_weights": "fc.pth"}, {"inception_score": "InceptionScore"}),
    "lantern_coco": (
        {
            "metrics.fid.reference.path": "REF",
            "metrics.clip.pretrained": "c.pt",
            "metrics.precision_recall.weights": "v.pth",
            "metrics.hps.checkpoint": "h.pt",
        },
        {"fid": "FID", "clip": "CLIPScore", "precision_recall": "PrecisionRecall", "hps": "HPSv2"},
    ),
    "sjd_coco": (
        {"metrics.fid.reference.path": "REF", "metrics.fid.extractor.weights": "p.pth", "metrics.clip.folder": "CLIP"},
        {"fid": "FID", "clip": "TorchmetricsCLIPScore"},
    ),
}


IMAGES = 300  # a signal sent after image 2 must land before the run ends: the tiny model does 20-60 images/s


BASE = (
    "model=tiny_random_c2i",
    f"num_images={IMAGES}",
    "batch_size=1",
    "warmup=0",
    "speedup_baseline=null",
    "wandb.mode=disabled",
)


def _as_from_a_terminal() -> None:
    """Ctrl-C's default action in the child, as a shell gives a foreground command: a test suite started as
    a background job (``pytest &``) ignores SIGINT, and a child would inherit that and never see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "run.py", *BASE, f"hydra.run.dir={out}", *overrides],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name} appeared: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.02)


def finish(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run.py", *BASE, f"hydra.run.dir={out}", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def uninterrupted_run(tmp_path_factory):
    """An uninterrupted run of the configuration the run-folder tests interrupt (their ``reference`` fixture)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = finish(out)
    assert proc.returncode == 0, proc.stderr
    return out
