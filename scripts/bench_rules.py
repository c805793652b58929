"""Time LANTERN's rules as they were at 4df88c0 (the frozen oracle in tests/frozen_rules.py) against today's.

One process, the two sides interleaved call by call on identical inputs, eager and ``torch.compile``'d
(``fullgraph=True``, the harness's Inductor options), medians of many repeats; prints each case's old and
new median in microseconds and their ratio. Relative figures hold on a loaded machine; absolute ones do not
(``--clock cpu`` times the process's CPU time, which another process's load does not inflate as much).

    python scripts/bench_rules.py                       # the default cases, eager and compiled
    python scripts/bench_rules.py --cases sampled --compile none --reps 400 --threads 1 --clock cpu

Its body stays here rather than in ``lantern/run``: the old side is the frozen oracle under ``tests/``.

Cases (world-sized: V 2048, k 1000 of a 1024-column table, batch 1): ``sampled`` / ``deterministic``: a
bounded LANTERN delta 0.1 rule's work in a walk over a chain(3) of that kind (the transport resp. the merge of
its three nodes in one call, then a node call per level); ``pp``: the same with LANTERN++ lambda 3, sampled; ``reference``: one deterministic
reference-rule node with 10 siblings (one level of the dynamic tree); ``reference_sampled``: the reference
rule's work in a sampled chain(3) walk (its TV audit included: O(V k) per node, so not among the defaults).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from frozen_rules import FrozenComposed, FrozenReference, FrozenRelaxation  # noqa: E402

from lantern import checks, rng  # noqa: E402
from lantern.cli.main import ArgumentParser, run_or_exit  # noqa: E402
from lantern.decoding.compile import inductor_options  # noqa: E402
from lantern.decoding.tree.draft import chain  # noqa: E402
from lantern.decoding.tree.verify import _relax_chain  # noqa: E402
from lantern.models.sampling import SamplingConfig  # noqa: E402
from lantern.rules.api import Composed, Relaxed  # noqa: E402
from lantern.rules.exact import EXACT  # noqa: E402
from lantern.rules.neighbours import neighbour_table  # noqa: E402
from lantern.rules.reference import LanternReference  # noqa: E402
from lantern.rules.relaxation import NeighbourRelaxation, NeighbourTable  # noqa: E402

VOCAB, K, DEPTH, SIBLINGS = 2048, 1000, 3, 10
CASES = ("sampled", "deterministic", "pp", "reference", "reference_sampled")
DEFAULT_CASES = CASES[:4]


class Drafter:
    """Peaked random drafter laws, as a trained drafter's (a few codes hold most of the mass)."""

    def __init__(self, generator: torch.Generator, rows: int):
        self.generator = generator
        self.root_q = self._q(rows, 1)[:, 0]

    def _q(self, rows: int, count: int) -> torch.Tensor:
        return torch.softmax(2.5 * torch.randn(rows, count, VOCAB, generator=self.generator), -1)

    def expand(self, tokens, parents):
        return self._q(*tokens.shape)


def _bounded(table, kind: str, old: bool, **budget):
    relaxation = (FrozenRelaxation if old else NeighbourRelaxation)(K, table, **budget)
    return (FrozenComposed if old else Composed)(relaxation, EXACT[kind]())


def _walk_case(table, kind: str, make, seed: int = 0):
    """(old call, new call): the rule's work in a chain(3) walk (the chain's nodes relaxed in one call where the
    rule allows, then one node call per level) on a target near the drafter; the walk's own bookkeeping and
    random numbers, the same for both, are left out."""
    generator = torch.Generator().manual_seed(seed)
    keys, step = rng.keys_tensor(seed, range(1)), torch.zeros(1, dtype=torch.long)
    structure = chain(DEPTH, kind)
    structure.prepare(torch.device("cpu"))
    draft = structure.grow(Drafter(generator, 1), torch.randint(VOCAB, (1,), generator=generator), keys, step, kind)
    noise = torch.softmax(2.5 * torch.randn(1, draft.num_nodes, VOCAB, generator=generator), -1)
    p = 0.6 * draft.q + 0.4 * noise
    uniforms = torch.rand(1, DEPTH, generator=generator)
    races = torch.empty(1, DEPTH, VOCAB).exponential_(generator=generator)
    valid = draft.candidates[:, :DEPTH] >= 0  # (1, D, 1)
    sampling = SamplingConfig(temperature=1.0)

    def call(rule):
        def work():
            ahead = None if rule.relax is None else _relax_chain(draft, p, rule, DEPTH)
            out = []
            for level in range(DEPTH):
                extra = {} if ahead is None else {"relaxed": Relaxed(*(part[:, level] for part in ahead))}
                args = (p[:, level], draft.candidates[:, level], valid[:, level], draft.q[:, level])
                outcome = rule.node(*args, uniforms[:, level : level + 1], races[:, level], sampling, True, **extra)
                out += [outcome.chosen, outcome.target]
            return torch.cat([t.flatten().to(p.dtype) for t in out])

        return work

    return call(make(True)), call(make(False))


def _reference_node_case(table, seed: int = 0):
    """(old, new) one deterministic reference node: 10 siblings, the drafter's top 10, batch 1."""
    generator = torch.Generator().manual_seed(seed)
    q = Drafter(generator, 1).root_q
    p = 0.6 * q + 0.4 * torch.softmax(2.5 * torch.randn(1, VOCAB, generator=generator), -1)
    tokens = q.topk(SIBLINGS, dim=1).indices
    valid = torch.ones_like(tokens, dtype=torch.bool)
    u = torch.rand(1, SIBLINGS, generator=generator)
    noise = torch.empty(1, VOCAB).exponential_(generator=generator)
    sampling = SamplingConfig(temperature=1.0)
    old, new = (cls(K, table, delta=0.1) for cls in (FrozenReference, LanternReference))

    def call(rule):
        def work():
            outcome = rule.node(p, tokens, valid, q, u, noise, sampling)
            return torch.cat([outcome.emitted.to(p.dtype), outcome.target.flatten()])

        return work

    return call(old), call(new)


def cases(table, names):
    made = {
        "sampled": lambda: _walk_case(table, "sampled", lambda old: _bounded(table, "sampled", old, delta=0.1)),
        "deterministic": lambda: _walk_case(
            table, "deterministic", lambda old: _bounded(table, "deterministic", old, delta=0.1)
        ),
        "pp": lambda: _walk_case(table, "sampled", lambda old: _bounded(table, "sampled", old, lam=3.0)),
        "reference": lambda: _reference_node_case(table),
        "reference_sampled": lambda: _walk_case(
            table,
            "sampled",
            lambda old: (FrozenReference if old else LanternReference)(K, table, delta=0.1, candidates="sampled"),
        ),
    }
    return {name: made[name]() for name in names}


def interleaved(old, new, reps: int, clock) -> tuple[float, float]:
    """Medians (us) of ``reps`` calls of each side, alternating old and new call by call."""
    times = ([], [])
    for _ in range(reps):
        for side, call in enumerate((old, new)):
            start = clock()
            call()
            times[side].append(clock() - start)
    return tuple(statistics.median(t) * 1e6 for t in times)


def main(argv=None) -> None:
    parser = ArgumentParser(__doc__)
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated, of {','.join(CASES)}")
    parser.add_argument("--compile", default="both", choices=("both", "none", "default"))
    parser.add_argument("--reps", type=int, default=200, help="calls of each side, interleaved")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="cpu: the process's CPU time (what a loaded machine's preemption does not inflate; all threads summed)",
    )
    args = parser.parse(argv)
    # What sets the run's length and threads, before any work (10^12 reps would never end).
    run_or_exit(
        lambda: (checks.capped("--reps", args.reps, 1, 10**6), checks.capped("--threads", args.threads, 1, 256))
    )
    names = args.cases.split(",")
    if not set(names) <= set(CASES):
        print(f"error: --cases={args.cases!r}: expected a comma-separated list of {','.join(CASES)}", file=sys.stderr)
        raise SystemExit(2)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    table = NeighbourTable(neighbour_table(torch.randn(VOCAB, 8), 1024))
    modes = ("none", "default") if args.compile == "both" else (args.compile,)
    print(f"{'case':<20}{'mode':<9}{'old us':>10}{'new us':>10}{'new/old':>9}")
    for name, (old, new) in cases(table, names).items():
        for mode in modes:
            a, b = old, new
            if mode != "none":
                options = inductor_options(mode, "cpu")
                a, b = (torch.compile(f, fullgraph=True, **options) for f in (old, new))
            for _ in range(5):  # warm-up (and compile)
                a(), b()
            gap = (a() - b()).abs().max().item()
            assert gap < 1e-5, f"{name}: the two rules differ by {gap}"
            t_old, t_new = interleaved(
                a, b, args.reps, time.perf_counter if args.clock == "wall" else time.process_time
            )
            print(f"{name:<20}{mode:<9}{t_old:>10.1f}{t_new:>10.1f}{t_new / t_old:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
