"""A sweep of bad inputs through the entry point: each must give exactly one line on stderr that starts
with ``error:`` and names the value, exit status 2, nothing on stdout and no run folder.

The cases run in this process (``run.py`` through :func:`runpy.run_path`, as ``python run.py`` does), so
the sweep stays fast; ``test_the_contract_holds_in_a_real_process`` runs a few of them as real
processes, and the file-system faults run there too.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import TINY, run_in_process

REPO = Path(__file__).resolve().parents[1]
DECODERS = sorted(path.stem for path in (REPO / "conf" / "decoding").glob("*.yaml"))


class Evil:
    """Pickles as a call of ``os.system``: what a malicious checkpoint holds."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Bad (and a few good) input files, made once for the sweep."""
    root = tmp_path_factory.mktemp("inputs")
    made = {}

    def put(name: str, data: bytes) -> Path:
        path = root / name
        path.write_bytes(data)
        made[name] = path
        return path

    put("latin1.txt", "a cat\nan \u00e9clair\n".encode("latin-1"))
    put("binary.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 48)  # ~12 KB of bytes
    put("blank.txt", b"\n  \n\t\n")
    put("captions.txt", b"a red coat\na white sneaker\n")
    put("text.pt", b"this is not a checkpoint")
    put("empty.pt", b"")
    made["namespace.pt"] = root / "namespace.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "args": argparse.Namespace(lr=1e-4)}, made["namespace.pt"])
    made["evil.pt"] = root / "evil.pt"
    torch.save({"model": Evil()}, made["evil.pt"])
    made["list.pt"] = root / "list.pt"
    torch.save({"model": [1, 2, 3]}, made["list.pt"])
    made["small.pt"] = root / "small.pt"
    torch.save({"model": {"tok_embeddings.weight": torch.zeros(4, 4)}}, made["small.pt"])
    put("notcoco.json", b'{"images": []}')
    put("broken.json", b'{"annotations": [')
    put("parti.tsv", b"Text\tCategory\na cat\tAnimals\n")
    put("parti_ok.tsv", b"Prompt\tCategory\na cat\tAnimals\n")
    for name, manifest in [
        ("escape", {"files": {"../../../etc/passwd": {"sha256": "0" * 64}}}),
        ("absolute", {"files": {"/etc/hostname": {"sha256": "0" * 64}}}),
        ("altered", {"files": {"gpt.safetensors": {"sha256": "0" * 64, "command": "python x.py"}}}),
        ("notable", {"files": ["gpt.safetensors"]}),
    ]:
        folder = root / f"world_{name}"
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        (folder / "gpt.safetensors").write_bytes(b"x")
        made[f"world_{name}"] = folder
    (root / "world_badjson").mkdir()
    (root / "world_badjson" / "manifest.json").write_text("{nope")
    made["world_badjson"] = root / "world_badjson"
    (root / "empty_dir").mkdir()
    made["empty_dir"] = root / "empty_dir"
    (root / "t5_other").mkdir()
    (root / "t5_other" / "config.json").write_text('{"model_type": "bert"}')
    made["t5_other"] = root / "t5_other"
    made["root"] = root
    return made


def F(name):
    """A placeholder for the path of fixture file ``name`` in an override."""
    return "{" + name + "}"


# The LlamaGen model configs with tiny architectures, so no case builds a large model before its error.
C2I = [
    "model=llamagen_c2i_b_256",
    "model.bundle.gpt.preset=GPT-nano",
    "model.bundle.gpt.image_size=32",
    "+model.bundle.gpt.overrides={vocab_size:1024}",
    "model.bundle.vq.preset=VQ-tiny",
    "+model.bundle.vq.overrides={codebook_size:1024}",
]
T2I = [
    "model=llamagen_t2i_xl_256",
    "model.bundle.gpt.preset=GPT-nano",
    "model.bundle.gpt.image_size=32",
    "+model.bundle.gpt.overrides={vocab_size:1024,caption_dim:16,cls_token_num:12}",
    "model.bundle.vq.preset=VQ-tiny",
    "+model.bundle.vq.overrides={codebook_size:1024}",
    "model.bundle.conditioner.max_length=12",
    f"model.gpt_ckpt={F('text.pt')}",
    f"model.vq_ckpt={F('text.pt')}",
]

# (id, overrides, text the error line must contain). Overrides come after TINY unless they pick a model.
CASES = [
    # Sampling knobs: ranges, non-finite numbers, text where a number belongs.
    ("temperature-negative", ["temperature=-0.5"], "temperature=-0.5: expected"),
    ("temperature-inf", ["temperature=inf"], "temperature=inf: expected a finite number"),
    ("temperature-minus-inf", ["temperature=-inf"], "temperature=-inf: expected a finite number"),
    ("temperature-nan", ["temperature=nan"], "temperature=nan: expected a finite number"),
    ("temperature-text", ["temperature=hot"], "temperature='hot': expected a number"),
    ("temperature-bool", ["temperature=true"], "temperature=true: expected a number"),
    ("temperature-list", ["temperature=[1,2]"], "temperature=[1, 2]: expected a number"),
    ("top-k-negative", ["top_k=-1"], "top_k=-1: expected an integer >= 0"),
    ("top-k-text", ["top_k=abc"], "top_k='abc': expected a number"),
    ("top-k-fraction", ["top_k=2.5"], "top_k=2.5: expected an integer >= 0"),
    ("top-k-inf", ["top_k=inf"], "top_k=inf: expected a finite number"),
    ("top-k-null", ["top_k=null"], "top_k=null: expected an integer"),
    ("top-p-zero", ["top_p=0"], "top_p=0: expected a number in (0, 1]"),
    ("top-p-above-one", ["top_p=1.5"], "top_p=1.5: expected a number in (0, 1]"),
    ("top-p-nan", ["top_p=nan"], "top_p=nan: expected a finite number"),
    ("top-p-inf", ["top_p=inf"], "top_p=inf: expected a finite number"),
    ("top-p-text", ["top_p=all"], "top_p='all': expected a number"),
    ("cfg-negative", ["cfg_scale=-1"], "cfg_scale=-1: expected a finite number >= 0"),
    ("cfg-inf", ["cfg_scale=inf"], "cfg_scale=inf: expected a finite number"),
    ("cfg-nan", ["cfg_scale=nan"], "cfg_scale=nan: expected a finite number"),
    ("cfg-text", ["cfg_scale=strong"], "cfg_scale='strong': expected a number"),
    ("cfg-null", ["cfg_scale=null"], "cfg_scale=null: expected a finite number"),
    ("cfg-interval-low", ["cfg_interval=-2"], "cfg_interval=-2: expected an integer >= -1"),
    ("cfg-interval-fraction", ["cfg_interval=1.5"], "cfg_interval=1.5: expected an integer >= -1"),
    ("cfg-interval-text", ["cfg_interval=abc"], "cfg_interval='abc': expected a number"),
    ("cfg-below-one-unknown", ["cfg_below_one=average"], "cfg_below_one='average': expected one of conditional, mix"),
    ("cfg-below-one-number", ["cfg_below_one=1"], "cfg_below_one=1: expected one of conditional, mix"),
    ("sampling-nested-inf", ["sampling.temperature=inf"], "temperature=inf: expected a finite number"),
    # The job's integers.
    ("num-images-zero", ["num_images=0"], "num_images=0: expected an integer >= 1"),
    ("num-images-negative", ["num_images=-3"], "num_images=-3: expected an integer >= 1"),
    ("num-images-text", ["num_images=abc"], "num_images='abc': expected an integer >= 1"),
    ("num-images-fraction", ["num_images=2.5"], "num_images=2.5: expected an integer >= 1"),
    ("num-images-inf", ["num_images=inf"], "num_images=inf: expected a finite number"),
    ("batch-size-zero", ["batch_size=0"], "batch_size=0: expected an integer >= 1"),
    ("batch-size-text", ["batch_size=big"], "batch_size='big': expected an integer >= 1"),
    ("seed-negative", ["seed=-1"], "seed=-1: expected an integer >= 0"),
    ("seed-text", ["seed=lucky"], "seed='lucky': expected an integer >= 0"),
    ("seed-fraction", ["seed=0.5"], "seed=0.5: expected an integer >= 0"),
    ("warmup-negative", ["warmup=-1"], "warmup=-1: expected an integer >= 0"),
    ("speedup-every-zero", ["speedup_every=0"], "speedup_every=0: expected an integer >= 1"),
    ("speedup-every-text", ["speedup_every=often"], "speedup_every='often': expected an integer >= 1"),
    ("device-unknown", ["device=tpu"], "device='tpu'"),
    ("dtype-unknown", ["dtype=int8"], "dtype='int8': expected one of float32, bfloat16, float16"),
    ("dtype-double", ["dtype=float64"], "dtype='float64': expected one of float32, bfloat16, float16"),
    ("wandb-mode", ["wandb.mode=sometimes"], "wandb.mode='sometimes': expected one of"),
    # LANTERN's top-level knobs, for every decoder.
    ("k-zero", ["k=0"], "k=0: expected an integer >= 1"),
    ("k-negative", ["k=-5"], "k=-5: expected an integer >= 1"),
    ("k-text", ["k=many"], "k='many': expected an integer >= 1"),
    ("k-fraction", ["k=2.5"], "k=2.5: expected an integer >= 1"),
    ("k-inf", ["k=inf"], "k=inf: expected a finite number"),
    ("delta-negative", ["delta=-0.1"], "delta=-0.1: expected a number in [0, 1]"),
    ("delta-above-one", ["delta=1.5"], "delta=1.5: expected a number in [0, 1]"),
    ("delta-nan", ["delta=nan"], "delta=nan: expected a finite number"),
    ("delta-text", ["delta=small"], "delta='small': expected a number in [0, 1]"),
    ("lambda-below-one", ["lambda=0.5"], "lambda=0.5: expected a finite number >= 1"),
    ("lambda-text", ["lambda=big"], "lambda='big': expected a finite number >= 1"),
    ("lambda-inf", ["lambda=inf"], "lambda=inf: expected a finite number"),
    ("lantern-delta-negative", ["decoding=lantern", "delta=-0.1"], "delta=-0.1"),
    ("lantern-k-too-big", ["decoding=lantern", "k=5000"], "k=5000"),
    ("lantern-pp-lambda", ["decoding=lantern_pp", "lambda=0.5"], "lambda=0.5"),
    ("lantern-pp-k-text", ["decoding=lantern_pp", "k=ten"], "k='ten'"),
    ("eagle-delta-bad", ["decoding=eagle", "delta=2"], "delta=2: expected a number in [0, 1]"),
    (
        "lantern-semantics",
        ["decoding=lantern", "semantics=paper"],
        "semantics=paper is not an option; choose one of bounded, reference",
    ),
    (
        "lantern-audit",
        ["decoding=lantern", "semantics=reference", "decoding.acceptance.tv_audit_every=0"],
        "tv_audit_every=0",
    ),
    (
        "lantern-audit-text",
        ["decoding=lantern", "semantics=reference", "decoding.acceptance.tv_audit_every=x"],
        "tv_audit_every='x': expected a number",
    ),
    ("draft-depth-zero", ["decoding=eagle", "draft.depth=0"], "depth=0"),
    ("draft-depth-text", ["decoding=eagle", "draft.depth=deep"], "draft.depth='deep': expected a number"),
    ("draft-candidates", ["decoding=eagle", "draft.candidates=random"], "candidates='random'"),
    ("dynamic-tree-nodes", ["decoding=eagle", "draft=dynamic_tree", "draft.nodes=100000"], "nodes=100000"),
    ("dynamic-tree-top-k", ["decoding=eagle", "draft=dynamic_tree", "draft.top_k=0"], "top_k=0"),
    (
        "neighbours-k-max-text",
        ["decoding=lantern", "model.neighbours.k_max=abc"],
        "model.neighbours.k_max='abc': expected a number",
    ),
    # Hydra: unknown keys, unknown options, overrides that do not parse.
    ("unknown-key", ["foo=1"], "unknown key 'foo'; top-level keys: "),
    ("unknown-key-added", ["+foo=1"], "unknown key 'foo' (added with +foo=...)"),
    ("delta-added-again", ["+delta=0.2"], "delta"),
    ("unknown-sampling-key", ["sampling.foo=1"], "unknown key 'sampling.foo'; the keys of sampling are: "),
    ("unknown-model-key", ["model.ckpt=x"], "unknown key 'model.ckpt'; the keys of model are: "),
    ("unknown-nested-key", ["model.bundle.gpt.nope=3"], "unknown key 'model.bundle.gpt.nope'"),
    ("unknown-job-key", ["job.foo=1"], "unknown key 'job.foo'"),
    ("unknown-wandb-key", ["wandb.key=1"], "unknown key 'wandb.key'"),
    ("unknown-draft-key", ["draft.width=3"], "unknown key 'draft.width'"),
    ("unknown-decoder", ["decoding=xyz"], f"decoding=xyz is not an option; choose one of {', '.join(DECODERS)}"),
    (
        "unknown-draft",
        ["draft=nope"],
        "draft=nope is not an option; choose one of chain, dynamic_tree, mc_sim_7b_63, naive_extend_57, static_paths, static_tree",
    ),
    ("unknown-model", ["model=gpt5"], "model=gpt5 is not an option; choose one of "),
    ("unknown-prompts", ["prompts=nope"], "prompts=nope is not an option"),
    ("unknown-metrics", ["metrics=nope"], "metrics=nope is not an option"),
    ("unknown-experiment", ["+experiment=nope"], "experiment=nope is not an option; choose one of "),
    ("parse-open-list", ["top_k=[1,"], "cannot parse the override 'top_k=[1,'"),
    ("parse-no-key", ["=5"], "cannot compose the config from the overrides"),
    ("parse-bad-interpolation", ["top_k=${"], "cannot parse the override"),
    (
        "unresolved-interpolation",
        ["temperature=${nope}"],
        "temperature cannot be resolved: Interpolation key 'nope' not found",
    ),
    ("deleted-knob", ["~num_images"], "num_images cannot be resolved"),
    # Model files.
    ("gpt-ckpt-required", ["model=llamagen_c2i_b_256"], "model.gpt_ckpt is required"),
    (
        "gpt-ckpt-missing",
        [*C2I, "model.gpt_ckpt=/nonexistent/gpt.pt", f"model.vq_ckpt={F('text.pt')}"],
        "model.gpt_ckpt='/nonexistent/gpt.pt': expected an existing file or folder (no such path)",
    ),
    (
        "vq-ckpt-missing",
        [*C2I, f"model.gpt_ckpt={F('text.pt')}", "model.vq_ckpt=/nonexistent/vq.pt"],
        "model.vq_ckpt='/nonexistent/vq.pt': expected an existing file or folder (no such path)",
    ),
    (
        "ckpt-text",
        [*C2I, f"model.gpt_ckpt={F('text.pt')}", f"model.vq_ckpt={F('text.pt')}"],
        "text.pt' is not a readable checkpoint",
    ),
    (
        "ckpt-empty",
        [*C2I, f"model.gpt_ckpt={F('empty.pt')}", f"model.vq_ckpt={F('empty.pt')}"],
        "empty.pt' is not a readable checkpoint",
    ),
    (
        "ckpt-namespace",
        [*C2I, f"model.gpt_ckpt={F('namespace.pt')}", f"model.vq_ckpt={F('namespace.pt')}"],
        "holds a pickled argparse.Namespace, not only tensors",
    ),
    (
        "ckpt-malicious",
        [*C2I, f"model.gpt_ckpt={F('evil.pt')}", f"model.vq_ckpt={F('evil.pt')}"],
        "holds a pickled posix.system, not only tensors",
    ),
    (
        "ckpt-not-tensors",
        [*C2I, f"model.gpt_ckpt={F('list.pt')}", f"model.vq_ckpt={F('list.pt')}"],
        "is not a state dict",
    ),
    (
        "ckpt-other-model",
        [*C2I, f"model.gpt_ckpt={F('small.pt')}", f"model.vq_ckpt={F('small.pt')}"],
        "does not match VQ-tiny",
    ),
    (
        "ckpt-folder",
        [*C2I, f"model.gpt_ckpt={F('empty_dir')}", f"model.vq_ckpt={F('text.pt')}"],
        "is a folder without config.json: expected a checkpoint file or an HF-layout folder",
    ),
    ("gpt-preset", ["model.bundle.gpt.preset=GPT-Q"], "model.bundle.gpt.preset='GPT-Q': expected one of GPT-B"),
    ("gpt-model-type", ["model.bundle.gpt.model_type=x2i"], "model_type"),
    ("gpt-image-size", ["model.bundle.gpt.image_size=30"], "image_size 30"),
    (
        "gpt-image-size-text",
        ["model.bundle.gpt.image_size=big"],
        "model.bundle.gpt.image_size='big': expected a number",
    ),
    ("vq-preset", ["model.bundle.vq.preset=VQ-nope"], "VQ-nope"),
    ("init-seed-text", ["model.bundle.init_seed=abc"], "model.bundle.init_seed='abc': expected a number"),
    (
        "t5-folder-missing",
        [*T2I, "model.text_encoder_path=/nonexistent/t5"],
        "model.text_encoder_path='/nonexistent/t5': expected an existing file or folder (no such path)",
    ),
    ("t5-folder-other-model", [*T2I, f"model.text_encoder_path={F('t5_other')}"], "holds model_type 'bert', not 't5'"),
    ("t5-folder-no-config", [*T2I, f"model.text_encoder_path={F('empty_dir')}"], "has no config.json"),
    (
        "t5-dtype",
        [*T2I, f"model.text_encoder_path={F('empty_dir')}", "model.text_encoder_dtype=int8"],
        "model.text_encoder_dtype='int8': expected one of float32, bfloat16, float16",
    ),
    (
        "t5-preprocessing",
        [*T2I, f"model.text_encoder_path={F('empty_dir')}", "model.text_preprocessing=upper"],
        "model.text_preprocessing='upper': expected one of clean, lower, none",
    ),
    # The world's manifest.
    (
        "world-missing",
        ["model=fashion_t2i", "model.bundle.folder=/nonexistent/world"],
        "model.bundle.folder='/nonexistent/world': expected an existing file or folder",
    ),
    ("world-escape", ["model=fashion_t2i", f"model.bundle.folder={F('world_escape')}"], "outside the world folder"),
    (
        "world-absolute",
        ["model=fashion_t2i", f"model.bundle.folder={F('world_absolute')}"],
        "only relative paths inside the world folder",
    ),
    (
        "world-altered",
        ["model=fashion_t2i", f"model.bundle.folder={F('world_altered')}"],
        "was altered (sha256 2d711642b726..., manifest 000000000000...); restore it from where the world folder came from",
    ),
    ("world-not-a-table", ["model=fashion_t2i", f"model.bundle.folder={F('world_notable')}"], "has no 'files' table"),
    ("world-bad-json", ["model=fashion_t2i", f"model.bundle.folder={F('world_badjson')}"], "is not valid JSON"),
    # Prompts.
    ("prompt-file-required", ["model=fashion_t2i", "prompts=caption_file"], "prompts.path is required"),
    (
        "prompt-file-missing",
        ["model=fashion_t2i", "prompts=caption_file", "prompts.path=/nonexistent.txt"],
        "prompt file not found: '/nonexistent.txt'",
    ),
    (
        "prompt-file-latin1",
        ["model=fashion_t2i", "prompts=caption_file", f"prompts.path={F('latin1.txt')}"],
        "is not UTF-8 text: line 2, column 4 has the byte 0xe9",
    ),
    (
        "prompt-file-binary",
        ["model=fashion_t2i", "prompts=caption_file", f"prompts.path={F('binary.txt')}"],
        "is a binary file, not text (a NUL byte on line 3)",
    ),
    ("prompt-file-blank", ["model=fashion_t2i", "prompts=caption_file", f"prompts.path={F('blank.txt')}"], "is empty"),
    (
        "prompt-file-is-folder",
        ["model=fashion_t2i", "prompts=caption_file", f"prompts.path={F('empty_dir')}"],
        "prompt file not found",
    ),
    (
        "coco-not-coco",
        ["model=fashion_t2i", "prompts=coco2017_longest", f"prompts.path={F('notcoco.json')}"],
        "is not a COCO caption file",
    ),
    (
        "coco-broken-json",
        ["model=fashion_t2i", "prompts=coco2017_longest", f"prompts.path={F('broken.json')}"],
        "is not a COCO caption file",
    ),
    (
        "coco-latin1",
        ["model=fashion_t2i", "prompts=coco2017_longest", f"prompts.path={F('latin1.txt')}"],
        "is not UTF-8 text",
    ),
    (
        "coco-per-image",
        [
            "model=fashion_t2i",
            "prompts=coco2017_longest",
            f"prompts.path={F('notcoco.json')}",
            "prompts.per_image=middle",
        ],
        "per_image='middle': expected one of longest, first, all",
    ),
    ("parti-no-column", ["model=fashion_t2i", "prompts=parti", f"prompts.path={F('parti.tsv')}"], "no 'Prompt' column"),
    (
        "parti-category",
        ["model=fashion_t2i", "prompts=parti", f"prompts.path={F('parti_ok.tsv')}", "prompts.category=Food"],
        "holds no prompts in category 'Food'",
    ),
    (
        "parti-start",
        ["model=fashion_t2i", "prompts=parti", f"prompts.path={F('parti_ok.tsv')}", "prompts.start=5"],
        "start=5 is past the 1 prompts",
    ),
    (
        "parti-count",
        ["model=fashion_t2i", "prompts=parti", f"prompts.path={F('parti_ok.tsv')}", "prompts.count=0"],
        "count=0: expected an integer >= 1",
    ),
    ("class-prompts-for-text-model", ["model=fashion_t2i", "prompts=imagenet_demo"], "holds class prompts but model"),
    ("text-prompts-for-class-model", ["prompts=captions_demo"], "holds text prompts but model"),
    ("class-id-out-of-range", ["prompts=imagenet_demo"], "class prompt=207: expected a class id in [0, 9]"),
    (
        "fashion-count",
        ["model=fashion_t2i", "model.default_prompts.count=0"],
        "prompts.count=0: expected an integer >= 1",
    ),
    # Metrics: every input is checked before the first image.
    ("clip-weights-required", ["metrics=clip"], "metrics.clip.pretrained is required"),
    ("clip-needs-text", ["metrics=clip", f"metrics.clip.pretrained={F('text.pt')}"], "metrics=clip needs text prompts"),
    (
        "clip-weights-missing",
        ["model=fashion_t2i", "metrics=clip", "metrics.clip.pretrained=/nonexistent.pt"],
        "metrics.clip.pretrained='/nonexistent.pt': expected an existing file (it does not exist)",
    ),
    (
        "clip-weights-malicious",
        ["model=fashion_t2i", "metrics=clip", f"metrics.clip.pretrained={F('evil.pt')}"],
        "holds a pickled posix.system, not only tensors",
    ),
    (
        "clip-weights-text",
        ["model=fashion_t2i", "metrics=clip", f"metrics.clip.pretrained={F('text.pt')}"],
        "cannot be loaded as ViT-B-32 weights",
    ),
    (
        "clip-convention",
        ["model=fashion_t2i", "metrics=clip", "metrics.clip.pretrained=x", "metrics.clip.convention=mine"],
        "convention='mine': expected one of lantern, torchmetrics",
    ),
    (
        "clip-model",
        ["model=fashion_t2i", "metrics=clip", f"metrics.clip.pretrained={F('text.pt')}", "metrics.clip.model=nope"],
        "unknown open_clip model 'nope'",
    ),
    (
        "fid-folder-required",
        ["metrics=fid_folder", "metrics.fid.reference_name=x"],
        "metrics.fid.reference.path is required",
    ),
    (
        "fid-folder-missing",
        ["metrics=fid_folder", "metrics.fid.reference_name=x", "metrics.fid.reference.path=/nonexistent"],
        "metrics.fid.reference.path='/nonexistent': expected an existing folder (it does not exist)",
    ),
    (
        "fid-folder-empty",
        ["metrics=fid_folder", "metrics.fid.reference_name=x", f"metrics.fid.reference.path={F('empty_dir')}"],
        "no .png images in",
    ),
    (
        "faithfulness-needs-labels",
        ["model=fashion_t2i", "metrics=world", "prompts=caption_file", f"prompts.path={F('captions.txt')}"],
        "prompt faithfulness needs a labelled prompt set",
    ),
    # Speed-up baselines.
    ("baseline-run-missing", ["speedup_baseline_run=/nonexistent/run"], "speedup_baseline_run"),
    # Output folders of the wrong kind.
    ("run-dir-is-a-file", ["hydra.run.dir={captions.txt}"], "choose another path"),
]


def _fill(overrides: list[str], files: dict[str, Path]) -> list[str]:
    filled = []
    for override in overrides:
        for name, path in files.items():
            override = override.replace("{" + name + "}", str(path))
        filled.append(override)
    return filled


def test_the_sweep_has_at_least_a_hundred_cases():
    assert len(CASES) >= 100 and len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize("overrides,expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_error_line_exit_2_and_writes_nothing(tmp_path, files, monkeypatch, overrides, expected):
    out = tmp_path / "run"
    status, stdout, stderr = run_in_process(_fill(overrides, files), out, monkeypatch)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert expected.format(**{k: str(v) for k, v in files.items()}) in lines[0], lines[0]
    assert stdout == ""
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    assert len(lines[0]) <= 600


def test_the_contract_holds_in_a_real_process(tmp_path, files):
    """A few cases as real processes: what a user sees in a shell."""
    for overrides, expected in [
        (["foo=1"], "unknown key 'foo'"),
        (["top_k=abc"], "top_k='abc'"),
        (["top_k=[1,"], "cannot parse"),
        (["temperature=inf"], "temperature=inf"),
        (["model=fashion_t2i", "prompts=caption_file", f"prompts.path={files['binary.txt']}"], "is a binary file"),
    ]:
        out = tmp_path / "run"
        proc = subprocess.run(
            [sys.executable, "run.py", *TINY, f"hydra.run.dir={out}", *overrides],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (
            proc.stderr
        )
        assert proc.stdout == "" and not out.exists()


def _read_only_command(folder: Path, command: list[str]) -> list[str] | None:
    """``command`` with ``folder`` read-only: by permission bits, or for root (who ignores them) by a
    read-only bind mount in a private mount namespace; None when neither is possible here."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return command
    probe = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && ! touch {folder}/probe",
        ],
        capture_output=True,
    )
    if probe.returncode != 0:
        return None
    quoted = " ".join(f"'{part}'" for part in command)
    return [
        "unshare",
        "-m",
        "sh",
        "-c",
        f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && exec {quoted}",
    ]


def test_a_read_only_output_folder_is_one_line_before_any_work(tmp_path):
    parent = tmp_path / "ro"
    existing = parent / "run"
    existing.mkdir(parents=True)
    try:
        for out in (parent / "new", existing):
            command = _read_only_command(parent, [sys.executable, "run.py", *TINY, f"hydra.run.dir={out}"])
            if command is None:
                pytest.skip("cannot make a read-only folder here (root without mount namespaces)")
            proc = subprocess.run(
                command,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            )
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
            assert lines[0].startswith(("error: Read-only file system: ", "error: Permission denied: ")), lines[0]
            assert str(out) in lines[0] and "check its permissions" in lines[0], lines[0]
            assert not (parent / "new").exists() and list(existing.iterdir()) == []
    finally:
        parent.chmod(0o755)


def _small_files():
    """A full disk as the writer sees it: every file this process writes is capped at 4 KiB (EFBIG)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_a_full_disk_is_one_line_and_leaves_no_temp_or_record(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            *TINY,
            "num_images=3",
            "batch_size=1",
            f"hydra.run.dir={out}",
            f"paths.cache={tmp_path / 'cache'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        preexec_fn=_small_files,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 2 and len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr[
        -3000:
    ]
    assert errors[0].startswith("error: File too large: ") and "free some space" in errors[0], errors[0]
    assert str(out) in errors[0]  # the file it could not write
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []
    assert not [name for name in left if name.endswith(".tmp")], left  # no temporary files
    assert "metrics.json" not in left  # no half-written record
    for png in out.glob("*.png"):  # what was finished is whole
        from PIL import Image

        Image.open(png).verify()


def test_fault_messages_name_the_file():
    from lantern.errors import user_message

    full = OSError(errno.ENOSPC, "No space left on device", "/data/run/000003.png")
    assert user_message(full) == (
        "No space left on device: '/data/run/000003.png'; free some space or write elsewhere (hydra.run.dir=DIR)"
    )
    read_only = OSError(errno.EROFS, "Read-only file system", "/mnt/ro/run/.lock")
    assert user_message(read_only).startswith("Read-only file system: '/mnt/ro/run/.lock'; check its permissions")
    assert user_message(OSError(errno.ENOENT, "No such file or directory", "x")) is None  # not a fault: a bug's


def test_a_fault_names_the_setting_that_chooses_where_its_entry_point_writes():
    """run.py writes under hydra.run.dir, export_hf and the training scripts under out_dir, fid_reference
    under --out: the hint names the one the user can change, also through a wrapping exception."""
    from lantern.errors import user_message, writes_under
    from lantern.metrics.reference import make_reference
    from lantern.run.export import export
    from lantern.training.jobs import classifier, clip, drafter, gpt, vq

    def disk_full(*args):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/x/model.safetensors")
        except OSError as exc:
            raise RuntimeError("wrapped") from exc

    for knob in ("out_dir", "--out"):
        with pytest.raises(RuntimeError) as caught:
            writes_under(knob)(disk_full)()
        assert user_message(caught.value).endswith(f"free some space or write elsewhere ({knob}=DIR)")
    with pytest.raises(RuntimeError) as caught:  # the innermost entry point's setting wins
        writes_under("hydra.run.dir")(writes_under("out_dir")(disk_full))()
    assert user_message(caught.value).endswith("(out_dir=DIR)")
    with pytest.raises(RuntimeError) as caught:
        disk_full()
    assert user_message(caught.value).endswith("(hydra.run.dir=DIR)")

    def denied():
        raise OSError(errno.EACCES, "Permission denied", "/data/x")

    with pytest.raises(OSError) as caught:
        writes_under("out_dir")(denied)()
    assert user_message(caught.value).endswith("check its permissions or write elsewhere (out_dir=DIR)")
    for job in (export, classifier.train, clip.train, drafter.run, gpt.train, vq.train):
        assert job.output_knob == "out_dir", job.__qualname__  # export_hf's hint end to end: test_hardening2
    assert make_reference.output_knob == "--out"
