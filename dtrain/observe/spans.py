"""Spans: the tasks inside windows as each worker's chain ran them, from the chains' own timings.

A window that runs as one task per worker (:mod:`dtrain.taskgraph.fuse`,
:mod:`dtrain.taskgraph.span`, :mod:`dtrain.taskgraph.expand`) shows in Dask's task
stream as one long bar.  Its chain times every task it runs and keeps a sample of them as
spans; the window's meta brings them to the driver as *groups*, one per chain run::

    (worker, start, end, seconds by kind, ((key, kind, start, end), ...))

(times by the worker's wall clock, seconds since the epoch; a ``recv-wait`` span lies
inside the task that waited, after it).  This module turns groups into what the
``/dtrain`` page, ``report.html`` and ``summary.json`` show: rows of the ``dtrain-spans``
source (:func:`columns`), each worker's share of time by kind (:func:`busy`,
:class:`Totals`) and a sample of windows for the report (:class:`Sample`).  Plain data
in, plain data out: it runs on the driver and on the scheduler alike.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from dtrain.core import keys

# the kinds shown, in the order the busy panel stacks them; "other" is the rest of a window
# (its start and kept states, picking values out), "idle" the time outside any window
KINDS = ("forward-backward", "reduce", "update", "evaluate", "send", "recv-wait", "other")
SEND, RECV_WAIT = "send", "recv-wait"
COLORS = {**{k: keys.color(k) for k in KINDS[:4]}, SEND: "#F0E442", RECV_WAIT: "#CC6677",
          "other": keys.color(keys.STATE)}
COLUMNS = ("worker", "kind", "start", "end", "key", "step", "shard", "ms", "color")
_AS = {keys.ALLREDUCE: "reduce", "recv": RECV_WAIT, keys.LOCAL_SGD: keys.FORWARD_BACKWARD,
       keys.FORWARD: keys.FORWARD_BACKWARD, keys.BACKWARD: keys.FORWARD_BACKWARD}

Group = tuple[str, float, float, dict[str, float], tuple]


@functools.lru_cache(maxsize=256)
def kind_of(kind: str | None) -> str:
    """The kind a chain's task is shown as (``allreduce`` is a ``reduce``, the wait in a
    ``recv`` node ``recv-wait``, ``evaluate-test`` an ``evaluate``; ``other`` for the
    rest).  Cached: the head asks for every span of every worker's window (a few kinds)."""
    kind = _AS.get(kind or "", kind)
    kind = keys.family(kind) or "other"
    return kind if kind in KINDS else "other"


def shares(seconds: dict[str, float]) -> dict[str, float]:
    """A chain's seconds by task kind as seconds by shown kind: a part timed inside a task
    (``<kind>/<inside>``: ``recv-wait/allreduce``, the waits inside the step's sum;
    ``reduce/forward-backward``, a group's sum) taken out of the task's kind; ``critical``
    (a sum of the others) dropped."""
    out = dict.fromkeys(KINDS, 0.0)
    for kind, s in seconds.items():
        if kind == "critical":
            continue
        part, _, inside = kind.partition("/")
        out[kind_of(part)] += s
        if inside:
            out[kind_of(inside)] -= s
    return {k: max(0.0, v) for k, v in out.items()}


def flatten(groups: Iterable[Group]) -> list[tuple[str, str, float, float, str]]:
    """Every span of ``groups`` as ``(worker, kind shown, start, end, key)``, in order."""
    return [(g[0], kind_of(kind), a, b, key) for g in groups for key, kind, a, b in g[4]]


def columns(rows: list[tuple[str, str, float, float, str]],
            names: dict[str, str] | None = None) -> dict[str, list[Any]]:
    """The ``dtrain-spans`` source's columns for ``rows`` (:func:`flatten`): ``worker``
    (``worker <name>`` where ``names`` knows the address), ``kind``, ``start`` and ``end``
    (milliseconds since the epoch, as Dask's task stream has them), ``key``; and for the
    hover, ``step``, ``shard`` (-1: none), ``ms`` (the duration) and ``color``."""
    names = names or {}
    out: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for worker, kind, a, b, key in rows:
        parsed = keys.parse(key)
        numbers = parsed.numbers if parsed is not None else []
        out["worker"].append(f"worker {names[worker]}" if worker in names else worker)
        out["kind"].append(kind)
        out["start"].append(a * 1000.0)
        out["end"].append(b * 1000.0)
        out["key"].append(key)
        out["step"].append(numbers[0] if numbers else -1)
        out["shard"].append(numbers[1] if len(numbers) > 1 and parsed.kind in keys.LEAVES
                            else -1)
        out["ms"].append(round((b - a) * 1000.0, 3))
        out["color"].append(COLORS[kind])
    return out


def busy(windows: Iterable[tuple[str, float, float, dict[str, float]]], workers: Iterable[str],
         lo: float, hi: float) -> dict[str, dict[str, float]]:
    """Per worker, the share of ``lo`` to ``hi`` spent in each shown kind and ``idle`` (in no
    window: waiting for the driver, or for the scheduler between windows), from the
    windows ``(worker, start, end, shares)``: a window partly inside counts for the part of
    its time that is, spread evenly (a sample of its steps is all its spans hold, but its
    seconds are every task's)."""
    span = max(hi - lo, 1e-9)
    out = {w: dict.fromkeys(KINDS, 0.0) for w in workers}
    inside: dict[str, float] = dict.fromkeys(out, 0.0)
    for worker, a, b, sh in windows:
        part = min(b, hi) - max(a, lo)
        if worker not in out or part <= 0 or b <= a:
            continue
        frac = part / (b - a)
        for kind, s in sh.items():
            out[worker][kind] += s * frac / span
        inside[worker] += part / span
    for w, row in out.items():
        room = min(inside[w], 1.0)
        total = sum(row.values())
        if total > room > 0:                # chains of one worker side by side: scale down
            for k in row:
                row[k] *= room / total
        row["other"] += max(0.0, room - sum(row.values()))
        row["idle"] = max(0.0, 1.0 - room)
    return out


class Totals:
    """Each worker's time by shown kind over a run, for ``summary.json``: the windows'
    seconds summed, and their wall time (so ``idle``: the run's time between its first
    window's start and last window's end outside any window on that worker)."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = {}
        self.inside: dict[str, float] = {}
        self.first: float | None = None
        self.last: float | None = None

    def add(self, groups: Iterable[Group]) -> None:
        for worker, a, b, seconds, _ in groups:
            row = self.seconds.setdefault(worker, dict.fromkeys(KINDS, 0.0))
            for kind, s in shares(seconds).items():
                row[kind] += s
            self.inside[worker] = self.inside.get(worker, 0.0) + (b - a)
            self.first = a if self.first is None else min(self.first, a)
            self.last = b if self.last is None else max(self.last, b)

    def summary(self, names: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
        """``{worker: {kind: share of the time windows ran, ..., "idle": ...}}``, shares
        rounded to 4 digits (empty where no window reported spans)."""
        if self.first is None or self.last is None:
            return {}
        names = names or {}
        wall = max(self.last - self.first, 1e-9)
        out = {}
        for worker in sorted(self.seconds, key=lambda w: names.get(w, w)):
            row = {k: s / wall for k, s in self.seconds[worker].items()}
            row["other"] += max(0.0, min(self.inside[worker], wall) / wall - sum(row.values()))
            row["idle"] = max(0.0, 1.0 - self.inside[worker] / wall)
            out[names.get(worker, worker) or "driver"] = {k: round(v, 4)
                                                          for k, v in row.items()}
        return out


class Sample:
    """A sample of a run's windows' spans, for ``report.html``: at most ``keep`` windows,
    spread over the run (when it is full, every second one is dropped and from then on
    only every second window is kept, and so on)."""

    def __init__(self, keep: int = 8, max_spans: int = 4000):
        self.keep, self.max_spans = keep, max_spans
        self.windows: list[list[tuple[str, str, float, float, str]]] = []
        self.every, self.seen = 1, 0

    def add(self, groups: Iterable[Group]) -> None:
        self.seen += 1
        if (self.seen - 1) % self.every:
            return
        groups = list(groups)
        each = max(1, self.max_spans // self.keep // max(len(groups), 1))
        # a huge window: each chain's first spans
        self.windows.append(flatten((*g[:4], g[4][:each]) for g in groups))
        if len(self.windows) > self.keep:
            self.windows = self.windows[::2]
            self.every *= 2

    def record(self) -> dict[str, Any] | None:
        """The sample as ``timeline.json`` keeps it (``spans``): the windows kept, each a list
        of ``[worker, kind, start, end, key]``; None where no window reported spans."""
        if not self.windows:
            return None
        return {"columns": ["worker", "kind", "start", "end", "key"],
                "windows_seen": self.seen, "every": self.every,
                "windows": [[list(r) for r in w] for w in self.windows]}
