"""One bad value for every knob of every config group run.py composes, generated from conf/ itself.

Every option yaml of every group is walked (a new knob gets a case without anyone writing one): each number
gets an out-of-range value (an integer far past any upper bound: 10^12; a real far below zero), each text a
path that climbs out (``../no_such_x``: an unknown member where a choice is expected, a ``..`` where a name is,
a missing file where a path is), each flag a word. The case composes the run config as ``python run.py
GROUP=OPTION KEY=VALUE`` would, then runs, in this process, what run.py runs before it claims its folder:
the kind check of a command-line value, :func:`lantern.cli.preflight.check_run_config` and the prompt set.
Each must refuse the value with one ConfigError naming it. A handful of real processes prove the wiring
(one ``error:`` line, exit 2, no folder).

Knobs left out are listed below with the reason; a knob accepting its bad value is a bug to fix in the
preflight, not an entry to add here.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lantern.cli.hydra_errors import hydra_message
from lantern.cli.preflight import check_kind, check_run_config  # importing lantern registers ${lantern_root:}
from lantern.errors import user_message

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
BIG_INT, NEGATIVE_REAL, FLAG, TEXT = 10**12, -1e12, "maybe", "../no_such_x"
# The groups of a run, models last (their presets share most keys; each key is tried once, on the first preset
# that has it: the world and the tiny presets, which build without files).
GROUPS = ("decoding", "draft", "semantics", "coupling", "prompts", "metrics", "protocol", "paths")
PRESETS = ("fashion_t2i", *sorted(p.stem for p in (CONF / "model").glob("tiny_random_*.yaml")))

# Knobs that legitimately take any value of their kind (their bad value is then a word where a number belongs).
ANY_VALUE = {
    "seed": "any integer in [0, 2^63) names a draw (checked there)",
    "cfg_interval": "guides tokens 0..n+1: an n past the image guides every token, no more work",
    "report.prompts": "the report shows at most the images a sweep has",
    "speedup_every": "times the baseline on every N-th batch: a larger N only times it less often",
    "skip_interval": "VVS skips on every N-th step: a larger N skips less, no more work",
    "decoding.tv_audit_every": "audits the realised TV every N-th step: a larger N audits less",
    "decoding.label": "display text of tables and plots; never a path",
    "decoding.acceptance.tv_audit_every": "as decoding.tv_audit_every",
    "sjd_pp_threshold": "SJD++'s keep ratio p/q: any finite number (<= 0 keeps every draft, as released)",
    "gsd_p_thr": "GSD's probability gap: any finite number (<= 0 groups nothing)",
    "model.target_export_refused": "the sentence export_hf prints for a family it cannot export",
    "model.recommended.temperature": "read through the top-level temperature, checked there",
    "model.recommended.cfg_scale": "read through the top-level cfg_scale, checked there",
    "model.recommended.top_k": "read through the top-level top_k, checked there",
    "model.recommended.top_p": "read through the top-level top_p, checked there",
    "model.bundle.init_seed": "the seed of the random preset's weights: any integer in [0, 2^63)",
    **dict.fromkeys(
        [f"protocol.{key}" for key in ("description", "prompts.source", "prompts.selection", "prompts.order")]
        + [f"protocol.{key}" for key in ("reference.source", "reference.preprocessing", "image.resize")]
        + ["protocol.seeds.per_sample"],
        "a protocol's description of itself for readers: any text, never a path",
    ),
    **dict.fromkeys(
        [f"metrics.{m}.interval_seed" for m in ("fid", "clip", "hps", "kid", "inception_score", "precision_recall")]
        + ["metrics.faithfulness.interval_seed", "metrics.kid.seed", "metrics.inception_score.seed"],
        "a metric's seed: any integer >= 0 names a draw",
    ),
}
# Knobs the preflight does not check yet. Empty: the model's nodes (bundle, drafter, codebook, timing) and every
# metric are built through their dry twins before any model loads (lantern.run.dry_build, lantern.models.dry).
BUILT_LATE = ()


def leaves(node, prefix: str = ""):
    """(dotted key, value) of every leaf of a yaml's raw content (``_target_`` and ``defaults`` left out)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key != "defaults" and not str(key).startswith("_"):
                yield from leaves(value, f"{prefix}{key}.")
    elif not isinstance(node, list):
        yield prefix.rstrip("."), node


def bad_value(key: str, default):
    """The bad value for a knob whose default is ``default`` (None: no case, see below)."""
    if default is None or (isinstance(default, str) and "${" in default):
        return None  # a null has no kind to break; an interpolation is tried at the knob it reads
    if key in ANY_VALUE:
        return None if isinstance(default, str) else "many"
    if isinstance(default, bool):
        return FLAG
    if isinstance(default, int):
        return BIG_INT
    if isinstance(default, float):
        return NEGATIVE_REAL
    return TEXT


def generated_cases() -> list[tuple[str, str, str, object, object]]:
    """(group, option, key, default, bad value) for each knob, each key once."""
    options = [(group, path) for group in GROUPS for path in sorted((CONF / group).glob("*.yaml"))]
    options = [("", CONF / "config.yaml"), *options] + [("model", CONF / "model" / f"{p}.yaml") for p in PRESETS]
    seen, cases = set(), []
    for group, path in options:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        header = re.search(r"^# @package (\S+)", path.read_text(), re.MULTILINE)
        package = header.group(1) if header else group
        package = "" if package in ("", "_global_") else f"{package}."
        for key, default in leaves({k: v for k, v in raw.items() if k != "hydra"}, package):
            value = bad_value(key, default)
            if key in seen or value is None or (BUILT_LATE and key.startswith(BUILT_LATE)):
                continue
            seen.add(key)
            cases.append((group, path.stem, key, default, value))
    return cases


CASES = generated_cases()


def stand_ins(folder: Path) -> dict[str, str]:
    """Files in the formats the metric and protocol options read, for their mandatory paths (``???``) and the
    asset places their presets point at: a weights file, an image folder, COCO captions, a PartiPrompts TSV, a
    caption file, and the papers' own lists (LANTERN's JSON list, LlamaGen's CSV)."""
    (folder / "images").mkdir()
    (folder / "images" / "000000.png").write_bytes(b"")  # never opened: a dry build only stats paths
    (folder / "weights.pt").write_bytes(b"stand-in weights")
    annotations = [{"image_id": i, "id": i, "caption": f"a photo of thing {i}"} for i in range(8)]
    (folder / "captions.json").write_text(json.dumps({"annotations": annotations}))
    (folder / "captions.txt").write_text("a white sneaker\na long dress\n")
    (folder / "parti.tsv").write_text("Prompt\tCategory\n" + "".join(f"prompt {i}\tAnimals\n" for i in range(8)))
    (folder / "longest.json").write_text(json.dumps([f"a photo of thing {i}" for i in range(8)]))
    (folder / "coco_captions.csv").write_text("Prompt\n" + "".join(f"a photo of thing {i}\n" for i in range(8)))
    return {kind: str(folder / name) for kind, name in (("file", "weights.pt"), ("folder", "images"))} | {
        "lantern.run.prompts.coco_captions": str(folder / "captions.json"),
        "lantern.run.prompts.parti_prompts": str(folder / "parti.tsv"),
        "lantern.run.prompts.caption_file": str(folder / "captions.txt"),
        "lantern.run.paper_prompts.json_list": str(folder / "longest.json"),
        "lantern.run.paper_prompts.llamagen_csv": str(folder / "coco_captions.csv"),
        "lantern.run.paper_prompts.coco_paper_captions": str(folder / "captions.json"),
    }


def with_stand_ins(cfg, files: dict[str, str]):
    """``cfg`` with each mandatory path (``???``) and each asset path its protocol preset names given a stand-in:
    a name for a ``reference_name``, the image folder for a folder, the prompt file its prompt set reads."""
    raw = OmegaConf.to_container(cfg, resolve=False)
    keys = {key for key, value in leaves({k: v for k, v in raw.items() if k != "hydra"}) if value == "???"}
    keys |= {key.replace("/", ".") for key in (raw.get("assets") or {}).get("protocol") or {}}
    for key in sorted(keys):
        if key.endswith("reference_name"):
            value = "stand_in"
        elif key == "prompts.path":
            value = files[OmegaConf.select(cfg, "prompts._target_")]
        else:
            value = files["folder" if key.endswith(("reference.path", ".folder")) else "file"]
        OmegaConf.update(cfg, key, value, merge=False)
    if OmegaConf.select(cfg, "assets.extra") is not None:
        cfg.assets.extra = []  # files fetch.py makes for the protocol: stood in for by the ones above
    pinned = (raw.get("protocol") or {}).get("image", {}).get("size")
    if isinstance(pinned, int) and OmegaConf.select(cfg, "model.bundle.gpt.image_size") is not None:
        cfg.model.bundle.gpt.image_size = pinned  # the world's model at the protocol's size: a preflight builds none
    return cfg


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """The run config of each group option (composed once), as ``python run.py GROUP=OPTION`` composes it, with
    stand-in files where the option needs a path given."""
    from hydra import compose, initialize_config_dir

    files = stand_ins(tmp_path_factory.mktemp("stand_ins"))
    made = {}
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):

        def get(group: str, option: str):
            """(config, the base's own refusal or ''): an option refused even so is skipped, with its knobs."""
            if (group, option) not in made:
                model = "fashion_t2i" if group in ("protocol", "prompts", "metrics") else "tiny_random_c2i"
                choice = [f"{group}={option}"] if group else []
                cfg = with_stand_ins(compose("config", overrides=[f"model={model}", *choice]), files)
                made[group, option] = cfg, preflight(copy.deepcopy(cfg), "seed", 0, 0)
            cfg, refused = made[group, option]
            return copy.deepcopy(cfg), refused

        yield get


def preflight(cfg, key: str, value, default) -> str:
    """What run.py checks before it claims its folder, for ``cfg`` with ``key`` set to ``value`` on the command
    line: the error message (ConfigError) or ''."""
    try:
        OmegaConf.update(cfg, key, value, merge=False)
        check_kind(key, value, default)  # lantern.cli.preflight.check_overrides, for this one value
        check_run_config(cfg)
        instantiate(cfg.prompts)  # run.py's next step before its folder: the prompt set's own checks
    except Exception as exc:  # noqa: BLE001 - a user error is one message; anything else is a bug
        message = hydra_message(exc) or user_message(exc)
        if message is None:
            raise
        return message
    return ""


@pytest.mark.parametrize(
    "group,option,key,default,value", CASES, ids=[f"{c[0] or 'config'}:{c[1]}:{c[2]}" for c in CASES]
)
def test_every_knob_refuses_its_bad_value_before_any_work(composed, group, option, key, default, value):
    cfg, refused = composed(group, option)
    if refused:
        pytest.skip(f"{group}={option} is refused as it stands here: {refused}")
    message = preflight(cfg, key, value, default)
    assert message, f"{key}={value!r} accepted (default {default!r}); check it in lantern/cli/preflight.py"
    assert str(value) in message and "\n" not in message, message


def test_the_walk_reaches_every_group_and_the_top_level():
    walked = {case[0] for case in CASES}
    assert {"", "decoding", "draft", "prompts", "protocol", "model"} <= walked, walked
    assert len(CASES) >= 80
    assert {"num_images", "window", "attention", "draft.nodes", "model.name"} <= {case[2] for case in CASES}


# One real process per entry-point class: what a user sees in a shell.
PROCESS_CASES = [
    # The case: LANTERN (the default) with no AR baseline builds no AR decoder, and attention is still checked.
    (["speedup_baseline=null", "attention=flash"], "attention='flash': expected one of fast, reference"),
    (["decoding=sjd", "window=1000000000000"], "window=1000000000000: expected an integer in [1, 16384]"),
    (["model.name=../x"], "model.name='../x': expected a name"),
]


@pytest.mark.parametrize("overrides,expected", PROCESS_CASES, ids=[c[1].split(":")[0] for c in PROCESS_CASES])
def test_run_py_refuses_in_a_real_process(tmp_path, overrides, expected):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "run.py", "model=tiny_random_c2i", "wandb.mode=disabled", f"hydra.run.dir={out}", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert expected in lines[0], lines[0]
    assert proc.stdout == "" and not out.exists()
