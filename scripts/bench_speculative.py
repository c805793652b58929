"""Speculative decoding vs AR on the same prompts and seeds, in one run: tau, latency, speed-up.

    python scripts/bench_speculative.py                       # the embedded world, CPU, batch 1
    python scripts/bench_speculative.py --images 20 --runs 3 --out results/bench_speculative

Every mode is composed from the project configs exactly as ``run.py`` would (``decoding=...
draft=... delta=... temperature=...``), so a row here is what a user gets from the same overrides.
For each sampling setting (greedy, and the model's recommended sampling) the AR baseline and every
mode decode the same images at batch 1; runs are interleaved image by image (AR, mode 1, mode 2, ...,
then the next image) so machine noise hits all modes alike, after one untimed warm-up per mode.
Latency per image is the median over ``--runs`` repeats; a mode's latency is the mean over images.
Speed-up = AR latency / mode latency, measured in this run; speed-up / tau shows how much of the
step compression survives the drafter and tree overheads. The spread is the range of the speed-ups of
the single runs (run j: mean over images of AR's j-th time / the mode's j-th time); every time is kept
in the JSON record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lantern import REPO_ROOT
from lantern.files import write_json_atomic
from lantern.results.provenance import environment
from lantern.rng import keys_tensor
from lantern.run.job import synchronize

EXACT_STRUCTURES = ("chain", "static_tree", "dynamic_tree")
DELTAS = (0.05, 0.1, 0.2, 0.4)
# Drafter-free decoders (lantern.decoding.jacobi.decoder). GSD measures its realised TV over the whole vocabulary at
# every step by default (half its step time on the world); gsd_audit_off never audits (every 10^6-th step),
# the cost of the method alone, and records no TV.
PEERS = {
    "sjd": ["decoding=sjd"],
    "gsd": ["decoding=gsd"],
    "gsd_audit_off": ["decoding=gsd", "decoding.tv_audit_every=1000000"],
}


def modes(
    structures: tuple[str, ...],
    lantern_structures: tuple[str, ...],
    deltas: tuple[float, ...],
    candidates: tuple[str, ...] = ("deterministic",),
) -> list[tuple[str, list[str]]]:
    """(label, Hydra overrides) of every speculative mode in the benchmark, for each candidate kind."""
    rows = []
    structures, lantern_structures = tuple(s for s in structures if s), tuple(s for s in lantern_structures if s)
    for kind in candidates:
        tag, extra = ("", []) if kind == "deterministic" else (f" {kind}", [f"draft.candidates={kind}"])
        rows += [(f"eagle {s}{tag}", ["decoding=eagle", f"draft={s}", *extra]) for s in structures]
        for s in lantern_structures:
            rows += [
                (f"lantern d={d} {s}{tag}", ["decoding=lantern", f"draft={s}", f"delta={d}", *extra]) for d in deltas
            ]
        if lantern_structures:
            rows.append(
                (
                    f"lantern_pp l=3 k=10 {lantern_structures[0]}{tag}",
                    ["decoding=lantern_pp", f"draft={lantern_structures[0]}", *extra],
                )
            )
    return rows


def compose_config(overrides: list[str]):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
        return compose("config", overrides=overrides)


def timed(decoder, bundle, condition, keys) -> tuple[float, object]:
    synchronize(bundle.device)
    start = time.perf_counter()
    result = decoder.generate(bundle.gpt, condition, keys)
    synchronize(bundle.device)
    return time.perf_counter() - start, result


def bench_setting(name: str, base: list[str], rows, args) -> list[dict]:
    """All modes for one sampling setting; returns one record per mode (AR first)."""
    cfg = compose_config(base)
    bundle = instantiate(cfg.model.bundle)
    prompts = instantiate(cfg.prompts)
    items = [prompts.items[i % len(prompts.items)] for i in range(args.images)]
    decoders = [("ar", instantiate(cfg.decoding))]
    for label, overrides in rows:
        if "temperature=0" in base and "draft.candidates=sampled" in overrides:
            continue  # greedy decoding drafts top-ranked candidates only
        decoders.append((label, instantiate(compose_config(base + overrides).decoding)))
    conditions = [bundle.conditioner.encode([item]) for item in items]
    keys = [keys_tensor(args.seed, [i], bundle.device) for i in range(args.images)]
    for _, decoder in decoders:  # warm-up: caches, neighbour tables, allocator
        timed(decoder, bundle, conditions[0], keys[0])
    times = {label: [[] for _ in items] for label, _ in decoders}
    results = {label: [None] * len(items) for label, _ in decoders}
    for _ in range(args.runs):
        for i in range(len(items)):
            for label, decoder in decoders:
                seconds, result = timed(decoder, bundle, conditions[i], keys[i])
                times[label][i].append(seconds)
                results[label][i] = result
    records = []
    ar_latency = statistics.mean(statistics.median(t) for t in times["ar"])
    ar_runs = [statistics.mean(t[j] for t in times["ar"]) for j in range(args.runs)]  # run j's mean latency
    for label, decoder in decoders:
        latency = statistics.mean(statistics.median(t) for t in times[label])
        steps = sum(int(r.per_sample["steps"].sum()) for r in results[label])
        tokens = sum(int(r.per_sample["tokens"].sum()) for r in results[label])
        tau = tokens / steps
        record = {
            "setting": name,
            "mode": label,
            "latency_s": latency,
            "speedup": ar_latency / latency,
            "tau": tau,
            "speedup_per_tau": ar_latency / latency / tau,
            "speedup_runs": [a / statistics.mean(t[j] for t in times[label]) for j, a in enumerate(ar_runs)],
            "times_s": times[label],  # (image, run)
            "describe": decoder.settings.record(),
        }
        if "tv_measured" in results[label][0].per_sample:  # speculative modes (AR rows, compiled or not, have none)
            stats = {k: sum(r.stats[k] for r in results[label]) for k in results[label][0].stats}
            phases = {k.removesuffix("_time_s"): v for k, v in stats.items() if k.endswith("_time_s")}
            if phases:  # eager runs time each phase (compiled steps are timed as a whole)
                record["drafter_share"] = phases["drafter"] / max(1e-12, sum(phases.values()))
                record["phase_ms_per_step"] = {k: 1000 * v / steps for k, v in phases.items() if k != "prefill"}
            measured = sum(int(r.per_sample["tv_measured"].sum()) for r in results[label])
            record["tv_measured_tokens"] = measured
            if measured:
                record["tv_realised_mean"] = (
                    sum(float(r.per_sample["tv_realised_sum"].sum()) for r in results[label]) / measured
                )
                record["tv_realised_max"] = max(float(r.per_sample["tv_realised_max"].max()) for r in results[label])
            record["same_tokens_as_ar"] = all(
                torch.equal(a.codes, b.codes) for a, b in zip(results[label], results["ar"], strict=True)
            )
        records.append(record)
        print(
            f"{name:9s} {label:32s} latency {latency * 1000:7.1f} ms  tau {tau:5.2f}  speed-up {record['speedup']:5.2f}x "
            f"({_spread(record)})  speed-up/tau {record['speedup_per_tau']:4.2f}",
            flush=True,
        )
    return records


def _spread(record: dict) -> str:
    runs = record["speedup_runs"]
    return f"{min(runs):.2f}-{max(runs):.2f}"


def markdown(records: list[dict], env: dict, args) -> str:
    lines = [
        f"# Speculative decoding benchmark (model={args.model})",
        "",
        f"`python scripts/bench_speculative.py {' '.join(args.argv)}` at commit {env['commit'][:7]}{' (dirty)' if env['dirty'] else ''} on "
        f"{env['device_name']} ({env['num_threads']} threads), torch {env['versions']['torch']}. Batch 1, {args.images} prompts, "
        f"median of {args.runs} interleaved runs per image after a warm-up; speed-up against AR in the same run.",
        "",
        "| setting | mode | tau | latency ms/image | speed-up | runs' range | speed-up / tau | drafter share of time (phases per step) | realised TV mean / max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        share = f"{r['drafter_share']:.0%}" if "drafter_share" in r else ""
        if "phase_ms_per_step" in r:
            share += " (" + ", ".join(f"{k} {v:.2f}" for k, v in r["phase_ms_per_step"].items()) + " ms/step)"
        tv = f"{r['tv_realised_mean']:.3f} / {r['tv_realised_max']:.3f}" if "tv_realised_mean" in r else ""
        tv = "not audited" if r.get("tv_measured_tokens") == 0 else tv
        lines.append(
            f"| {r['setting']} | {r['mode']} | {r['tau']:.2f} | {r['latency_s'] * 1000:.1f} | {r['speedup']:.2f}x | "
            f"{_spread(r)} | {r['speedup_per_tau']:.2f} | {share} | {tv} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20, help="prompts (one image each) per mode")
    parser.add_argument("--runs", type=int, default=3, help="timed repeats per image (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="fashion_t2i")
    parser.add_argument("--structures", default=",".join(EXACT_STRUCTURES), help="draft structures for exact decoding")
    parser.add_argument("--lantern-structures", default="dynamic_tree", help="draft structures for LANTERN")
    parser.add_argument("--deltas", default=",".join(map(str, DELTAS)))
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
        help="training-free peers to add, comma-separated: sjd, gsd, gsd_audit_off (their yaml defaults)",
    )
    parser.add_argument(
        "--mode",
        action="append",
        default=[],
        metavar="LABEL::OVERRIDES",
        help="an extra row: its label, '::', then space-separated Hydra overrides on top of the setting's "
        "(e.g. 'ar compiled::compile=default' or 'lantern d=0.4 chain(5)::decoding=lantern delta=0.4 draft.depth=5')",
    )
    parser.add_argument(
        "--overrides",
        default="",
        help="extra Hydra overrides for AR and every mode, comma-separated (e.g. draft.depth=3)",
    )
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    for name, value in (("--images", args.images), ("--runs", args.runs), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{name}={value} must be >= 1")
    torch.set_num_threads(args.threads)
    kinds = tuple(args.candidates.split(","))
    if any(kind not in ("deterministic", "sampled") for kind in kinds):
        parser.error(f"--candidates {args.candidates!r}: allowed deterministic, sampled")
    rows = modes(
        tuple(args.structures.split(",")),
        tuple(args.lantern_structures.split(",")),
        tuple(float(d) for d in args.deltas.split(",")),
        kinds,
    )
    for peer in (p for p in args.peers.split(",") if p):
        if peer not in PEERS:
            parser.error(f"--peers {peer!r}: allowed {', '.join(PEERS)}")
        rows.append((peer, PEERS[peer]))
    for mode in args.mode:
        label, sep, overrides = mode.partition("::")
        if not sep or not label.strip() or not overrides.split():
            parser.error(f"--mode {mode!r}: expected LABEL::OVERRIDES")
        rows.append((label.strip(), overrides.split()))
    extra = [o for o in args.overrides.split(",") if o]
    settings = {"greedy": ["temperature=0"], "sampling": []}
    records = []
    for name in args.settings.split(","):
        if name not in settings:
            parser.error(f"--settings {name!r}: allowed greedy, sampling")
        records += bench_setting(name, [f"model={args.model}", *settings[name], *extra], rows, args)
    env = environment(torch.device("cpu"))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out.with_suffix(".json"), {"args": vars(args), "environment": env, "records": records})
        out.with_suffix(".md").write_text(markdown(records, env, args))
        print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
    else:
        print(json.dumps(records, indent=1, default=str)[:2000])


if __name__ == "__main__":
    main()
