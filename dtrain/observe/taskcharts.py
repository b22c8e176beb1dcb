"""The report's charts of a run's task records (``timeline.json``): step time, timeline, spans.

Each step's time split into compute (the critical path through the step's
tasks) and overhead (the rest: messages, scheduling, transfers, the driver),
on a y axis that a few slow steps do not flatten (:func:`robust_top`); a
per-worker timeline of the task intervals; and the tasks inside a sample of
windows as their chains ran them (:func:`spans_figure`).  Long series are thinned to what a
page can hold (every k-th step, the last intervals), and the chart says so.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, FixedTicker, HoverTool, Range1d, Title
from bokeh.plotting import figure

from dtrain.core import keys
from dtrain.observe import figures, spans as spanlib

STEP_TYPES = (keys.FORWARD_BACKWARD, keys.REDUCE, keys.UPDATE)
MAX_STEP_BARS = 600         # more steps than this: every k-th step's bar
MAX_INTERVALS = 1000        # more task intervals than this: the last ones
TOP_QUANTILE, TOP_HEADROOM = 0.95, 1.5    # the step chart's y range: 1.5 x the 95th percentile
OVERHEAD_COLOR = "#BBBBBB"


def _records(timeline: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not timeline or "rows" not in timeline:     # (a run's spans alone: no task records)
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


def robust_top(values: list[float]) -> float:
    """The end of a y range that shows ``values`` (>= 0) without letting a few spikes flatten
    the rest: :data:`TOP_HEADROOM` x their :data:`TOP_QUANTILE` quantile, or a little above
    the largest where none is that far out."""
    peak = max(values, default=0.0)
    top = TOP_HEADROOM * float(np.quantile(values, TOP_QUANTILE)) if values else 0.0
    return top if 0 < top < peak else (peak * 1.05 or 1.0)


def ordinal(n: int) -> str:
    """``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _round(values: list[float], digits: int) -> list[float]:
    return [round(v, digits) for v in values]


def _note(fig: figure, text: str) -> None:
    """A line under the figure's title saying how to read it (what was cut or thinned)."""
    fig.add_layout(Title(text=text, text_font_style="italic", text_font_size="11px",
                         text_color="#555555"), "above")


def step_figure(times: dict[str, list[float]], name: str = "report-step-time") -> figure:
    """Stacked bars of each step's compute and overhead (ms), from :func:`step_times`; the y
    axis ends at :func:`robust_top` of the step totals, steps above it marked at the top."""
    n = len(times["step"])
    total = [c + o for c, o in zip(times["compute"], times["overhead"])]     # (n,)
    top, every = robust_top(total), math.ceil(n / MAX_STEP_BARS)
    shown = {k: _round(v[::every], 3) for k, v in times.items()}
    fig = figures.new_figure("Step time: compute on the critical path vs overhead", "ms",
                             x_label="step", name=name, y_range=Range1d(0, top))
    bars = fig.vbar_stack(["compute", "overhead"], x="step", width=0.9 * every,
                          source=ColumnDataSource(shown),
                          color=[keys.color(keys.FORWARD_BACKWARD), OVERHEAD_COLOR],
                          legend_label=["compute", "overhead"])
    tips = [("step", "@step"), ("wall", "@wall{0.00} ms"), ("compute", "@compute{0.00} ms"),
            ("overhead", "@overhead{0.00} ms")]
    fig.add_tools(HoverTool(renderers=bars, tooltips=tips))
    notes = []
    if every > 1:
        notes.append(f"every {ordinal(every)} step of {n:,} shown")
    over = [i for i, t in enumerate(total) if t > top]
    if over:
        spikes = {k: _round([v[i] for i in over], 3) for k, v in times.items()}
        source = ColumnDataSource({**spikes, "y": [top * 0.97] * len(over)})
        marks = fig.scatter("step", "y", source=source, marker="inverted_triangle", size=10,
                            color="#D55E00", legend_label="above the axis (hover: its time)")
        fig.add_tools(HoverTool(renderers=[marks], tooltips=tips))
        notes.append(f"y axis cut at {top:,.1f} ms ({TOP_HEADROOM:g} × the "
                     f"{TOP_QUANTILE * 100:g}th percentile step); {len(over):,} slower step"
                     f"{'s' if len(over) > 1 else ''} marked at the top, up to "
                     f"{max(total):,.1f} ms")
    if notes:
        _note(fig, "; ".join(notes))
    figures.legend_outside(fig, ncols=3)
    return fig


def timeline_data(timeline: dict[str, Any] | None) -> tuple[list[str], dict[str, dict],
                                                              str]:
    """The timeline's lanes (a worker, or a worker's thread where it ran tasks on
    several), its bars by task family (columns ``lane`` (index), ``left``, ``right`` (s),
    ``ms``, ``key``), at most :data:`MAX_INTERVALS` of them (the last), and a note on what
    was left out ("" for nothing)."""
    records = sorted(_records(timeline), key=lambda r: r["start"])
    names = (timeline or {}).get("workers", {})
    run = (timeline or {}).get("run")
    threads: dict[str, set] = defaultdict(set)
    for r in records:
        threads[r["worker"]].add(r["thread"])

    def lane(r: dict[str, Any]) -> str:
        text = f"worker {names.get(r['worker'], r['worker'])}"
        if len(threads[r["worker"]]) > 1:
            text += f" thread {sorted(threads[r['worker']]).index(r['thread'])}"
        return text

    t0 = records[0]["start"] if records else 0.0
    kept = records[-MAX_INTERVALS:]
    lanes = sorted({lane(r) for r in kept}, key=lambda s: [
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in s.split()])
    bars: dict[str, dict[str, list]] = {}
    for r in kept:
        kind = keys.family(keys.kind_of(r["key"])) if r["action"] == "compute" else "transfer"
        cols = bars.setdefault(kind or "other",
                               {"lane": [], "left": [], "right": [], "ms": [], "key": []})
        cols["lane"].append(lanes.index(lane(r)))
        cols["left"].append(round(r["start"] - t0, 5))
        cols["right"].append(round(r["stop"] - t0, 5))
        cols["ms"].append(round((r["stop"] - r["start"]) * 1e3, 3))
        cols["key"].append(str(r["key"]).removesuffix(f"-{run}") if run else str(r["key"]))
    notes = []
    if len(kept) < len(records):
        notes.append(f"the last {len(kept):,} of {len(records):,} task intervals shown")
    seen = (timeline or {}).get("tasks_seen")
    if seen and len(records) >= (timeline or {}).get("limit", len(records) + 1):
        notes.append(f"timeline.json kept the last {len(records):,} intervals of {seen:,} "
                     f"tasks")
    return lanes, bars, "; ".join(notes)


def timeline_figure(timeline: dict[str, Any] | None,
                    name: str = "report-timeline") -> figure | None:
    """Per-worker bars of the task intervals, coloured by task family; None without
    records."""
    lanes, bars, note = timeline_data(timeline)
    if not lanes:
        return None
    fig = figures.new_figure("Tasks per worker", "", x_label="seconds since the first task",
                             y_range=Range1d(len(lanes) - 0.5, -0.5), name=name,
                             height=max(220, 55 * len(lanes) + 110))
    fig.yaxis.ticker = FixedTicker(ticks=list(range(len(lanes))))
    fig.yaxis.major_label_overrides = dict(enumerate(lanes))
    fig.ygrid.grid_line_color = None
    drawn = []
    order = {k: i for i, k in enumerate(figures.BUSY_PARTS)}
    for kind in sorted(bars, key=lambda k: (order.get(k, len(order)), k)):
        drawn.append(fig.hbar(y="lane", left="left", right="right",
                              height=0.35 if kind == "transfer" else 0.8,
                              color=figures.BUSY_COLORS.get(kind, keys.color(kind)),
                              legend_label=kind, source=ColumnDataSource(bars[kind])))
    fig.add_tools(HoverTool(renderers=drawn, tooltips=[
        ("task", "@key"), ("took", "@ms{0.000} ms"), ("from", "@left{0.00000} s")]))
    if note:
        _note(fig, note)
    figures.legend_outside(fig, ncols=len(drawn))
    return fig


MAX_SPAN_LANES = 48     # report.html's spans figure: at most this many rows (window, worker)


def spans_data(timeline: dict[str, Any] | None) -> tuple[list[str], dict[str, list], str]:
    """The sample of windows' spans ``timeline.json`` keeps (``spans``: see
    :class:`dtrain.observe.spans.Sample`) as one source: a lane per window and worker
    (``steps a-b, worker n``), each span's ``start`` and ``end`` in milliseconds since its
    window began; and a note on what the sample is ("" for nothing)."""
    record = (timeline or {}).get("spans")
    if not record or not record.get("windows"):
        return [], {}, ""
    names = (timeline or {}).get("workers", {})
    lanes: list[str] = []
    rows: list[tuple[str, str, float, float, str]] = []
    shown = 0
    for window in record["windows"]:
        if not window:
            continue
        steps = [k.step for k in map(keys.parse, (r[4] for r in window))
                 if k is not None and k.kind in keys.WORK and k.step is not None]
        what = f"steps {min(steps)}-{max(steps)}" if steps else f"window {shown + 1}"
        if any(lane.startswith(f"{what}, ") for lane in lanes):      # (the same steps again)
            what = f"{what} (window {shown + 1})"
        t0 = min(r[2] for r in window)
        workers = list(dict.fromkeys(r[0] for r in window))
        if lanes and len(lanes) + len(workers) > MAX_SPAN_LANES:
            break
        shown += 1
        for worker, kind, a, b, key in window:
            lane = f"{what}, worker {names.get(worker, worker) or 'driver'}"
            if lane not in lanes:
                lanes.append(lane)
            rows.append((lane, kind, a - t0, b - t0, key))
    cols = spanlib.columns(rows)
    seen, every = record.get("windows_seen", shown), record.get("every", 1)
    note = (f"{shown} of the run's {seen:,} windows" +
            (f" (every {ordinal(every)})" if every > 1 else "") +
            "; of a long window, a sample of its steps")
    return lanes, cols, note


def spans_figure(timeline: dict[str, Any] | None,
                 name: str = "report-spans") -> figure | None:
    """The tasks inside a sample of the run's windows, as each worker's chain ran them (the
    ``/dtrain`` page's stream of spans); None where the run kept none."""
    lanes, cols, note = spans_data(timeline)
    if not lanes:
        return None
    fig = figures.new_figure("Inside the windows: a sample", "",
                             x_label="milliseconds since the window's start",
                             y_range=FactorRange(*reversed(lanes)), name=name,
                             height=max(220, 28 * len(lanes) + 110))
    figures.add_spans(fig, ColumnDataSource(cols))
    _note(fig, note)
    return fig
