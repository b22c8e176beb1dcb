"""Task types: dtrain's task keys read back, and one colour per type.

Keys are built by :func:`key` as ``<type>-<numbers>-<run>``::

    forward-backward-<step>-<shard>-<run>      reduce-<step>-<level>-<first shard>-<run>
    update-<step>-<run>        state-<step>-<run>        evaluate-<epoch>-<run>
    load-shard-<i>-<gen>-<run> load-val-<run>            load-test-<run>
    evaluate-test-<run>        local-sgd-<step>-<shard>-<run>
    model-parallel: forward-<step>-<block>-<slice>-<run>, backward-..., loss-<step>-<run>,
    combine-<step>-<block>-<run>, back-combine-..., input-grad-..., load-train-<i>-<gen>-<run>

The same colours are used by the Dask task stream (see :mod:`dtrain.readable`),
the ``/dtrain`` page, ``report.html`` and the task-graph pictures, so a colour
means one thing wherever it is seen.
"""
from __future__ import annotations

def key(name: str, *parts: int | str, run: str) -> str:
    """``name-part-part-run``: the dashboard groups tasks by ``name``."""
    return "-".join([name, *map(str, parts), run])


# Okabe-Ito colours (safe for colour-blind readers); evaluation and loading share a colour
# with their kind.  Order matters: longer names first, so "evaluate-test" wins over "evaluate".
TASK_COLORS: dict[str, str] = {
    "forward-backward": "#0072B2",   # blue: the compute of a step
    "local-sgd": "#0072B2",          # (local SGD: several steps of it)
    "forward": "#56B4E9",            # sky blue: model-parallel halves of it
    "backward": "#0072B2",
    "back-combine": "#E69F00",       # orange: combining across workers
    "combine": "#E69F00",
    "input-grad": "#F0E442",         # yellow: a slice's share sent down
    "reduce": "#E69F00",
    "loss": "#D55E00",               # vermillion: the root's step
    "update": "#D55E00",
    "evaluate-test": "#009E73",      # green: evaluation
    "evaluate": "#009E73",
    "load-shard": "#CC79A7",         # purple: loading
    "load-val": "#CC79A7",
    "load-test": "#CC79A7",
    "load-train": "#CC79A7",
    "state": "#999999",              # grey: the literal state that starts a window
}
TASK_TYPES: tuple[str, ...] = tuple(TASK_COLORS)
OTHER_COLOR = "#BBBBBB"


NUMBERLESS = ("load-val", "load-test", "evaluate-test")     # <type>-<run>, no numbers


def task_type(key: object) -> str | None:
    """The task type of a dtrain key (``"forward-backward"``, ...), None for other keys.

    After the type comes a step or index (digits), except for the few types
    that are followed by the run id alone.
    """
    if type(key) is not str:
        return None
    for name in TASK_TYPES:
        if key.startswith(name) and key[len(name):len(name) + 1] == "-":
            rest = key[len(name) + 1:]
            if name in NUMBERLESS or rest[:1].isdigit():
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
