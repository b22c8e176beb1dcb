"""The figures of docs/performance.md, drawn from results committed in ``benchmarks/``.

    python -m benchmarks.figures                    # every figure, into docs/figures/
    python -m benchmarks.figures layouts-2core      # one of them
    python -m benchmarks.figures --out DIR          # somewhere else

Each figure is a function that reads its numbers (a table of a results file, or a model it
runs) and returns an SVG document; ``FIGURES`` maps a figure's file name to its function.
To add a figure, write such a function, building :class:`Series` and calling
:func:`line_chart`, and add it to ``FIGURES``: the command, ``tests/test_figures.py`` (which
checks that the committed files are what the command writes) and the page pick it up.

The charts are plain SVG written here rather than by a plotting library, so neither the
figures nor the documentation build need a dependency the project does not already have,
and the same numbers always give the same bytes.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = REPO / "docs" / "figures"

# Okabe and Ito's colours, told apart by colour-blind readers; graphs/ uses the same set.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")


# --- reading the results files ----------------------------------------------------------------

def markdown_table(path: Path, after: str, *, section: str = "") -> list[dict[str, str]]:
    """The rows of the first pipe table after the first line of ``path`` containing ``after``
    (looked for from the first line that starts with ``section``), each a dict from the
    header's column names to the cells' text."""
    lines = path.read_text().splitlines()
    begin = next((i for i, line in enumerate(lines) if line.startswith(section)), None)
    start = None if begin is None else next(
        (i for i, line in enumerate(lines[begin:], begin) if after in line), None)
    if start is None:
        raise LookupError(f"{path.name}: no line contains {after!r} after {section!r}")
    table: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table:
            break
    if len(table) < 3:
        raise LookupError(f"{path.name}: no table after {after!r}")
    header, rows = table[0], table[2:]           # table[1] is the |---| line
    return [dict(zip(header, row)) for row in rows]


def number(cell: str) -> float:
    """The first number in a cell: ``"0.632 s, 1.00x, 100%"`` -> 0.632, ``"1,015 k"`` -> 1015."""
    match = re.search(r"-?\d[\d,]*\.?\d*", cell)
    if match is None:
        raise ValueError(f"no number in {cell!r}")
    return float(match.group().replace(",", ""))


# --- drawing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    """One line of a chart: its legend label, its (x, y) points, and whether it is dashed (a
    second measurement, or a reference such as ideal scaling)."""
    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False
    colour: str | None = None


@dataclass(frozen=True)
class _Axis:
    lo: float
    hi: float
    log: bool
    ticks: tuple[float, ...]

    def at(self, v: float, start: float, length: float) -> float:
        """Where ``v`` falls on an axis drawn from ``start`` over ``length`` pixels."""
        if self.log:
            f = (math.log(v) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        else:
            f = (v - self.lo) / (self.hi - self.lo)
        return start + f * length


def _axis(values: Sequence[float], log: bool, ticks: Sequence[float] | None) -> _Axis:
    lo, hi = min(values), max(values)
    if ticks is None:
        if log:
            ticks = [m * 10 ** e for e in range(math.floor(math.log10(lo)),
                                                math.ceil(math.log10(hi)) + 1)
                     for m in (1, 2, 5) if lo <= m * 10 ** e * 1.0001 and m * 10 ** e <= hi * 2]
        else:
            step = 10 ** math.floor(math.log10((hi - min(lo, 0)) / 4 or 1))
            step *= next(m for m in (1, 2, 5, 10) if (hi - min(lo, 0)) / (m * step) <= 6)
            ticks = [i * step for i in range(math.floor(min(lo, 0) / step),
                                             math.ceil(hi / step) + 1)]
    lo, hi = min(lo, *ticks), max(hi, *ticks)
    return _Axis(lo, hi, log, tuple(ticks))


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:,.0f}"


def line_chart(title: str, x_label: str, y_label: str, series: Sequence[Series], *,
               log_x: bool = False, log_y: bool = False,
               x_ticks: Sequence[float] | None = None,
               y_ticks: Sequence[float] | None = None,
               note: str = "") -> str:
    """An SVG line chart (640 x 400) of ``series``, with a legend on the right and ``note``
    (where the numbers come from) under the x axis."""
    width, height = 640, 400
    left, right, top, bottom = 64, 190, 40, 72
    pw, ph = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    xa, ya = _axis(xs, log_x, x_ticks), _axis(ys, log_y, y_ticks)

    def px(x: float) -> str:
        return f"{xa.at(x, left, pw):.1f}"

    def py(y: float) -> str:
        return f"{ya.at(y, top + ph, -ph):.1f}"

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12" '
           f'role="img" aria-labelledby="title">',
           f'<title id="title">{escape(title)}</title>',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']
    for t in xa.ticks:
        out.append(f'<line x1="{px(t)}" y1="{top}" x2="{px(t)}" y2="{top + ph}" '
                   f'stroke="#e0e0e0"/>')
        out.append(f'<text x="{px(t)}" y="{top + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
    for t in ya.ticks:
        out.append(f'<line x1="{left}" y1="{py(t)}" x2="{left + pw}" y2="{py(t)}" '
                   f'stroke="#e0e0e0"/>')
        out.append(f'<text x="{left - 6}" y="{float(py(t)) + 4:.1f}" '
                   f'text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               f'stroke="#444444"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph + 36}" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    if note:
        out.append(f'<text x="{left}" y="{height - 10}" font-size="10" '
                   f'fill="#555555">{escape(note)}</text>')
    for i, s in enumerate(series):
        colour = s.colour or COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        points = " ".join(f"{px(x)},{py(y)}" for x, y in s.points)
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                   f'stroke-width="2"{dash}/>')
        for x, y in s.points:
            out.append(f'<circle cx="{px(x)}" cy="{py(y)}" r="3" fill="{colour}"/>')
        ly = top + 12 + 20 * i
        out.append(f'<line x1="{left + pw + 14}" y1="{ly - 4}" x2="{left + pw + 38}" '
                   f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{left + pw + 44}" y="{ly}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- the figures --------------------------------------------------------------------------------

def strong_scaling_16core() -> str:
    """dtrain-default's speedup over its one-worker epoch on the lent 16-core Xeon, P1, P2 and
    P3, both runs of ``benchmarks/results-16core.md`` (run 2 solid, run 1 dashed)."""
    counts = (1, 2, 4, 8, 16)
    series: list[Series] = []
    for run, dashed in (("Run 2", False), ("Run 1", True)):
        rows = markdown_table(HERE / "results-16core.md", "Strong scaling", section=f"## {run}:")
        for i, row in enumerate(rows):
            epochs = [number(row["1 worker" if n == 1 else f"{n} workers"]) for n in counts]
            series.append(Series(f"{row['workload']}, {run.lower()}",
                                 [(n, epochs[0] / e) for n, e in zip(counts, epochs)],
                                 dashed, COLOURS[i]))
    series.append(Series("ideal", [(n, float(n)) for n in counts], True, "#999999"))
    return line_chart("Strong scaling on one 16-core node (dtrain-default)",
                      "workers (shards, one per core)", "speedup over 1 worker (log)", series,
                      log_x=True, log_y=True, x_ticks=counts, y_ticks=(0.5, 1, 2, 4, 8, 16),
                      note="benchmarks/results-16core.md: 16-core Xeon; run 2 on an H200 "
                           "machine, run 1 on an H100 machine")


def layouts_2core() -> str:
    """ms a step against shards in the hybrid layout (``python -m dtrain``'s default: one
    worker process, a thread per shard) and the flat one (a process per shard), iris and P3 on
    the 2-core machine: the "Layout goal" table of ``benchmarks/README.md``."""
    rows = markdown_table(HERE / "README.md", 'the "Layout goal" table')
    series = []
    for i, workload in enumerate(("iris", "P3")):
        mine = sorted((number(r["shards"]), r) for r in rows if r["workload"] == workload)
        series.append(Series(f"{workload}, hybrid (default)",
                             [(n, number(r["default ms"])) for n, r in mine], False, COLOURS[i]))
        series.append(Series(f"{workload}, flat",
                             [(n, number(r["flat ms"])) for n, r in mine], True, COLOURS[i]))
    return line_chart("Layouts on one 2-core machine: ms a step", "shards",
                      "ms per step (log)", series, log_x=True, log_y=True,
                      x_ticks=(2, 4, 8, 16), y_ticks=(2, 5, 10, 20, 50, 100, 200),
                      note="benchmarks/README.md, Layouts: 2-core AMD EPYC, iris 4-30-20-3 b4, "
                           "P3 784-128-10 b256")


MODEL = HERE / "model-across.json"      # python -m benchmarks.model --across --json MODEL


def model_strong_scaling() -> str:
    """The cost model's strong scaling, P3 and P2 (their global batch of 16 nodes split over
    1 to 256 nodes of 16 cores): dtrain's predicted speedup over its own step on one node,
    beside an MPI Allreduce loop's (``strong`` of :data:`MODEL`)."""
    import json

    found = json.loads(MODEL.read_text())
    series = []
    nodes: list[int] = []
    for i, model in enumerate(("P3", "P2")):
        rows = found["strong"][model]
        nodes = [r["nodes"] for r in rows]
        series.append(Series(f"{model}, dtrain", [(r["nodes"], r["dtrain_speedup"])
                                                  for r in rows], False, COLOURS[i]))
        series.append(Series(f"{model}, MPI Allreduce", [(r["nodes"], r["mpi_speedup"])
                                                         for r in rows], True, COLOURS[i]))
    series.append(Series("ideal", [(n, float(n)) for n in nodes], True, "#999999"))
    return line_chart("Strong scaling across nodes (cost model, predicted)", "nodes of 16 cores",
                      "speedup over 1 node (log)", series, log_x=True, log_y=True,
                      x_ticks=nodes, y_ticks=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                      note="benchmarks/model-across.json: python -m benchmarks.model --across; "
                           "constants measured on the 2-core machine, a 2 us 10 GB/s network")


FIGURES: dict[str, Callable[[], str]] = {
    "strong-scaling-16core.svg": strong_scaling_16core,
    "layouts-2core.svg": layouts_2core,
    "model-strong-scaling.svg": model_strong_scaling,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.figures",
                                     description="Draw docs/performance.md's figures as SVG "
                                     "from the results committed in benchmarks/.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="figures to draw (default all): "
                        + ", ".join(n.removesuffix(".svg") for n in FIGURES))
    parser.add_argument("--out", type=Path, default=OUT,
                        help="folder to write them to (default docs/figures)")
    args = parser.parse_args(argv)
    wanted = [n if n.endswith(".svg") else f"{n}.svg" for n in args.names] or list(FIGURES)
    unknown = [n for n in wanted if n not in FIGURES]
    if unknown:
        parser.error(f"no figure {', '.join(unknown)}; there are {', '.join(FIGURES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        path = args.out / name
        path.write_text(FIGURES[name]())
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
