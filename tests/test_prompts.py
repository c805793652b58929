"""Prompt sets read from the field's files: COCO caption annotations and PartiPrompts."""

import json

import pytest

from lantern.errors import ConfigError
from lantern.run.prompts import coco_captions, parti_prompts


@pytest.fixture()
def coco_file(tmp_path):
    annotations = [
        {"image_id": 9, "id": 1, "caption": "A dog."},
        {"image_id": 3, "id": 2, "caption": "A cat on a mat."},
        {"image_id": 9, "id": 3, "caption": "A brown dog runs on grass."},
        {"image_id": 3, "id": 4, "caption": "A cat."},
        {"image_id": 5, "id": 5, "caption": "  Boats in a harbour at dawn. "},
    ]
    path = tmp_path / "captions_val2017.json"
    path.write_text(json.dumps({"images": [], "annotations": annotations}))
    return str(path)


def test_coco_longest_caption_per_image_in_image_order(coco_file):
    prompts = coco_captions(coco_file)
    assert prompts.items == ["A cat on a mat.", "Boats in a harbour at dawn.", "A brown dog runs on grass."]
    assert coco_captions(coco_file, per_image="first").items == [
        "A cat on a mat.",
        "Boats in a harbour at dawn.",
        "A dog.",
    ]
    assert len(coco_captions(coco_file, per_image="all")) == 5
    assert coco_captions(coco_file, start=1, count=1).items == ["Boats in a harbour at dawn."]


def test_parti_prompts_by_category(tmp_path):
    path = tmp_path / "PartiPrompts.tsv"
    path.write_text("Prompt\tCategory\tChallenge\tNote\na red car\tVehicles\tBasic\t\na corgi\tAnimals\tBasic\t\n")
    assert parti_prompts(str(path)).items == ["a red car", "a corgi"]
    assert parti_prompts(str(path), category="Animals").items == ["a corgi"]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found"),
        ("{}", "is not a COCO caption file"),
        ("not json", "is not a COCO caption file"),
        ('{"annotations": []}', "holds no captions"),
    ],
)
def test_bad_coco_files_get_one_clear_error(tmp_path, content, message):
    path = tmp_path / "captions.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        coco_captions(str(path))


def test_bad_ranges_and_parti_files_are_refused(tmp_path, coco_file):
    with pytest.raises(ConfigError, match="start=7 is past the 3 prompts"):
        coco_captions(coco_file, start=7)
    with pytest.raises(ConfigError, match="count=0"):
        coco_captions(coco_file, count=0)
    with pytest.raises(ConfigError, match="per_image='median'"):
        coco_captions(coco_file, per_image="median")
    bad = tmp_path / "bad.tsv"
    bad.write_text("Text\tCategory\nx\ty\n")
    with pytest.raises(ConfigError, match="no 'Prompt' column"):
        parti_prompts(str(bad))


@pytest.mark.parametrize(
    "loader,what",
    [("caption_file", "prompt file"), ("coco_captions", "COCO caption file"), ("parti_prompts", "PartiPrompts file")],
)
def test_binary_or_non_utf8_prompt_files_name_the_file_and_line(tmp_path, loader, what):
    import lantern.run.prompts as prompts

    latin = tmp_path / "latin1.txt"
    latin.write_bytes("a cat\nthe second line\na caf\u00e9 sign\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        getattr(prompts, loader)(str(latin))
    message = str(caught.value)
    assert message == f"{what} {str(latin)!r} is not UTF-8 text: line 3, column 6 has the byte 0xe9; save it as UTF-8"
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    with pytest.raises(
        ConfigError, match=rf"^{what} '.*image\.png' is a binary file, not text \(a NUL byte on line 3\)"
    ):
        getattr(prompts, loader)(str(binary))
    assert len(str(caught.value)) < 300


def test_a_long_prompt_warns_once_and_is_stored_once_by_its_start_and_hash(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    long = "a long red summer dress with thin straps " * 5000  # 205 KB on one line
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(long + "\na white sneaker\n")
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "prompts=caption_file",
            f"prompts.path={prompts}",
            "num_images=4",
            "batch_size=4",
            "warmup=0",
            "speedup_baseline=null",
            "wandb.mode=disabled",
            f"hydra.run.dir={out}",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        line for line in warnings if "1 of 2 distinct prompts are longer than the text encoder's 16 tokens" in line
    ]
    assert len(warnings) == 1
    record = json.loads((out / "metrics.json").read_text())
    import hashlib

    stored, short = record["distinct_prompts"]
    text = long.strip()
    assert short == "a white sneaker"
    assert stored.startswith(text[:4096]) and stored.endswith(
        f"[... {len(text)} characters in all, sha256 {hashlib.sha256(text.encode()).hexdigest()}]"
    )
    assert [row["prompt_id"] for row in record["per_image"]] == [0, 1, 0, 1]
    assert (out / "metrics.json").stat().st_size < 40_000  # its start and hash, stored once, not per image


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    from lantern.run.prompts import caption_file

    path = tmp_path / "captions.txt"
    path.write_bytes("\ufeffa red dress\na white sneaker\n".encode())
    assert list(caption_file(str(path))) == ["a red dress", "a white sneaker"]
