"""Task types: dtrain's task keys read back, and one colour per type.

Keys are built by :func:`dtrain.graph.key` as ``<type>-<numbers>-<run>``::

    forward-backward-<step>-<shard>-<run>      reduce-<step>-<level>-<first shard>-<run>
    update-<step>-<run>        state-<step>-<run>        evaluate-<epoch>-<run>
    load-shard-<i>-<run>       load-val-<run>            load-test-<run>
    evaluate-test-<run>

The same colours are used by the Dask task stream (see :mod:`dtrain.readable`),
the ``/dtrain`` page, ``report.html`` and the task-graph pictures, so a colour
means one thing wherever it is seen.
"""
from __future__ import annotations

# Okabe-Ito colours (safe for colour-blind readers); evaluation and loading share a colour
# with their kind.  Order matters: longer names first, so "evaluate-test" wins over "evaluate".
TASK_COLORS: dict[str, str] = {
    "forward-backward": "#0072B2",   # blue: the compute of a step
    "reduce": "#E69F00",             # orange: combining gradients
    "update": "#D55E00",             # vermillion: the optimizer step
    "evaluate-test": "#009E73",      # green: evaluation
    "evaluate": "#009E73",
    "load-shard": "#CC79A7",         # purple: loading
    "load-val": "#CC79A7",
    "load-test": "#CC79A7",
    "state": "#999999",              # grey: the literal state that starts a window
}
TASK_TYPES: tuple[str, ...] = tuple(TASK_COLORS)
OTHER_COLOR = "#BBBBBB"


def task_type(key: object) -> str | None:
    """The task type of a dtrain key (``"forward-backward"``, ...), None for other keys."""
    if type(key) is not str:
        return None
    for name in TASK_TYPES:
        if key.startswith(name) and key[len(name):len(name) + 1] == "-":
            return name
    return None


def numbers(key: str) -> list[int]:
    """The numeric parts of a key, in order: ``[step, shard]`` for ``forward-backward``."""
    name = task_type(key)
    rest = key[len(name) + 1:].split("-")[:-1] if name else []   # drop the run suffix
    return [int(p) for p in rest if p.isdigit()]


def run_of(key: object) -> str | None:
    """The run id that ends a dtrain key, None for other keys."""
    return key.rsplit("-", 1)[-1] if task_type(key) else None  # type: ignore[union-attr]


def color(name: str | None) -> str:
    """The colour of a task type (grey for anything else)."""
    return TASK_COLORS.get(name or "", OTHER_COLOR)


def family(name: str | None) -> str | None:
    """Task types grouped for summaries: ``load-*`` is ``load``, ``evaluate-test`` is
    ``evaluate``."""
    if name is None:
        return None
    if name.startswith("load-"):
        return "load"
    return "evaluate" if name.startswith("evaluate") else name
