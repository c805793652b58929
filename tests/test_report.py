"""The sweep's report: per-token step indices of every decoder, the page beside the table, and how it looks."""

import base64
import html
import io
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO
from PIL import Image

from lantern.decoding.stats import run_lengths
from lantern.errors import ConfigError
from lantern.results import report_plots
from lantern.results.report import REPORT_NAME, parse_prompts, write_report
from lantern.results.tables import load_records
from lantern.run.tracking import WandbLogger

DECODERS = {
    "ar": ["decoding=ar"],
    "eagle": ["decoding=eagle"],
    "lantern": ["decoding=lantern"],
    "sjd": ["decoding=sjd"],
    "gsd": ["decoding=gsd"],
    "sjd_pp": ["decoding=sjd_pp"],
    "zipar": ["decoding=zipar", "window=4"],
    "vvs": ["decoding=vvs"],
}


def world_decode(overrides):
    from hydra.utils import instantiate

    from lantern.run.compose import ModelParts, build_decoder, compose_config

    cfg = compose_config(["device=cpu", "dtype=float32", *overrides])
    parts = ModelParts(cfg.model)
    bundle = parts.bundle
    prompts = instantiate(cfg.prompts).items
    result = build_decoder(cfg.decoding, parts).generate(
        bundle.target, bundle.conditioner.encode(prompts[:2]), torch.tensor([3, 4])
    )
    return result, bundle.target.config


@pytest.mark.parametrize("name", list(DECODERS))
def test_every_token_names_the_step_that_emitted_it(name):
    result, cfg = world_decode(DECODERS[name])
    stats = result.per_sample
    steps = stats.token_steps.long()  # (B, N)
    assert steps.shape == result.codes.shape and (steps[:, 0] == 0).all()  # token 0: the prefill
    side = cfg.grid_size
    if name == "zipar":  # emitted row by row in parallel: in order along each grid row, rows start later and later
        rows = steps.view(steps.shape[0], -1, side)
        assert (rows[:, :, 1:] >= rows[:, :, :-1]).all()
        assert (rows[:, 1:, 0] > rows[:, :-1, 0]).all()
        assert (steps.amax(1) < steps.shape[1] - 1).all()  # fewer steps than raster AR
    else:  # raster order: a step's tokens follow the previous step's
        assert (steps[:, 1:] >= steps[:, :-1]).all()
    distinct = torch.tensor([len(set(row[1:].tolist())) for row in steps])
    # VVS numbers its skip steps too: they emit tokens without a target forward, so the distinct steps are
    # the target-forward steps plus the skip steps that committed this image's tokens.
    expected = stats.steps + (stats.skip_steps if name == "vvs" else 0)
    assert distinct.tolist() == expected.tolist()
    if name == "vvs":  # the tokens skip steps committed unverified, each image's count
        assert stats.token_skipped.sum(1).tolist() == stats.skipped_tokens.tolist() and stats.skipped_tokens.sum() > 0
    lengths = run_lengths(steps)
    assert (lengths[:, 1:] >= 1).all() and (lengths[:, 1:] <= steps.shape[1] - 1).all()
    if name == "ar":
        assert (lengths[:, 1:] == 1).all()
    if "histogram" in stats and name != "vvs":  # a step that accepted a drafts emitted a run of a + 1 tokens
        for row, histogram in zip(steps, stats.histogram, strict=True):
            runs = torch.bincount(torch.bincount(row[1:])[1:], minlength=histogram.numel() + 1)[1:]
            # the same steps; only the last may have emitted fewer (its tokens past the image are cut)
            assert runs.sum() == histogram.sum() and (runs - histogram).abs().sum() <= 2


# ----- the page beside a sweep's table ----------------------------------------------------------------------


class Page(HTMLParser):
    """The page's images (src and attributes) and the grid's cells."""

    def __init__(self):
        super().__init__()
        self.images, self.cells, self.scripts = [], 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        if tag == "td" and attrs.get("class") == "cell":
            self.cells += 1
        if tag in ("script", "link") and (attrs.get("src") or attrs.get("href")):
            self.scripts.append(attrs)


@pytest.fixture(scope="module")
def world_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("report") / "sweep"
    proc = subprocess.run(
        [
            sys.executable, "run.py", "-m", "decoding=ar,eagle,lantern", "num_images=2", "warmup=0",
            "speedup_baseline=null", "wandb.mode=disabled", f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sweep


def test_a_sweep_writes_a_report_whose_images_exist_and_whose_maps_cover_every_token(world_sweep):
    page = (world_sweep / REPORT_NAME).read_text()
    parsed = Page()
    parsed.feed(page)
    assert not parsed.scripts and "http://" not in page and "https://" not in page  # nothing from elsewhere
    linked = [img["src"] for img in parsed.images if not img["src"].startswith("data:")]
    assert linked and all((world_sweep / src).is_file() for src in linked)
    assert parsed.cells == 2 * 3  # prompts x methods
    table = json.loads((world_sweep / "table.json").read_text())
    for row in table["rows"]:
        assert html.escape(row["method"]) in page
    maps = [img for img in parsed.images if img.get("class") == "map"]
    assert len(maps) == 6
    for img in maps:
        tokens = int(img["data-tokens"])
        counts = dict(pair.split(":") for pair in img["data-counts"].split(","))
        assert tokens == 64 and sum(int(v) for v in counts.values()) == tokens  # the world: 8 x 8 tokens
        picture = Image.open(io.BytesIO(base64.b64decode(img["src"].split(",", 1)[1])))
        assert picture.size == (8 * report_plots.CELL, 8 * report_plots.CELL)
    # AR emits one token per step: every token of its maps is on a run of length 1
    assert all(set(img["data-counts"].split(",")) == {"0:1", "1:63"} for img in maps[0::3])
    assert "commit" in page and "python run.py -m" in page and "decoding=ar,eagle,lantern" in page


def test_the_report_s_grid_and_histograms_are_logged_to_w_and_b(world_sweep, monkeypatch):
    import wandb

    seen = {}

    class FakeRun:
        def log(self, values):
            seen.update(values)

        def finish(self):
            pass

    monkeypatch.setattr(wandb, "init", lambda **kwargs: FakeRun())
    records = load_records([world_sweep])
    _, data = write_report(records, world_sweep / "again", prompts=[1])
    WandbLogger(mode="offline").log_table(world_sweep, [{"method": m} for m in data.methods], None, data)
    assert seen["images"].columns == ["prompt", *data.methods] and len(seen["images"].data) == 1
    assert all(isinstance(cell, wandb.Image) for cell in seen["images"].data[0][1:])
    assert len(seen["acceptance_maps"].data[0]) == 4 and "accepted_length" in seen


def test_report_prompts_must_be_a_count_or_indices():
    assert parse_prompts(8) == 8 and parse_prompts("3,5") == [3, 5] and parse_prompts([0, 2]) == [0, 2]
    for bad in ("many", -1, [1, -2], 2.5):
        with pytest.raises(ConfigError, match="report.prompts"):
            parse_prompts(bad)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(page: Path, png: Path, size: str = "1300,2600") -> subprocess.CompletedProcess:
    """Open ``page`` in headless Chromium and save a screenshot; its console messages go to stderr."""
    return subprocess.run(
        [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
            "--v=0", f"--window-size={size}", f"--screenshot={png}", page.resolve().as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow  # a browser start, ~5 s
@pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_report_opens_in_a_browser_with_no_console_error(world_sweep, tmp_path):
    shot = tmp_path / "report.png"
    proc = screenshot(world_sweep / REPORT_NAME, shot)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 20 and (pixels < 100).mean() > 0.02  # not blank: text, plots and images drawn
    # the sorting script runs: a page with a deliberate error in it is caught the same way
    broken = tmp_path / "broken.html"
    broken.write_text((world_sweep / REPORT_NAME).read_text().replace("</script>", "undefinedFunction();</script>"))
    proc = screenshot(broken, tmp_path / "broken.png")
    assert any("undefinedFunction" in line for line in proc.stderr.splitlines())


def test_make_tables_writes_the_report_elsewhere_with_links_that_resolve_and_refuses_bad_prompts(world_sweep, tmp_path):
    out = tmp_path / "tables"
    script = [sys.executable, "scripts/make_tables.py", str(world_sweep), "--out", str(out), "--report"]
    proc = subprocess.run([*script, "--report-prompts", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = Page()
    parsed.feed((out / REPORT_NAME).read_text())
    linked = [img["src"] for img in parsed.images if not img["src"].startswith("data:")]
    assert len(linked) == 3 and all((out / src).resolve().is_file() for src in linked)
    assert parsed.cells == 3  # one prompt x three methods
    bad = tmp_path / "bad"
    proc = subprocess.run(
        [*script[:4], str(bad), "--report", "--report-prompts", "x"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --report-prompts='x'") and not bad.exists()
