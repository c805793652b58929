"""``report.html``: a sweep as one self-contained page to look at.

Written beside every sweep's table (:class:`lantern.cli.sweep.SweepTable`) and by ``make_tables --report``.
The page holds the table (the rows of ``table.md``, sortable by a click on a column's head), the plots
(Pareto, tau and speed-up against realised TV, accepted-length histograms), a qualitative grid (rows: the
first ``prompts`` images or the named ones; columns: the table's methods in order; each image captioned
with its own tau and latency) with an acceptance map under each image (its token grid coloured by the
length of the run that emitted each token, from the ``token_steps`` its ``tokens/`` file keeps), and each
run's provenance. Plots and maps are embedded as PNG data; the generated images are linked relative to the
page, so the page opens from disk with no server, network, script or style from elsewhere.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lantern.decoding.stats import run_lengths
from lantern.errors import ConfigError
from lantern.files import image_name, write_bytes_atomic
from lantern.results import batch_sweep, report_plots
from lantern.results.images import ImageStore
from lantern.results.record import RunRecord
from lantern.results.render import frame, notes, shown
from lantern.results.tables import Table, build_table

REPORT_NAME = "report.html"
SORT_JS = """
for (const table of document.querySelectorAll("table.sortable")) {
  table.querySelectorAll("th").forEach((head, column) => head.addEventListener("click", () => {
    const body = table.tBodies[0], rows = Array.from(body.rows);
    const up = head.dataset.order !== "up"; head.dataset.order = up ? "up" : "down";
    const key = (row) => { const text = row.cells[column].textContent.trim(), n = parseFloat(text);
      return Number.isNaN(n) ? text : n; };
    rows.sort((a, b) => { const x = key(a), y = key(b);
      const order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === "number" ? -1 : 1);
      return up ? order : -order; });
    rows.forEach((row) => body.appendChild(row));
  }));
}
"""
STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin-bottom: 1em; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
table.sortable th { cursor: pointer; background: #eef; }
td.cell { text-align: center; font-size: 11px; }
img.sample { width: 128px; image-rendering: pixelated; display: block; margin: auto; }
img.plot { max-width: 720px; display: block; }
img.map { width: 128px; image-rendering: pixelated; display: block; margin: 2px auto; }
.notes { font-size: 12px; color: #555; }
"""


@dataclass
class Cell:
    """One image of one method: where its PNG is, its own tau and latency, and its tokens' run lengths."""

    method: str
    index: int
    image: Path | None
    tau: float | None
    latency_s: float | None
    lengths: torch.Tensor | None  # (N,) run length of the step that emitted each token; None: not recorded
    skipped: torch.Tensor | None = None  # (N,) committed without a target forward (VVS)

    def caption(self) -> str:
        tau = "-" if self.tau is None else f"{self.tau:.2f}"
        latency = "-" if self.latency_s is None else f"{1000 * self.latency_s:.0f} ms"
        return f"tau {tau} · {latency}"


@dataclass
class ReportData:
    """What the page and the tracker show beyond the table: the grid (rows: prompts) and the histograms."""

    methods: list[str]
    prompts: list[int]
    captions: list[str]  # each grid row's prompt
    cells: list[list[Cell]]  # (prompts, methods)
    histograms: dict[str, list[int]] = field(default_factory=dict)
    longest: int = 1  # the longest run on any map (one colour scale for all)


MAX_GRID = 10_000  # the grid's rows at most: each row is every method's image on one page


def parse_prompts(value, key: str = "report.prompts") -> int | list[int]:
    """``report.prompts``: a count (the first N images) or image indices (a list, or text ``3,5,7``);
    ConfigError otherwise."""
    if isinstance(value, str):
        text = value.strip().strip("[]")
        value = [v for v in text.split(",")] if "," in text else text
    try:
        if isinstance(value, (list, tuple)):
            chosen = [int(v) for v in value]
            if chosen and min(chosen) >= 0 and len(chosen) <= MAX_GRID:
                return chosen
        elif not isinstance(value, bool) and 0 <= int(value) <= MAX_GRID and float(value) == int(value):
            return int(value)
    except (TypeError, ValueError):
        pass
    raise ConfigError(
        f"{key}={value!r}: expected a count in [0, {MAX_GRID}] or at most {MAX_GRID} image indices >= 0 (e.g. [0,3,7])"
    )


def chosen_prompts(prompts: int | Sequence[int], available: int) -> list[int]:
    """The grid's image indices: the first ``prompts`` images, or the named ones that exist."""
    if isinstance(prompts, int):
        return list(range(min(prompts, available)))
    return [int(i) for i in prompts if 0 <= int(i) < available]


def _cell(record: RunRecord, method: str, index: int) -> Cell:
    folder = Path(record.run_dir)
    row = next((r for r in record.per_image if r.get("index") == index), {})
    lengths = skipped = None
    store = ImageStore(folder)
    if store.tokens_path(index).is_file():
        stored = store.load(index)["per_sample"]
        lengths = None if stored.get("token_steps") is None else run_lengths(stored["token_steps"])
        skipped = stored.get("token_skipped")
    image = folder / image_name(index)
    return Cell(
        method=method,
        index=index,
        image=image if image.is_file() else None,
        tau=row.get("mean_accepted_length"),
        latency_s=row.get("latency_s"),
        lengths=lengths,
        skipped=skipped,
    )


def collect(table: Table, records: list[RunRecord], prompts: int | Sequence[int] = 8) -> ReportData:
    """The grid of the table's rows (each row's run) over the chosen prompts, and each row's histogram."""
    by_dir = {record.run_dir: record for record in records}
    rows = [(row["method"], by_dir[row["run"]]) for row in table.rows if row.get("run") in by_dir]
    available = min((record.num_images for _, record in rows), default=0)
    indices = chosen_prompts(prompts, available)
    cells = [[_cell(record, method, index) for method, record in rows] for index in indices]
    first = rows[0][1] if rows else None
    texts = (first.get("distinct_prompts") or []) if first else []
    ids = {r.get("index"): r.get("prompt_id") for r in first.per_image} if first else {}
    captions = []
    for index in indices:
        text = texts[ids[index]] if ids.get(index) is not None and ids[index] < len(texts) else None
        captions.append(
            f"#{index}"
            + (f": {str(text.get('text', text) if isinstance(text, dict) else text)[:80]}" if text is not None else "")
        )
    longest = max((int(c.lengths.max()) for row in cells for c in row if c.lengths is not None), default=1)
    histograms = {method: list(record.get("acceptance_histogram") or []) for method, record in rows}
    return ReportData([m for m, _ in rows], indices, captions, cells, histograms, longest)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _table_html(table: Table, root: Path, failed: list[dict] | None) -> str:
    data = shown(table, root)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in data.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
        for row in data.itertuples(index=False)
    )
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in notes(table, failed, root))
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table><ul class="notes">{lines}</ul>'


def map_counts(lengths: torch.Tensor) -> dict[int, int]:
    """Tokens per run length on a map (token 0, the prefill's, counted under 0)."""
    counts = {0: 1}
    for value, number in zip(*torch.unique(lengths[1:], return_counts=True), strict=True):
        counts[int(value)] = int(number)
    return counts


def _grid_html(data: ReportData, root: Path) -> str:
    head = "<th>prompt</th>" + "".join(f"<th>{html.escape(m)}</th>" for m in data.methods)
    rows = []
    for caption, cells in zip(data.captions, data.cells, strict=True):
        tds = [f"<td>{html.escape(caption)}</td>"]
        for cell in cells:
            parts = []
            if cell.image is not None:
                link = Path(os.path.relpath(cell.image, root)).as_posix()
                parts.append(f'<img class="sample" src="{html.escape(link)}" alt="image {cell.index}">')
            parts.append(f"<div>{html.escape(cell.caption())}</div>")
            if cell.lengths is not None:
                png = report_plots.png_bytes_of(report_plots.map_image(cell.lengths, data.longest, cell.skipped))
                counts = ",".join(f"{k}:{v}" for k, v in map_counts(cell.lengths).items())
                parts.append(
                    f'<img class="map" src="{_data_uri(png)}" data-tokens="{cell.lengths.numel()}" '
                    f'data-counts="{counts}" alt="acceptance map {cell.index}">'
                )
            tds.append(f'<td class="cell">{"".join(parts)}</td>')
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f'<table class="grid"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _provenance_html(table: Table, records: list[RunRecord], root: Path, command: str | None) -> str:
    by_dir = {record.run_dir: record for record in records}
    items = [f"<li>command: <code>{html.escape(command)}</code></li>"] if command else []
    for row in table.rows:
        record = by_dir.get(row.get("run"))
        if record is None:
            continue
        env = record.environment
        commit = str(env.get("commit") or "-")[:12] + (" (dirty)" if env.get("dirty") else "")
        inputs = ", ".join(
            f"{Path(path).name} {str(entry.get('sha256'))[:12]}"
            for path, entry in sorted((record.inputs or {}).items())
        )
        protocol = record.protocol or "none"
        run = Path(os.path.relpath(record.run_dir, root)).as_posix()
        items.append(
            f"<li><b>{html.escape(row['method'])}</b> ({html.escape(run)}): commit {html.escape(commit)}, "
            f"machine {html.escape(str(env.get('device_name', '-')))}, protocol {html.escape(protocol)}, "
            f"inputs: {html.escape(inputs or '-')}</li>"
        )
    return f'<ul class="notes">{"".join(items)}</ul>'


def render_report(
    table: Table,
    records: list[RunRecord],
    root: Path,
    data: ReportData,
    command: str | None = None,
    failed: list[dict] | None = None,
) -> str:
    """The page's HTML: title, table, plots, grid with maps, provenance."""
    plots = [
        ("Quality against speed-up", report_plots.pareto_png(table)),
        ("tau and speed-up against realised TV", report_plots.tv_png(table)),
        ("Accepted-length histograms", report_plots.histogram_png(data.histograms)),
    ]
    if batch_sweep.is_batch_sweep(frame(table)):  # +experiment=batch_sweep
        plots.insert(0, ("Speed-up over AR against batch size", batch_sweep.batch_png(frame(table))))
    figures = "".join(
        f'<h3>{title}</h3><img class="plot" src="{_data_uri(png)}" alt="{title}">' for title, png in plots
    )
    legend = f'<img src="{_data_uri(report_plots.legend_png(data.longest))}" alt="map colour scale">'
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>lantern sweep report</title>"
        f"<style>{STYLE}</style></head><body>"
        f"<h1>Sweep report: {html.escape(root.name)}</h1>"
        f"<h2>Table</h2>{_table_html(table, root, failed)}"
        f"<h2>Plots</h2>{figures}"
        f"<h2>Images</h2><p class='notes'>Each image: its own tau and latency (its batch's decode time over the "
        f"batch); under it, its acceptance map.</p>{legend}{_grid_html(data, root)}"
        f"<h2>Provenance</h2>{_provenance_html(table, records, root, command)}"
        f"<script>{SORT_JS}</script></body></html>"
    )


def write_report(
    records: list[RunRecord],
    out_dir: str | os.PathLike,
    prompts: int | Sequence[int] = 8,
    latency: list[RunRecord] | None = None,
    notes_: list[str] | None = None,
    throughput: bool = True,
    command: str | None = None,
    failed: list[dict] | None = None,
) -> tuple[Path, ReportData]:
    """Write ``report.html`` into ``out_dir`` (atomically); return its path and the grid it shows."""
    out = Path(out_dir)
    table = build_table(records, latency, throughput)
    table.notes.extend(notes_ or [])
    data = collect(table, records, prompts)
    page = render_report(table, records, out, data, command, failed)
    out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out / REPORT_NAME, page.encode("utf-8"))
    return out / REPORT_NAME, data
