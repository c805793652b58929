"""What the Chameleon and Janus family tests share: the entry point in a subprocess, its PNGs and tau, a tiny
preset's parts, and the greedy chain-vs-AR compile check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from helpers import CountingBackend

from lantern.decoding.ar import ARDecoder
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import chain
from lantern.models.drafter import Drafter, DrafterConfig
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.exact import ExactDeterministic
from lantern.rules.neighbours import CodebookNeighbours

REPO = Path(__file__).resolve().parents[1]


def run(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``run.py`` with ``overrides`` writing into ``out`` (no wandb, no warm-up)."""
    command = [sys.executable, "run.py", f"hydra.run.dir={out}", "wandb.mode=disabled", "warmup=0", *overrides]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def pngs(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("0*.png"))}


def tau(folder: Path) -> float:
    return json.loads((folder / "metrics.json").read_text())["mean_accepted_length"]


def tiny_preset(preset: str, family, neighbours_dir: Path):
    """A tiny random preset's bundle, drafter and codebook neighbours, and its prompts; ``family`` is the
    family's bundle module (``random_bundle``, ``random_drafter``, ``random_codebook``)."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(REPO / f"conf/model/{preset}.yaml"), resolve=False)
    target, vq = node["bundle"]["target"], node["bundle"]["vq"]
    model_bundle = family.random_bundle(preset, target, vq)
    drafter = family.random_drafter(target, vq)
    neighbours = CodebookNeighbours(codebook=family.random_codebook(vq), k_max=1024, cache_dir=neighbours_dir)
    return model_bundle, drafter, neighbours, node["default_prompts"]["captions"]


def check_greedy_chain_equals_ar_in_one_graph(target, condition, cfg_scale: float) -> None:
    """Compiled greedy AR (one graph, reused by a second batch) and a compiled chain-3 speculative decoder with a
    random drafter write eager greedy AR's codes."""
    keys = keys_tensor(0, range(len(condition)))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    torch.manual_seed(0)
    drafter = Drafter(DrafterConfig(target.config)).eval()
    expected = ARDecoder(sampling).generate(target, condition, keys).codes
    backend = CountingBackend()
    ar = ARDecoder(sampling, compile="default", backend=backend)
    for _ in range(2):  # a second batch of the same shape reuses the graph
        assert torch.equal(ar.generate(target, condition, keys).codes, expected)
    assert backend.graphs == 1
    backend = CountingBackend()
    spec = SpeculativeDecoder(
        sampling, drafter=drafter, draft=chain(3), acceptance=ExactDeterministic(), compile="default", backend=backend
    )
    assert torch.equal(spec.generate(target, condition, keys).codes, expected)
    assert backend.graphs == 1


def relabelled(folder: Path, copy: Path, **config) -> Path:
    """A copy of the HF folder ``folder`` at ``copy`` whose ``config.json`` has ``config``'s entries changed."""
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    stated = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**stated, **config}))
    return copy
