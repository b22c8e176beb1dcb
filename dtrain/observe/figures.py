"""Bokeh figures shared by the live ``/dtrain`` page and ``report.html``.

Curves are drawn against the epoch (fractional for per-step points), so the
page (step events) and the report (epoch rows) read the same way.  Sources
hold the columns of ``metrics.jsonl`` (``epoch``, ``train_loss``,
``train_accuracy``, ``val_loss``, ``val_accuracy``, ``samples_per_second``)
and, for steps, ``epoch`` (fractional), ``loss`` and ``rate``.  In both the
loss and the accuracy figure a run's training curve is solid and its
validation curve dashed, in the same colour.  Legends sit below the plot
frame (:func:`legend_outside`), never on the data.
"""
from __future__ import annotations

import math
from typing import Any

from bokeh.models import ColumnDataSource, HoverTool, Legend, NumeralTickFormatter
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from dtrain.core.keys import COLORS
from dtrain.observe.spans import COLORS as SPAN_COLORS

RUN_COLORS = Category10_10
TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
BUSY_PARTS = ("forward-backward", "reduce", "update", "evaluate", "load", "transfer", "send",
              "recv-wait", "other", "idle")
BUSY_COLORS = {**COLORS, **SPAN_COLORS, "load": COLORS["load-shard"], "transfer": "#F0E442",
               "idle": "#EEEEEE"}


def new_figure(title: str, y_label: str, *, x_label: str = "epoch", name: str | None = None,
               **kwargs: Any) -> figure:
    """A figure in dtrain's style: stretches to the page width, pan/zoom tools above it."""
    fig = figure(title=title, x_axis_label=x_label, y_axis_label=y_label, tools=TOOLS,
                 height=kwargs.pop("height", 280), sizing_mode="stretch_width", name=name,
                 toolbar_location="above", **kwargs)
    fig.toolbar.logo = None
    return fig


def legend_outside(fig: figure, where: str = "below", ncols: int = 3) -> None:
    """Move ``fig``'s legend out of the plot frame (``where``: ``"below"`` or ``"right"``);
    below, its items run in rows of at most ``ncols``.  Idempotent: call it again after
    adding items."""
    for legend in [m for m in fig.center if isinstance(m, Legend)]:
        fig.center.remove(legend)
        fig.add_layout(legend, where)
    for legend in fig.below:
        if isinstance(legend, Legend):
            legend.orientation = "horizontal"
            legend.ncols = max(1, min(ncols, len(legend.items)))
            legend.padding, legend.margin, legend.spacing = 4, 4, 12
            legend.border_line_alpha = 0


def legend_rows(fig: figure) -> int:
    """How many rows of items the legends below ``fig`` take."""
    return sum(math.ceil(len(m.items) / (m.ncols if isinstance(m.ncols, int) else len(m.items)))
               for m in fig.below if isinstance(m, Legend) and m.items)


def _hover(fig: figure, renderers: list, y: str, fmt: str = "{0.0000}") -> None:
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[
        ("epoch", "@epoch{0.00}"), (y, f"@{y}{fmt}")]))


def add_loss(fig: figure, epochs: ColumnDataSource, color: str, label: str = "",
             steps: ColumnDataSource | None = None) -> None:
    """Training (solid) and validation (dashed) loss per epoch, plus minibatch losses."""
    prefix = f"{label}: " if label else ""
    if steps is not None:
        fig.line("epoch", "loss", source=steps, color=color, alpha=0.35,
                 legend_label=f"{prefix}minibatch loss")
    train = fig.line("epoch", "train_loss", source=epochs, color=color, line_width=2,
                     legend_label=f"{prefix}train loss")
    val = fig.line("epoch", "val_loss", source=epochs, color=color, line_width=2,
                   line_dash="dashed", legend_label=f"{prefix}validation loss")
    _hover(fig, [train], "train_loss")
    _hover(fig, [val], "val_loss")
    fig.legend.click_policy = "hide"
    legend_outside(fig)


def add_accuracy(fig: figure, epochs: ColumnDataSource, color: str, label: str = "") -> None:
    """The epoch's running training accuracy over its minibatches (solid) and the
    validation accuracy after it (dashed, with markers), as :func:`add_loss` draws losses."""
    prefix = f"{label}: " if label else ""
    train = fig.line("epoch", "train_accuracy", source=epochs, color=color, line_width=2,
                     legend_label=f"{prefix}train accuracy")
    val = fig.line("epoch", "val_accuracy", source=epochs, color=color, line_width=2,
                   line_dash="dashed", legend_label=f"{prefix}validation accuracy")
    fig.scatter("epoch", "val_accuracy", source=epochs, color=color, size=4)
    _hover(fig, [train], "train_accuracy")
    _hover(fig, [val], "val_accuracy")
    fig.legend.click_policy = "hide"
    legend_outside(fig)


def add_rate(fig: figure, source: ColumnDataSource, y: str, color: str,
             label: str = "") -> None:
    """Training samples per second (``y`` names the column); a legend only for a labelled
    run (the axis says what a lone curve is)."""
    line = fig.line("epoch", y, source=source, color=color, line_width=2,
                    **({"legend_label": label} if label else {}))
    _hover(fig, [line], y, "{0,0}")
    fig.yaxis.formatter = NumeralTickFormatter(format="0,0")
    legend_outside(fig)


def add_spans(fig: figure, source: ColumnDataSource) -> None:
    """The spans of ``source`` (columns of :func:`dtrain.observe.spans.columns`) as Dask's
    task stream draws tasks: a bar per span from ``start`` to ``end``, a row per ``worker``
    (``fig``'s y range a ``FactorRange``), coloured by kind; hovering names the task."""
    bars = fig.hbar(y="worker", left="start", right="end", height=0.8, color="color",
                    line_color=None, source=source)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("task", "@key"), ("kind", "@kind"), ("step", "@step"), ("shard", "@shard"),
        ("duration", "@ms{0.000} ms")]))
    fig.ygrid.grid_line_color = None
