"""Tokens/s of the AR decoder on randomly initialised weights, batch 1 and batch 8 (median of runs).

    python scripts/bench_ar.py                                 # GPT-tiny c2i, 16x16 tokens, CPU
    python scripts/bench_ar.py --llamagen-repo PATH            # also time LlamaGen's own generate()

With ``--llamagen-repo`` (a local checkout of FoundationVision/LlamaGen, never committed here) the
reference model is built from the same state dict, timed in the same process with the same settings,
and its greedy tokens are compared with ours token for token.
"""

from __future__ import annotations

from lantern.cli.main import ArgumentParser, run_or_exit
from lantern.run.bench.ar import run_ar_bench


def main() -> None:
    parser = ArgumentParser(__doc__)
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
    args = parser.parse()
    run_or_exit(lambda: run_ar_bench(args))


if __name__ == "__main__":
    main()
