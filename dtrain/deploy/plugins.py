"""dtrain's plugins on a scheduler that outlives the run: removed when the last run ends.

A run registers scheduler and worker plugins on the cluster it trains on
(the live page's ``dtrain``, ``dtrain-step-timer``, ``dtrain-low-latency-*``,
``dtrain-quiet-user-errors``, ...; every name is ``dtrain`` or starts with
``dtrain-``).  On a cluster dtrain started they go with it; on a user's
scheduler (``train(client=...)``, an estimator's client, ``--scheduler-address``,
``--scheduler-file``, Dask's ``scheduler-address``) :func:`removed_after`
unregisters them when the run ends, so the user's cluster is left as it was
found: the plugins' hooks no longer run on every task transition.  Several
runs may share one scheduler at once (from several processes, or a
``GridSearchCV`` of threads): the scheduler counts the runs in progress, and
the last one to end removes the plugins.

A cluster that is dtrain's own and serves many runs (the estimators' embedded cluster:
``GridSearchCV`` fits hundreds of clones on it) is kept
(:func:`dtrain.core.broadcast.keep`): its plugins are registered by the first run and
stay; later runs neither register nor remove them (20 of the 34 scheduler round trips
of a 45 ms fit of iris).

What the plugins set while installed stays until the scheduler or a worker
restarts (README, "Python API"): the batching intervals of the
control streams (0 instead of 2-10 ms), the workers' inline executor and
allocator thresholds, the dashboard's task names and colours, and the
``/dtrain`` page, which keeps showing the last run.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

PREFIX = "dtrain"
RUNS = "_dtrain_runs"         # the scheduler's count of dtrain runs in progress


def is_dtrain(name: Any) -> bool:
    """Whether a plugin name is one of dtrain's."""
    return isinstance(name, str) and (name == PREFIX or name.startswith(PREFIX + "-"))


def _enter(dask_scheduler: Any) -> int:
    runs = getattr(dask_scheduler, RUNS, 0) + 1
    setattr(dask_scheduler, RUNS, runs)
    return runs


def _leave(dask_scheduler: Any) -> list[str] | None:
    """One run fewer; the names of dtrain's scheduler plugins if it was the last (None:
    others go on)."""
    runs = max(getattr(dask_scheduler, RUNS, 0) - 1, 0)
    setattr(dask_scheduler, RUNS, runs)
    if runs:
        return None
    return sorted(name for name in dask_scheduler.plugins if is_dtrain(name))


def _worker_plugins(dask_worker: Any) -> list[str]:
    return [name for name in dask_worker.plugins if is_dtrain(name)]


def remove(client: Any, scheduler_plugins: list[str]) -> list[str]:
    """Unregister dtrain's plugins from ``client``'s scheduler (``scheduler_plugins``) and
    workers (those any worker holds); returns the names removed."""
    removed = []
    for name in scheduler_plugins:
        with contextlib.suppress(Exception):        # already gone: nothing to do
            client.unregister_scheduler_plugin(name)
            removed.append(name)
    held = client.run(_worker_plugins, on_error="return")
    names = sorted({n for found in held.values() if isinstance(found, list) for n in found})
    for name in names:
        with contextlib.suppress(Exception):
            client.unregister_worker_plugin(name)
            removed.append(name)
    return removed


@contextlib.contextmanager
def removed_after(client: Any) -> Iterator[None]:
    """Around a run on ``client``'s scheduler: when it ends (however it ends) and no other
    dtrain run is in progress there, dtrain's plugins are unregistered from the scheduler
    and its workers.  A scheduler that has gone away is left alone."""
    client.run_on_scheduler(_enter)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            last = client.run_on_scheduler(_leave)
            if last is not None:
                remove(client, last)
