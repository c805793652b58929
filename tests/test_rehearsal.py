"""The dress rehearsal of the real path (issue 54): every real model preset and every protocol with assets, fetched
from replicas of their upstream repositories on a loopback hub into an empty store, run from that store with no
path typed by hand, and tabled.

The replicas (``tests/fixtures/hub``) hold what upstream's listings name, at the listed revisions, with tiny
contents in upstream's formats; the registry and protocol pins are upstream's with each digest swapped for the
replica's (:mod:`fixtures.hub.pins`). The default suite lists and fetches every real preset, and runs the three
commands of ``docs/gpu_quickstart.md`` once per protocol and family; ``-m slow`` runs every preset under every
protocol it can run under.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from fixtures.hub import pins
from fixtures.hub.rehearsal import REPO, Case, Stage, compose, pinned_size
from fixtures.hub.replicas import Replicas, commit_of, hub_names, listings
from fixtures.hub.server import Hub, environment

pytest.importorskip("transformers")

REAL = sorted(
    path.stem
    for path in (REPO / "conf" / "model").glob("*.yaml")
    if not path.stem.startswith("tiny_random") and path.stem != "fashion_t2i"
)
PROTOCOLS = sorted(
    path.stem for path in (REPO / "conf" / "protocol").glob("*.yaml") if "assets" in yaml.safe_load(path.read_text())
)
# One full pass per protocol and per family: LANTERN's Table 2, SJD-PAC's table, LlamaGen's COCO FID, then the
# Janus, Emu3, Anole and class-conditional LlamaGen families.
FULL = [
    Case("llamagen_t2i_xl_256", "lantern_coco17_5k", "lantern"),
    Case("lumina_mgpt_7b_768", "sjd_coco17_5k", "ar"),
    Case("llamagen_t2i_xl_256", "llamagen_coco14_30k", "ar"),
    Case("janus_pro_1b", "parti", "sjd"),
    Case("emu3_gen", "parti", "ar"),
    Case("anole_7b", "parti", "lantern"),
    Case("llamagen_c2i_b_256", None, "ar"),
]
# SJD-PAC's own decoder on its table's target (2,353 tokens an image: slow on a CPU).
MORE = [Case("lumina_mgpt_7b_768", "sjd_coco17_5k", "sjd_pac")]


def test_the_rehearsal_covers_every_real_preset_and_every_protocol_with_assets():
    assert {case.protocol for case in FULL} - {None} == set(PROTOCOLS)
    families = {case.preset.split("_")[0] for case in FULL}
    assert families == {preset.split("_")[0] for preset in REAL}
    assert {case.preset for case in SLOW} == set(REAL)


def test_sjd_pacs_emu3_table_composes_under_its_protocol():
    """``+experiment=sjd_pac_table model=emu3_gen`` (docs/gpu_quickstart.md): the protocol must admit the model's
    image size (Emu3-Gen: 720 px), or the run stops at its preflight."""
    resolved = compose(["+experiment=sjd_pac_table", "model=emu3_gen", "published.model=Emu3"])
    assert resolved["protocol"]["image"]["size"] in (None, resolved["model"]["image_size"])


def drafting(preset: str) -> str:
    """The preset's decoder for a fetch: LANTERN where a drafter is released (it fetches the drafter too)."""
    return (
        "lantern"
        if "drafter_ckpt" in (yaml.safe_load((REPO / f"conf/model/{preset}.yaml").read_text())["assets"])
        else "ar"
    )


def _preset(preset: str) -> tuple[bool, int]:
    """(conditions on captions, image size) of a preset, read from its YAML (no composition at collection)."""
    node = yaml.safe_load((REPO / f"conf/model/{preset}.yaml").read_text())
    bundle = node["bundle"]
    size = (bundle.get("gpt") or bundle.get("target"))["image_size"]
    return "class_prompts" not in node["default_prompts"]["_target_"], int(size)


def _slow_cases() -> list[Case]:
    cases = []
    for preset in REAL:
        captions, size = _preset(preset)
        cases.append(Case(preset, None, drafting(preset)))
        for protocol in PROTOCOLS if captions else ():
            if pinned_size(protocol) in (None, size):  # a protocol that pins a size runs the presets that make it
                cases.append(Case(preset, protocol, drafting(preset)))
    return cases + MORE


SLOW = _slow_cases()


@pytest.fixture(scope="module")
def hub():
    with Hub(lifetime=3600) as server:
        yield server


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    return Replicas(tmp_path_factory.mktemp("replicas"))


def rehearse(case: Case, root: Path, replicas: Replicas, hub: Hub, table_here: bool = True) -> Stage:
    """The three commands of ``docs/gpu_quickstart.md`` for ``case``, each checked as a user would see it (the
    table in this process unless ``table_here`` is false: the script is the same, its imports paid once)."""
    stage = Stage(root, case, replicas, hub)
    stage.prepare()
    steps = (("fetch", stage.fetch), ("run", stage.run), ("table", lambda: stage.table(in_process=table_here)))
    for name, step in steps:
        proc = step()
        assert proc.returncode == 0, f"{case.name}: {name} failed:\n{proc.stderr[-3000:]}"
    return stage


def _digest_of(path: str, lock: dict[str, str]) -> str | None:
    """What ``note_input`` records for ``path`` if it holds exactly the locked files: a file's sha256, or the
    folder digest over its files' locked sha256s."""
    if path in lock:
        return lock[path]
    inside = sorted((name[len(path) + 1 :], sha) for name, sha in lock.items() if name.startswith(path + "/"))
    if not inside:
        return None
    return hashlib.sha256("".join(f"{name}\0{sha}\n" for name, sha in inside).encode()).hexdigest()


def check_record(stage: Stage) -> None:
    """The run read what the fetch locked and nothing else from the store, made its images, and is a table row."""
    record, lock = stage.record(), json.loads((stage.store / "assets.lock.json").read_text())["files"]
    locked = {str(stage.store / name): entry["sha256"] for name, entry in lock.items()}
    read = {path: entry["sha256"] for path, entry in record["inputs"].items() if path.startswith(str(stage.store))}
    assert read, record["inputs"]
    for path, sha in read.items():
        assert _digest_of(path, locked) == sha, f"{stage.case.name}: {path} is not what the fetch locked"
    assert record["num_images"] == len(list(stage.out.glob("0*.png")))
    assert record.get("protocol") == stage.case.protocol
    table = json.loads((stage.root / "table" / "table.json").read_text())
    assert len(table["rows"]) == 1 and not table["failed"]


@pytest.mark.parametrize("case", FULL, ids=lambda case: case.name)
def test_fetch_run_table(case, tmp_path, replicas, hub):
    stage = rehearse(case, tmp_path, replicas, hub, table_here=case != FULL[0])  # Table 2: every step a subprocess
    check_record(stage)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in SLOW if c not in FULL], ids=lambda case: case.name)
def test_fetch_run_table_for_every_preset_and_protocol(case, tmp_path, replicas, hub):
    check_record(rehearse(case, tmp_path, replicas, hub))


def test_every_real_preset_lists_only_what_its_replicas_hold_and_fetches(tmp_path, replicas, hub, monkeypatch):
    """``fetch.py --list`` of each real preset names only files its upstream replicas hold, and the fetch of each
    completes into an empty store (in this process: the scripts' own functions, one preset after another)."""
    from huggingface_hub import constants

    from lantern.run.assets import fetching, listing

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for key, value in environment(hub).items():
        monkeypatch.setenv(key, value)
    for preset in REAL:
        stage = Stage(tmp_path / preset, Case(preset, None, drafting(preset)), replicas, hub)
        stage.prepare()
        monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(stage.registry))
        monkeypatch.setenv("HF_HOME", str(stage.root / "hf"))
        resolved = compose([*stage.case.overrides(), f"paths.assets={stage.store}"])
        served = {
            f"hf://{r.repo_id}@{rev}/{name}"
            for r in hub.repos.values()
            for rev in (r.commit, *r.branches)
            for name in r.files
        }
        for line in listing.listing(resolved)[1:]:
            source = line.split(" | ")[0].split(": ", 1)[1]
            assert source.startswith(("recipe ", "http://127.0.0.1")) or source in served or "<" in source, (
                preset,
                line,
            )
        fetching.fetch(resolved, say=lambda _: None, progress=False)
        lock = json.loads((stage.store / "assets.lock.json").read_text())["files"]
        assert lock, preset
        for relative, entry in lock.items():  # every file came from a replica, at the listed commit
            source = entry["source"]
            assert source.startswith("http://127.0.0.1") or source in served, (preset, relative, source)
            assert (stage.store / relative).exists(), (preset, relative)


def test_a_replica_that_differs_from_upstreams_listing_fails_the_rehearsal(tmp_path, replicas, hub):
    """Upstream without the tokenizer the registry asks for, or with one weights file where the registry asks for
    an index and its shards: the fetch is one error line naming the missing file, and no run follows."""

    def tokenizer_gone(files: dict) -> None:
        del files["tokenizer.json"]

    def one_weights_file(files: dict) -> None:
        shards = sorted(name for name in files if name.startswith("model"))
        files["model.safetensors"] = files[shards[0]]
        for name in shards:
            del files[name]

    for change, missing in ((tokenizer_gone, "tokenizer.json"), (one_weights_file, "model.safetensors.index.json")):
        stage = Stage(tmp_path / change.__name__, Case("lumina_mgpt_7b_768", None, "ar"), replicas, hub)
        stage.prepare()  # serves the replica as upstream lists it; then it is changed
        change(hub.repos["Alpha-VLLM/Lumina-mGPT-7B-768"].files)
        proc = stage.fetch()
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("error: ") and missing in proc.stderr, proc.stderr
        assert not (stage.store / "Alpha-VLLM/Lumina-mGPT-7B-768" / missing).exists()


def test_every_replica_holds_exactly_its_listing_at_its_revision(replicas):
    """Each replica serves the listing's names and nothing else (where the listing leaves the weights' layout open,
    its first layout), every file non-empty; a URL replica is the one listed file. Run after the rehearsals
    above, which built most of them."""
    for stem, listing in listings().items():
        built = replicas.build(stem)
        if listing["kind"] == "hub":
            assert sorted(built.files) == sorted(hub_names(listing)), stem
            assert len(commit_of(listing)) == 40 and (listing["revision"] in (None, commit_of(listing)))
        else:
            assert list(built.files) == [listing["files"][0]["name"]], stem
        assert all(path.is_file() and path.stat().st_size > 0 for path in built.files.values()), stem


def test_the_registry_copy_differs_from_upstreams_in_pin_values_and_addresses_only(tmp_path, replicas, hub):
    """The rewrite of every entry keeps names, revisions, files, patterns and destinations; it swaps only pins that
    upstream's registry sets, moves URLs to the loopback host under their own path, and drops redirect hosts."""
    originals = {p.name: yaml.safe_load(p.read_text()) for p in sorted((REPO / "conf" / "assets").glob("*.yaml"))}
    copy = pins.rewrite_registry(REPO / "conf" / "assets", tmp_path / "registry", replicas, hub)
    swapped = 0
    for name, original in originals.items():
        rewritten = yaml.safe_load((copy / name).read_text())
        assert list(rewritten) == list(original), name
        for line in pins.differences(original, rewritten):
            key = line.split(":", 1)[0]
            assert pins.allowed_change(key, *_values(original, rewritten, key)), line
            swapped += key.rsplit(".", 1)[-1] in pins.PIN_KEYS
    assert swapped >= 10


def _values(original: dict, copy: dict, key: str):
    def at(tree, dotted):
        for part in dotted.replace("[", ".[").split("."):
            tree = tree[int(part[1:-1])] if part.startswith("[") else (tree or {}).get(part)
        return tree

    return at(original, key), at(copy, key)
