"""The ``/dtrain`` page of the Dask dashboard: a Bokeh server document on the scheduler.

:func:`install` adds it to the scheduler's own web server, next to
distributed's pages and in its navigation bar
(:func:`dtrain.core.internals.add_dashboard_page`); it reads the run logs of
the :class:`~dtrain.observe.live.DtrainPlugin` that installs it every
:data:`REFRESH_MS` (the header, the busy panel and the spans less often: each change is
drawn again in the browser, on cores the workers may share).  A failure leaves the
dashboard as it was (the training does not depend on the page).
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, FactorRange

from dtrain.core import internals
from dtrain.observe import figures, spans
from dtrain.observe.runlog import BUSY_WINDOW, SPAN_SECONDS, RunLog

ROUTE = "/dtrain"
REFRESH_MS = 2000          # each refresh is the browser's drawing, on cores the workers
                           # may share (tools/measure_page_cost.py)
STEP_COLUMNS = ("epoch", "step", "loss", "epoch_loss", "rate")
EPOCH_COLUMNS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy",
                 "samples_per_second")
SPANS_EVERY = 4.0        # seconds between two sendings of the spans (and of the busy panel)
                         # at least: the spans are the page's heaviest drawing, and show
                         # the last SPAN_SECONDS anyway
SPAN_LIMIT = 1_000      # spans the page holds at most (beyond: every k-th step's)
HEADER_EVERY = 10.0      # seconds between two updates of the header's line at least: a new
                         # text lays the whole page out again in the browser
POINTS = 1_000          # points a curve of the page holds at most (beyond: every k-th one):
                        # each refresh draws every point of a changed curve again
BUSY_NOTE = (f"<b>Inside the windows</b>: each worker's tasks as its window ran them, over the "
             f"last {SPAN_SECONDS:g} s of windows that ended (a window's spans arrive as it "
             "ends; of a long window, a sample of its steps), coloured as in the task stream; "
             "<i>send</i> and <i>recv-wait</i> are the messages between workers and the waits "
             f"for them. <b>Busy vs idle</b>: the share of the last {BUSY_WINDOW:g} s each "
             "worker spent in each kind of work, from the windows' own timings (a run whose "
             "steps are tasks of their own: from the scheduler's records of finished tasks, "
             "<i>transfer</i> their inputs); <i>idle</i> is the rest: between windows, waiting "
             "for the driver or the scheduler.")


# distributed's page template, plus a line for readers without JavaScript (and for curl).
TEMPLATE = """{% extends "simple.html" %}
{% block content %}
<noscript>dtrain live training page: training and validation loss and accuracy, samples/s
and per-worker busy vs idle time, drawn by Bokeh with JavaScript.</noscript>
{{ super() }}
{% endblock %}"""


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


class Thinned:
    """A growing series in a ``ColumnDataSource`` of at most ``limit`` rows: every row while
    they fit; then every second row held is dropped and from then on only every second new
    one is drawn, and so on (every ``every``-th row of the series, the first included)."""

    def __init__(self, source: ColumnDataSource, limit: int = POINTS):
        self.source, self.limit = source, limit
        self.every = 1          # rows of the series a drawn row stands for
        self.seen = 0           # rows of the series so far

    def clear(self) -> None:
        self.source.data = {c: [] for c in self.source.data}
        self.every, self.seen = 1, 0

    def add(self, columns: dict[str, list[Any]]) -> None:
        """Append the series' next rows (``columns``: one list per column of the source)."""
        n = len(next(iter(columns.values())))
        first = -self.seen % self.every             # the first of them to draw
        self.seen += n
        new = {c: v[first::self.every] for c, v in columns.items()}
        count = len(next(iter(new.values())))
        if not count:
            return
        if len(next(iter(self.source.data.values()))) + count <= self.limit:
            self.source.stream(new)
            return
        data = {c: [*self.source.data[c], *new[c]] for c in new}
        while len(next(iter(data.values()))) > self.limit:
            data = {c: v[::2] for c, v in data.items()}
            self.every *= 2
        self.source.data = data


class LivePage:
    """The figures of the latest run, updated from the plugin's :class:`RunLog`."""

    def __init__(self, plugin: Any):
        self.plugin = plugin                 # the DtrainPlugin: latest(), worker_names(), nthreads()
        self.run: str | None = None
        self.steps_seen = self.epochs_seen = 0
        self.steps = ColumnDataSource({c: [] for c in STEP_COLUMNS}, name="dtrain-steps")
        self.epochs = ColumnDataSource({c: [] for c in EPOCH_COLUMNS}, name="dtrain-epochs")
        self.step_curve, self.epoch_curve = Thinned(self.steps), Thinned(self.epochs)
        self.busy = ColumnDataSource({"worker": [], **{p: [] for p in figures.BUSY_PARTS}},
                                     name="dtrain-busy")
        self.spans = ColumnDataSource({c: [] for c in spans.COLUMNS}, name="dtrain-spans")
        self.spans_seen = 0
        self.spans_drawn = 0.0               # when the spans were last sent (monotonic)
        self.header_drawn = -math.inf        # when the header last changed (monotonic)
        self.busy_drawn = -math.inf          # when the busy panel was last computed
        self.header = Div(text="<h2>dtrain</h2><p>waiting for a dtrain run on this cluster</p>",
                          sizing_mode="stretch_width", name="dtrain-header")
        loss = figures.new_figure("Loss", "loss", name="dtrain-loss")
        figures.add_loss(loss, self.epochs, figures.RUN_COLORS[0], steps=self.steps)
        acc = figures.new_figure("Accuracy", "accuracy", name="dtrain-accuracy")
        figures.add_accuracy(acc, self.epochs, figures.RUN_COLORS[1])
        rate = figures.new_figure("Training throughput", "samples/s", name="dtrain-rate")
        figures.add_rate(rate, self.steps, "rate", figures.RUN_COLORS[2])
        self.busy_fig = figures.new_figure(f"Worker busy vs idle (last {BUSY_WINDOW:g} s)",
                                           "worker", x_label="share of time",
                                           y_range=FactorRange(), name="dtrain-busy")
        self.busy_fig.hbar_stack(list(figures.BUSY_PARTS), y="worker", height=0.7,
                                 source=self.busy, legend_label=list(figures.BUSY_PARTS),
                                 color=[figures.BUSY_COLORS[p] for p in figures.BUSY_PARTS])
        self.busy_fig.legend.orientation = "horizontal"
        self.busy_fig.legend.label_text_font_size = "8pt"
        self.busy_fig.add_layout(self.busy_fig.legend[0], "below")
        self.spans_fig = figures.new_figure(
            f"Inside the windows (last {SPAN_SECONDS:g} s of spans)", "worker",
            x_label="time", x_axis_type="datetime", y_range=FactorRange(),
            name="dtrain-spans", height=120 + 40 * 2)
        figures.add_spans(self.spans_fig, self.spans)
        self.root = column(self.header, row(loss, acc, sizing_mode="stretch_width"),
                           row(rate, self.busy_fig, sizing_mode="stretch_width"),
                           self.spans_fig,
                           Div(text=BUSY_NOTE, sizing_mode="stretch_width"),
                           sizing_mode="stretch_width")

    def update(self, now: float | None = None) -> None:
        """Bring the figures up to date (``now``: the monotonic clock's reading, for tests)."""
        plugin = self.plugin
        log = plugin.latest()
        if log is None:
            return
        if log.run != self.run:                    # a new run: start the figures afresh
            self.run, self.steps_seen, self.epochs_seen, self.spans_seen = log.run, 0, 0, 0
            self.header_drawn = self.busy_drawn = -math.inf
            self.spans.data = {c: [] for c in spans.COLUMNS}
            self.step_curve.clear()
            self.epoch_curve.clear()
        per_epoch = log.meta.get("steps_per_epoch") or 1
        new = min(log.steps_seen - self.steps_seen, len(log.steps))
        if new > 0:
            rows = [log.steps[i] for i in range(len(log.steps) - new, len(log.steps))]
            self.step_curve.add({
                "epoch": [r["step"] / per_epoch for r in rows], "step": [r["step"] for r in rows],
                "loss": [r["loss"] for r in rows], "epoch_loss": [r["epoch_loss"] for r in rows],
                "rate": [_num(r["rate"]) for r in rows]})
            self.steps_seen = log.steps_seen
        new = min(log.epochs_seen - self.epochs_seen, len(log.epochs))
        if new > 0:
            rows = [log.epochs[i] for i in range(len(log.epochs) - new, len(log.epochs))]
            self.epoch_curve.add({c: [_num(r.get(c)) for r in rows] for c in EPOCH_COLUMNS})
            self.epochs_seen = log.epochs_seen
        now = time.monotonic() if now is None else now
        if log.finished or now - self.busy_drawn >= SPANS_EVERY:
            self.busy_drawn = now
            self._update_busy(plugin, log)
        due = log.finished or now - self.spans_drawn >= SPANS_EVERY
        if log.spans_seen != self.spans_seen and due:   # a window ended: its spans, the last s
            self.spans_seen, self.spans_drawn = log.spans_seen, now
            cols: dict[str, Any] = spans.columns(log.recent_spans(SPAN_SECONDS, SPAN_LIMIT),
                                                 plugin.worker_names())
            for name, kind in (("start", "f8"), ("end", "f8"), ("ms", "f4"), ("step", "i4"),
                               ("shard", "i4")):
                cols[name] = np.asarray(cols[name], dtype=kind)     # sent as binary
            lanes = sorted(set(cols["worker"]), key=lambda w: (len(w), w))
            self.spans.data = cols
            if list(self.spans_fig.y_range.factors) != lanes:   # (a change lays the page
                self.spans_fig.y_range.factors = lanes            # out again in the browser)
                self.spans_fig.height = 120 + 40 * max(len(lanes), 2)
        if log.finished or now - self.header_drawn >= HEADER_EVERY:
            text = self._header(log)
            if text != self.header.text:
                self.header.text, self.header_drawn = text, now

    def _update_busy(self, plugin: Any, log: RunLog) -> None:
        names = plugin.worker_names()
        shares = log.busy(time.time(), plugin.nthreads())
        order = sorted(shares, key=lambda a: (len(names.get(a, a)), names.get(a, a)))
        labels = [f"worker {names.get(a, a)}" for a in order]
        data = {"worker": labels, **{p: [round(shares[a].get(p, 0.0), 3) for a in order]
                                     for p in figures.BUSY_PARTS}}
        if data != self.busy.data:          # drawn again in the browser only when it moved
            self.busy.data = data
        if list(self.busy_fig.y_range.factors) != labels:
            self.busy_fig.y_range.factors = labels

    @staticmethod
    def _header(log: RunLog) -> str:
        m, last = log.meta, log.last_step
        total = m.get("steps_per_epoch", 0) * m.get("epochs", 0)
        step = last["step"] if last else 0
        status = "finished" if log.finished else "training"
        parts = [f"run <b>{log.run}</b>: {m.get('dataset', '?')}, {m.get('strategy', '?')} on "
                 f"{m.get('workers', '?')} worker(s), {status}",
                 *([f"layers {m['layers']}"] if m.get("layers") else []),
                 f"step {step}/{total}, epoch {last['epoch'] if last else 0}/{m.get('epochs', '?')}"]
        if last:
            parts.append(f"loss {last['epoch_loss']:.4f}")
            if last.get("epoch_accuracy") is not None:
                parts.append(f"train_acc {last['epoch_accuracy']:.4f}")
            if last["rate"] is not None:
                parts.append(f"{last['rate']:,.0f} samples/s")
        if log.epochs and log.epochs[-1].get("val_accuracy") is not None:
            ev = log.epochs[-1]
            parts.append(f"val_acc {ev['val_accuracy']:.4f} (epoch {ev.get('epoch', '?')})")
        return "<h2>dtrain</h2><p>" + " &middot; ".join(parts) + "</p>"


def dtrain_doc(plugin: Any, scheduler: Any, extra: dict[str, Any], doc: Any) -> None:
    """Bokeh document for ``/dtrain`` (after ``plugin``, the signature distributed's dashboard
    pages have)."""
    page = LivePage(plugin)
    page.update()
    doc.add_root(page.root)
    internals.style_dashboard_doc(doc, page, REFRESH_MS, "Dask: dtrain", TEMPLATE, extra)


def install(scheduler: Any, plugin: Any) -> bool:
    """Serve ``/dtrain`` from the scheduler's dashboard, from ``plugin``'s run logs; False
    where there is none."""
    if getattr(scheduler, "_dtrain_page", False):
        return True
    done = internals.add_dashboard_page(scheduler, ROUTE, functools.partial(dtrain_doc, plugin),
                                        "dtrain")
    scheduler._dtrain_page = done
    return done
