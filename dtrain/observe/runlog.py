"""What the scheduler remembers of a run: its events and task records, bounded.

A :class:`RunLog` per run is kept by the scheduler plugin
(:mod:`dtrain.observe.live`) and read by the ``/dtrain`` page, the Prometheus
gauges and, at the end of a run, ``timeline.json``.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from dtrain.core import keys
from dtrain.observe import spans as spanlib

KEEP_RUNS = 5            # runs remembered by the scheduler plugin
STEP_POINTS = 20_000     # step events kept per run
EPOCH_ROWS = 20_000      # epoch rows kept per run (the newest)
TIMELINE_LIMIT = 20_000  # task records kept per run (the newest)
BUSY_WINDOW = 10.0       # seconds over which busy vs idle is measured
SPAN_SECONDS = 2.0       # the spans the page shows: the last this many seconds of them ...
SPAN_ROWS = 20_000       # ... at most this many kept per run (the newest)
WINDOW_RECORDS = 4_096   # windows' timings kept per run, for busy vs idle


class StepRate:
    """Samples per second over the last ``span`` ``step`` events of one run."""

    def __init__(self, train_samples: int, span: int = 10):
        self.train_samples = train_samples
        self.points: deque[tuple[float, int]] = deque(maxlen=span + 1)

    def add(self, msg: dict[str, Any]) -> float | None:
        self.points.append((msg["t"], (msg["epoch"] - 1) * self.train_samples + msg["seen"]))
        (t0, n0), (t1, n1) = self.points[0], self.points[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None


class RunLog:
    """What the scheduler remembers of one run; every list is bounded."""

    def __init__(self, run: str):
        self.run = run
        self.meta: dict[str, Any] = {}
        self.steps: deque[dict[str, Any]] = deque(maxlen=STEP_POINTS)
        self.steps_seen = 0                        # step events ever received
        self.epochs: deque[dict[str, Any]] = deque(maxlen=EPOCH_ROWS)
        self.epochs_seen = 0                       # epoch rows ever received
        self.tasks: deque[tuple] = deque(maxlen=TIMELINE_LIMIT)
        self.tasks_seen = 0
        self.finished = False
        self._rate = StepRate(1)
        # the chains' own timings (spanlib): each chain run's (worker, start, end, shares),
        # and its spans (worker, kind, start, end, key)
        self.windows: deque[tuple[str, float, float, dict[str, float]]] = \
            deque(maxlen=WINDOW_RECORDS)
        self.spans: deque[tuple[str, str, float, float, str]] = deque(maxlen=SPAN_ROWS)
        self.spans_seen = 0                         # groups of spans ever received
        self.spans_end = 0.0                        # the latest end of a window among them
        self.spans_start: float | None = None       # the earliest start (the first window's)

    def on_event(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        if kind == "start":
            self.meta = dict(msg)
            self._rate = StepRate(int(msg.get("train_samples") or 1))
        elif kind == "step":
            self.steps.append({**msg, "rate": self._rate.add(msg)})
            self.steps_seen += 1
        elif kind == "epoch":
            self.epochs.append(dict(msg))
            self.epochs_seen += 1
        elif kind == "end":
            self.finished = True

    def on_task(self, key: str, kwargs: dict[str, Any]) -> None:
        """Keep a finished task's compute and transfer intervals."""
        worker, thread = kwargs.get("worker"), kwargs.get("thread")
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") in ("compute", "transfer"):
                self.tasks.append((key, worker, thread, ss["action"], ss["start"], ss["stop"]))
        self.tasks_seen += 1

    def on_spans(self, groups: list) -> None:
        """Keep the spans and timings of a window's chains (:mod:`dtrain.observe.spans`)."""
        for worker, a, b, seconds, rows in groups:
            self.windows.append((worker, a, b, spanlib.shares(seconds)))
            self.spans.extend((worker, spanlib.kind_of(kind), x, y, key)
                              for key, kind, x, y in rows)
            self.spans_end = max(self.spans_end, b)
            self.spans_start = a if self.spans_start is None else min(self.spans_start, a)
        self.spans_seen += 1

    def recent_spans(self, seconds: float = SPAN_SECONDS, limit: int = 5_000
                     ) -> list[tuple[str, str, float, float, str]]:
        """The spans of the last ``seconds`` before the latest window's end, oldest first
        (as they arrived: by window, each worker's in turn); of more than ``limit``, those of
        every k-th step."""
        lo, out = self.spans_end - seconds, []
        for row in reversed(self.spans):    # by window, each worker's spans in turn
            if row[2] < lo - 60.0:
                break
            if row[3] >= lo:
                out.append(row)
        out.reverse()
        if len(out) <= limit:
            return out
        every = -(-len(out) // max(limit, 1))       # more: every k-th step of each worker's
        steps: dict[str, int] = {}                  # (a step ends with its update)
        kept = []
        for row in out:
            at = steps.get(row[0], 0)
            if not at % every:
                kept.append(row)
            steps[row[0]] = at + (row[1] == "update")
        return kept if len(kept) <= 2 * limit else kept[::every]

    @property
    def last_step(self) -> dict[str, Any] | None:
        return self.steps[-1] if self.steps else None

    def busy(self, now: float, nthreads: dict[str, int],
             window: float = BUSY_WINDOW) -> dict[str, dict[str, float]]:
        """Per worker, the fraction of ``window`` seconds spent in each kind of work; ``idle``
        is the rest.  Where windows ran as a task per worker and sent their timings
        (:meth:`on_spans`): the ``window`` seconds before the latest window's end (but not
        before the first window's start), from the
        chains' own timings (:func:`dtrain.observe.spans.busy`); else from the scheduler's
        records of finished tasks, each task type's share (times threads) or receiving
        data (:meth:`task_busy`)."""
        if self.windows:
            hi = min(now, self.spans_end)
            lo = max(hi - window, self.spans_start or 0.0)    # not before the first window
            recent = []
            for record in reversed(self.windows):   # they arrive by window: stop well before
                if record[2] < lo - 60.0:
                    break
                recent.append(record)
            return spanlib.busy(recent, nthreads, lo, hi)
        return self.task_busy(now, nthreads, window)

    def task_busy(self, now: float, nthreads: dict[str, int],
                  window: float = BUSY_WINDOW) -> dict[str, dict[str, float]]:
        """Busy vs idle from the scheduler's task records (see :meth:`busy`)."""
        lo = now - window
        out = {w: {} for w in nthreads}
        for key, worker, _, action, start, stop in reversed(self.tasks):
            if stop < lo - 60:          # records arrive roughly in order; stop scanning
                break
            if worker not in out or stop <= lo:
                continue
            kind = keys.family(keys.kind_of(key)) if action == "compute" else "transfer"
            share = (min(stop, now) - max(start, lo)) / (window * nthreads[worker])
            out[worker][kind] = out[worker].get(kind, 0.0) + max(share, 0.0)
        for shares in out.values():
            shares["idle"] = max(0.0, 1.0 - sum(shares.values()))
        return out

    def timeline(self, workers: dict[str, str]) -> dict[str, Any]:
        """The kept task records, as written to ``timeline.json``."""
        return {"run": self.run, "tasks_seen": self.tasks_seen, "limit": TIMELINE_LIMIT,
                "workers": workers,
                "columns": ["key", "worker", "thread", "action", "start", "stop"],
                "rows": [list(r) for r in self.tasks]}
