"""Our decoders against the authors' LANTERN code (jadohu/LANTERN) on identical weights, in one process.

The embedded world is converted to their HF layout (:mod:`lantern.models.llamagen.reference_layout`) and their
``LlamaForCausalLM`` and ``EaModel`` are built on it (:mod:`lantern.models.llamagen.reference_code`). Then:

1. **Conversion check**: our and their target logits, and our and their drafter logits, on the same
   teacher-forced inputs (largest absolute difference; it must stay below ``LOGITS_TOLERANCE``).
2. **Greedy equality** (temperature 0, ``check_images`` prompts): our AR codes == their AR codes, our
   EAGLE-2 codes == their EAGLE-2 codes (both equal AR when lossless), and, per delta, our LANTERN decoder
   under reference semantics == the same decoder whose walk asks their ``evaluate_posterior`` (their
   function as released, on our trees and target rows: :func:`reference_code.their_greedy_walk`); and our
   and their greedy EAGLE-2 tau, equal when the two drafters grow the same trees.
3. **Timing** (skipped with ``runs=0``: the conversion and greedy checks only) in the world's recommended
   sampling setting (CFG 3, temperature 1, no top-k/top-p), batch 1, eager on both sides (neither is
   compiled), for each mode of :func:`modes`: after one untimed warm-up per mode and side, image by image,
   interleaved (ours AR, theirs AR, ours EAGLE-2, theirs EAGLE-2, ...), ``runs`` times
   (:mod:`lantern.run.bench.reference_timing`). A side's latency is the mean over images of the per-image
   median; ours/theirs is our total time over theirs, every image and run; the spread is the min-max of the
   per-run ratios, which always contains it. Beside it: each side's time per verification step, its phases
   (drafter, target forward, walk, advance) per step, and tau on one footing; a speculative mode whose two
   taus differ beyond noise gets no ratio.

Settings matched on both sides: their ``EaModel.from_pretrained`` defaults (``total_token=59, depth=4,
top_k=10``: a root plus 58 drafted nodes over five levels) are our ``draft=dynamic_tree`` (depth 5 levels,
top_k 10, 58 nodes, deterministic top-k children); their ``lantern=True, lantern_k=1000, lantern_delta``
is our ``decoding=lantern semantics=reference k=1000 delta=...`` (their rule, as released), on the same
raw-row neighbour table. The drafter computes the same on both sides (``drafter_inputs="ours"``, the
default): their released ``generate()`` feeds its drafter code 0's embedding at 119 unmasked condition
entries, ours the condition embeddings at the real ones, as the world's drafter was trained; their drafter is
made to read ours (:class:`lantern.models.llamagen.reference_drafter.OurDrafterInputs`), so both grow the
same trees from the same states. ``drafter_inputs="released"`` runs theirs as released (tau 1.53 against
1.86 on the world: the EAGLE-2 row's ratio is then refused).

What differs by construction, and is stated in the output: their ``generate()`` has 120 condition slots
(the world has 16; 104 always-masked slots lead, logits unchanged, a little more attention work per step
on their side), and their loop runs 1-2 verification steps past the image. Their sampled acceptance uses
Python's ``random``, ours counter-based keys: sampled images differ, greedy ones must not.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate

from lantern import checks
from lantern.decoding.batch import ModelInputs, prefill_condition
from lantern.errors import ConfigError
from lantern.files import write_json_atomic, write_text_atomic
from lantern.models.llamagen import reference_code as theirs
from lantern.models.llamagen import reference_layout as convert
from lantern.models.llamagen.reference_drafter import OurDrafterInputs, Probe, condition_layout
from lantern.models.world.load import DEFAULT_WORLD
from lantern.results.provenance import environment
from lantern.rng import keys_tensor, sample_key
from lantern.run.bench.common import check_writable, repo_relative
from lantern.run.bench.reference_checks import check_drafter_prefill, greedy_check
from lantern.run.bench.reference_report import MODEL, K, greedy_counts, markdown
from lantern.run.bench.reference_timing import time_modes
from lantern.run.compose import ModelParts, build_decoder, compose_config

LOGITS_TOLERANCE = 1e-4  # fp32; measured differences are float rounding (~1e-6)
DELTAS = (0.1, 0.4)
TREE = ["draft=dynamic_tree", "draft.candidates=deterministic"]
REFERENCE_SEMANTICS = ["decoding=lantern", "semantics=reference", f"k={K}"]


def modes(deltas: tuple[float, ...]) -> list[dict]:
    """Each mode: its label, our Hydra overrides, and the arguments of their ``generate()``."""
    rows = [
        {"mode": "ar", "ours": ["decoding=ar"], "theirs": None},
        {"mode": "eagle-2 dynamic tree", "ours": ["decoding=eagle", *TREE], "theirs": {"lantern": False}},
    ]
    for delta in deltas:
        rows.append(
            {
                "mode": f"lantern reference k={K} delta={delta} dynamic tree",
                "ours": [*REFERENCE_SEMANTICS, f"delta={delta}", *TREE],
                "theirs": {"lantern": True, "k": K, "delta": delta},
            }
        )
    return rows


@dataclass
class Plan:
    """What :func:`run` does (checked by :func:`plan_from`)."""

    images: int = 8
    runs: int = 3
    check_images: int = 3
    seed: int = 0
    threads: int = 2
    deltas: tuple[float, ...] = DELTAS
    reference: str | None = None
    out: str | None = None
    argv: tuple[str, ...] = ()
    drafter_inputs: str = "ours"
    rows: list = field(default_factory=list)


DRAFTER_INPUTS = ("ours", "released")  # what their drafter reads at the condition entries (module docstring)


def plan_from(
    images, runs, check_images, seed, threads, deltas, reference, out, argv=(), drafter_inputs="ours"
) -> Plan:
    """A checked :class:`Plan`; every value is checked before anything is built (ConfigError: bad input)."""
    # Upper bounds far past any benchmark's need: a larger value is a typo that would run for days.
    images = checks.capped("--images", images, 1, 10_000)
    runs = checks.capped("--runs", runs, 0, 1000, note="0 = no timing: the conversion and greedy checks only")
    check_images = checks.capped("--check-images", check_images, 0, 10_000)
    seed, threads = checks.integer("--seed", seed, 0), checks.capped("--threads", threads, 1, 256)
    values = []
    for part in str(deltas).split(","):
        try:
            value = float(part)
        except ValueError:
            value = part
        values.append(checks.probability("--deltas", value))
    if out is not None and (
        not isinstance(out, str) or not out.strip() or Path(out).suffix not in ("", ".md", ".json")
    ):
        raise checks.refuse("--out", out, "a path stem (OUT.md and OUT.json are written)")
    if reference is not None:
        theirs.reference_folder(reference)  # a given folder must hold their code (bad input otherwise)
    drafter_inputs = checks.choice(
        "--drafter-inputs", drafter_inputs, DRAFTER_INPUTS, note="what their drafter reads at the condition entries"
    )
    plan = Plan(images, runs, check_images, seed, threads, tuple(values), reference, out, tuple(argv), drafter_inputs)
    plan.rows = modes(plan.deltas)
    for row in plan.rows:  # compose every config now: a bad override costs nothing
        compose_config(_overrides(row["ours"]))
    return plan


EAGLE2_DRAFTER = "drafter_eagle2.safetensors"


def _overrides(mode: list[str], greedy: bool = False) -> list[str]:
    return [
        f"model={MODEL}",
        # their drafter is EAGLE-2's kind (no fused layers): the world's EAGLE-2-style file, not its default
        f"model.drafter_ckpt={DEFAULT_WORLD / EAGLE2_DRAFTER}",
        "compile=none",
        "dtype=float32",
        "device=cpu",
        *(["temperature=0"] if greedy else []),
        *mode,
    ]


@torch.inference_mode()
def _condition_states(target, inputs: ModelInputs) -> torch.Tensor:
    """Our target's final-norm states over the condition (rows, T, D), as our decoders' prefill computes them."""
    capacity = inputs.cond_emb.shape[1]
    return prefill_condition(
        target, inputs.cond_emb, inputs.cond_mask, target.new_cache(inputs.rows, capacity), capacity
    )


class Sides:
    """Our decoders and their models, built once; ``ours(mode)`` / ``theirs(mode)`` decode image ``i``."""

    def __init__(self, plan: Plan, modules: theirs.Modules):
        cfg = compose_config(_overrides([]))
        self.cfg = cfg
        self.parts = ModelParts(cfg.model)  # the bundle, drafter and neighbours every decoder of ours shares
        self.bundle = self.parts.bundle
        wanted = max(plan.images, plan.check_images)
        # As many distinct prompts as are used (the world's default set has 20; greedy repeats would add nothing).
        prompts = instantiate(cfg.prompts, **({"count": wanted} if "count" in cfg.prompts else {}))
        self.items = [prompts.items[i % len(prompts.items)] for i in range(wanted)]
        self.conditions = [self.bundle.conditioner.encode([item]) for item in self.items]
        self.captions = [convert.caption_inputs(c.values, c.mask) for c in self.conditions]
        self.seed = plan.seed
        eagle_cfg = compose_config(_overrides(plan.rows[1]["ours"]))
        self.drafter = self.parts.drafter
        tree = instantiate(eagle_cfg.draft)
        self.tree = {"depth": tree.depth, "top_k": tree.top_k, "nodes": tree.nodes}
        neighbours = self.parts.neighbours
        codebook = neighbours.codebook()
        from lantern.rules.neighbours import neighbour_table

        full = neighbour_table(codebook, codebook.shape[0] - 1, normalize=False)  # (V, V-1), as their file
        ours_table = neighbours.table(default_normalize=False).indices
        if not torch.equal(full[:, : ours_table.shape[1]].to(ours_table.device), ours_table.long()):
            raise RuntimeError("the full neighbour table disagrees with the one our reference rule reads")
        self.reference = theirs.build_reference(modules, self.bundle, self.drafter, full, **self.tree)
        self.modules, self.full_table = modules, full
        self.probe = Probe(self.reference.eagle)  # their accepted lengths and phase times, per generate()
        self.their_drafter = OurDrafterInputs(self.reference.eagle.ea_layer)
        # What our drafter reads at the condition entries, in their 120 slots, per prompt (same for greedy).
        self._ours: dict[tuple, object] = {}
        sampling = self.our_decoder(plan.rows[1], greedy=False).sampling  # EAGLE-2's: CFG rows as our decoders
        self.drafter_inputs = None
        if plan.drafter_inputs == "ours":
            self.drafter_inputs = []
            for condition in self.conditions:
                inputs = ModelInputs.of(self.bundle.target, condition, sampling)
                states = _condition_states(self.bundle.target, inputs)
                self.drafter_inputs.append(condition_layout(inputs.cond_emb, inputs.cond_mask, states))
        self.sampling = {
            "cfg": float(cfg.cfg_scale),
            "temperature": float(cfg.temperature),
            "top_k": int(cfg.top_k),
            "top_p": float(cfg.top_p),
        }

    def our_decoder(self, row: dict, greedy: bool):
        key = (row["mode"], greedy)
        if key not in self._ours:
            self._ours[key] = build_decoder(compose_config(_overrides(row["ours"], greedy)).decoding, self.parts)
        return self._ours[key]

    def with_their_rule(self, row: dict):
        """Our greedy decoder for a LANTERN ``row`` whose walk asks their ``evaluate_posterior`` (their
        function, our drafts and target rows): what their rule makes of our trees."""
        key = (row["mode"], "their rule")
        if key not in self._ours:
            decoder = build_decoder(compose_config(_overrides(row["ours"], greedy=True)).decoding, self.parts)
            spec = row["theirs"]
            decoder.rule.walk = theirs.their_greedy_walk(self.modules, self.full_table, spec["k"], spec["delta"])
            self._ours[key] = decoder
        decoder = self._ours[key]
        return lambda index: decoder.generate(
            self.bundle.target, self.conditions[index], keys_tensor(self.seed, [index], self.bundle.device)
        )

    def overrides(self, row: dict) -> list[str]:
        """Our Hydra overrides of ``row`` as a record states them (paths relative to the repository)."""
        return [repo_relative(o) for o in _overrides(row["ours"])]

    def ours(self, row: dict, index: int, greedy: bool = False):
        decoder = self.our_decoder(row, greedy)
        keys = keys_tensor(self.seed, [index], self.bundle.device)
        return lambda: decoder.generate(self.bundle.target, self.conditions[index], keys)

    def theirs(self, row: dict, index: int, greedy: bool = False):
        s = dict(self.sampling, temperature=0.0) if greedy else self.sampling
        caption, spec = self.captions[index], row["theirs"]
        # Outside the timed call: their RNG, their drafter's condition entries, the probe's records.
        theirs.seed_reference(sample_key(self.seed, index) & 0x7FFFFFFF)
        if self.drafter_inputs is None:
            self.their_drafter.clear()
        else:
            self.their_drafter.set(self.drafter_inputs[index])
        self.probe.start()
        args = (caption, s["temperature"], s["top_k"], s["top_p"], s["cfg"])
        if spec is None:
            return lambda: self.reference.ar(*args)
        return lambda: self.reference.speculative(*args, spec["lantern"], spec.get("k", K), spec.get("delta", 0.1))[0]


def run(plan: Plan) -> dict | None:
    """Locate and import their code (None, after one line, when it cannot be used), build both sides,
    check the conversion and greedy equality, time the modes; write ``out``.md/.json when given."""
    try:
        folder = theirs.reference_folder(plan.reference)
        modules = theirs.import_reference(folder)
    except theirs.ReferenceUnavailable as exc:
        print(f"skipped: {exc}")
        return None
    if plan.out:
        check_writable(Path(plan.out).with_suffix(".json"))
    torch.set_num_threads(plan.threads)
    sides = Sides(plan, modules)
    logits = theirs.check_logits(sides.bundle, sides.drafter, sides.reference, sides.conditions[0], plan.seed)
    logits |= check_drafter_prefill(
        sides.bundle, sides.drafter, sides.reference, sides.their_drafter, sides.conditions[0], plan.seed
    )
    print("conversion check: " + ", ".join(f"{k} {v:.2e}" for k, v in logits.items()), flush=True)
    worst = max(
        logits["target_logits_max_abs_diff"],
        logits["drafter_logits_max_abs_diff"],
        logits["drafter_prefill_matched_max_abs_diff"],
    )
    if worst > LOGITS_TOLERANCE:
        raise ConfigError(
            f"the converted models disagree with ours (logits differ by {worst:.3g} > {LOGITS_TOLERANCE})"
        )
    greedy = greedy_check(sides, plan)
    counts = greedy_counts(greedy)
    print("greedy equality: " + ", ".join(f"{k} equal on {v}/{len(greedy)}" for k, v in counts.items()), flush=True)
    records = time_modes(sides, plan) if plan.runs else []
    report = {
        "args": {k: v for k, v in asdict(plan).items() if k != "rows"},
        "reference": {
            "folder": repo_relative(str(folder)),
            "commit": _snapshot_commit(folder),
            "transformers": theirs.check_transformers(),
        },
        "environment": environment(torch.device("cpu")) | {"machine": platform.machine()},
        "sampling": sides.sampling,
        "tree": sides.tree,
        "conversion_check": logits,
        "greedy": greedy,
        "greedy_counts": counts,
        "records": records,
    }
    if plan.out:
        write_results(plan, report)
    return report


def _snapshot_commit(folder: Path) -> str | None:
    """The commit their snapshot came from, when the folder says (a ``COMMIT`` file or a git checkout)."""
    marker = folder / "COMMIT"
    if marker.is_file():
        return marker.read_text(encoding="utf-8").strip() or None
    return None


def write_results(plan: Plan, report: dict) -> Path:
    out = Path(plan.out)
    write_json_atomic(out.with_suffix(".json"), report)
    write_text_atomic(out.with_suffix(".md"), markdown(report))
    return out.with_suffix(".md")
