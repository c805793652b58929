r"""Our decoders against the authors' LANTERN code (jadohu/LANTERN) on identical weights, in one process.

    /work/refenv/bin/python scripts/bench_against_reference.py --images 8 --runs 3 --out results/against_reference
    /work/refenv/bin/python scripts/bench_against_reference.py --reference /path/to/LANTERN --images 2 --runs 1

Their code needs transformers 4.45 and ours runs beside it, so this runs under a side environment
whose transformers is 4.45 and whose torch, hydra and ``lantern`` come from the project's venv:

    python3 -m venv /work/refenv
    /work/refenv/bin/pip install "transformers==4.45.*" ftfy beautifulsoup4
    echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" \
        > /work/refenv/lib/python3.11/site-packages/main_venv.pth

and their code is a snapshot of jadohu/LANTERN (``--reference PATH``, else ``$LANTERN_REFERENCE``, else
``../ref/LANTERN`` beside the repository). docs/against_reference.md has every step.

It checks the conversion (our and their logits on the same inputs, and our and their drafter's prefill with
their drafter reading our condition entries), then greedy equality (our AR and EAGLE-2 codes against theirs),
then times AR, EAGLE-2 (dynamic tree, their default settings) and LANTERN under the authors' semantics
(k 1000, ``--deltas``) in the world's sampling setting, interleaved image by image, eager and fp32 on both
sides, with the same drafter computation on both (``--drafter-inputs ours``, the default); it prints the
table (per image and per verification step, the phases of a step, tau on one footing; no ratio for a mode
whose taus differ beyond noise) and writes OUT.md and OUT.json with ``--out``.

Exit status: 2 with one ``error:`` line for a bad option (checked before anything is built, nothing
written), including a ``--reference`` folder without their code. 0 with one ``skipped:`` line, nothing
written, when their code cannot be used: no ``--reference`` and nothing at the default location, a
transformers that is not 4.45 (the project's own venv has 5.x), or their import failing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lantern.cli.main import ArgumentParser, flag_number, run_or_exit
from lantern.run.bench.against_reference import plan_from, run


def main() -> None:
    parser = ArgumentParser(__doc__)
    parser.add_argument("--images", default="8", help="prompts (one image each) timed per mode and side")
    parser.add_argument("--runs", default="3", help="timed repeats per image (median)")
    parser.add_argument("--check-images", default="3", help="prompts of the greedy-equality check")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--deltas", default="0.1,0.4", help="LANTERN deltas (reference semantics, k 1000)")
    parser.add_argument("--reference", default=None, help="a snapshot folder of jadohu/LANTERN")
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    parser.add_argument(
        "--drafter-inputs",
        default="ours",
        help="what their drafter reads at the condition entries: ours (the same computation as our drafter) "
        "or released (code 0, unmasked, as their generate() feeds it)",
    )
    args = parser.parse()
    plan = run_or_exit(
        lambda: plan_from(
            flag_number(args.images),
            flag_number(args.runs),
            flag_number(args.check_images),
            flag_number(args.seed),
            flag_number(args.threads),
            args.deltas,
            args.reference,
            args.out,
            sys.argv[1:],
            args.drafter_inputs,
        )
    )
    report = run_or_exit(lambda: run(plan))
    if report is not None and plan.out:
        stem = Path(plan.out)
        print(f"wrote {stem.with_suffix('.md')} and {stem.with_suffix('.json')}")


if __name__ == "__main__":
    main()
