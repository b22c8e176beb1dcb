"""Pictures of one minibatch's task graph: a box per worker, a colour per task type.

:func:`step_graph` builds the graph the trainer would submit for step 0
(:func:`dtrain.graph.window_graph`, with the loading tasks it refers to) for
``cluster.workers`` workers, and describes it as DOT with the ``graphviz``
package (pure Python); only rendering to SVG/PNG needs Graphviz's ``dot``
program.  ``graphs/`` holds the :data:`GALLERY`, one picture per strategy.
"""
from __future__ import annotations

import dataclasses
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
    "allreduce-task-per-shard": ["graph.strategy=allreduce", "graph.fan_in=2",
                                 "graph.fuse_shards=false"],
    "allreduce-root-update": ["graph.strategy=allreduce", "graph.fan_in=2", "graph.update=root"],
    "parameter-server": ["graph.strategy=parameter-server"],
    "local-sgd": ["graph.strategy=local-sgd", "graph.sync_every=4"],
    "model-parallel": ["graph.strategy=model-parallel", "graph.slices=4"],
    "model-parallel-deep": ["graph.strategy=model-parallel", "graph.slices=4",
                            "model.layers=[4, 16, 8, 12, 3]"],
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
        return f"forward-backward\\nstep {nums[0]}, {_span(covers)}"
    if kind == "local-sgd":
        return f"local-sgd\\nsteps {nums[0]}..., shard {nums[1]}"
    if kind in ("forward", "backward", "input-grad"):
        return f"{kind}\\nstep {nums[0]}, block {nums[1]}, slice {nums[2]}"
    if kind in ("combine", "back-combine"):
        return f"{kind}\\nstep {nums[0]}, block {nums[1]}"
    if kind == "loss":
        return f"loss\\nstep {nums[0]}"
    if kind == "reduce":
        tag, level = key.split("-")[1:3]                 # model-parallel tags: 3f0, 3b1
        side = "f" if "f" in tag else "b" if "b" in tag else ""
        step, _, block = tag.partition(side) if side else (tag, "", "")
        where = f", {'forward' if side == 'f' else 'backward'} block {block}" if side else ""
        span = _span(covers).replace("shard", "slice") if side else _span(covers)
        return f"reduce\\nstep {step}, level {level}{where}, {span}"
    if kind == "update" and len(nums) > 1:               # replicated: one per worker
        return f"update\\nstep {nums[0]}, this worker's copy"
    if kind == "update":
        return f"update\\nstep {nums[0]}" + (f", sum of {_span(covers)}" if covers else "")
    if kind == "state":
        of = ", root" if "-root-" in key else f", block {nums[1]}, slice {nums[2]}" \
            if len(nums) == 3 else ""
        return f"state\\nbefore step {nums[0]}{of}"
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
    """One training step's task graph for ``config`` (a local SGD round: one round), placed on
    ``cluster.workers`` workers."""
    from dtrain.trainer import plan

    cfg = config
    if cfg.graph.strategy == "serial":
        raise UserError("graph.strategy = 'serial' runs without a task graph; picture "
                        "'allreduce' or 'parameter-server' instead")
    workers = [f"worker-{i}" for i in range(cfg.cluster.workers)]
    if cfg.graph.strategy == "parameter-server" and len(workers) < 2:
        raise UserError("graph.strategy = 'parameter-server' needs 2 workers (a head and at "
                        "least one trainer); use --set cluster.workers=2 or more")
    # replicated updates keep each state every graph.state_every steps; the picture keeps
    # step 0's, to show where it would be kept
    p = plan(dataclasses.replace(cfg, graph=dataclasses.replace(cfg.graph, state_every=1)))
    where = p.strategy.place(workers)
    items = p.strategy.data(where)
    refs = [TaskRef(graph.key(*item.name, run=RUN)) for item in items]
    val = TaskRef(graph.key("load-val", run=RUN)) if p.info.val else None
    steps = list(graph.units([p.schedule[t] for t in range(p.schedule.steps_per_epoch)],
                             p.recipe)[0])
    if p.recipe.replicated:
        # steps 0 and 1 of a longer window: every worker's update of step 0, and the step 1
        # forward-backward tasks that read the same partial sums (step 2 is built, not shown)
        steps = [p.schedule[t] for t in range(3)]
    win = p.strategy.window(steps, p.initial_state(), refs, val, where, RUN)
    if p.recipe.replicated:
        for k in [k for k in win.dsk if task_type(k) in ("forward-backward", "reduce", "update")
                  and numbers(k)[0] == 2]:
            del win.dsk[k], win.where[k]
    nodes = {ref.key: [item.worker] for ref, item in zip(refs, items)}
    deps = {k: sorted(win.dsk[k].dependencies) for k in win.dsk}
    if val is not None and any(val.key in d for d in deps.values()):
        nodes[val.key] = [where.root]
    nodes.update(win.where)
    covers: dict[str, set[int]] = {}          # shards (or slices) a task's value sums over

    def cover(k: str) -> set[int]:
        if k not in covers:
            kind = task_type(k)
            covers[k] = {numbers(d)[0] for d in deps[k] if task_type(d) == "load-shard"} \
                if kind == "forward-backward" else \
                {numbers(k)[1]} if kind == "local-sgd" else \
                {numbers(k)[2]} if kind in ("forward", "input-grad") else set().union(
                    *(cover(d) for d in deps.get(k, ()) if task_type(d) not in
                      ("state", "loss", "combine", "back-combine", "update")))
        return covers[k]

    for k in nodes:
        cover(k)

    strategy = cfg.graph.strategy
    leaves = "slices" if strategy == "model-parallel" else "shards"
    detail = {"parameter-server": "", "model-parallel": f", {cfg.graph.slices} slices",
              "local-sgd": f", one round of {cfg.graph.sync_every} steps"}.get(
        strategy, f", fan-in {graph.fan_in(strategy, cfg.graph.fan_in, len(p.ranges))}")
    if p.recipe.replicated:
        detail += ", replicated updates (steps 0 and 1)"
    title = (f"{strategy}{detail}: {len(p.ranges)} shards on {len(workers)} workers "
             f"(layers {list(cfg.model.layers)})")
    dot = graphviz.Digraph(f"dtrain-{strategy}", graph_attr={
        "rankdir": "TB", "fontname": "Helvetica", "labelloc": "b", "nodesep": "0.25",
        "label": _legend(title, dict.fromkeys(task_type(n) for n in nodes))},
        node_attr={"shape": "box", "style": "filled,rounded", "fontname": "Helvetica",
                   "fontsize": "11"},
        edge_attr={"color": "#555555", "arrowsize": "0.6"})
    short = {n: n[:-len(RUN) - 1] for n in nodes}
    for i, w in enumerate(workers):
        held = [s for s, owner in enumerate(where.leaves) if owner == w]
        role = ", head: reduce and update" if w == where.root and not held else ""
        span = _span(held).replace("shard", leaves[:-1]) if held else ""
        with dot.subgraph(name=f"cluster_{i}") as box:
            box.attr(label=f"worker {i}" + (f" ({span}{role})" if held else
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
