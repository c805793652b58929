"""The report of :mod:`lantern.run.bench.against_reference`: its markdown table and the figures it states."""

from __future__ import annotations

MODEL = "fashion_t2i"
K = 1000  # LANTERN's neighbourhood size (the paper's and both codes' default)


def greedy_counts(greedy: list[dict]) -> dict[str, int]:
    """How many prompts are equal, per mode: ``ar``, ``eagle2``, ``lantern d=...``."""
    counts = {"ar": sum(r["ar_equal"] for r in greedy), "eagle2": sum(r["eagle2_equal"] for r in greedy)}
    counts["eagle2 tau"] = sum(r.get("eagle2_tau_equal", False) for r in greedy)
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
        if key.startswith("lantern ")
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
        f"Drafter prefill (our drafter's logits after image token 0 against theirs on the same target states): "
        f"{_prefill(report['conversion_check'])}.",
        "",
        f"Greedy equality (temperature 0, {len(greedy)} prompts, codes token for token): AR equal on "
        f"{counts['ar']}/{len(greedy)}, EAGLE-2 equal on {counts['eagle2']}/{len(greedy)} (and its tau on one "
        f"footing equal on {counts['eagle2 tau']}/{len(greedy)}){relaxed}.",
        "",
    ]
    if timed:
        lines += speed_table(report["records"]) + [""] + phase_table(report["records"])
    tree = report["tree"]
    lines += [
        "",
        f"Tree on both sides: EAGLE-2 dynamic tree, top-k {tree['top_k']}, {tree['nodes']} drafted nodes + root, "
        f"{tree['depth']} levels (theirs: `total_token={tree['nodes'] + 1}, depth={tree['depth'] - 1}, "
        f"top_k={tree['top_k']}`, the `EaModel.from_pretrained` defaults; ours: `draft=dynamic_tree "
        "draft.candidates=deterministic`). LANTERN rows: their `lantern=True, lantern_k, lantern_delta` against our "
        "`decoding=lantern semantics=reference`, the same raw-row neighbour table.",
        "",
        _drafter_note(args.get("drafter_inputs", "ours")),
        "",
        "Differences by construction: their `generate()` has 120 condition slots (the world 16: 104 masked slots "
        "lead, logits unchanged, more attention work on their side), and their loop runs 1-2 verification steps "
        "past the image (in their time and their ms per step, not in their tau). Tau on one footing: the mean "
        "over the steps that build the image of the tokens each appends, both sides; taus agree when they differ "
        "by at most 3 standard errors of the difference (per-step spread, every step of every image), else the "
        "row's ratios are refused. 'ms per step' is a side's time per image over the verification steps it ran "
        "(prefill included); the phases are per verification step (ours: the eager step's phase timer; theirs: "
        "their `initialize_tree`, `tree_decoding`, `evaluate_posterior`, `topK_genrate` and the rest of "
        "`update_inference_inputs`, each timed around their call). Their drafter phase also feeds the accepted "
        "tokens to their drafter, which ours does in its advance phase.",
    ]
    return "\n".join(lines) + "\n"


def _drafter_note(inputs: str) -> str:
    if inputs == "ours":
        return (
            "The drafter computes the same on both sides: their drafter reads, at the condition entries, the "
            "target's condition embeddings with the padded entries masked, as ours (and as the world's drafter "
            "was trained), instead of code 0 at 119 unmasked entries (`--drafter-inputs ours`, "
            "`lantern.models.llamagen.reference_drafter.OurDrafterInputs`)."
        )
    return (
        "Their drafter runs as released (`--drafter-inputs released`): code 0's embedding at 119 unmasked "
        "condition entries, where ours reads the condition embeddings at the real ones; drafts and tau differ."
    )


def _prefill(check: dict) -> str:
    if "drafter_prefill_matched_max_abs_diff" not in check:
        return "not checked"
    return (
        f"differ by at most {check['drafter_prefill_matched_max_abs_diff']:.1e} with their drafter reading our "
        f"condition entries, {check['drafter_prefill_released_max_abs_diff']:.1e} as released "
        f"(logits up to {check['drafter_prefill_logits_scale']:.1f})"
    )


def speed_table(records: list[dict]) -> list[str]:
    """Per mode: both sides per image and per verification step, ours/theirs (or why it is refused), tau."""
    lines = [
        "| mode | ours (our overrides) | compile, dtype, threads | ours s/image | theirs s/image | ours/theirs | "
        "runs' range | ms per step ours / theirs | per step ours/theirs | tau ours / theirs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        ours = " ".join(o for o in r["ours_overrides"] if not o.startswith(("model=", "compile=", "dtype=", "device=")))
        if r["ratio"] is None:
            ratio, spread, step = f"refused: {r['refused']}", "", ""
        else:
            ratio = f"{r['ratio']:.3f}"
            spread = f"{min(r['ratio_runs']):.3f}-{max(r['ratio_runs']):.3f}"
            step = f"{r['step_ratio']:.3f}"
        tau = f"{r['tau_ours']:.2f} / {r['tau_theirs']:.2f}"
        if r.get("tau_se"):
            tau += f" (se {r['tau_se']:.2f})"
        lines.append(
            f"| {r['mode']} | `{ours or 'decoding=ar'}` | {r.get('compile', 'none')}, {r['dtype']}, {r['threads']} | "
            f"{r['ours_s_per_image']:.3f} | {r['theirs_s_per_image']:.3f} | {ratio} | {spread} | "
            f"{r['ours_ms_per_step']:.1f} / {r['theirs_ms_per_step']:.1f} | {step} | {tau} |"
        )
    return lines


def phase_table(records: list[dict]) -> list[str]:
    """Per speculative mode and side: ms per verification step in each phase, and the prefill per image."""
    lines = [
        "| mode | side | drafter | target forward | walk | advance | other | ms per step | prefill ms/image |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "tau_se" not in r:  # AR: neither side times its phases
            continue
        for side in ("ours", "theirs"):
            ph = r[f"{side}_phases_ms"]
            cells = " | ".join(f"{ph[name]:.2f}" for name in ("drafter", "target", "walk", "advance", "other"))
            lines.append(
                f"| {r['mode']} | {side} | {cells} | {r[f'{side}_ms_per_step']:.2f} | {ph['prefill_per_image']:.1f} |"
            )
    return lines
