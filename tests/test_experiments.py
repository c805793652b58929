"""Experiments and run-end metrics, end to end through run.py (subprocesses on the shipped world)."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import METRIC_CASES, REPO

from lantern.decoding.api import settings_from_record
from lantern.run.compose import ModelParts, build_decoder

EXPERIMENTS = sorted(p.stem for p in (REPO / "experiments" / "experiment").glob("*.yaml"))
METRICS = sorted(p.stem for p in (REPO / "conf" / "metrics").glob("*.yaml"))


def coco_captions_file(folder: Path, count: int = 3) -> Path:
    """A small MS-COCO caption file: two captions for each of ``count`` images."""
    captions = [
        "a sneaker",
        "a white sneaker seen from the side",
        "a dress",
        "a long summer dress with thin straps",
        "a bag",
        "a leather bag with a handle",
    ]
    path = folder / "captions_val2017.json"
    path.write_text(
        json.dumps(
            {"annotations": [{"image_id": i // 2, "id": i, "caption": c} for i, c in enumerate(captions[: 2 * count])]}
        )
    )
    return path


def smoke_overrides(experiment: str, folder: Path) -> list[str]:
    """What an experiment needs to run on the embedded world (checkpoints and data it names are not here)."""
    if experiment == "paper_table_llamagen_coco":
        return ["model=fashion_t2i", f"prompts.path={coco_captions_file(folder)}", "draft=chain"]
    if experiment.startswith("sjd_pac_table"):  # its protocol's COCO files are not here
        return ["protocol=none"]
    if experiment == "lantern_table2":  # its protocol's metrics need the 10k reference; the smoke run has none
        return ["protocol=none"]
    if experiment == "lantern_table2_latency":  # the speed part pins warm-up 1; the smoke run has none
        return ["protocol.speed.warmup=0"]
    return []


@pytest.mark.parametrize(
    "experiment",
    [
        # The world's paper table and its batch-1 latency form are 15 modes each (minutes on 2 cores), the
        # peers' table 6 of them and the COCO grid runs FID and CLIP per job: every mode of each is composed
        # and built by the fast test below, and the COCO metrics run in the fast test further down; the
        # whole sweeps are in the slow suite.
        pytest.param(e, marks=pytest.mark.slow)
        if e
        in (
            "paper_table",
            "peers",
            "paper_table_latency",
            "paper_table_llamagen_coco",
            "lantern_table2",
            "lantern_table2_latency",
            "sjd_pac_table",  # on the tiny targets in test_sjd_pac_table.py
            "sjd_pac_table_latency",
            "frontier",  # 48 jobs: every point builds in tests/test_frontier.py, two of them run there
            "batch_sweep",  # 25 jobs: tests/test_batch_sweep.py runs two modes at two batches, table, plot, report
        )
        else e
        for e in EXPERIMENTS
    ],
)
def test_every_experiment_smoke_runs_and_writes_its_table(tmp_path, experiment):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "run.py"),
            "-m",
            f"+experiment={experiment}",
            "num_images=1",
            "warmup=0",
            "metrics=none",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={sweep}",
            *smoke_overrides(experiment, tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,  # another working directory on purpose
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = sorted(p for p in sweep.iterdir() if (p / "metrics.json").is_file())
    table = json.loads((sweep / "table.json").read_text())
    assert len(table["rows"]) == len(runs) >= 2


def test_world_metrics_land_in_the_record(tmp_path):
    """The world protocol's run: its metrics (recomputed here), their intervals, the protocol in the record and
    the table (one run for all of it: a run.py process with FID costs ~20 s)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "protocol=world",
            "num_images=4",
            "batch_size=4",
            "warmup=0",
            "metrics.fid.reference.count=64",
            "protocol.reference.count=64",  # the protocol's pin follows (the record's protocol hash then differs)
            f"metrics.fid.cache_dir={tmp_path / 'fid'}",
            "wandb.mode=disabled",
            f"hydra.run.dir={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["fid"] > 0 and metrics["fid_reference"] == "fashion_mnist_test_32"
    assert any(Path(tmp_path / "fid").glob("fashion_mnist_test_32_64*"))
    # The record's figures, recomputed here from the PNGs, the labels and the prompts.
    images = run_images(out, 4)
    labels = np.array([row["label"] for row in metrics["per_image"]])
    from lantern.metrics.classifier import load_classifier, predict

    predicted = predict(load_classifier(REPO / "worlds" / "fashion_mnist" / "classifier.safetensors"), images)
    assert metrics["prompt_accuracy"] == pytest.approx(float((predicted == labels).mean()))
    captions = [metrics["distinct_prompts"][row["prompt_id"]] for row in metrics["per_image"]]
    assert metrics["clip_score"] == pytest.approx(world_clip_score(images, captions), abs=1e-4)
    assert metrics["clip_score"] != pytest.approx(world_clip_score(images, captions[1:] + captions[:1]), abs=1e-4)
    # The protocol: named, a subset of its 1,000 prompts, every quality figure inside its interval, shown by the table.
    from lantern.metrics.protocol import prompt_list_sha256
    from lantern.results.render import make_tables
    from lantern.run.prompts import fashion_prompts

    assert metrics["protocol"] == "world" and metrics["protocol_subset"] is True and metrics["schema_version"] == 6
    assert metrics["protocol_inputs"]["prompts"] == prompt_list_sha256(fashion_prompts(1000).items)
    for name in ("fid", "clip_score", "prompt_accuracy"):
        interval = metrics[f"{name}_ci"]
        assert interval["lo"] <= metrics[name] <= interval["hi"] and interval["resamples"] >= 2
    _, paths = make_tables([str(out)], out=str(tmp_path / "table"))
    text = paths["md"].read_text()
    assert f"{metrics['fid']:.2f} ± " in text and "world (subset)" in text and "bootstrap" in text


def run_images(folder: Path, count: int) -> np.ndarray:
    """A run's first ``count`` PNGs as uint8 (N, H, W, 3)."""
    from PIL import Image

    return np.stack([np.asarray(Image.open(folder / f"{i:06d}.png").convert("RGB")) for i in range(count)])


def world_clip_score(images: np.ndarray, captions: list[str]) -> float:
    """The LANTERN-convention CLIP score with the world's CLIP, straight through open_clip: the mean
    cosine of each image and "A photo depicts " + its caption."""
    import open_clip
    import torch
    from PIL import Image

    world = REPO / "worlds" / "fashion_mnist"
    open_clip.add_model_config(str(world / "lantern-fashion-clip.json"))
    clip, _, preprocess = open_clip.create_model_and_transforms(
        "lantern-fashion-clip", pretrained=str(world / "clip.safetensors")
    )
    tokenizer = open_clip.get_tokenizer("lantern-fashion-clip")
    with torch.no_grad():
        image = clip.eval().encode_image(torch.stack([preprocess(Image.fromarray(i)) for i in images])).float()
        text = clip.encode_text(tokenizer(["A photo depicts " + c for c in captions])).float()
    cosine = torch.nn.functional.cosine_similarity(image, text, dim=-1)
    return float(cosine.mean())


# Values the metrics configs leave mandatory (???); constructors do no I/O, so any path instantiates.
METRIC_VALUES = {
    "fid_folder": ["metrics.fid.reference_name=ref", "metrics.fid.reference.path=ref_dir"],
    "clip": ["metrics.clip.pretrained=clip.pt"],
    "coco2017": ["metrics.fid.reference.path=ref_dir", "metrics.clip.pretrained=clip.pt"],
}


@pytest.mark.parametrize("metrics", [m for m in METRICS if m not in METRIC_CASES])  # the rest: test_metric_configs
def test_every_metrics_config_instantiates(metrics):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    importlib.import_module("lantern")  # registers the lantern_root resolver the config uses

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("config", overrides=[f"metrics={metrics}", *METRIC_VALUES.get(metrics, [])])
    built = instantiate(cfg.metrics)
    assert all(callable(metric) for metric in built.values())
    expected = {"none": set(), "fid_folder": {"fid"}, "clip": {"clip"}, "coco2017": {"fid", "clip"}}
    if metrics in expected:
        assert set(built) == expected[metrics]


def test_fid_reference_folder_is_centre_cropped_and_refuses_to_overwrite(tmp_path):
    from PIL import Image

    from lantern.metrics.reference import centre_square

    wide = np.zeros((40, 60, 3), dtype=np.uint8)
    wide[:, 10:50] = 255  # the centred 40x40 square is all white, the side strips black
    assert np.asarray(centre_square(Image.fromarray(wide), 16)).min() == 255
    source = tmp_path / "val2017"
    source.mkdir()
    for i in range(3):
        Image.fromarray(wide).save(source / f"{i:012d}.jpg")
    out = tmp_path / "ref"
    command = [
        sys.executable,
        str(REPO / "scripts" / "fid_reference.py"),
        "--images",
        str(source),
        "--out",
        str(out),
        "--size",
        "16",
        "--no-progress",
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"{i:012d}.png" for i in range(3)]
    assert Image.open(out / "000000000000.png").size == (16, 16)
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.strip().splitlines()[-1].startswith("error: output folder")
    missing = [*command[:2], "--images", str(tmp_path / "none"), "--out", str(tmp_path / "x")]
    empty = subprocess.run(missing, capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and "image folder not found" in empty.stderr and not (tmp_path / "x").exists()


@pytest.mark.slow  # ~15 s; test_world_metrics_land_in_the_record keeps FID and CLIP in the default suite
def test_the_coco_experiment_measures_fid_and_clip_on_the_world(tmp_path):
    """The LlamaGen COCO experiment's metrics run end to end, with the world's images, captions and CLIP."""
    from PIL import Image

    from lantern.metrics.classifier import fashion_test_images
    from lantern.metrics.reference import make_reference

    source = tmp_path / "val2017"
    source.mkdir()
    for i, image in enumerate(fashion_test_images(8)):
        Image.fromarray(image).save(source / f"{i:012d}.png")
    make_reference(source, tmp_path / "ref", size=32, progress=False)
    world = REPO / "worlds" / "fashion_mnist"
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "+experiment=paper_table_llamagen_coco",
            "+experiment/mode=lantern_0.1",
            *smoke_overrides("paper_table_llamagen_coco", tmp_path),
            "num_images=3",
            "batch_size=3",
            "warmup=0",
            f"metrics.fid.reference.path={tmp_path / 'ref'}",
            f"metrics.fid.cache_dir={tmp_path / 'fid'}",
            f"metrics.clip.pretrained={world / 'clip.safetensors'}",
            f"metrics.clip.model_config={world / 'lantern-fashion-clip.json'}",
            "metrics.clip.model=lantern-fashion-clip",
            "wandb.mode=disabled",
            f"hydra.run.dir={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["prompts"] == "coco2017_longest" and metrics["decoding"] == "lantern" and metrics["delta"] == 0.1
    assert metrics["fid"] > 0 and metrics["fid_reference"] == "coco2017_val_256"
    assert metrics["clip_convention"] == "lantern"
    captions = [metrics["distinct_prompts"][row["prompt_id"]] for row in metrics["per_image"]]
    assert metrics["clip_score"] == pytest.approx(world_clip_score(run_images(out, 3), captions), abs=1e-4)
    assert [metrics["distinct_prompts"][row["prompt_id"]] for row in metrics["per_image"]] == [
        "a white sneaker seen from the side",
        "a long summer dress with thin straps",
        "a leather bag with a handle",
    ]


PAPER_TABLES = {  # preset -> what it needs to compose on the world
    "paper_table": [],
    "lantern_table2": [],
    "paper_table_llamagen_coco": ["model=fashion_t2i"],
}


@pytest.mark.parametrize("preset", sorted(PAPER_TABLES))
def test_every_paper_table_mode_composes_and_puts_each_rule_on_its_baselines_drafts(preset):
    """The fast half of the paper-table smoke runs (which are slow): each mode of the sweep composes with the
    experiment and instantiates its decoder; the drafted rows come in two blocks, deterministic and sampled
    drafts, and every relaxed rule has the exact rule on the same draft structure and kind beside it (a
    LANTERN row on top-k drafts against an EAGLE row on sampled drafts compares drafts, not rules)."""
    import yaml
    from hydra import compose, initialize_config_dir

    import lantern  # noqa: F401  (registers the ${lantern_root:} resolver the search path uses)

    spec = yaml.safe_load((REPO / "experiments" / "experiment" / f"{preset}.yaml").read_text())
    modes = spec["hydra"]["sweeper"]["params"]["+experiment/mode"].split(",")
    names, drafted = set(), []
    for mode in modes:
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
            cfg = compose(
                "config", overrides=[f"+experiment={preset}", f"+experiment/mode={mode}", *PAPER_TABLES[preset]]
            )
        decoder = build_decoder(cfg.decoding, ModelParts(cfg.model))
        settings = decoder.settings
        names.add((decoder.name, str(sorted(settings.record().items()))))
        if settings.draft_kind() is not None:
            assert settings.draft_kind() in settings.method(), f"{mode}: the row label hides its draft kind"
            exact = settings.lossless()
            drafted.append((exact, settings.draft_kind(), settings.draft["draft"], mode))
    assert len(names) == len(modes), "two modes build the same decoder"
    assert {kind for _, kind, _, _ in drafted} == {"deterministic", "sampled"}
    baselines = {(kind, structure) for exact, kind, structure, _ in drafted if exact}
    for exact, kind, structure, mode in drafted:
        assert exact or (kind, structure) in baselines, f"{mode}: no exact row on {kind} {structure} drafts"
