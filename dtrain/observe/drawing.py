"""Pictures of a task graph: a box per worker, a colour per task kind.

:func:`draw` turns a :class:`Picture` (the tasks of one step, where each
runs, what each reads) into DOT with the ``graphviz`` package (pure Python);
only rendering to SVG/PNG needs Graphviz's ``dot`` program (:func:`render`).
What to picture for a config is :mod:`dtrain.training.pictures`' job;
``graphs/`` holds one picture per strategy.
"""
from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import graphviz

from dtrain.core import keys
from dtrain.core.errors import UserError

FORMATS = ("svg", "png", "pdf")


@dataclass(frozen=True)
class Picture:
    """One step's tasks as a picture shows them.

    ``nodes`` maps every key drawn to its worker (in drawing order), ``deps``
    each task to the keys it reads; ``leaves[i]`` is the worker that holds
    leaf ``i`` (a ``leaf_word``: shard or slice) and ``root`` the one that
    updates; ``run`` is the run id that ends every key (not shown).
    """

    name: str
    title: str
    workers: list[str]
    nodes: dict[str, str]
    deps: dict[str, list[str]]
    leaves: tuple[str, ...]
    root: str
    leaf_word: str
    run: str


def _text_color(fill: str) -> str:
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "white"


def _legend(title: str, kinds: Iterable[str]) -> str:
    cells = "".join(f'<td bgcolor="{keys.COLORS[k]}"><font color="{_text_color(keys.COLORS[k])}">'
                    f"{k}</font></td>" for k in kinds)
    return (f'<<table border="0" cellborder="1" cellspacing="2" cellpadding="4">'
            f'<tr><td colspan="20" border="0">{html.escape(title)}</td></tr>'
            f"<tr>{cells}</tr></table>>")


# what a value's shards (or slices) are not summed through
_OPAQUE = (keys.STATE, keys.LOSS, keys.COMBINE, keys.BACK_COMBINE, keys.UPDATE)


def covers(p: Picture) -> dict[str, set[int]]:
    """The shards (or slices) each task's value sums over."""
    out: dict[str, set[int]] = {}

    def cover(k: str) -> set[int]:
        if k not in out:
            key, deps = keys.parse(k), p.deps.get(k, ())
            if key.kind == keys.FORWARD_BACKWARD:
                out[k] = {keys.parse(d).numbers[0] for d in deps
                          if keys.kind_of(d) == keys.LOAD_SHARD}
            elif key.kind == keys.LOCAL_SGD:
                out[k] = {key.numbers[1]}
            elif key.kind in (keys.FORWARD, keys.INPUT_GRAD):
                out[k] = {key.numbers[2]}
            else:
                out[k] = set().union(*(cover(d) for d in deps
                                       if keys.kind_of(d) not in _OPAQUE))
        return out[k]

    for k in p.nodes:
        cover(k)
    return out


def draw(p: Picture) -> graphviz.Digraph:
    """The DOT description of a :class:`Picture`."""
    cover = covers(p)
    dot = graphviz.Digraph(p.name, graph_attr={
        "rankdir": "TB", "fontname": "Helvetica", "labelloc": "b", "nodesep": "0.25",
        "label": _legend(p.title, dict.fromkeys(keys.kind_of(n) for n in p.nodes))},
        node_attr={"shape": "box", "style": "filled,rounded", "fontname": "Helvetica",
                   "fontsize": "11"},
        edge_attr={"color": "#555555", "arrowsize": "0.6"})
    short = {n: n[:-len(p.run) - 1] for n in p.nodes}
    for i, w in enumerate(p.workers):
        held = [s for s, owner in enumerate(p.leaves) if owner == w]
        role = ", head: reduce and update" if w == p.root and not held else ""
        span = keys.span(held, p.leaf_word) if held else ""
        with dot.subgraph(name=f"cluster_{i}") as box:
            box.attr(label=f"worker {i}" + (f" ({span}{role})" if held else
                                            f" ({role[2:]})" if role else ""),
                     style="rounded", color="#888888", fontname="Helvetica")
            for n, placed in p.nodes.items():
                if placed == w:
                    fill = keys.COLORS[keys.kind_of(n)]
                    box.node(short[n], keys.label(n, cover[n]), fillcolor=fill,
                             fontcolor=_text_color(fill))
    for n in p.nodes:
        for d in p.deps.get(n, ()):
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
