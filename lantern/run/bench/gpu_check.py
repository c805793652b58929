"""The GPU check (``scripts/gpu_check.py``): AR vs exact vs LANTERN, compiled, bf16, with no host sync inside a decode step.

    python scripts/gpu_check.py                                   # on a CUDA machine: writes results/gpu_check.{md,json}
    python scripts/gpu_check.py --device cpu --dtype float32 --compile none --tiny --out /tmp/g   # its CPU form (tests)

Targets (``--targets``): the embedded world (with its trained drafter), a random-weight LlamaGen GPT-XL
t2i at 256 px (official layout and sizes: 36 x 1280, 120 caption tokens of 2048, V = 16384) with a random
one-layer drafter, and the 7B family presets ``anole_7b`` (Chameleon-7B: 32 x 4096, 65536 ids, 32 x 32
codes of 8192, 128 prompt slots) and ``janus_pro_7b`` (30 x 4096, 24 x 24 codes of 16384): random weights of
the preset's full architecture (its ``timing`` node) made on the meta device and materialised on the
device directly in ``--dtype`` (a 7B target is never built in fp32: ~14 GB in bf16 plus a ~0.4 GB drafter),
a random one-layer drafter of the family's own kind, random prompts of varied length and a random codebook's
neighbour table. So verification and drafting costs are the real architecture's even where acceptance is not.
For the world and LlamaGen: eager AR, compiled AR, exact chain decoding and LANTERN (delta 0.1 and 0.4) on
chains; for the 7B presets eager AR, compiled AR and LANTERN delta 0.1 on a chain (a 1024-token image takes
seconds); compiled alike, batch 1, interleaved image by image after warm-up (compilation happens there),
median latency per mode (``latency_ms`` and ``s_per_image``). Timed steps run under ``torch.cuda.set_sync_debug_mode("error")``, so any
host synchronisation inside a step fails the check. Greedy tokens of compiled and eager AR are
compared too. Every decoder is composed from conf/ as ``run.py`` composes it (``decoding=... draft=chain
draft.depth=3 delta=... compile=...``), and every row names the compile mode, dtype and attention its decoder
ran with, read from the decoder and the target (:func:`lantern.run.bench.common.ran_with`). ``--tiny`` swaps GPT-XL for GPT-nano sizes and the 7B presets for ``tiny_random_chameleon`` /
``tiny_random_janus`` (their ``timing`` nodes: the same code path; the CPU form, which the tests run).
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate

from lantern import checks
from lantern.errors import ConfigError
from lantern.files import write_json_atomic, write_text_atomic
from lantern.models.condition import Condition
from lantern.models.drafter import Drafter, DrafterConfig
from lantern.models.llamagen.bundle import random_gpt
from lantern.results.provenance import environment
from lantern.rng import keys_tensor
from lantern.rules.neighbours import CodebookNeighbours
from lantern.run.bench import gpu_baselines
from lantern.run.bench.common import ran_with
from lantern.run.compose import ModelParts, build_decoder, compose_config
from lantern.run.timing import timed


@contextlib.contextmanager
def no_host_sync(device: torch.device):
    """Raise on any host-device synchronisation inside the block (CUDA); nothing to check on the CPU."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def world_target(device, dtype, tiny: bool):
    """The embedded world: its GPT, drafter, codebook neighbours and a few of its prompts."""
    overrides = [f"device={device.type}", f"dtype={str(dtype).removeprefix('torch.')}"]
    cfg = compose_config(overrides)
    parts = ModelParts(cfg.model)
    prompts = instantiate(cfg.prompts).items
    conditions = [parts.bundle.conditioner.encode([prompts[i % len(prompts)]]) for i in range(64)]
    return Target("embedded world (GPT, 8x8 tokens)", parts.bundle.target, parts, conditions, overrides)


LLAMAGEN_SAMPLING = ["cfg_scale=7.5", "temperature=1.0", "top_k=1000", "top_p=1.0"]  # LlamaGen t2i's recommended


def random_llamagen(device, dtype, tiny: bool):
    """A random-weight LlamaGen t2i target (GPT-XL at 256 px, or GPT-nano sizes with --tiny) and drafter."""
    if tiny:
        model = random_gpt("GPT-nano", "t2i", 64, vocab_size=512, caption_dim=32, cls_token_num=8)
    else:
        model = random_gpt("GPT-XL", "t2i", 256)
    config = model.config
    model = model.to(device=device, dtype=dtype).eval()
    drafter = Drafter(DrafterConfig(config)).to(device=device, dtype=dtype).eval()
    neighbours = CodebookNeighbours(codebook=torch.randn(config.vocab_size, 8), k_max=1024 if not tiny else 64)
    conditions = []
    for i in range(64):
        generator = torch.Generator().manual_seed(i)
        states = torch.randn(1, config.cls_token_num, config.caption_dim, generator=generator)
        mask = torch.zeros(1, config.cls_token_num, dtype=torch.bool)
        mask[:, -(8 + i % (config.cls_token_num - 7)) :] = True  # left-padded captions of varied length
        conditions.append(Condition(states.to(device=device, dtype=dtype), mask.to(device)))
    name = "random GPT-nano t2i (tiny form)" if tiny else "random-weight LlamaGen GPT-XL t2i 256 px"
    overrides = [f"device={device.type}", *LLAMAGEN_SAMPLING]  # the decoders' configs; the model is this one
    parts = ModelParts(None, drafter=drafter, neighbours=neighbours)
    return Target(name, model, parts, conditions, overrides)


FAMILY_PRESETS = {  # a family preset -> its tiny preset, what --tiny times instead (the same code path)
    "anole_7b": "tiny_random_chameleon",
    "janus_pro_7b": "tiny_random_janus",
    "lumina_mgpt_7b_768": "tiny_random_lumina",
}
TARGETS = ("world", "llamagen", *FAMILY_PRESETS)


def family_target(preset: str, device, dtype, tiny: bool):
    """A family preset's ``timing`` node (random weights of its architecture on ``device`` in ``dtype``), a
    random codebook's neighbours and its recommended sampling; with ``tiny`` the tiny preset of that family."""
    name = FAMILY_PRESETS[preset] if tiny else preset
    overrides = [f"model={name}", f"device={device.type}", f"dtype={str(dtype).removeprefix('torch.')}"]
    cfg = compose_config(overrides)
    timing = instantiate(cfg.model.timing)
    codebook = torch.randn(timing.num_codes, 8, generator=torch.Generator().manual_seed(0))
    neighbours = CodebookNeighbours(codebook=codebook, k_max=64 if tiny else 1024)
    label = f"random {name} (tiny form of {preset})" if tiny else f"random-weight {preset}"
    parts = ModelParts(cfg.model, drafter=timing.drafter, neighbours=neighbours)
    return Target(label, timing.target, parts, timing.conditions, overrides)


@dataclass
class Target:
    """What one target's check times: its model, the parts its decoders are handed (drafter, neighbours),
    conditions, and the overrides its decoders' configs are composed with."""

    name: str
    model: object
    parts: ModelParts
    conditions: list
    overrides: list[str]


CHAIN3 = ["draft=chain", "draft.depth=3", "draft.candidates=sampled"]


def mode_overrides(mode: str, k: int, full: bool = True) -> dict[str, list[str]]:
    """The compared modes (label -> Hydra overrides); AR eager and AR compiled are always there, exact chain
    and LANTERN delta 0.4 only when ``full``."""
    modes = {"ar eager": ["decoding=ar", "compile=none"], f"ar {mode}": ["decoding=ar", f"compile={mode}"]}
    if mode == "reduce-overhead":  # the CUDA-graph mode beside plain compilation: what the graphs add
        modes["ar default"] = ["decoding=ar", "compile=default"]
    if full:
        modes["exact chain3 sampled"] = ["decoding=eagle", *CHAIN3, f"compile={mode}"]
    for delta in (0.1, 0.4) if full else (0.1,):
        modes[f"lantern d={delta} chain3 sampled"] = [
            "decoding=lantern",
            *CHAIN3,
            f"k={k}",
            f"delta={delta}",
            f"compile={mode}",
        ]
    return modes


def decoders(target: Target, modes: dict[str, list[str]], guard) -> dict:
    """Each mode's decoder (label -> decoder), composed from conf/ with the target's parts handed in."""
    built = {}
    for label, given in modes.items():
        node = compose_config([*target.overrides, *given]).decoding
        checked = {"guard": guard} if node.compile != "none" else {}  # host syncs are refused in compiled steps
        built[label] = build_decoder(node, target.parts, **checked)
    return built


def check(target: Target, args, device, full: bool = True) -> dict:
    model, conditions = target.model, target.conditions
    guard = lambda: no_host_sync(device)  # noqa: E731
    k = min(1000, target.parts.neighbours.k_max - 1)  # the bounded rule needs k <= k_max
    modes = decoders(target, mode_overrides(args.compile, k, full), guard)
    keys = [keys_tensor(0, [i], device) for i in range(args.images)]

    def decode(decoder, i):
        return timed(lambda: decoder.generate(model, conditions[i], keys[i]), device)

    compile_s = {}
    for label, decoder in modes.items():  # warm-up: compilation, CUDA graph capture, tables
        compile_s[label] = sum(decode(decoder, 0)[0] for _ in range(2))
    times = {label: [] for label in modes}
    taus = {label: [] for label in modes}
    for i in range(args.images):
        for label, decoder in modes.items():
            seconds, result = decode(decoder, i)
            times[label].append(seconds)
            taus[label].append(int(result.per_sample["tokens"].sum()) / max(1, int(result.per_sample["steps"].sum())))
    greedy = {"eager": "none", "compiled": args.compile}
    greedy = decoders(target, {k: ["decoding=ar", "temperature=0", f"compile={m}"] for k, m in greedy.items()}, guard)
    eager_codes, compiled_codes = (d.generate(model, conditions[1], keys[1]).codes for d in greedy.values())
    ar = statistics.median(times[f"ar {args.compile}"])
    rows = []
    for label, decoder in modes.items():
        latency = statistics.median(times[label])
        rows.append(
            {
                "mode": label,
                **ran_with(decoder, model),
                "latency_ms": latency * 1000,
                "s_per_image": latency,
                "min_ms": min(times[label]) * 1000,
                "max_ms": max(times[label]) * 1000,
                "tau": statistics.mean(taus[label]),
                "speedup_vs_compiled_ar": ar / latency,
                "warmup_s": compile_s[label],
            }
        )
    extra = {}
    if full:  # the reference-grade AR (LlamaGen's own loop, eager) and the batch sweep, on LlamaGen-shaped targets
        sampling = instantiate(compose_config(target.overrides).sampling)
        extra["reference"] = gpu_baselines.reference_row(target, args, device, sampling, ar)
        swept = {
            label: modes[label] for label in modes if label.startswith((f"ar {args.compile}", "exact", "lantern d=0.1"))
        }
        extra["batch_sweep"] = gpu_baselines.batch_sweep(target, swept, args, device) if args.batches else []
    return {
        **extra,
        "target": target.name,
        "tokens": model.config.num_image_tokens,
        "rows": rows,
        "greedy_tokens_equal_compiled_vs_eager": float((eager_codes == compiled_codes).float().mean()),
        "compiled_ar_over_eager_ar": statistics.median(times["ar eager"]) / ar,
    }


def markdown(results: list[dict], env: dict, args) -> str:
    lines = [
        "# GPU check: compiled decode steps (AR, exact, LANTERN)",
        "",
        f"`python scripts/gpu_check.py {' '.join(args.argv)}` at commit {env['commit'][:7]} on {env['device_name']}, "
        f"torch {env['versions']['torch']}, dtype {args.dtype}, compile={args.compile}, batch 1, {args.images} images per mode "
        "(interleaved, after two warm-up images), median latency with min-max. Every compiled step ran under "
        "`torch.cuda.set_sync_debug_mode('error')`: no host sync inside a step.",
        "",
    ]
    for result in results:
        lines += [
            f"## {result['target']} ({result['tokens']} tokens)",
            "",
            f"compiled AR / eager AR speed: {result['compiled_ar_over_eager_ar']:.2f}x; greedy tokens equal "
            f"(compiled vs eager AR): {result['greedy_tokens_equal_compiled_vs_eager']:.1%}",
            "",
            "| mode | tau | latency ms/image (min-max) | speed-up vs compiled AR | warm-up s | "
            "ran with (compile, dtype, attention) |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["rows"]:
            lines.append(
                f"| {r['mode']} | {r['tau']:.2f} | {r['latency_ms']:.1f} ({r['min_ms']:.1f}-{r['max_ms']:.1f}) | "
                f"{r['speedup_vs_compiled_ar']:.2f}x | {r['warmup_s']:.1f} | {r['compile']}, {r['dtype']}, {r['attention']} |"
            )
        lines.append("")
        lines += gpu_baselines.markdown_lines(result)
    return "\n".join(lines)


def run_gpu_check(args) -> list[dict]:
    """Time every target of ``args`` (see the module docstring) and write ``args.out``.md/.json."""
    from lantern.models.devices import resolve_device

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "--device cuda but no CUDA device is available; the CPU form is --device cpu "
            "--dtype float32 --compile none --tiny"
        )
    device = resolve_device(args.device)
    checks.capped("--images", args.images, 2, 1000, note="timed images per mode, after two warm-up images")
    targets = [checks.choice("--targets", t, TARGETS) for t in args.targets.split(",")]
    text = getattr(args, "batches", "") or ""
    sizes = [b.strip() for b in str(text).split(",") if b.strip()]
    args.batches = [checks.capped("--batches", int(b) if b.isdigit() else b, 1, 256) for b in sizes]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    results = []
    for name in targets:
        full = name not in FAMILY_PRESETS  # a 1024-token 7B image takes seconds: AR and LANTERN d=0.1 only
        build = world_target if name == "world" else random_llamagen if name == "llamagen" else family_target
        target = build(device, dtype, args.tiny) if full else build(name, device, dtype, args.tiny)
        results.append(check(target, args, device, full))
        del target  # a 7B target's memory goes before the next is built
        if device.type == "cuda":
            torch.cuda.empty_cache()
    env = environment(device)
    write_json_atomic(
        out.with_suffix(".json"),
        {"args": {k: v for k, v in vars(args).items()}, "environment": env, "results": results},
    )
    write_text_atomic(out.with_suffix(".md"), markdown(results, env, args))
    return results
