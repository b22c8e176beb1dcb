"""``report.html``: a standalone Bokeh page (scripts inline, opens offline) about runs.

Built from the run directory's files alone (``config.toml``,
``metrics.jsonl``, ``summary.json``, ``timeline.json``), so
``python -m dtrain report DIR [DIR...]`` rebuilds it any time and overlays
several runs.  It shows the training and validation loss and accuracy per
epoch, throughput, each step's time split into compute (the critical path
through the step's tasks) and overhead (the rest: messages, scheduling,
transfers, the driver), a per-worker timeline of the tasks, and each run's
config and summary.
"""
from __future__ import annotations

import html
import json
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bokeh.embed import file_html
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, FactorRange, HoverTool, TabPanel, Tabs
from bokeh.resources import INLINE

from dtrain.core import files, keys
from dtrain.core.errors import UserError
from dtrain.observe import figures
from dtrain.observe.console import split_lines

STEP_TYPES = (keys.FORWARD_BACKWARD, keys.REDUCE, keys.UPDATE)
SUMMARY_KEYS = ("dataset", "strategy", "workers", "shards", "fan_in", "epochs", "steps",
                "batch_size", "train_samples", "seconds", "samples_per_second",
                "final_train_loss", "final_train_accuracy", "final_val_accuracy", "test_loss",
                "test_accuracy", "work_split")


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


# --- numbers from the task records --------------------------------------------------------------

def _records(timeline: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not timeline:
        return []
    cols = timeline["columns"]
    return [dict(zip(cols, r)) for r in timeline["rows"]]


def step_times(timeline: dict[str, Any] | None) -> dict[str, list[float]]:
    """Per recorded step: wall time (from the previous step's end to this one's), compute on
    its critical path (slowest ``forward-backward`` + slowest ``reduce`` of each level +
    ``update``), and overhead (wall - compute), in milliseconds.  A step ends with its update,
    or, where every worker updates (``update-<step>-<shard>``, off the critical path), with
    its last gradient task."""
    fb: dict[int, float] = defaultdict(float)
    levels: dict[int, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    upd: dict[int, float] = defaultdict(float)
    end: dict[int, float] = {}
    begin: dict[int, float] = {}
    for r in _records(timeline):
        k = keys.parse(r["key"])
        if r["action"] != "compute" or k is None or k.kind not in STEP_TYPES or k.replicated:
            continue                                # (replicated updates: off the critical path)
        step, took = k.step, r["stop"] - r["start"]
        begin[step] = min(begin.get(step, r["start"]), r["start"])
        end[step] = max(end.get(step, r["stop"]), r["stop"])
        if k.kind == keys.FORWARD_BACKWARD:
            fb[step] = max(fb[step], took)
        elif k.kind == keys.REDUCE:
            levels[step][k.tree] = max(levels[step][k.tree], took)
        else:
            upd[step] = took
    out: dict[str, list[float]] = {"step": [], "wall": [], "compute": [], "overhead": []}
    for step in sorted(end):
        start = end[step - 1] if step - 1 in end else begin[step]
        compute = fb[step] + sum(levels[step].values()) + upd[step]
        wall = end[step] - start
        for name, value in (("step", step), ("wall", wall * 1e3), ("compute", compute * 1e3),
                            ("overhead", max(wall - compute, 0.0) * 1e3)):
            out[name].append(value)
    return out


def timeline_rows(timeline: dict[str, Any] | None) -> dict[str, list[Any]]:
    """Columns for the per-worker timeline: one bar per compute or transfer interval."""
    records = _records(timeline)
    names = (timeline or {}).get("workers", {})
    threads: dict[str, set] = defaultdict(set)
    for r in records:
        threads[r["worker"]].add(r["thread"])
    t0 = min((r["start"] for r in records), default=0.0)
    cols: dict[str, list[Any]] = defaultdict(list)
    for r in records:
        kind = keys.family(keys.kind_of(r["key"])) if r["action"] == "compute" else "transfer"
        lane = f"worker {names.get(r['worker'], r['worker'])}"
        if len(threads[r["worker"]]) > 1:
            lane += f" thread {sorted(threads[r['worker']]).index(r['thread'])}"
        cols["lane"].append(lane)
        cols["left"].append(r["start"] - t0)
        cols["right"].append(r["stop"] - t0)
        cols["ms"].append((r["stop"] - r["start"]) * 1e3)
        cols["key"].append(r["key"])
        cols["type"].append(kind or "other")
        cols["color"].append(figures.BUSY_COLORS.get(kind or "", keys.color(kind)))
        cols["height"].append(0.35 if kind == "transfer" else 0.8)
    return dict(cols)


# --- figures ------------------------------------------------------------------------------

def _epochs_source(run: RunData) -> ColumnDataSource:
    keys = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy",
            "samples_per_second")
    return ColumnDataSource({k: [m.get(k) if m.get(k) is not None else float("nan")
                                 for m in run.metrics] for k in keys})


def _step_figure(run: RunData) -> Any:
    times = step_times(run.timeline)
    if not times["step"]:
        return Div(text="<p><i>No task records for this run (serial runs have none): no "
                        "step-time split.</i></p>")
    fig = figures.new_figure("Step time: compute on the critical path vs overhead", "ms",
                             x_label="step", name="report-step-time")
    fig.vbar_stack(["compute", "overhead"], x="step", width=0.9, source=ColumnDataSource(times),
                   color=[keys.color(keys.FORWARD_BACKWARD), "#BBBBBB"],
                   legend_label=["compute", "overhead"])
    fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("wall", "@wall{0.00} ms"),
                                      ("compute", "@compute{0.00} ms"),
                                      ("overhead", "@overhead{0.00} ms")]))
    fig.add_layout(fig.legend[0], "right")
    return fig


def _timeline_figure(run: RunData) -> Any:
    rows = timeline_rows(run.timeline)
    if not rows:
        return Div(text="<p><i>No task records: no timeline.</i></p>")
    lanes = sorted(set(rows["lane"]), key=lambda s: [(0, int(p), "") if p.isdigit() else
                                                     (1, 0, p) for p in s.split()])
    kept, seen = len(run.timeline["rows"]), run.timeline.get("tasks_seen")
    note = f" (the last {kept} intervals of {seen} tasks)" if seen and kept >= \
        run.timeline.get("limit", kept + 1) else ""
    fig = figures.new_figure(f"Tasks per worker{note}", "", x_label="seconds",
                             y_range=FactorRange(*reversed(lanes)), name="report-timeline",
                             height=max(200, 60 * len(lanes) + 80))
    bars = fig.hbar(y="lane", left="left", right="right", height="height", color="color",
                    legend_field="type", source=ColumnDataSource(rows))
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("task", "@key"),
                                                        ("took", "@ms{0.000} ms")]))
    fig.add_layout(fig.legend[0], "right")
    return fig


def _summary_value(summary: dict[str, Any], key: str) -> Any:
    if key == "work_split":         # only worth a row where CPU and GPU workers mixed
        return "; ".join(line.removeprefix("work split: ")
                         for line in split_lines(summary)) or None
    return summary.get(key)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        text = f"{v:.6g}" if isinstance(v, float) else ("-" if v is None else str(v))
        return f"<td>{html.escape(text)}</td>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows)
    return f'<table style="border-collapse:collapse" border="1" cellpadding="4">' \
           f"<tr>{head}</tr>{body}</table>"


def _config_rows(runs: list[RunData]) -> list[list[Any]]:
    """Config keys; with several runs, only those that differ."""
    flat = [{f"{s}.{k}": v for s, sec in r.config.items() for k, v in sec.items()}
            for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    if len(runs) > 1:
        keys = [k for k in keys if len({json.dumps(f.get(k)) for f in flat}) > 1]
    return [[k, *(f.get(k) for f in flat)] for k in keys]


def build(runs: list[RunData]) -> Any:
    """The report's Bokeh layout for one run or an overlay of several."""
    loss = figures.new_figure("Loss", "loss", name="report-loss")
    acc = figures.new_figure("Accuracy", "accuracy", name="report-accuracy")
    rate = figures.new_figure("Throughput", "samples/s", name="report-rate")
    for i, run in enumerate(runs):
        c, label = figures.RUN_COLORS[i % len(figures.RUN_COLORS)], run.name if \
            len(runs) > 1 else ""
        source = _epochs_source(run)
        figures.add_loss(loss, source, c, label)
        figures.add_accuracy(acc, source, c, label)
        figures.add_rate(rate, source, "samples_per_second", c, label)
        test = (run.summary or {}).get("test_accuracy")
        if test is not None and run.metrics:
            acc.scatter([run.metrics[-1]["epoch"]], [test], marker="star", size=14, color=c,
                        legend_label=f"{label + ': ' if label else ''}test accuracy")
    names = ", ".join(html.escape(r.name) for r in runs)
    summary = _table(["", *(r.name for r in runs)],
                     [[k, *(_summary_value(r.summary or {}, k) for r in runs)]
                      for k in SUMMARY_KEYS])
    config = _table(["config key", *(r.name for r in runs)], _config_rows(runs))
    title = "config (keys that differ)" if len(runs) > 1 else "config"
    per_run = [column(_step_figure(r), _timeline_figure(r), sizing_mode="stretch_width")
               for r in runs]
    detail = per_run[0] if len(runs) == 1 else Tabs(
        tabs=[TabPanel(child=p, title=r.name) for p, r in zip(per_run, runs)],
        sizing_mode="stretch_width")
    return column(Div(text=f"<h1>dtrain report</h1><p>{names}</p>"),
                  row(loss, acc, sizing_mode="stretch_width"),
                  row(rate, Div(text=f"<h3>summary</h3>{summary}"),
                      sizing_mode="stretch_width"),
                  detail, Div(text=f"<h3>{title}</h3>{config}"), sizing_mode="stretch_width")


def write(runs: list[RunData], out: str | Path) -> Path:
    """Write the report of ``runs`` to ``out`` (standalone HTML) and return its path."""
    out = Path(out)
    page = file_html(build(runs), resources=INLINE,
                     title=f"dtrain report: {', '.join(r.name for r in runs)}")
    try:
        files.atomic_write(out, page.encode())
    except OSError as exc:
        raise UserError(f"cannot write the report to {out}: {exc.strerror}; pick another "
                        f"--out") from None
    return out
