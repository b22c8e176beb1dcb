"""The workers a client sees: waiting for them, and listing them in a fixed order."""
from __future__ import annotations

import threading
import time
from typing import Any

from distributed import Client, Future, SchedulerPlugin

from dtrain.core import internals
from dtrain.core.errors import UserError
from dtrain.deploy.p2p import Broken


class WorkerLeft(Broken):
    """A worker that the awaited tasks were placed on left the cluster: the window runs
    again from its start, on the workers there now (as when a peer of a window that spans
    workers is lost)."""


class Stalled(Broken):
    """The awaited tasks waited on something no worker was doing for the whole timeout
    (a task left ``no-worker`` or ``queued`` after its worker was lost): the window runs
    again from its start, as when a worker left."""


def wait_for_workers(client: Client, n: int, timeout: float, after: str | None = None) -> None:
    """Block until ``n`` workers are connected, or raise a UserError saying how many came.

    ``after`` (mid-run: what becomes of the checkpoint) ends the message; a run left with
    no worker at all says so as ``gather`` does."""
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError:
        found = len(internals.scheduler_workers(client))
        if after is not None and not found:
            raise _none_left(timeout, after) from None
        raise UserError(f"needs {n} Dask worker(s), found {found} after {timeout:g} s; start more "
                        f"workers or lower the count{after or ''}") from None


def present(client: Client, n: int, timeout: float, after: str | None = None,
            left_out: frozenset[str] | set[str] = frozenset()) -> dict[str, dict]:
    """``{address: info}`` of the workers there now (:func:`workers`, less ``left_out``:
    workers that stopped answering), once at least ``n`` are: what a placement is made over.

    The list counted is the list returned: a worker that leaves between a wait and a list
    cannot leave a placement with none.  Too few is waited for, up to ``timeout`` seconds
    (every worker gone mid-run is a fault like a worker lost at any other instant), then it
    is a UserError in one line, as :func:`wait_for_workers` says it; too few because of
    ``left_out`` says so at once."""
    deadline = time.monotonic() + timeout
    while True:
        listed = workers(client)
        there = {a: i for a, i in listed.items() if a not in left_out}
        if len(there) >= n:
            return there
        if len(listed) >= n:
            raise UserError(f"the run needs {n} worker(s) that answer; {len(left_out)} "
                            f"stopped answering mid-run (left out: "
                            f"{', '.join(sorted(left_out))})")
        if time.monotonic() >= deadline:
            if after is not None and not listed:
                raise _none_left(timeout, after)
            raise UserError(f"needs {n} Dask worker(s), found {len(listed)} after {timeout:g} s; "
                            f"start more workers or lower the count{after or ''}")
        time.sleep(0.1)


def _none_left(timeout: float, after: str) -> UserError:
    return UserError(f"every Dask worker left the cluster and none joined within {timeout:g} s "
                     f"(cluster.timeout){after}")


def gather(client: Client, futures: list[Future], timeout: float, after: str = "",
           needs: frozenset[str] = frozenset(), watch: list[Future] = (),
           stalls: bool = False) -> list:
    """``client.gather(futures)``, except that a cluster left with no worker for ``timeout``
    seconds raises a UserError (``after`` ends its message) instead of waiting for ever:
    the scheduler keeps tasks that no worker can run until one comes, and none may.  That
    holds while the values are fetched too: if the last workers leave once the futures are
    done, their data is lost, and ``client.gather`` would wait for it to be made again.  So
    the gather runs in a thread of its own while this one watches the workers (if it gives
    up, that thread ends once the caller releases the futures).  A worker of ``needs``
    (where the tasks were placed) that has left raises :class:`WorkerLeft`: distributed
    would run the lost tasks again, and a window's tasks take a state that was kept on the
    lost worker.  A future of ``watch`` that failed raises its error: a window's task per
    worker that failed (its worker lost, run again elsewhere and found misplaced) fails the
    window even before the tasks that wait for it do.  With ``stalls`` (a window's wait),
    tasks that wait for ``timeout`` seconds on something no worker is doing
    (:func:`~dtrain.core.internals.stalled_tasks`) raise :class:`Stalled`: the scheduler
    would keep them so for ever."""
    got: dict[str, object] = {}
    fetched = threading.Event()

    def fetch() -> None:
        try:
            got["values"] = client.gather(futures)
        except BaseException as exc:            # raised in the caller's thread below
            got["error"] = exc
        finally:
            fetched.set()

    threading.Thread(target=fetch, name="dtrain-gather", daemon=True).start()
    alone: float | None = None                      # since when no worker has been there
    idle: float | None = None                       # ... nothing of the tasks has run
    keys = [f.key for f in (*futures, *watch)] if stalls else []
    while not fetched.wait(min(timeout, 1.0)):
        there = internals.scheduler_workers(client)
        gone = sorted(needs - there.keys())
        if gone:
            raise WorkerLeft(f"worker {', '.join(gone)} left")
        failed = next((f for f in watch if f.status == "error"), None)
        if failed is not None:
            raise failed.exception()
        stalled = client.run_on_scheduler(internals.stalled_tasks, keys) if keys and there \
            else None
        if not stalled:
            idle = None
        elif idle is None:
            idle = time.monotonic()
        elif time.monotonic() - idle >= timeout:
            states = ", ".join(f"{k} {v}" for k, v in sorted(stalled.items())[:3])
            raise Stalled(f"its tasks waited {timeout:g} s with none of them running "
                          f"({states}{', ...' if len(stalled) > 3 else ''})")
        if there:
            alone = None
        elif alone is None:
            alone = time.monotonic()
        elif time.monotonic() - alone >= timeout:
            raise _none_left(timeout, after)
    if "error" in got:
        raise got.pop("error")
    return got["values"]  # type: ignore[return-value]


def _natural(name: object) -> tuple:
    text = str(name)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def worker_addresses(client: Client) -> list[str]:
    """Addresses of the connected workers, ordered by worker name (0, 1, 2, ... for
    LocalCluster and dask-mpi ranks)."""
    return list(workers(client))


def workers(client: Client) -> dict[str, dict]:
    """``{address: info}`` of the connected workers, ordered by worker name."""
    info = internals.scheduler_workers(client)
    return {a: info[a] for a in sorted(info, key=lambda a: _natural(info[a].get("name", a)))}


def free_memory(client: Client) -> dict[str, float]:
    """``{address: bytes}`` each worker may still take before its memory limit, as the
    scheduler last heard (the limit less the process's memory); a worker without a limit is
    left out (no bound known)."""
    out = {}
    for a, i in workers(client).items():
        limit, used = i.get("memory_limit") or 0, (i.get("metrics") or {}).get("memory") or 0
        if limit:
            out[a] = float(max(0, limit - used))
    return out


def _nothing() -> None:
    return None


def round_trip(client: Client, repeats: int = 5) -> float:
    """Median seconds for a task that does nothing to go to a worker and its result back: a
    step's cost per hop between workers, as this cluster pays it."""
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.submit(_nothing, pure=False).result()
        took.append(time.perf_counter() - start)
    return sorted(took)[len(took) // 2]


def _known(dask_scheduler, names: list[str]) -> bool:
    return any(k in dask_scheduler.tasks for k in names)


def forgotten(client: Client, names: list[str], timeout: float) -> None:
    """Wait until the scheduler has forgotten the tasks ``names`` (their futures released or
    cancelled) and this client has heard all it said of them, so that a graph of the same
    keys is a new graph, not their old (failed, cancelled) outcome.

    The scheduler answers a cancel on the client's stream ("cancelled-keys"); the check
    here, a call of its own, can overtake that answer, which arriving late would cancel
    the new graph's futures of the same keys.  A task sent after it comes back on the same
    stream after it: once its result is here, so is the answer (with no worker to run it,
    the next gather says so)."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_known, names=names) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        client.submit(_nothing, pure=False).result(timeout=timeout)
    except TimeoutError:
        pass


class StrandedTasks(SchedulerPlugin):
    """When a worker joins or starts running, the tasks that may run on any worker but wait
    as ``no-worker`` go to the workers (:func:`~dtrain.core.internals.schedule_stranded`):
    a cluster's only worker, lost and started again by its nanny, would otherwise never get
    the tasks that were pinned to the one lost (a run's data, its held-out splits)."""

    name = "dtrain-stranded-tasks"
    idempotent = True           # a second engine on the scheduler: the one there serves

    def __init__(self) -> None:
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def add_worker(self, scheduler: Any, worker: str) -> None:
        internals.schedule_stranded_soon(scheduler)

    def log_event(self, topic: str, msg: Any) -> None:
        if self.scheduler is not None and internals.starts_running(msg):
            internals.schedule_stranded_soon(self.scheduler)
