"""The report of :mod:`lantern.run.bench.against_reference`: its markdown table and the figures it states."""

from __future__ import annotations

MODEL = "fashion_t2i"
K = 1000  # LANTERN's neighbourhood size (the paper's and both codes' default)


def greedy_counts(greedy: list[dict]) -> dict[str, int]:
    """How many prompts are equal, per mode: ``ar``, ``eagle2``, ``lantern d=...``."""
    counts = {"ar": sum(r["ar_equal"] for r in greedy), "eagle2": sum(r["eagle2_equal"] for r in greedy)}
    for delta in greedy[0]["lantern"] if greedy else ():
        counts[f"lantern d={delta}"] = sum(r["lantern"][delta]["equal"] for r in greedy)
    return counts


def markdown(report: dict) -> str:
    env, args, s = report["environment"], report["args"], report["sampling"]
    greedy = report["greedy"]
    counts = greedy_counts(greedy)
    relaxed = "".join(
        f", LANTERN (reference semantics, k={K}, delta {key.split('=')[1]}) equal to the same decoder walking "
        f"with their `evaluate_posterior` on {value}/{len(greedy)}"
        for key, value in counts.items()
        if key.startswith("lantern")
    )
    ref = report["reference"]
    timed = bool(report["records"])
    lines = [
        "# Our decoders against the authors' LANTERN code, identical weights",
        "",
        f"`python scripts/bench_against_reference.py {' '.join(args['argv'])}` (under the side environment of "
        f"docs/against_reference.md) at commit {env['commit'][:7]}{' (dirty)' if env['dirty'] else ''} on "
        f"{env['device_name']}, {args['threads']} threads, torch {env['versions']['torch']}, their code from "
        f"{ref['folder']}{' at ' + ref['commit'][:7] if ref['commit'] else ''} under transformers {ref['transformers']}.",
        "",
        f"World `{MODEL}`, batch 1, fp32, eager on both sides (no torch.compile), sampling CFG {s['cfg']:g}, "
        f"temperature {s['temperature']:g}, top-k {s['top_k']} (off), top-p {s['top_p']:g}. "
        + (
            f"{args['images']} prompts, median of {args['runs']} interleaved runs per image after one untimed "
            "warm-up per mode and side; ours/theirs is our total time over theirs, every image and run, the range "
            "the same ratio run by run."
            if timed
            else "No timing (`--runs 0`): the conversion and greedy checks only."
        ),
        "",
        f"Conversion check (same teacher-forced inputs, fp32): target logits differ by at most "
        f"{report['conversion_check']['target_logits_max_abs_diff']:.1e}, drafter logits by "
        f"{report['conversion_check']['drafter_logits_max_abs_diff']:.1e}.",
        "",
        f"Greedy equality (temperature 0, {len(greedy)} prompts, codes token for token): AR equal on "
        f"{counts['ar']}/{len(greedy)}, EAGLE-2 equal on {counts['eagle2']}/{len(greedy)}{relaxed}.",
        "",
    ]
    if timed:
        lines += [
            "| mode | ours (our overrides) | compile, dtype, threads | ours s/image | theirs s/image | ours/theirs | "
            "runs' range | tau ours / theirs | ms per target step ours / theirs |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    for r in report["records"]:
        ours = " ".join(o for o in r["ours_overrides"] if not o.startswith(("model=", "compile=", "dtype=", "device=")))
        lines.append(
            f"| {r['mode']} | `{ours or 'decoding=ar'}` | {r.get('compile', 'none')}, {r['dtype']}, {r['threads']} | "
            f"{r['ours_s_per_image']:.3f} | {r['theirs_s_per_image']:.3f} | {r['ratio']:.3f} | "
            f"{min(r['ratio_runs']):.3f}-{max(r['ratio_runs']):.3f} | {r['tau_ours']:.2f} / {r['tau_theirs']:.2f} | "
            f"{r['ours_ms_per_step']:.1f} / {r['theirs_ms_per_step']:.1f} |"
        )
    tree = report["tree"]
    lines += [
        "",
        f"Tree on both sides: EAGLE-2 dynamic tree, top-k {tree['top_k']}, {tree['nodes']} drafted nodes + root, "
        f"{tree['depth']} levels (theirs: `total_token={tree['nodes'] + 1}, depth={tree['depth'] - 1}, "
        f"top_k={tree['top_k']}`, the `EaModel.from_pretrained` defaults; ours: `draft=dynamic_tree "
        "draft.candidates=deterministic`). LANTERN rows: their `lantern=True, lantern_k, lantern_delta` against our "
        "`decoding=lantern semantics=reference`, the same raw-row neighbour table.",
        "",
        "Differences by construction: their `generate()` has 120 condition slots (the world 16: 104 masked slots "
        "lead, logits unchanged, more attention work on their side); their drafter reads code 0 at 119 unmasked "
        "condition entries, ours the condition embeddings at 15 masked ones, so drafts and tau may differ; tau "
        "theirs is the mean accepted length their `generate()` returns (its last steps overshoot the image), "
        "ours tokens per target step. 'ms per target step' is s/image x tau / N: the cost of one step with its "
        "drafting, verification and acceptance, which does not depend on how well the drafter guesses.",
    ]
    return "\n".join(lines) + "\n"
