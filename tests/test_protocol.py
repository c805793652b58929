"""Evaluation protocols (conf/protocol, lantern.metrics.protocol): pins checked before any work, recorded."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

import lantern  # noqa: F401 - registers the resolvers the configs use
from lantern.cli.preflight import resolve as resolve_config
from lantern.errors import ConfigError
from lantern.files import sha256_file
from lantern.metrics.protocol import Protocol, prompt_list_sha256

PRESETS = sorted(p.stem for p in (REPO / "conf" / "protocol").glob("*.yaml") if p.stem != "none")
WORLD = REPO / "worlds" / "fashion_mnist"


def composed(*overrides: str, resolve: bool = True) -> dict:
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("config", overrides=list(overrides))
    return resolve_config(cfg) if resolve else OmegaConf.to_container(cfg)  # as run.py's preflight resolves


def checked(*overrides: str) -> dict:
    """What ``run.py`` does before claiming its folder: the protocol's pins against the composed run."""
    resolved = composed(*overrides)
    protocol = Protocol.from_config(resolved["protocol"])
    return protocol.check(resolved, instantiate(resolved["prompts"]), resolved["num_images"])


def coco_files(tmp_path, images: int = 6, size: int = 256):
    """A COCO caption file of ``images`` images (two captions each) and a reference folder of ``size`` px PNGs."""
    annotations = [
        {"image_id": i, "id": 10 * i + j, "caption": f"a photo of thing {i}" + " indeed" * j}
        for i in range(images)
        for j in range(2)
    ]
    captions = tmp_path / "captions_val2017.json"
    captions.write_text(json.dumps({"annotations": annotations}))
    # the papers' own formats: LANTERN's JSON list (the longest caption per image), LlamaGen's one-column CSV
    (tmp_path / "captions_val2017_longest.json").write_text(json.dumps([a["caption"] for a in annotations[1::2]]))
    (tmp_path / "coco_captions.csv").write_text("Prompt\n" + "".join(f"a coco prompt {i}\n" for i in range(images)))
    reference = tmp_path / f"ref{size}"
    reference.mkdir()
    for i in range(3):
        Image.fromarray(np.full((size, size, 3), 40 * i, np.uint8)).save(reference / f"{i:06d}.png")
    clip = tmp_path / "ViT-B-32.pt"
    clip.write_bytes(b"not the real weights")
    return captions, reference, clip


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_pins_every_field(name):
    resolved = composed(f"protocol={name}", resolve=False)  # COCO's files are not here: pins only
    protocol = Protocol.from_config(resolved["protocol"])
    assert protocol.name == name and protocol.count >= protocol.node["speed"]["prompts"]
    assert resolved["num_images"] == "${protocol.prompts.count}"  # one image per pinned prompt
    for metric in protocol.node["metrics"]:
        assert metric in resolved["metrics"]  # the preset selects the metrics it pins


def test_no_protocol_is_the_default_and_records_null():
    resolved = composed()
    assert resolved["protocol"] is None and Protocol.from_config(None) is None


def test_world_protocol_pins_its_prompts_weights_and_reference():
    fields = checked("protocol=world", "num_images=100")
    assert fields["protocol"] == "world" and fields["protocol_subset"] is True
    inputs = fields["protocol_inputs"]
    assert inputs["prompts"] == prompt_list_sha256(instantiate(composed("protocol=world")["prompts"]).items)
    assert inputs["clip"] == sha256_file(WORLD / "clip.safetensors")
    assert inputs["faithfulness"] == sha256_file(WORLD / "classifier.safetensors")
    assert inputs["reference"] == sha256_file(REPO / "data" / "fashion_mnist" / "t10k-images-idx3-ubyte.gz")
    assert checked("protocol=world")["protocol_subset"] is False
    # The protocol's hash ignores where files lie on this machine, not what they are.
    moved = checked("protocol=world", f"paths.root={REPO}/.")
    assert moved["protocol_sha256"] == fields["protocol_sha256"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["seed=3"], "seed=3: protocol world pins seed 0"),
        (["num_images=1001"], "num_images=1001: protocol world has 1000 prompts"),
        (["prompts=model_default"], "hold 20 prompts; protocol world pins 1000"),
        (["+prompts.seed=1"], "the first 1000 prompts of 'fashion_mnist' has sha256"),  # other captions
        (["metrics=clip", "metrics.clip.pretrained=x.pt"], "protocol world measures 'fid' but metrics.fid is not"),
        (["~metrics.faithfulness"], "protocol world measures 'faithfulness' but metrics.faithfulness is not"),
        (["metrics.clip._target_=lantern.metrics.fid.FID"], "metrics.clip is 'lantern.metrics.fid.FID'"),
        (["model.bundle.gpt.image_size=64"], "makes 64 px images; protocol world pins 32 px"),
        (["metrics.fid.reference.count=64"], "reference.count=64: protocol world compares with all 10000 reference"),
        (["~protocol.speed"], "protocol world: the preset gives no 'speed'"),
        (["~protocol.prompts.sha256"], "gives no 'prompts.sha256'"),
    ],
)
def test_a_run_that_leaves_the_protocol_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checked("protocol=world", *overrides)


def test_an_altered_or_missing_weights_file_names_the_expected_hash(tmp_path):
    altered = tmp_path / "classifier.safetensors"
    shutil.copy(WORLD / "classifier.safetensors", altered)
    with open(altered, "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(ConfigError, match=r"metrics.faithfulness weights=.* has sha256 .*pins 8add70f3495aece7"):
        checked("protocol=world", f"metrics.faithfulness.classifier_path={altered}")
    with pytest.raises(ConfigError, match=r"no such file or folder \(protocol world expects sha256 8add70f3495aece7"):
        checked("protocol=world", f"metrics.faithfulness.classifier_path={tmp_path / 'gone.safetensors'}")


def test_coco_protocol_reads_its_stand_in_files_and_refuses_another_resolution(tmp_path):
    captions, reference, clip = coco_files(tmp_path)
    base = [
        "protocol=lantern_coco17_5k",
        "model=llamagen_t2i_xl_256",
        *(f"model.{key}=unused" for key in ("gpt_ckpt", "vq_ckpt", "text_encoder_path")),  # nothing is built
        f"prompts.path={tmp_path / 'captions_val2017_longest.json'}",  # LANTERN's list, in its format
        "protocol.prompts.sha256=null",  # the stand-in list is not LANTERN's
        f"metrics.fid.reference.path={reference}",
        f"metrics.precision_recall.weights={clip}",  # stand-ins: the check hashes files, it loads none
        f"metrics.hps.checkpoint={clip}",
        f"metrics.clip.pretrained={clip}",
        "protocol.metrics.clip.sha256=null",  # the stand-in is not OpenAI's file
        "protocol.reference.count=3",  # the stand-in folder's images
    ]
    with pytest.raises(ConfigError, match="hold 6 prompts; protocol lantern_coco17_5k pins 5000"):
        checked(*base)
    fields = checked(*base, "protocol.prompts.count=4", "protocol.speed.prompts=4", "num_images=4")
    longest = [f"a photo of thing {i} indeed" for i in range(4)]  # the longest caption per image, image id order
    assert fields["protocol_inputs"]["prompts"] == prompt_list_sha256(longest)
    assert fields["protocol_inputs"]["clip"] == sha256_file(clip) and fields["protocol_subset"] is False
    assert set(fields["protocol_inputs"]) == {"prompts", "clip", "precision_recall", "hps", "reference"}
    (tmp_path / "small").mkdir()
    _, small, _ = coco_files(tmp_path / "small", size=32)
    with pytest.raises(ConfigError, match="holds 32x32 images .* protocol lantern_coco17_5k compares at 256x256"):
        checked(
            *base,
            "protocol.prompts.count=4",
            "protocol.speed.prompts=4",
            "num_images=4",
            f"metrics.fid.reference.path={small}",
        )
    with pytest.raises(ConfigError, match="reference_name='coco2014_val_256': protocol lantern_coco17_5k compares"):
        checked(
            *base,
            "protocol.prompts.count=4",
            "protocol.speed.prompts=4",
            "num_images=4",
            "metrics.fid.reference_name=coco2014_val_256",
        )
    with pytest.raises(ConfigError, match="pins 40d365715913c9da"):  # the real pin refuses the stand-in weights
        checked(*base[:-2], "protocol.prompts.count=4", "protocol.speed.prompts=4", "num_images=4")
    with pytest.raises(ConfigError, match="holds 3 images; protocol lantern_coco17_5k compares with 5000"):
        checked(*base[:-1], "protocol.prompts.count=4", "protocol.speed.prompts=4", "num_images=4")


def test_switching_protocol_switches_what_is_read(tmp_path):
    captions, reference, clip = coco_files(tmp_path)
    world = composed("protocol=world")
    coco = composed("protocol=lantern_coco17_5k", f"prompts.path={captions}", resolve=False)
    assert world["prompts"]["_target_"] != coco["prompts"]["_target_"]
    assert world["metrics"]["fid"]["reference_name"] != coco["metrics"]["fid"]["reference_name"]
    assert set(world["metrics"]) != set(coco["metrics"])


def test_run_py_refuses_an_unknown_protocol_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "run.py", "protocol=coco3000", "wandb.mode=disabled", f"hydra.run.dir={out}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "protocol" in proc.stderr
    assert "world" in proc.stderr and not out.exists()


def test_the_speed_part_pins_batch_warmup_and_no_metrics_and_shares_the_protocol_hash():
    speed = ["protocol=world", "protocol.part=speed", "metrics=none", "batch_size=1", "num_images=100"]
    fields = checked(*speed)
    assert fields["protocol_part"] == "speed" and fields["protocol_subset"] is False
    assert fields["protocol_sha256"] == checked("protocol=world")["protocol_sha256"]  # latency runs join quality runs
    assert set(fields["protocol_inputs"]) == {"prompts"}  # no metric weights are read
    with pytest.raises(ConfigError, match="batch_size=10: the speed part of protocol world pins batch_size 1"):
        checked(*speed, "batch_size=10")
    with pytest.raises(ConfigError, match="num_images=101: the speed part of protocol world times its first 100"):
        checked(*speed, "num_images=101")
    with pytest.raises(ConfigError, match="measures no quality: set metrics=none"):
        checked(*[o for o in speed if o != "metrics=none"])
    with pytest.raises(ConfigError, match="part='timing'"):
        checked("protocol=world", "protocol.part=timing")


def test_the_table2_experiments_compose_the_two_parts():
    quality = composed("+experiment=lantern_table2", "+experiment/mode=lantern_0.1", resolve=False)
    latency = composed("+experiment=lantern_table2_latency", "+experiment/mode=lantern_0.1", resolve=False)
    assert quality["protocol"]["name"] == latency["protocol"]["name"] == "world"
    assert (quality["protocol"]["part"], latency["protocol"]["part"]) == ("quality", "speed")
    assert latency["metrics"] == {} and quality["metrics"]["fid"]


@pytest.mark.parametrize("model", sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml")))
def test_every_model_preset_states_its_image_size(model):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("config", overrides=[f"model={model}"])
    size = OmegaConf.select(cfg, "model.image_size")  # what a protocol's image.size is compared with
    assert isinstance(size, int) and size % 16 == 0, size


def test_each_coco_and_parti_preset_reads_what_it_pins_from_stand_in_files(tmp_path):
    captions, reference, weights = coco_files(tmp_path, size=768)
    (tmp_path / "256").mkdir()
    _, reference256, _ = coco_files(tmp_path / "256", size=256)
    parti = tmp_path / "PartiPrompts.tsv"
    parti.write_text("Prompt\tCategory\n" + "".join(f"a parti prompt {i}\tAnimals\n" for i in range(5)))
    small = ["protocol.prompts.count=4", "protocol.speed.prompts=4", "num_images=4"]
    unbuilt = [f"model.{key}=unused" for key in ("gpt_ckpt", "vq_ckpt", "text_encoder_path")]
    cases = {
        "sjd_coco17_5k": (
            ["model=llamagen_t2i_xl_512", "model.bundle.gpt.image_size=768", *unbuilt, f"prompts.path={captions}"]
            + [f"metrics.fid.reference.path={reference}", f"metrics.fid.extractor.weights={weights}"]
            + [f"metrics.clip.folder={tmp_path / '256'}", "protocol.reference.count=3"],
            {"prompts", "fid", "clip", "reference"},
        ),
        "llamagen_coco14_30k": (
            ["model=llamagen_t2i_xl_256", *unbuilt, f"prompts.path={tmp_path / 'coco_captions.csv'}"]
            + [f"metrics.fid.reference.path={reference256}", "protocol.prompts.sha256=null"],
            {"prompts", "reference"},
        ),
        "parti": (
            ["model=llamagen_t2i_xl_256", *unbuilt, f"prompts.path={parti}", f"metrics.clip.pretrained={weights}"]
            + ["protocol.metrics.clip.sha256=null", "protocol.prompts.sha256=null"],
            {"prompts", "clip"},
        ),
    }
    for name, (overrides, read) in cases.items():
        fields = checked(f"protocol={name}", *overrides, *small)
        assert fields["protocol"] == name and set(fields["protocol_inputs"]) == read, (name, fields)
