"""Task keys: the one grammar that makes, parses and labels dtrain's task keys.

Every key is ``<kind>-<part>-...-<run>``: the kind names the task type, the
parts are numbers (a step, a shard, a level) or a tag, and the run id lets
several runs share a cluster::

    forward-backward-<step>-<shard>-<run>      reduce-<step>-<level>-<first shard>-<run>
    update-<step>-<run>  (root)                update-<step>-<first shard>-<run>  (replicated)
    state-<step>-<run>   evaluate-<epoch>-<run>  evaluate-test-<run>
    window-<first step>-<last step>-w<rank>-<run>  (a window as one task per worker; ``w0``
    the one task of a window fused on one worker), and its
    window-<first step>-<last step>-meta-<run>  (the window's timings)
    lbfgs-<first evaluation>-<run>  (a full-batch L-BFGS loop on the one worker holding
    every shard; elsewhere each evaluation is forward-backward-<evaluation>-<shard>, the
    reduce tree, and reduce-<evaluation>-total-<run>)
    kept-<step>-<run>  (a window's end state, kept on its worker for the next window)
    allreduce-<step>-<segment>-<run>  (a worker's part of a step's sums reduced in segments,
    inside a window cut across workers: :mod:`dtrain.taskgraph.segments`)
    load-shard-<i>-<gen>-<run>   load-val-<run>   load-test-<run>   local-sgd-<step>-<shard>-<run>
    fit-normalization-<run>   partition-stats-<partition>-<run>   merge-stats-<level>-<i>-<run>
    model-parallel: forward-<step>-<block>-<slice>-<run>, backward-..., input-grad-...,
    combine-<step>-<block>-<run>, back-combine-..., loss-<step>-<run>,
    reduce-<step>f<block>-... / reduce-<step>b<block>-... (forward / backward trees),
    state-<step>-root-<run>, state-<step>-<block>-<slice>-<run>, load-train-<i>-<gen>-<run>

Nothing else in dtrain splits a key: builders call :func:`make`, readers
(the timers, the live page, the report, the pictures, the dashboard labels)
call :func:`parse`.  The colours are shared by the Dask task stream, the
``/dtrain`` page, ``report.html`` and the pictures, so a colour means one
thing wherever it is seen.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Task kinds, by what they do (the names are what the dashboard shows)
FORWARD_BACKWARD = "forward-backward"
LOCAL_SGD = "local-sgd"
REDUCE = "reduce"
UPDATE = "update"
STATE = "state"
WINDOW = "window"       # a window of steps that never leave one worker, as one task
LBFGS = "lbfgs"         # a full-batch L-BFGS loop on the one worker holding every shard
KEPT = "kept"           # a window's end state, kept on its worker for the next window
EVALUATE = "evaluate"
EVALUATE_TEST = "evaluate-test"
LOAD_SHARD, LOAD_VAL, LOAD_TEST, LOAD_TRAIN = "load-shard", "load-val", "load-test", "load-train"
NORMALIZATION = "fit-normalization"     # the training split's statistics, for model.json
PART_STATS, MERGE_STATS = "partition-stats", "merge-stats"    # a Dask collection's, once
FORWARD, BACKWARD, INPUT_GRAD = "forward", "backward", "input-grad"
COMBINE, BACK_COMBINE, LOSS = "combine", "back-combine", "loss"
ALLREDUCE = "allreduce"     # a step's sums reduced in segments, worker to worker
CONTEXT = "context"         # a worker's share of a run on a mesh, for the windows it builds

# Okabe-Ito colours (safe for colour-blind readers); evaluation and loading share a colour
# with their kind.  Order matters: longer names first, so "evaluate-test" wins over "evaluate".
COLORS: dict[str, str] = {
    FORWARD_BACKWARD: "#0072B2",    # blue: the compute of a step
    WINDOW: "#332288",              # indigo: a window of steps as one task (many of each)
    LBFGS: "#0072B2",               # (an L-BFGS loop: many full-batch evaluations of it)
    LOCAL_SGD: "#0072B2",           # (local SGD: several steps of it)
    FORWARD: "#56B4E9",             # sky blue: model-parallel halves of it
    BACKWARD: "#0072B2",
    BACK_COMBINE: "#E69F00",        # orange: combining across workers
    COMBINE: "#E69F00",
    INPUT_GRAD: "#F0E442",          # yellow: a slice's share sent down
    REDUCE: "#E69F00",
    ALLREDUCE: "#E69F00",
    LOSS: "#D55E00",                # vermillion: the root's step
    UPDATE: "#D55E00",
    EVALUATE_TEST: "#009E73",       # green: evaluation
    EVALUATE: "#009E73",
    LOAD_SHARD: "#CC79A7",          # purple: loading
    LOAD_VAL: "#CC79A7",
    LOAD_TEST: "#CC79A7",
    LOAD_TRAIN: "#CC79A7",
    NORMALIZATION: "#CC79A7",
    PART_STATS: "#CC79A7",
    MERGE_STATS: "#CC79A7",
    CONTEXT: "#CC79A7",
    STATE: "#999999",               # grey: the literal state that starts a window
    KEPT: "#999999",                # (and the state kept for the next window)
}
KINDS: tuple[str, ...] = tuple(COLORS)
OTHER_COLOR = "#BBBBBB"
NUMBERLESS = (LOAD_VAL, LOAD_TEST, EVALUATE_TEST, NORMALIZATION)   # <kind>-<run>, no parts
_BY_HEAD: dict[str, tuple[str, ...]] = {    # a key's first word -> the KINDS it may start with
    head: tuple(k for k in KINDS if k.split("-", 1)[0] == head)
    for head in dict.fromkeys(k.split("-", 1)[0] for k in KINDS)}
LEAVES = (FORWARD_BACKWARD, LOCAL_SGD)                 # the model's maths on a shard
WORK = (FORWARD_BACKWARD, LOCAL_SGD, FORWARD, BACKWARD)   # the model's maths, any strategy


@dataclass(frozen=True)
class Key:
    """A dtrain key read back: ``kind``, the ``parts`` between it and the ``run`` id."""

    kind: str
    parts: tuple[str, ...]
    run: str

    @property
    def numbers(self) -> list[int]:
        """The parts that are whole numbers, in order: ``[step, shard]`` for
        ``forward-backward``."""
        return [int(p) for p in self.parts if p.isdigit()]

    @property
    def step(self) -> int | None:
        """The step (epoch for ``evaluate``) the key starts with: the leading digits of its
        first part (``12`` of a model-parallel tree's ``12f0``)."""
        m = re.match(r"\d+", self.parts[0]) if self.parts else None
        return int(m.group()) if m else None

    @property
    def replicated(self) -> bool:
        """An ``update`` on every worker (``update-<step>-<first shard>``), not the root's."""
        return self.kind == UPDATE and len(self.parts) > 1

    @property
    def tree(self) -> tuple[str, str] | None:
        """A ``reduce`` key's tree and level: the tag (step, or step and block) and the level;
        the tasks of one level run side by side."""
        return (self.parts[0], self.parts[1]) if self.kind == REDUCE and len(self.parts) > 1 \
            else None


def make(kind: str, *parts: int | str, run: str) -> str:
    """``kind-part-part-run``: the dashboard groups tasks by ``kind``."""
    return "-".join([kind, *map(str, parts), run])


def parse(key: object) -> Key | None:
    """The :class:`Key` of a dtrain key, None for any other key.

    After the kind comes a part that starts with a digit (a step or an
    index), except for the few kinds followed by the run id alone.
    """
    kind = kind_of(key)
    if kind is None:
        return None
    *parts, run = key[len(kind) + 1:].split("-")       # type: ignore[index]
    return Key(kind, tuple(parts), run)


def kind_of(key: object) -> str | None:
    """The task kind of a dtrain key (``"forward-backward"``, ...), None for other keys
    (what :func:`parse` reads first; the graph passes ask it of every task)."""
    if type(key) is not str:
        return None
    for kind in _BY_HEAD.get(key.split("-", 1)[0], ()):     # KINDS that can match, in order
        if key.startswith(kind) and key[len(kind):len(kind) + 1] == "-":
            if kind in NUMBERLESS or key[len(kind) + 1:len(kind) + 2].isdigit():
                return kind
    return None


def run_of(key: object) -> str | None:
    """The run id that ends a dtrain key, None for other keys."""
    parsed = parse(key)
    return parsed.run if parsed else None


def prefixes(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """What keys of these ``kinds`` start with, for a fast ``key.startswith(...)`` on hot
    paths (every key of a window, as it is submitted).  Only for kinds whose prefix no
    other kind's key starts with (``forward-`` would also match ``forward-backward-``)."""
    out = tuple(f"{kind}-" for kind in kinds)
    for p in out:
        clash = [k for k in KINDS if k != p[:-1] and k.startswith(p)]
        if clash:
            raise ValueError(f"keys of {clash} start with {p!r} too; use parse()")
    return out


_LEAF_PREFIXES = prefixes(LEAVES)


def is_leaf(key: object) -> bool:
    """Whether a key is a leaf of a data-parallel graph: the model's maths on a shard."""
    return isinstance(key, str) and key.startswith(_LEAF_PREFIXES)


def color(kind: str | None) -> str:
    """The colour of a task kind (grey for anything else)."""
    return COLORS.get(kind or "", OTHER_COLOR)


def family(kind: str | None) -> str | None:
    """Task kinds grouped for summaries: ``load-*`` is ``load``, ``evaluate-test`` is
    ``evaluate``."""
    if kind is None:
        return None
    if kind.startswith("load-"):
        return "load"
    return EVALUATE if kind.startswith(EVALUATE) else kind


def span(indices: set[int] | list[int], word: str = "shard") -> str:
    """``"shard 3"``, ``"shards 0-3"``: the leaves a value covers."""
    s = sorted(indices)
    return "" if not s else f"{word} {s[0]}" if len(s) == 1 else f"{word}s {s[0]}-{s[-1]}"


def label(key: str, covers: set[int] = frozenset()) -> str:
    """A two-line description of a task for pictures: its kind, then where it sits in the
    step (``covers``: the shards or slices its value sums over, where known)."""
    k = parse(key)
    if k is None:
        return key
    n = k.numbers
    if k.kind == FORWARD_BACKWARD:
        return f"{k.kind}\\nstep {n[0]}, {span(covers)}"
    if k.kind == LOCAL_SGD:
        return f"{k.kind}\\nsteps {n[0]}..., shard {n[1]}"
    if k.kind in (FORWARD, BACKWARD, INPUT_GRAD):
        return f"{k.kind}\\nstep {n[0]}, block {n[1]}, slice {n[2]}"
    if k.kind in (COMBINE, BACK_COMBINE):
        return f"{k.kind}\\nstep {n[0]}, block {n[1]}"
    if k.kind == LOSS:
        return f"loss\\nstep {n[0]}"
    if k.kind == REDUCE:
        tag, level = k.parts[0], k.parts[1]             # model-parallel tags: 3f0, 3b1
        side = "f" if "f" in tag else "b" if "b" in tag else ""
        step, _, block = tag.partition(side) if side else (tag, "", "")
        where = f", {'forward' if side == 'f' else 'backward'} block {block}" if side else ""
        return f"reduce\\nstep {step}, level {level}{where}, " \
               f"{span(covers, 'slice' if side else 'shard')}"
    if k.replicated:
        return f"update\\nstep {n[0]}, this worker's copy"
    if k.kind == UPDATE:
        return f"update\\nstep {n[0]}" + (f", sum of {span(covers)}" if covers else "")
    if k.kind == STATE:
        of = ", root" if "root" in k.parts else f", block {n[1]}, slice {n[2]}" \
            if len(n) == 3 else ""
        return f"state\\nbefore step {n[0]}{of}"
    if k.kind == EVALUATE:
        return f"evaluate\\nepoch {n[0]}"
    if k.kind == KEPT:
        return f"kept\\nstate before step {n[0]}"
    if k.kind == WINDOW:
        return f"window\\nsteps {n[0]}-{n[1]}"
    if k.kind == LBFGS:
        return f"lbfgs\\nevaluations from {n[0]}"
    return f"{k.kind} {n[0]}" if n else k.kind
