"""Tokens/s of the AR decoder on randomly initialised weights, batch 1 and batch 8 (median of runs).

    python scripts/bench_ar.py                                 # GPT-tiny c2i, 16x16 tokens, CPU
    python scripts/bench_ar.py --llamagen-repo PATH            # also time LlamaGen's own generate()

With ``--llamagen-repo`` (a local checkout of FoundationVision/LlamaGen, never committed here) the
reference model is built from the same state dict, timed in the same process with the same settings,
and its greedy tokens are compared with ours token for token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from lantern.decoding.ar import ARDecoder
from lantern.models.condition import ClassConditioner
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.sampling import SamplingConfig
from lantern.results.provenance import environment
from lantern.rng import keys_tensor
from lantern.run.job import synchronize


def timed(fns: dict, runs: int, warmup: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each callable; runs are interleaved so background load hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def reference_model(repo: str, model: Transformer):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="GPT-tiny")
    parser.add_argument("--grid", type=int, default=16, help="image side in tokens")
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--cfg-scale", type=float, default=4.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--llamagen-repo", default=None, help="local LlamaGen checkout to compare against")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = gpt_config(args.preset, "c2i", args.grid * 16, vocab_size=args.vocab)
    model = Transformer(cfg).to(device).eval()
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
        medians = timed(fns, args.runs, args.warmup, device)
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
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "results": rows, "environment": environment(device)}, handle, indent=2)


if __name__ == "__main__":
    main()
