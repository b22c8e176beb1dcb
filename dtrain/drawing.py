"""Pictures of one minibatch's task graph: a box per worker, a colour per task type.

:func:`step_graph` builds the graph the trainer would submit for step 0
(:func:`dtrain.graph.window_graph`, with the loading tasks it refers to) for
``cluster.workers`` workers, and describes it as DOT with the ``graphviz``
package (pure Python); only rendering to SVG/PNG needs Graphviz's ``dot``
program.  ``graphs/`` holds the :data:`GALLERY`, one picture per strategy.
"""
from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path

import graphviz
from dask.task_spec import TaskRef

from dtrain import graph
from dtrain.config import Config, load_config
from dtrain.errors import UserError
from dtrain.tasktypes import TASK_COLORS, numbers, task_type

# name -> --set overrides on top of configs/iris.toml and GALLERY_BASE; add a strategy here.
GALLERY: dict[str, list[str]] = {
    "allreduce-fan-in-2": ["graph.strategy=allreduce", "graph.fan_in=2"],
    "allreduce-fan-in-4": ["graph.strategy=allreduce", "graph.fan_in=4"],
    "parameter-server": ["graph.strategy=parameter-server"],
}
GALLERY_BASE = ["data.shards=8", "cluster.workers=4"]
FORMATS = ("svg", "png", "pdf")
RUN = "picture"                  # the run id in the pictured keys (not shown)


def _text_color(fill: str) -> str:
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "white"


def _span(shards: Iterable[int]) -> str:
    s = sorted(shards)
    return "" if not s else f"shard {s[0]}" if len(s) == 1 else f"shards {s[0]}-{s[-1]}"


def _label(key: str, covers: set[int]) -> str:
    kind, nums = task_type(key), numbers(key)
    if kind == "forward-backward":
        return f"forward-backward\\nstep {nums[0]}, shard {nums[1]}"
    if kind == "reduce":
        return f"reduce\\nstep {nums[0]}, level {nums[1]}, {_span(covers)}"
    if kind == "update":
        return f"update\\nstep {nums[0]}, sum of {_span(covers)}"
    if kind == "state":
        return f"state\\nbefore step {nums[0]}"
    if kind == "evaluate":
        return f"evaluate\\nepoch {nums[0]}"
    return f"{kind} {nums[0]}" if nums else str(kind)


def _legend(title: str, kinds: Iterable[str]) -> str:
    cells = "".join(f'<td bgcolor="{TASK_COLORS[k]}"><font color="{_text_color(TASK_COLORS[k])}">'
                    f"{k}</font></td>" for k in kinds)
    return (f'<<table border="0" cellborder="1" cellspacing="2" cellpadding="4">'
            f'<tr><td colspan="20" border="0">{html.escape(title)}</td></tr>'
            f"<tr>{cells}</tr></table>>")


def step_graph(config: Config) -> graphviz.Digraph:
    """One training step's task graph for ``config``, placed on ``cluster.workers`` workers."""
    from dtrain.trainer import plan

    cfg = config
    if cfg.graph.strategy == "serial":
        raise UserError("graph.strategy = 'serial' runs without a task graph; picture "
                        "'allreduce' or 'parameter-server' instead")
    workers = [f"worker-{i}" for i in range(cfg.cluster.workers)]
    if cfg.graph.strategy == "parameter-server" and len(workers) < 2:
        raise UserError("graph.strategy = 'parameter-server' needs 2 workers (a head and at "
                        "least one trainer); use --set cluster.workers=2 or more")
    p = plan(cfg)
    where = graph.place(workers, len(p.ranges), cfg.graph.strategy)
    shards = [TaskRef(graph.key("load-shard", i, run=RUN)) for i in range(len(p.ranges))]
    val = TaskRef(graph.key("load-val", run=RUN)) if p.info.val else None
    win = graph.window_graph([p.schedule[0]], p.initial_state(), shards, val, where, p.recipe,
                             RUN)
    nodes = {ref.key: [where.shards[i]] for i, ref in enumerate(shards)}
    deps = {k: sorted(win.dsk[k].dependencies) for k in win.dsk}
    if val is not None and any(val.key in d for d in deps.values()):
        nodes[val.key] = [where.root]
    nodes.update(win.where)
    covers: dict[str, set[int]] = {}
    for k in nodes:           # in build order: children before parents
        kind = task_type(k)
        covers[k] = {numbers(k)[1]} if kind == "forward-backward" else set().union(
            *(covers.get(d, set()) for d in deps.get(k, ()) if task_type(d) != "state"))

    k = graph.fan_in(cfg.graph.strategy, cfg.graph.fan_in, len(p.ranges))
    title = (f"{cfg.graph.strategy}" + ("" if cfg.graph.strategy == "parameter-server" else
                                       f", fan-in {k}") +
             f": one step, {len(p.ranges)} shards on {len(workers)} workers "
             f"(fuse_update = {str(cfg.graph.fuse_update).lower()})")
    dot = graphviz.Digraph(f"dtrain-{cfg.graph.strategy}", graph_attr={
        "rankdir": "TB", "fontname": "Helvetica", "labelloc": "b", "nodesep": "0.25",
        "label": _legend(title, dict.fromkeys(task_type(n) for n in nodes))},
        node_attr={"shape": "box", "style": "filled,rounded", "fontname": "Helvetica",
                   "fontsize": "11"},
        edge_attr={"color": "#555555", "arrowsize": "0.6"})
    short = {n: n[:-len(RUN) - 1] for n in nodes}
    for i, w in enumerate(workers):
        held = [s for s, owner in enumerate(where.shards) if owner == w]
        role = ", head: reduce and update" if w == where.root and not held else ""
        with dot.subgraph(name=f"cluster_{i}") as box:
            box.attr(label=f"worker {i}" + (f" ({_span(held)}{role})" if held else
                                            f" ({role[2:]})" if role else ""),
                     style="rounded", color="#888888", fontname="Helvetica")
            for n, placed in nodes.items():
                if placed[0] == w:
                    fill = TASK_COLORS[task_type(n)]
                    box.node(short[n], _label(n, covers[n]), fillcolor=fill,
                             fontcolor=_text_color(fill))
    for n in nodes:
        for d in deps.get(n, ()):
            dot.edge(short[d], short[n])
    return dot


def render(dot: graphviz.Digraph, out: str | Path) -> Path:
    """Write ``dot`` to ``out``: DOT text for ``.dot``/``.gv``, else rendered by ``dot``."""
    out = Path(out)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in (*FORMATS, "dot", "gv"):
        raise UserError(f"--out {out}: unknown picture format '{out.suffix}'; use .svg, .png, "
                        f".pdf, or .dot for the DOT source")
    try:
        out.write_bytes(dot.source.encode() if fmt in ("dot", "gv") else dot.pipe(format=fmt))
    except graphviz.ExecutableNotFound:
        raise UserError(f"rendering {out} needs Graphviz's `dot` program (Debian: apt-get "
                        f"install graphviz); or write the DOT source with --out "
                        f"{out.with_suffix('.dot')}") from None
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror}; pick another --out") from None
    return out


def gallery() -> dict[str, graphviz.Digraph]:
    """The pictures kept in ``graphs/``, by file name (without suffix)."""
    return {name: step_graph(load_config(None, [*GALLERY_BASE, *sets]))
            for name, sets in GALLERY.items()}


def write_gallery(directory: str | Path) -> list[Path]:
    """Write each :func:`gallery` picture as ``NAME.dot`` and ``NAME.svg``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [render(dot, directory / f"{name}.{fmt}")
            for name, dot in gallery().items() for fmt in ("dot", "svg")]
