"""The papers' own prompt files, read as their authors read them, and the caption rules derived from their code,
checked on a few rows taken from the stored repositories (tests/fixtures/papers/):

* LANTERN: its preprocess.py rule applied to 8 images of the captions_val2017.json stored in jadohu/LANTERN gives
  the first 8 captions of its published captions_val2017_longest.json, in order and unstripped;
* LlamaGen: its coco_captions.csv read as pandas.read_csv(delimiter='\\t') reads it (quotes as CSV quoting,
  trailing spaces kept), expected values as pandas gave them;
* SJD: MSCOCOPromptBench keeps the longest length and its position across images;
* each protocol pins the list it reads and names the commit its file is fetched at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lantern.errors import ConfigError
from lantern.metrics.protocol import prompt_list_sha256
from lantern.run.assets.registry import load_registry
from lantern.run.paper_prompts import coco_paper_captions, json_list, lantern_longest, llamagen_csv, sjd_running_max
from lantern.run.prompts import coco_captions

REPO = Path(__file__).resolve().parents[1]
PAPERS = REPO / "tests/fixtures/papers"
# pandas.read_csv(tests/fixtures/papers/llamagen_coco_captions_rows.csv, delimiter="\t")["Prompt"].tolist()
LLAMAGEN_ROWS = [
    "This wire metal rack holds several pairs of shoes and sandals",
    "A motorcycle parked in a parking space next to another motorcycle.",
    "A picture of a dog laying on the ground.",
    "A loft bed with a dresser underneath it.",
    "Two giraffes in a room with people looking at them.",
    "Head shot of a zebra against a stark background.",
    "A small kitchen with low a ceiling ",
    "Two people standing in a kitchen looking around. ",
    'A delivery truck driving on a freeway with "MOBEL PREISS" painted on it\'s sides. ',
    'A group of people seated on the ground and holding black and white "WWF" umbrellas over their heads.',
]


def test_lanterns_rule_on_its_annotations_gives_its_published_list():
    annotations = PAPERS / "lantern_captions_val2017_8images.json"
    published = json.loads((PAPERS / "lantern_captions_val2017_longest_head8.json").read_text())
    derived = coco_paper_captions(str(annotations), rule="lantern")
    assert list(derived) == published and len(published) == 8
    assert list(json_list(str(PAPERS / "lantern_captions_val2017_longest_head8.json"))) == published
    # the former recipe (image-id order, stripped) gives the same images in another order and spelling
    former = list(coco_captions(str(annotations), per_image="longest"))
    assert former != published and sorted(c.strip() for c in former) == sorted(c.strip() for c in published)


def test_lanterns_rule_keeps_the_first_of_equally_long_captions_and_does_not_strip():
    rows = [
        {"image_id": 7, "caption": "a cat "},
        {"image_id": 3, "caption": "a dog"},
        {"image_id": 7, "caption": "a bat "},  # as long: the first stays
        {"image_id": 3, "caption": "a big dog"},  # longer: replaces
    ]
    assert lantern_longest(rows) == ["a cat ", "a big dog"]


def test_llamagen_csv_is_read_as_llamagen_reads_it():
    prompts = llamagen_csv(str(PAPERS / "llamagen_coco_captions_rows.csv"))
    assert list(prompts) == LLAMAGEN_ROWS


def test_sjd_rule_keeps_the_longest_length_and_its_position_across_images():
    rows = [
        {"image_id": 2, "caption": "a long, long caption for image two"},  # image 2's first caption: the longest so far
        {"image_id": 2, "caption": "short"},
        {"image_id": 1, "caption": "one a"},
        {"image_id": 1, "caption": "one b is longer"},
        {"image_id": 3, "caption": "three a"},
        {"image_id": 3, "caption": "three b, longest of three"},  # shorter than image 2's: position 0 is kept
    ]
    # images in id order: 1 -> its longest (position 1); 2 -> position 0 (longer); 3 -> position 0, not its longest
    assert sjd_running_max(rows, [3, 1, 2]) == ["one b is longer", "a long, long caption for image two", "three a"]
    with pytest.raises(ConfigError, match="image 4 has 1 captions; SJD's rule takes caption 1"):
        sjd_running_max([*rows[2:4], {"image_id": 4, "caption": "x"}], [1, 4])


def _protocol(name: str) -> dict:
    return yaml.safe_load((REPO / f"conf/protocol/{name}.yaml").read_text())


@pytest.mark.parametrize(
    ("protocol", "asset", "commit"),
    [
        ("lantern_coco17_5k", "lantern_coco17_prompts", "3a56e451dd5ebfa1903d044f754c68c420de27a9"),
        ("llamagen_coco14_30k", "llamagen_coco14_prompts", "ce98ec41803a74a90ce68c40ababa9eaeffeb4ec"),
        ("parti", "parti_prompts", "5a657978134374ce28973948331b319adef164bd"),
    ],
)
def test_each_protocol_reads_its_papers_file_at_a_commit_and_pins_its_list(protocol, asset, commit):
    node = _protocol(protocol)
    registry = load_registry(str(REPO / "conf/assets"))
    assert node["assets"]["protocol"]["prompts/path"] == asset
    source = registry[asset].source
    assert f"/{commit}/" in source.url and "sha256" in registry[asset].pinned["verified"]
    assert commit in node["protocol"]["prompts"]["source"]
    assert len(node["protocol"]["prompts"]["sha256"]) == 64  # the list's hash, computed from the stored file


def test_a_pinned_list_refuses_another_one(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from lantern.cli.preflight import resolve as resolve_config
    from lantern.metrics.protocol import Protocol

    other = tmp_path / "list.json"
    other.write_text(json.dumps([f"caption {i}" for i in range(5000)]))
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose(
            "config", overrides=["protocol=lantern_coco17_5k", "model=llamagen_t2i_xl_256", f"prompts.path={other}"]
        )
    resolved = resolve_config(cfg)
    protocol = Protocol.from_config(resolved["protocol"])
    with pytest.raises(ConfigError, match="f8fd961ad14c7dd1"):
        protocol.check(resolved, instantiate(resolved["prompts"]), 10)
    assert prompt_list_sha256([f"caption {i}" for i in range(5000)]) != node_sha("lantern_coco17_5k")


def node_sha(name: str) -> str:
    return _protocol(name)["protocol"]["prompts"]["sha256"]
