"""The GPU check: AR vs exact vs LANTERN, compiled, bf16, with no host sync inside a decode step.

    python scripts/gpu_check.py                                   # on a CUDA machine: writes results/gpu_check.{md,json}
    python scripts/gpu_check.py --targets anole_7b,janus_pro_7b --images 2 --out results/gpu_check_7b   # the 7B presets
    python scripts/gpu_check.py --device cpu --dtype float32 --compile none --tiny --out /tmp/g   # its CPU form (tests)
    LANTERN_LLAMAGEN=PATH python scripts/gpu_check.py ...   # also LlamaGen's own generate() (reference-grade AR)

What it times and checks, and on which targets: :mod:`lantern.run.bench.gpu_check`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

# The device machine runs this from a copy of the tree that may not be installed: import it from here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lantern.cli.main import ArgumentParser, run_or_exit  # noqa: E402
from lantern.decoding.compile import COMPILE_MODES  # noqa: E402
from lantern.results.provenance import environment  # noqa: E402
from lantern.run.bench.gpu_check import markdown, run_gpu_check  # noqa: E402


def main(argv=None) -> int:
    parser = ArgumentParser(__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--compile", default="reduce-overhead", choices=COMPILE_MODES)
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument(
        "--targets",
        default="world,llamagen",
        help="comma list of world, llamagen (random-weight GPT-XL t2i), anole_7b, janus_pro_7b, lumina_mgpt_7b_768 "
        "(random weights, the presets' full architectures)",
    )
    parser.add_argument(
        "--tiny", action="store_true", help="GPT-nano and the tiny family presets' sizes instead (the CPU form)"
    )
    parser.add_argument(
        "--batches",
        default="1,4,16",
        help="comma list of batch sizes of the batch sweep (AR, exact, LANTERN 0.1); '' skips it",
    )
    parser.add_argument(
        "--llamagen",
        default=None,
        help="LlamaGen checkout for the reference-grade AR (else $LANTERN_LLAMAGEN, ../ref/LlamaGen)",
    )
    parser.add_argument("--out", default="results/gpu_check", help="writes OUT.md and OUT.json")
    args = parser.parse(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    results = run_or_exit(lambda: run_gpu_check(args))
    print(markdown(results, environment(torch.device(args.device)), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
