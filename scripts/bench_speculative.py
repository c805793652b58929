r"""Speculative decoding vs AR on the same prompts and seeds, in one run: tau, latency, speed-up.

    python scripts/bench_speculative.py                       # the embedded world, CPU, batch 1
    python scripts/bench_speculative.py --images 20 --runs 3 --out results/bench_speculative
    python scripts/bench_speculative.py --images 6 --runs 3 --settings sampling --deltas 0.1 \
        --lantern-structures chain --candidates sampled --peers sjd,gsd
    python scripts/bench_speculative.py --compile none ...   # eager steps, with a per-phase breakdown

Steps are compiled (``torch.compile(fullgraph=True)``, AR alike) unless ``--compile none``: the first
compile of each mode takes one to three minutes on a 2-core CPU and is cached by Inductor for later runs.

How modes are composed, interleaved and summarised: :mod:`lantern.run.bench.speculative`. Every value is checked and
every mode's config composed before the first is timed; ``--out`` is checked writable first, and the
results are written after each setting.
"""

from __future__ import annotations

import json
import sys

from lantern.cli.main import ArgumentParser, flag_number, run_or_exit
from lantern.run.bench.speculative import check_reference, plan_from, run_bench, write_results


def main() -> None:
    parser = ArgumentParser(__doc__)
    parser.add_argument("--images", default=20, help="prompts (one image each) per mode")
    parser.add_argument("--runs", default=3, help="timed repeats per image (median)")
    parser.add_argument("--seed", default=0)
    parser.add_argument("--threads", default=2)
    parser.add_argument("--model", default="fashion_t2i")
    parser.add_argument(
        "--structures", default="chain,static_tree,dynamic_tree", help="draft structures for exact decoding"
    )
    parser.add_argument("--lantern-structures", default="dynamic_tree", help="draft structures for LANTERN")
    parser.add_argument("--deltas", default="0.05,0.1,0.2,0.4")
    parser.add_argument(
        "--candidates",
        default="deterministic,sampled",
        help="candidate kinds (sampled ones in the sampling setting only)",
    )
    parser.add_argument(
        "--settings", default="greedy,sampling", help="greedy and/or sampling (the model's recommended)"
    )
    parser.add_argument(
        "--peers",
        default="",
        help="training-free peers to add, comma-separated: sjd, gsd, gsd_audit_off, mc_sjd, mc_sjd_gumbel, zipar_4 "
        "(lantern.run.bench.speculative.PEERS)",
    )
    parser.add_argument(
        "--mode",
        action="append",
        default=[],
        metavar="LABEL::OVERRIDES",
        help="an extra row: its label, '::', then space-separated Hydra overrides on top of the setting's "
        "(e.g. 'lantern d=0.4 chain(5)::decoding=lantern delta=0.4 draft.depth=5')",
    )
    parser.add_argument(
        "--overrides",
        default="",
        help="extra Hydra overrides for AR and every mode, comma-separated (e.g. draft.depth=3)",
    )
    parser.add_argument(
        "--compile",
        default="default",
        help="how AR and every mode run their steps: default (torch.compile, fullgraph), none (eager, timed per "
        "phase), max-autotune, reduce-overhead (CUDA)",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also time the reference-grade AR (the papers' loop, eager: baseline=both's) and each mode's speed-up over it",
    )
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse()
    plan = run_or_exit(
        lambda: plan_from(
            flag_number(args.images),
            flag_number(args.runs),
            flag_number(args.seed),
            flag_number(args.threads),
            args.model,
            args.structures,
            args.lantern_structures,
            args.deltas,
            args.candidates,
            args.settings,
            args.peers,
            args.mode,
            args.overrides,
            args.out,
            sys.argv[1:],
            args.compile,
        )
    )
    plan.reference = bool(args.reference)
    if plan.reference:  # the reference's code (LlamaGen's checkout for the world) before any timing
        run_or_exit(lambda: check_reference(plan))
    records = run_or_exit(lambda: run_bench(plan))
    if plan.out:
        print(f"wrote {write_results(plan, records)} and its .json")
    else:
        print(json.dumps(records, indent=1, default=str)[:2000])


if __name__ == "__main__":
    main()
