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
compared too. ``--tiny`` swaps GPT-XL for GPT-nano sizes and the 7B presets for ``tiny_random_chameleon`` /
``tiny_random_janus`` (their ``timing`` nodes: the same code path; the CPU form, which the tests run).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path

import torch

from lantern import REPO_ROOT, checks
from lantern.decoding.ar import ARDecoder
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import chain
from lantern.errors import ConfigError
from lantern.files import write_json_atomic, write_text_atomic
from lantern.models.condition import Condition
from lantern.models.drafter import Drafter, DrafterConfig
from lantern.models.llamagen.bundle import random_gpt
from lantern.models.sampling import SamplingConfig
from lantern.results.provenance import environment
from lantern.rng import keys_tensor
from lantern.rules.exact import ExactSampled
from lantern.rules.factory import lantern
from lantern.rules.neighbours import CodebookNeighbours


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


def world_target(device, dtype):
    """The embedded world: its GPT, drafter, codebook neighbours and a few of its prompts."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
        cfg = compose("config", overrides=[f"device={device.type}", f"dtype={str(dtype).removeprefix('torch.')}"])
    bundle = instantiate(cfg.model.bundle)
    drafter = instantiate(cfg.model.drafter)
    neighbours = instantiate(cfg.model.neighbours)
    prompts = instantiate(cfg.prompts).items
    conditions = [bundle.conditioner.encode([prompts[i % len(prompts)]]) for i in range(64)]
    return bundle.target, drafter, neighbours, conditions, dict(cfg.model.recommended)


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
    return model, drafter, neighbours, conditions, {"cfg_scale": 7.5, "temperature": 1.0, "top_k": 1000, "top_p": 1.0}


FAMILY_PRESETS = {  # a family preset -> its tiny preset, what --tiny times instead (the same code path)
    "anole_7b": "tiny_random_chameleon",
    "janus_pro_7b": "tiny_random_janus",
    "lumina_mgpt_7b_768": "tiny_random_lumina",
}
TARGETS = ("world", "llamagen", *FAMILY_PRESETS)


def family_target(preset: str, device, dtype, tiny: bool):
    """A family preset's ``timing`` node (random weights of its architecture on ``device`` in ``dtype``), a
    random codebook's neighbours and its recommended sampling; with ``tiny`` the tiny preset of that family."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    name = FAMILY_PRESETS[preset] if tiny else preset
    overrides = [f"model={name}", f"device={device.type}", f"dtype={str(dtype).removeprefix('torch.')}"]
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
        cfg = compose("config", overrides=overrides)
    parts = instantiate(cfg.model.timing)
    codebook = torch.randn(parts.num_codes, 8, generator=torch.Generator().manual_seed(0))
    neighbours = CodebookNeighbours(codebook=codebook, k_max=64 if tiny else 1024)
    return parts.target, parts.drafter, neighbours, parts.conditions, dict(cfg.model.recommended)


def decoders(drafter, neighbours, sampling, mode, guard, k, full: bool = True):
    """The compared modes (label -> decoder); AR eager and AR compiled are always there, exact chain and
    LANTERN delta 0.4 only when ``full``."""
    modes = {"ar eager": ARDecoder(sampling), f"ar {mode}": ARDecoder(sampling, compile=mode, guard=guard)}
    if full:
        modes["exact chain3 sampled"] = SpeculativeDecoder(
            sampling, drafter, chain(3, "sampled"), ExactSampled(), "eagle", mode, guard=guard
        )
    for delta in (0.1, 0.4) if full else (0.1,):
        modes[f"lantern d={delta} chain3 sampled"] = SpeculativeDecoder(
            sampling, drafter, chain(3, "sampled"), lantern(k, delta, neighbours), "lantern", mode, guard=guard
        )
    return modes


def timed(decoder, model, condition, keys, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = decoder.generate(model, condition, keys)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def check(name, model, drafter, neighbours, conditions, recommended, args, device, full: bool = True) -> dict:
    sampling = SamplingConfig(**{key: recommended[key] for key in ("cfg_scale", "temperature", "top_k", "top_p")})
    guard = lambda: no_host_sync(device)  # noqa: E731
    k = min(1000, neighbours.k_max - 1)  # the bounded rule needs k <= k_max
    modes = decoders(drafter, neighbours, sampling, args.compile, guard, k, full)
    keys = [keys_tensor(0, [i], device) for i in range(args.images)]
    compile_s = {}
    for label, decoder in modes.items():  # warm-up: compilation, CUDA graph capture, tables
        start = time.perf_counter()
        for _ in range(2):
            timed(decoder, model, conditions[0], keys[0], device)
        compile_s[label] = time.perf_counter() - start
    times = {label: [] for label in modes}
    taus = {label: [] for label in modes}
    for i in range(args.images):
        for label, decoder in modes.items():
            seconds, result = timed(decoder, model, conditions[i], keys[i], device)
            times[label].append(seconds)
            taus[label].append(int(result.per_sample["tokens"].sum()) / max(1, int(result.per_sample["steps"].sum())))
    greedy = SamplingConfig(temperature=0, cfg_scale=sampling.cfg_scale)
    eager_codes = ARDecoder(greedy).generate(model, conditions[1], keys[1]).codes
    compiled_codes = ARDecoder(greedy, compile=args.compile, guard=guard).generate(model, conditions[1], keys[1]).codes
    ar_label = f"ar {args.compile}"
    rows = []
    for label in modes:
        latency = statistics.median(times[label])
        spread = (min(times[label]), max(times[label]))
        rows.append(
            {
                "mode": label,
                "latency_ms": latency * 1000,
                "s_per_image": latency,
                "min_ms": spread[0] * 1000,
                "max_ms": spread[1] * 1000,
                "tau": statistics.mean(taus[label]),
                "speedup_vs_compiled_ar": statistics.median(times[ar_label]) / latency,
                "warmup_s": compile_s[label],
            }
        )
    return {
        "target": name,
        "tokens": model.config.num_image_tokens,
        "rows": rows,
        "greedy_tokens_equal_compiled_vs_eager": float((eager_codes == compiled_codes).float().mean()),
        "compiled_ar_over_eager_ar": statistics.median(times["ar eager"]) / statistics.median(times[ar_label]),
    }


def markdown(results: list[dict], env: dict, args) -> str:
    lines = [
        "# GPU check: compiled decode steps (AR, exact, LANTERN)",
        "",
        f"`python scripts/gpu_check.py {' '.join(args.argv)}` at commit {env['commit'][:7]} on {env['device_name']}, "
        f"torch {env['versions']['torch']}, dtype {args.dtype}, compile={args.compile}, batch 1, {args.images} images per mode "
        "(interleaved, after two warm-up images), median latency with min-max. Every timed step ran under "
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
            "| mode | tau | latency ms/image (min-max) | speed-up vs compiled AR | warm-up s |",
            "|---|---|---|---|---|",
        ]
        for r in result["rows"]:
            lines.append(
                f"| {r['mode']} | {r['tau']:.2f} | {r['latency_ms']:.1f} ({r['min_ms']:.1f}-{r['max_ms']:.1f}) | "
                f"{r['speedup_vs_compiled_ar']:.2f}x | {r['warmup_s']:.1f} |"
            )
        lines.append("")
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
    checks.integer("--images", args.images, 2)
    targets = [checks.choice("--targets", t, TARGETS) for t in args.targets.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    results = []
    for target in targets:
        if target == "world":
            results.append(check("embedded world (GPT, 8x8 tokens)", *world_target(device, dtype), args, device))
        elif target in FAMILY_PRESETS:
            name = (
                f"random {FAMILY_PRESETS[target]} (tiny form of {target})" if args.tiny else f"random-weight {target}"
            )
            parts = family_target(target, device, dtype, args.tiny)
            results.append(check(name, *parts, args, device, full=False))
            del parts  # a 7B target's memory goes before the next is built
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            name = "random GPT-nano t2i (tiny form)" if args.tiny else "random-weight LlamaGen GPT-XL t2i 256 px"
            results.append(check(name, *random_llamagen(device, dtype, args.tiny), args, device))
    env = environment(device)
    write_json_atomic(
        out.with_suffix(".json"),
        {"args": {k: v for k, v in vars(args).items()}, "environment": env, "results": results},
    )
    write_text_atomic(out.with_suffix(".md"), markdown(results, env, args))
    return results
