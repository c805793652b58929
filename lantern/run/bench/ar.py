"""Plain AR's tokens/s on a random target (``scripts/bench_ar.py``), and LlamaGen's own ``generate()`` on the
same weights beside it when a local checkout of LlamaGen is given."""

from __future__ import annotations

import statistics
import sys

import torch

from lantern import checks
from lantern.decoding.ar import ARDecoder
from lantern.files import write_json_atomic
from lantern.models.condition import ClassConditioner
from lantern.models.llamagen.bundle import random_gpt
from lantern.models.sampling import SamplingConfig
from lantern.results.provenance import environment
from lantern.rng import keys_tensor
from lantern.run.timing import timed


def timed_calls(fns: dict, runs: int, warmup: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each callable; runs are interleaved so background load hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            times[name].append(timed(fn, device)[0])
    return {name: statistics.median(values) for name, values in times.items()}


def reference_model(repo: str, model):
    """LlamaGen's own Transformer with our weights (imported from a local checkout)."""
    sys.path.insert(0, repo)
    from autoregressive.models.gpt import ModelArgs
    from autoregressive.models.gpt import Transformer as RefTransformer

    cfg = model.config
    args = ModelArgs(
        dim=cfg.dim,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        vocab_size=cfg.vocab_size,
        num_classes=cfg.num_classes,
        cls_token_num=cfg.cls_token_num,
        model_type=cfg.model_type,
        block_size=cfg.num_image_tokens,
        token_dropout_p=0.0,
        resid_dropout_p=0.0,
        ffn_dropout_p=0.0,
    )
    ref = RefTransformer(args)
    ref.load_state_dict(model.state_dict(), strict=True)
    return ref.to(model.output.weight.device).eval()


def run_ar_bench(args) -> list[dict]:
    """Tokens/s of the AR decoder on a random target (``scripts/bench_ar.py``), and of LlamaGen's own
    ``generate()`` on the same weights when ``args.llamagen_repo`` is a local checkout of it."""
    from lantern.models.devices import resolve_device

    # Upper bounds where a value sets work or memory (a 128 x 128 grid, a 65536-code vocabulary at most).
    checks.capped("--runs", args.runs, 1, 1000)
    checks.capped("--warmup", args.warmup, 0, 1000)
    checks.capped("--grid", args.grid, 1, 128)
    checks.capped("--vocab", args.vocab, 2, 65536)
    if checks.is_number(args.top_k) and args.top_k > args.vocab:  # below 0: the sampling settings say so
        raise checks.refuse("--top-k", args.top_k, f"an integer in [0, {args.vocab}]", "0 = off")
    checks.capped("--threads", args.threads, 0, 256)
    for batch in args.batch_sizes:
        checks.capped("--batch-sizes", batch, 1, 4096)
    if args.llamagen_repo is not None:
        checks.path("--llamagen-repo", args.llamagen_repo, "folder", note="a local LlamaGen checkout")
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_gpt(args.preset, "c2i", args.grid * 16, vocab_size=args.vocab).to(device).eval()
    cfg = model.config
    ref = reference_model(args.llamagen_repo, model) if args.llamagen_repo else None
    sampling = SamplingConfig(temperature=1.0, top_k=args.top_k, cfg_scale=args.cfg_scale)
    decoder = ARDecoder(sampling)
    conditioner = ClassConditioner(cfg.num_classes, device)
    rows = []
    print(
        f"{args.preset} c2i, {cfg.num_image_tokens} tokens/image, cfg {args.cfg_scale}, "
        f"{torch.get_num_threads()} threads on {device}"
    )
    for batch in args.batch_sizes:
        condition = conditioner.encode([i % cfg.num_classes for i in range(batch)])
        keys = keys_tensor(0, range(batch), device)
        fns = {"lantern": lambda condition=condition, keys=keys: decoder.generate(model, condition, keys)}
        if ref is not None:
            from autoregressive.models.generate import generate as ref_generate

            def run_ref(sample_logits=True, condition=condition):
                with torch.no_grad():
                    return ref_generate(
                        ref,
                        condition.values,
                        cfg.num_image_tokens,
                        cfg_scale=args.cfg_scale,
                        temperature=1.0,
                        top_k=args.top_k,
                        top_p=1.0,
                        sample_logits=sample_logits,
                    )

            fns["llamagen"] = run_ref
        medians = timed_calls(fns, args.runs, args.warmup, device)
        row = {"batch": batch}
        for name, seconds in medians.items():
            row[f"{name}_s"] = seconds
            row[f"{name}_tokens_per_s"] = batch * cfg.num_image_tokens / seconds
        if ref is not None:
            greedy_ours = (
                ARDecoder(SamplingConfig(temperature=0, cfg_scale=args.cfg_scale))
                .generate(model, condition, keys)
                .codes
            )
            greedy_ref = run_ref(sample_logits=False).long()
            row["speedup_vs_llamagen"] = medians["llamagen"] / medians["lantern"]
            row["greedy_tokens_equal"] = bool(torch.equal(greedy_ours, greedy_ref))
        rows.append(row)
        print("  " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if args.json:
        write_json_atomic(args.json, {"args": vars(args), "results": rows, "environment": environment(device)})
    return rows
