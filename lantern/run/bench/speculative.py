"""The speculative-decoding benchmark: every mode against AR on the same prompts and seeds, in one run.

Every mode is composed from the project configs exactly as ``run.py`` would (``decoding=... draft=...
delta=... temperature=...``), so a row is what a user gets from the same overrides. For each sampling
setting (greedy, and the model's recommended sampling) the AR baseline and every mode decode the same
images at batch 1; runs are interleaved image by image (AR, mode 1, mode 2, ..., then the next image) so
machine noise hits all modes alike, after one untimed warm-up per mode. Latency per image is the median
over ``runs`` repeats; a mode's latency is the mean over images. Speed-up = AR's total decode time / the
mode's, over every image and run of this run (as ``run.py`` reports it); speed-up / tau shows how much of the
step compression survives the drafter and tree overheads. The spread is the range of the speed-ups of the
single runs (run j: AR's j-th times / the mode's j-th times, summed over images); the speed-up, a ratio of
the same sums, always lies within it. Every time is kept in the JSON record. Every mode's config is composed
and its decoder built before the first is timed, and the output folder is checked writable first, so a
bad value or an unwritable ``out`` costs nothing.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate

from lantern import REPO_ROOT, checks
from lantern.decoding.compile import check_compile
from lantern.files import write_json_atomic, write_text_atomic
from lantern.models.devices import resolve_device
from lantern.models.sampling import SamplingConfig
from lantern.results.baselines import JOIN_KEYS
from lantern.results.provenance import environment
from lantern.rng import keys_tensor
from lantern.run.bench.common import check_writable, ran_with
from lantern.run.compose import ModelParts, build_decoder, compose_config, resolved_config
from lantern.run.timing import ratio_of_totals, timed

EXACT_STRUCTURES = ("chain", "static_tree", "dynamic_tree")
DELTAS = (0.05, 0.1, 0.2, 0.4)
# Drafter-free decoders (lantern.decoding.jacobi.decoder; zipar: lantern.decoding.zipar). GSD measures its realised TV over the whole vocabulary at
# every step by default (half its step time on the world); gsd_audit_off never audits (every 10^6-th step),
# the cost of the method alone, and records no TV.
AR = ["decoding=ar"]  # the baseline row (run.py's default decoder is LANTERN)


PEERS = {
    "sjd": ["decoding=sjd"],
    "gsd": ["decoding=gsd"],
    "gsd_audit_off": ["decoding=gsd", "decoding.tv_audit_every=1000000"],
    "mc_sjd": ["decoding=sjd", "coupling=mc"],
    "mc_sjd_gumbel": ["decoding=sjd", "coupling=gumbel"],
    "zipar_4": ["decoding=zipar", "window=4"],  # window 4: the world's default (half its 8-token rows), stated
    "sjd_pp": ["decoding=sjd_pp"],
    "sjd_pac": ["decoding=sjd_pac"],
    "vvs": ["decoding=vvs"],
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
        # Always explicit: the config's default kind is sampled, so no override would not mean deterministic.
        tag, extra = ("" if kind == "deterministic" else f" {kind}"), [f"draft.candidates={kind}"]
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


def target_forward_ms(bundle, sampling: SamplingConfig, count: int, compile_mode: str, repeats: int = 30) -> float:
    """Median ms of one target forward over ``count`` tokens per row at a speculative step's shapes (the CFG
    rows, a cache and mask over the step's capacity), run as ``compile_mode`` runs steps. A compiled step is
    timed whole; this is its target forward alone, so step time minus this is what lies outside it."""
    from lantern.decoding.compile import compiled, mark_static

    model, cfg = bundle.target, bundle.target.config
    rows = 2 if sampling.uses_cfg else 1
    capacity = cfg.cls_token_num + cfg.num_image_tokens + 2 * count + 2
    cache = model.new_cache(rows, capacity)
    if compile_mode != "none":
        mark_static(*cache.tensors())
    base = cfg.cls_token_num + cfg.num_image_tokens // 2  # mid-image: half the cache is attended
    tokens = torch.zeros(rows, count, dtype=torch.long, device=bundle.device)
    slots = base + torch.arange(count, device=bundle.device).expand(rows, -1)  # (rows, count)
    positions = slots.clamp_max(cfg.max_seq_len - 1)  # a tree's positions are base + depth, within the table
    mask = torch.arange(capacity, device=bundle.device) < base + count  # (capacity,)
    mask = mask.expand(rows, 1, count, capacity).contiguous()  # (rows, 1, count, W)

    def forward(_, inputs):  # a step's (ctx, state) convention, as lantern.decoding.compile.compiled calls it
        return model.forward_tokens(*inputs, cache)

    step = compiled(forward, compile_mode)
    inputs = (tokens, positions, slots, mask)
    with torch.inference_mode():
        for _ in range(3):  # compiles once; warms the allocator
            step(None, inputs)
        times = [timed(lambda: step(None, inputs), bundle.device)[0] for _ in range(repeats)]
    return 1000 * statistics.median(times)


def setting_decoders(base: list[str], rows) -> tuple[object, list]:
    """The setting's run config (AR's) and its (label, decoder) pairs, AR first, every decoder composed from
    conf/ with the model's drafter and neighbours built once and handed to each."""
    cfg = compose_config(base + AR)
    parts = ModelParts(cfg.model)
    decoders = [("ar", build_decoder(cfg.decoding, parts))]
    for label, overrides in rows:
        if "temperature=0" in base and "draft.candidates=sampled" in overrides:
            continue  # greedy decoding drafts top-ranked candidates only
        decoders.append((label, build_decoder(compose_config(base + overrides).decoding, parts)))
    return cfg, parts, decoders


def bench_setting(name: str, base: list[str], rows, args) -> list[dict]:
    """All modes for one sampling setting; returns one record per mode (AR first)."""
    cfg, parts, decoders = setting_decoders(base, rows)
    bundle = parts.bundle
    if getattr(args, "reference", False):  # the papers' loop, eager, timed beside AR on the same images
        reference = instantiate(compose_config([*base, *AR, "baseline=both"]).speedup_reference)
        reference.prepare(bundle)
        decoders.insert(1, (REFERENCE, reference))
    prompts = instantiate(cfg.prompts)
    items = [prompts.items[i % len(prompts.items)] for i in range(args.images)]
    conditions = [bundle.conditioner.encode([item]) for item in items]
    keys = [keys_tensor(args.seed, [i], bundle.device) for i in range(args.images)]

    def decode(decoder, i):
        return timed(lambda: decoder.generate(bundle.target, conditions[i], keys[i]), bundle.device)

    for _, decoder in decoders:  # warm-up: caches, neighbour tables, allocator
        decode(decoder, 0)
    times = {label: [[] for _ in items] for label, _ in decoders}
    results = {label: [None] * len(items) for label, _ in decoders}
    for _ in range(args.runs):
        for i in range(len(items)):
            for label, decoder in decoders:
                seconds, results[label][i] = decode(decoder, i)
                times[label][i].append(seconds)
    ar_latency = statistics.mean(statistics.median(t) for t in times["ar"])
    ar_token_ms = 1000 * ar_latency / int(results["ar"][0].codes.shape[1])  # one AR step (prefill included)
    forward_cache = {}  # nodes + 1 -> ms of a target forward alone (compiled rows)
    records = []
    for label, decoder in decoders:
        record = mode_record(name, label, decoder, times, results, ar_token_ms, args)
        record |= ran_with(decoder, bundle.target)
        if (
            label != REFERENCE and "tv_measured" in results[label][0].per_sample
        ):  # speculative modes (AR rows, compiled or not, have none)
            record |= speculative_figures(record, decoder, results, results[label], bundle, ar_token_ms, forward_cache)
        records.append(record)
        print(
            f"{name:9s} {label:32s} latency {record['latency_s'] * 1000:7.1f} ms  tau {record['tau']:5.2f}  "
            f"speed-up {record['speedup']:5.2f}x ({_spread(record)})  speed-up/tau {record['speedup_per_tau']:4.2f}",
            flush=True,
        )
    return records


def mode_record(name, label, decoder, times, results, ar_token_ms, args) -> dict:
    """One mode's latency, tau and speed-up against AR (every run's times kept)."""
    latency = statistics.mean(statistics.median(t) for t in times[label])
    steps = sum(int(r.per_sample["steps"].sum()) for r in results[label])
    tokens = sum(int(r.per_sample["tokens"].sum()) for r in results[label])
    tau = tokens / steps
    speedup, speedup_runs = ratio_of_totals(times["ar"], times[label])
    versus = {}
    if REFERENCE in times:  # the speed-up over the reference-grade AR, a ratio of totals as the other
        versus["speedup_vs_reference_ar"], versus["speedup_vs_reference_ar_runs"] = ratio_of_totals(
            times[REFERENCE], times[label]
        )
    return {
        **versus,
        "setting": name,
        "mode": label,
        "latency_s": latency,
        "speedup": speedup,
        "tau": tau,
        "speedup_per_tau": speedup / tau,
        "speedup_runs": speedup_runs,
        "times_s": times[label],  # (image, run)
        "describe": decoder.settings.record(),
        "threads": args.threads,
        "ar_step_ms": ar_token_ms,
        "steps": steps,
    }


def speculative_figures(record, decoder, results, mine, bundle, ar_token_ms, forward_cache) -> dict:
    """A speculative mode's phase shares (eager), time outside the target forward, realised TV and whether
    its tokens are AR's."""
    figures, steps = {}, record["steps"]
    stats = {k: sum(r.stats[k] for r in mine) for k in mine[0].stats}
    phases = {k.removesuffix("_time_s"): v for k, v in stats.items() if k.endswith("_time_s")}
    if phases:  # eager runs time each phase (compiled steps are timed as a whole)
        if "drafter" in phases:  # tree decoders; VVS times its step kinds instead
            figures["drafter_share"] = phases["drafter"] / max(1e-12, sum(phases.values()))
        figures["phase_ms_per_step"] = {k: 1000 * v / steps for k, v in phases.items() if k != "prefill"}
        outside = sum(v for k, v in figures["phase_ms_per_step"].items() if k != "target")
        figures["outside_target_ar_steps"] = outside / ar_token_ms  # drafter + walk + advance per step
    elif hasattr(decoder, "draft"):  # a compiled tree step: its target forward timed alone, at its shape
        nodes = decoder.draft.nodes + 1
        if nodes not in forward_cache:
            forward_cache[nodes] = target_forward_ms(bundle, decoder.sampling, nodes, decoder.settings.compile)
        step_ms = 1000 * record["latency_s"] / (steps / len(mine))  # prefill included, as in ar_step_ms
        figures["target_forward_ms"] = forward_cache[nodes]
        figures["step_ms"] = step_ms
        figures["outside_target_ar_steps"] = (step_ms - forward_cache[nodes]) / ar_token_ms
    measured = sum(int(r.per_sample["tv_measured"].sum()) for r in mine)
    figures["tv_measured_tokens"] = measured
    if measured:
        figures["tv_realised_mean"] = sum(float(r.per_sample["tv_realised_sum"].sum()) for r in mine) / measured
        figures["tv_realised_max"] = max(float(r.per_sample["tv_realised_max"].max()) for r in mine)
    figures["same_tokens_as_ar"] = all(torch.equal(a.codes, b.codes) for a, b in zip(mine, results["ar"], strict=True))
    return figures


def _spread(record: dict) -> str:
    runs = record["speedup_runs"]
    return f"{min(runs):.2f}-{max(runs):.2f}"


def markdown(records: list[dict], env: dict, args) -> str:
    lines = [
        f"# Speculative decoding benchmark (model={args.model})",
        "",
        f"`python scripts/bench_speculative.py {' '.join(args.argv)}` at commit {env['commit'][:7]}{' (dirty)' if env['dirty'] else ''} on "
        f"{env['device_name']} ({env['num_threads']} threads), torch {env['versions']['torch']}. Batch 1, {args.images} prompts, "
        f"median of {args.runs} interleaved runs per image after a warm-up; speed-up against AR in the same run: AR's total "
        "decode time over the mode's, every image and run; runs' range: the same ratio run by run.",
        "",
        f"Every row, AR included, ran with `compile={args.compile}` (a compiled step is built in the untimed warm-up and "
        "timed whole; eager rows are also timed per phase). 'Outside the target forward' is the time of a speculative "
        "step less its target forward, in units of one AR step of the same run: eager rows sum the drafter, walk and "
        "advance phases; compiled rows subtract a target forward over the step's tokens, compiled alike and timed "
        "alone at the step's shapes (shown after the step time, ms).",
        "",
        "| setting | mode | compile, dtype, threads | tau | latency ms/image | speed-up | runs' range | speed-up / tau | "
        "outside the target forward, AR steps | drafter share of time (phases per step) | realised TV mean / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        share = f"{r['drafter_share']:.0%}" if "drafter_share" in r else ""
        if "phase_ms_per_step" in r:
            share += " (" + ", ".join(f"{k} {v:.2f}" for k, v in r["phase_ms_per_step"].items()) + " ms/step)"
        tv = f"{r['tv_realised_mean']:.3f} / {r['tv_realised_max']:.3f}" if "tv_realised_mean" in r else ""
        tv = "not audited" if r.get("tv_measured_tokens") == 0 else tv
        outside = f"{r['outside_target_ar_steps']:.2f}" if "outside_target_ar_steps" in r else ""
        if "target_forward_ms" in r:
            outside += f" (step {r['step_ms']:.2f}, target forward {r['target_forward_ms']:.2f} ms)"
        ran = f"{r.get('compile', 'none')}, {r.get('dtype', '')}, {r.get('threads', '')}"
        lines.append(
            f"| {r['setting']} | {r['mode']} | {ran} | {r['tau']:.2f} | {r['latency_s'] * 1000:.1f} | {r['speedup']:.2f}x"
            + (f" ({r['speedup_vs_reference_ar']:.2f}x vs reference AR)" if "speedup_vs_reference_ar" in r else "")
            + " | "
            f"{_spread(r)} | {r['speedup_per_tau']:.2f} | {outside} | {share} | {tv} |"
        )
    return "\n".join(lines) + "\n"


@dataclass
class BenchPlan:
    """What :func:`run_bench` times: ``settings`` (greedy, sampling) x (AR + ``rows``: (label, overrides))."""

    images: int = 20
    runs: int = 3
    seed: int = 0
    threads: int = 2
    model: str = "fashion_t2i"
    settings: tuple[str, ...] = ("greedy", "sampling")
    rows: list = field(default_factory=list)
    overrides: tuple[str, ...] = ()
    out: str | None = None
    argv: tuple[str, ...] = ()
    compile: str = "default"
    reference: bool = False  # also time the reference-grade AR (baseline=both's; lantern.run.bench.baselines)


SETTINGS = {"greedy": ["temperature=0"], "sampling": []}
REFERENCE = "ar reference"  # the reference-grade AR's row (--reference): speed-ups over it beside those over AR
# What makes a speed-up comparable (the keys tables join on): set for AR and every mode alike (--model,
# --compile, --overrides), never by one row's --mode, so no row is set against an AR baseline that ran otherwise.
ROW_WIDE = tuple(key for key, _ in JOIN_KEYS)


def setting_overrides(plan: BenchPlan, name: str) -> list[str]:
    """The overrides AR and every mode of setting ``name`` share."""
    return [f"model={plan.model}", *SETTINGS[name], f"compile={plan.compile}", *plan.overrides]


def _keys(overrides) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~").removeprefix("decoding.") for o in overrides if "=" in o}


def plan_from(
    images: int,
    runs: int,
    seed: int,
    threads: int,
    model: str,
    structures: str,
    lantern_structures: str,
    deltas: str,
    candidates: str,
    settings: str,
    peers: str,
    mode: list[str],
    overrides: str,
    out: str | None,
    argv=(),
    compile_mode: str = "default",
) -> BenchPlan:
    """A checked :class:`BenchPlan` from the script's comma-separated options; every mode's config is
    composed and its decoder built (with stand-ins for the files it reads) before anything is timed."""
    from lantern.run.dry_build import dry_build

    # Upper bounds far past any benchmark's need (10^12 images filled the memory with prompts).
    images, runs = checks.capped("--images", images, 1, 10_000), checks.capped("--runs", runs, 1, 1000)
    seed, threads = checks.integer("--seed", seed, 0), checks.capped("--threads", threads, 1, 256)
    split = lambda text: tuple(part for part in text.split(",") if part)  # noqa: E731
    drafts = tuple(p.stem for p in (REPO_ROOT / "conf" / "draft").glob("*.yaml"))
    models = tuple(p.stem for p in (REPO_ROOT / "conf" / "model").glob("*.yaml"))
    checks.choice("--model", model, sorted(models))
    for flag, given in (("--structures", structures), ("--lantern-structures", lantern_structures)):
        for structure in split(given):
            checks.choice(flag, structure, sorted(drafts))
    kinds = tuple(checks.choice("--candidates", kind, ("deterministic", "sampled")) for kind in split(candidates))
    values = []
    for delta in split(deltas):
        try:
            value = float(delta)
        except ValueError:
            value = delta
        values.append(checks.probability("--deltas", value))
    rows = modes(split(structures), split(lantern_structures), tuple(values), kinds)
    for peer in split(peers):
        rows.append((checks.choice("--peers", peer, tuple(PEERS)), PEERS[peer]))
    for extra in mode:
        label, sep, given = extra.partition("::")
        if not sep or not label.strip() or not given.split():
            raise checks.refuse("--mode", extra, "LABEL::OVERRIDES (Hydra overrides separated by spaces)")
        if _keys(given.split()) & set(ROW_WIDE):
            raise checks.refuse(
                "--mode",
                extra,
                "overrides that leave compile, dtype, device and every key AR shares "
                f"({', '.join(ROW_WIDE)}) to --model, --compile and --overrides",
            )
        rows.append((label.strip(), given.split()))
    if "compile" in _keys(split(overrides)):
        raise checks.refuse("--overrides", overrides, "overrides without compile= (use --compile)")
    check_compile(compile_mode)
    for name in split(settings):
        checks.choice("--settings", name, tuple(SETTINGS))
    plan = BenchPlan(
        images, runs, seed, threads, model, split(settings), rows, split(overrides), out, tuple(argv), compile_mode
    )
    for name in plan.settings:
        base = setting_overrides(plan, name)
        for _, given in [("ar", AR)] + rows:
            config = resolved_config(base + given)
            check_compile(compile_mode, resolve_device(config["device"]))
            dry_build(config)
    if out is not None:
        check_writable(Path(out).with_suffix(".json"))
    return plan


def run_bench(plan: BenchPlan) -> list[dict]:
    """Time every mode of ``plan`` (see the module docstring); write ``out``.md/.json when given, as each
    setting finishes (so a long run's timings are never lost at the end)."""
    torch.set_num_threads(plan.threads)
    records = []
    for name in plan.settings:
        records += bench_setting(name, setting_overrides(plan, name), plan.rows, plan)
        if plan.out:
            write_results(plan, records)
    return records


def write_results(plan: BenchPlan, records: list[dict]) -> Path:
    """``out``.json (the plan, the environment, every record) and ``out``.md (the table)."""
    env = environment(torch.device("cpu"))
    out = Path(plan.out)
    args = {k: v for k, v in asdict(plan).items() if k != "rows"} | {"rows": [list(r) for r in plan.rows]}
    write_json_atomic(out.with_suffix(".json"), {"args": args, "environment": env, "records": records})
    write_text_atomic(out.with_suffix(".md"), markdown(records, env, plan))
    return out.with_suffix(".md")


def check_reference(plan: BenchPlan) -> None:
    """ConfigError before any timing unless the model's reference-grade AR can be built (``--reference``)."""
    base = setting_overrides(plan, plan.settings[0])
    instantiate(compose_config([*base, *AR, "baseline=both"]).speedup_reference).check_model(plan.model)
