"""``report.html``: a standalone page (scripts inline, opens offline) about runs.

Built from the run directory's files alone (``config.toml``,
``metrics.jsonl``, ``summary.json``, ``timeline.json``), so
``python -m dtrain report DIR [DIR...]`` rebuilds it any time and overlays
several runs.  It shows the training and validation loss and accuracy per
epoch, throughput, each run's summary, step-time split, per-worker timeline
and the tasks inside a sample of windows (:mod:`~dtrain.observe.taskcharts`),
each worker's time by kind, how its work was split over the workers, and its
config.  The page (:mod:`~dtrain.observe.htmlpage`) stays small: long series
are thinned and say so, BokehJS and the figures go in deflated.
"""
from __future__ import annotations

import html
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bokeh.model import Model
from bokeh.models import ColumnDataSource

from dtrain.core import files
from dtrain.core.errors import UserError
from dtrain.observe import figures, htmlpage, spans as spanlib
from dtrain.observe.taskcharts import (ordinal, spans_figure, step_figure, step_times,
                                       timeline_figure)

__all__ = ["RunData", "build", "step_times", "write"]

SUMMARY_KEYS = ("dataset", "strategy", "workers", "shards", "fan_in", "epochs", "steps",
                "batch_size", "train_samples", "seconds", "samples_per_second",
                "final_train_loss", "final_train_accuracy", "final_val_accuracy", "test_loss",
                "test_accuracy")
EPOCH_COLUMNS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy",
                 "samples_per_second")
FIGURE_HEIGHT, LEGEND_ROW = 300, 22     # px: the epoch figures, and each further legend row
MAX_EPOCH_POINTS = 500      # more epochs than this: every k-th epoch's point (and the last)


@dataclass
class RunData:
    """What a report needs from one run directory."""

    name: str
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    timeline: dict[str, Any] | None

    @classmethod
    def read(cls, path: str | Path, *, summary: dict[str, Any] | None = None,
             timeline: dict[str, Any] | None = None) -> RunData:
        """Read a run directory; ``summary``/``timeline`` given in memory win over the files."""
        path = Path(path)
        if not (path / "metrics.jsonl").is_file() or not (path / "config.toml").is_file():
            raise UserError(f"{path} is not a dtrain run directory (it needs config.toml and "
                            f"metrics.jsonl); pass a directory written by python -m dtrain")

        def load(name: str) -> Any:
            file = path / name
            return json.loads(file.read_text()) if file.is_file() else None

        try:
            config = tomllib.loads((path / "config.toml").read_text())
            metrics = [json.loads(line) for line in
                       (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
            summary = summary if summary is not None else load("summary.json")
            timeline = timeline if timeline is not None else load("timeline.json")
        except (ValueError, OSError) as exc:
            raise UserError(f"cannot read the run directory {path}: {exc}") from None
        return cls(path.resolve().name, config, metrics, summary, timeline)


# --- figures ------------------------------------------------------------------------------

def _num(value: Any) -> float:
    return float("nan") if value is None else float(f"{value:.6g}")


def _epochs_source(run: RunData) -> tuple[ColumnDataSource, int]:
    """The epoch rows (every k-th and the last where there are many) and k."""
    every = math.ceil(len(run.metrics) / MAX_EPOCH_POINTS) or 1
    rows = run.metrics[::every]
    if every > 1 and rows[-1] is not run.metrics[-1]:
        rows.append(run.metrics[-1])
    return ColumnDataSource({k: [_num(m.get(k)) for m in rows] for k in EPOCH_COLUMNS}), every


def _cell(v: Any) -> str:
    if isinstance(v, bool) or v is None or not isinstance(v, int | float):
        return f"<td>{html.escape('-' if v is None else str(v))}</td>"
    text = f"{v:,}" if isinstance(v, int) else f"{v:.6g}"
    return f'<td class="num">{text}</td>'


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in r) + "</tr>" for r in rows)
    return f'<table class="kv"><tr>{head}</tr>{body}</table>'


def _config_rows(runs: list[RunData]) -> list[list[Any]]:
    """Config keys; with several runs, only those that differ."""
    flat = [{f"{s}.{k}": v for s, sec in r.config.items() for k, v in sec.items()}
            for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    if len(runs) > 1:
        keys = [k for k in keys if len({json.dumps(f.get(k)) for f in flat}) > 1]
    return [[k, *(json.dumps(f.get(k)) if isinstance(f.get(k), list) else f.get(k)
                  for f in flat)] for k in keys]


def work_split_table(summary: dict[str, Any] | None) -> str:
    """Per worker: its device, the shards it computed, their samples, the samples/s measured
    (runs that mixed CPU and GPU workers) and its peak memory; a note where there were no
    workers."""
    split = (summary or {}).get("work_split") or {}
    if not split:
        return '<p class="note">No work split: the run had no Dask workers.</p>'
    rss = summary.get("worker_peak_rss_mb") or {}
    names = sorted(split, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))
    shards = "shards" if any(split[n].get("samples") is not None for n in names) else "leaves"
    cols = [("device", "device"), ("leaves", shards), ("samples", "samples"),
            ("samples_per_second", "samples/s measured")]
    cols = [(k, t) for k, t in cols if any(split[n].get(k) is not None for n in names)]
    header = ["worker", *(t for _, t in cols)] + (["peak memory (MB)"] if rss else [])
    rows = [[n, *(split[n].get(k) for k, _ in cols)] + ([rss.get(n)] if rss else [])
            for n in names]
    return _table(header, rows)


def build(runs: list[RunData]) -> tuple[str, dict[str, Model]]:
    """The report's body (HTML, with ``<!--root:NAME-->`` where a figure goes) and its
    figures by name, for one run or an overlay of several."""
    loss = figures.new_figure("Loss", "loss", name="report-loss", height=FIGURE_HEIGHT)
    acc = figures.new_figure("Accuracy", "accuracy", name="report-accuracy", height=FIGURE_HEIGHT)
    rate = figures.new_figure("Throughput", "samples/s", name="report-rate", height=FIGURE_HEIGHT)
    notes = []
    for i, run in enumerate(runs):
        c, label = figures.RUN_COLORS[i % len(figures.RUN_COLORS)], run.name if \
            len(runs) > 1 else ""
        source, every = _epochs_source(run)
        if every > 1:
            notes.append(f"{html.escape(run.name)}: every {ordinal(every)} epoch of "
                         f"{len(run.metrics):,} shown (and the last)")
        figures.add_loss(loss, source, c, label)
        figures.add_accuracy(acc, source, c, label)
        figures.add_rate(rate, source, "samples_per_second", c, label)
        test = (run.summary or {}).get("test_accuracy")
        if test is not None and run.metrics:
            acc.scatter([run.metrics[-1]["epoch"]], [test], marker="star", size=14, color=c,
                        legend_label=f"{label + ': ' if label else ''}test accuracy")
            figures.legend_outside(acc)
    rows = max(figures.legend_rows(f) for f in (loss, acc, rate))
    for fig in (loss, acc, rate):             # the same size, whatever their legends hold
        fig.height = FIGURE_HEIGHT + LEGEND_ROW * max(rows - 1, 0)
    roots: dict[str, Model] = {"loss": loss, "accuracy": acc, "rate": rate}
    summary = _table(["", *(r.name for r in runs)],
                     [[k, *((r.summary or {}).get(k) for r in runs)] for k in SUMMARY_KEYS])
    parts = ["<h1>dtrain report</h1>",
             f'<p class="note">{", ".join(html.escape(r.name) for r in runs)}</p>',
             *(f'<p class="note">{n}</p>' for n in notes),
             '<div class="grid"><div><!--root:loss--></div><div><!--root:accuracy--></div>',
             f'<div><!--root:rate--></div><div><h3>summary</h3>{summary}</div></div>']
    for i, run in enumerate(runs):
        if len(runs) > 1:
            parts.append(f"<h2>{html.escape(run.name)}</h2>")
        times = step_times(run.timeline)
        if times["step"]:
            roots[f"step-{i}"] = step_figure(times)
            parts.append(f'<div class="wide"><!--root:step-{i}--></div>')
        else:
            parts.append('<p class="note"><i>No task record of each step for this run (serial '
                         'runs have none, and a window run as one task per worker records '
                         'only that task: graph.fuse_steps = false records every step): no '
                         'step-time split' + ('; the tasks inside a sample of windows are '
                                              'drawn below' if (run.timeline or {}).get(
                                                  "spans") else '') + '.</i></p>')
        timeline = timeline_figure(run.timeline)
        if timeline is not None:
            roots[f"timeline-{i}"] = timeline
            parts.append(f'<div class="wide"><!--root:timeline-{i}--></div>')
        inside = spans_figure(run.timeline, name=f"report-spans-{i}")
        if inside is not None:
            roots[f"spans-{i}"] = inside
            parts.append(f'<div class="wide"><!--root:spans-{i}--></div>')
        shares = (run.summary or {}).get("worker_time_shares") or {}
        if shares:
            kinds = [k for k in (*spanlib.KINDS, "idle")
                     if any(row.get(k) for row in shares.values())]
            parts.append("<h3>time by kind, per worker (windows' own timings)</h3>" +
                         _table(["worker", *kinds],
                                [[w, *(row.get(k) for k in kinds)]
                                 for w, row in shares.items()]))
        parts.append(f"<h3>work split</h3>{work_split_table(run.summary)}")
    title = "config (keys that differ)" if len(runs) > 1 else "config"
    config = _table(["config key", *(r.name for r in runs)], _config_rows(runs))
    parts.append(f"<h3>{title}</h3>{config}")
    return "\n".join(parts), roots


def write(runs: list[RunData], out: str | Path) -> Path:
    """Write the report of ``runs`` to ``out`` (standalone HTML) and return its path."""
    out = Path(out)
    body, roots = build(runs)
    page = htmlpage.page(f"dtrain report: {', '.join(r.name for r in runs)}", body, roots)
    try:
        files.atomic_write(out, page.encode())
    except OSError as exc:
        raise UserError(f"cannot write the report to {out}: {exc.strerror}; pick another "
                        f"--out") from None
    return out
