"""distributed's internals that dtrain relies on (:mod:`dtrain.core.internals`) are still there.

Each check fails when the installed distributed changes one of them, so the change is seen
here first, rather than as a slower or plainer run (the functions themselves fall back to
doing nothing).
"""
from __future__ import annotations

import asyncio
import contextvars
import importlib
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from distributed import Client, Scheduler, Worker

from dtrain.core import internals, keys


def _run(coro):
    return asyncio.run(coro)


def test_control_streams_have_a_numeric_batching_interval():
    async def check():
        async with Scheduler(port=0, dashboard=False) as s, \
                Worker(s.address, nthreads=2) as w, \
                Client(s.address, asynchronous=True) as c:
            streams = [internals.client_stream(c), internals.worker_stream(w),
                       *internals.scheduler_streams(s, "workers").values(),
                       *internals.scheduler_streams(s, "clients").values()]
            assert len(streams) == 4
            for stream in streams:
                assert isinstance(internals.batch_interval(stream), float)
                assert internals.set_batch_interval(stream, 0.0)
                assert internals.batch_interval(stream) == 0.0
            assert internals.worker_threads(w) == 2
            assert internals.add_worker_handler(w, "dtrain_test", lambda: "ok")
            assert await s.broadcast(msg={"op": "dtrain_test"}) == {w.address: "ok"}
            info = await c.scheduler.identity(n_workers=-1)
            assert list(info["workers"]) == [w.address]
    _run(check())


def test_a_workers_profiler_and_tick_are_periodic_callbacks_in_ms():
    """(10): the callbacks that wake a worker's event loop, and their periods from config."""
    async def check():
        async with Scheduler(port=0, dashboard=False) as s, Worker(s.address) as w:
            assert internals.callback_ms(w, "profile") == 10.0     # distributed's defaults
            assert internals.callback_ms(w, "tick") == 20.0
            assert internals.slow_callback(w, "profile", 100.0)
            assert internals.callback_ms(w, "profile") == 100.0
            assert internals.slow_callback(w, "profile", 50.0)      # never made faster
            assert internals.callback_ms(w, "profile") == 100.0
            assert internals.slow_callback(w, "no-such-callback", 100.0) is False
            assert internals.callback_ms(w, "no-such-callback") is None
    _run(check())


def test_get_worker_reads_the_context_variable_an_inline_executor_sets():
    from distributed import get_worker

    current = internals.worker_context()
    assert isinstance(current, contextvars.ContextVar)

    async def check():
        async with Scheduler(port=0, dashboard=False) as s, Worker(s.address) as w:
            token = current.set(w)
            try:
                assert get_worker() is w
            finally:
                current.reset(token)
            assert internals.add_executor(w, "dtrain-test", ThreadPoolExecutor(1))
            assert internals.has_executor(w, "dtrain-test")
    _run(check())


def test_distributed_modules_hold_their_own_key_split_and_color_of():
    for module in internals.KEY_SPLIT_USERS:
        assert callable(getattr(importlib.import_module(module), "key_split")), module
    for module, attr in internals.COLOR_OF_USERS:
        assert callable(getattr(importlib.import_module(module), attr)), (module, attr)
    wrapped = internals.relabel_tasks(keys.kind_of, keys.COLORS)
    assert len(wrapped) == len(internals.KEY_SPLIT_USERS) + len(internals.COLOR_OF_USERS)
    from distributed.diagnostics import task_stream
    assert task_stream.key_split("reduce-3-1-0-ab12cd34") == "reduce"
    assert task_stream.color_of("update") == keys.COLORS["update"]
    assert task_stream.key_split("x-1") == internals.unwrapped(task_stream.key_split)("x-1")


def test_the_dashboard_takes_a_page_in_its_template():
    pytest.importorskip("bokeh")

    def make_doc(scheduler, extra, doc):
        from bokeh.models import Div

        class Page:
            def update(self):
                pass
        doc.add_root(Div(text="dtrain test page"))
        internals.style_dashboard_doc(doc, Page(), 500, "t", '{% extends "simple.html" %}',
                                      extra)

    async def check():
        async with Scheduler(port=0, dashboard=True, dashboard_address=":0") as s:
            assert internals.add_dashboard_page(s, "/dtrain-test", make_doc, "dtrain-test")
            from distributed.dashboard import scheduler as dashboard
            assert "dtrain-test" in dashboard.template_variables(s)["pages"]
    _run(check())


def test_an_event_logged_soon_reaches_the_scheduler_in_order(client):
    """log_event_soon queues Client.log_event's rpc on the client's loop instead of waiting:
    the events arrive, and a burst of them arrives in the order sent."""
    topic = "dtrain-internals-soon"
    assert all(internals.log_event_soon(client, topic, {"n": n}) for n in range(20))
    deadline = time.monotonic() + 10
    while len(client.get_events(topic)) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m["n"] for _, m in client.get_events(topic)] == list(range(20))


def _add_handler(dask_scheduler) -> None:
    got = dask_scheduler._dtrain_test_calls = []
    dask_scheduler.handlers["dtrain_test"] = lambda **kwargs: got.append(kwargs)


def _calls(dask_scheduler) -> list:
    return dask_scheduler._dtrain_test_calls


def test_a_handler_called_soon_reaches_the_scheduler_in_order(client):
    """call_scheduler_soon queues a call of a handler a plugin added (Server.handlers) on
    the client's loop: the calls arrive with their nested data, in the order sent; a
    handler the scheduler does not have is no error."""
    client.run_on_scheduler(_add_handler)
    groups = [["w", 1.5, 2.5, {"update": 0.25}, [["update-0-r", "update", 1.5, 1.75]]]]
    assert internals.call_scheduler_soon(client, "dtrain_not_there", run="r")
    assert all(internals.call_scheduler_soon(client, "dtrain_test", n=n, groups=groups)
               for n in range(10))
    deadline = time.monotonic() + 10
    while len(client.run_on_scheduler(_calls)) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    calls = client.run_on_scheduler(_calls)
    assert [c["n"] for c in calls] == list(range(10))
    assert [list(g) for g in calls[0]["groups"]][0][3] == {"update": 0.25}


def test_the_progress_panel_is_drawn_by_progress_quads():
    pytest.importorskip("bokeh")
    from distributed.dashboard.components import scheduler as components
    assert callable(components.progress_quads)
    assert internals.add_progress_rows(dict) == \
        "distributed.dashboard.components.scheduler.progress_quads"


def _one(x: int) -> int:
    return x + 1


def test_a_task_stranded_by_its_only_worker_runs_on_the_next_one():
    """(9) A task pinned to a worker with allow_other_workers, lost with it while no other
    worker runs, waits as no-worker; the scheduler's unrunnable tasks, their loose
    restrictions, its transitions and the event of a worker that starts running are what
    StrandedTasks uses to send it to the worker that joins next (distributed offers it
    only the tasks it is a valid worker of)."""
    from dtrain.deploy.workers import StrandedTasks

    async def check():
        async with Scheduler(port=0, dashboard=False) as s, \
                Client(s.address, asynchronous=True) as c:
            await c.register_plugin(StrandedTasks())
            first = await Worker(s.address, nthreads=1)
            x = c.submit(_one, 1, workers=[first.address], allow_other_workers=True)
            assert await x == 2
            await first.close()
            deadline = time.monotonic() + 10
            while not s.unrunnable and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            (stranded,) = s.unrunnable
            assert stranded.key == x.key and stranded.loose_restrictions
            assert internals.starts_running({"action": "worker-status-change",
                                             "status": "running"})
            async with Worker(s.address, nthreads=1):
                assert await asyncio.wait_for(x, 10) == 2
    _run(check())


def test_tasks_waiting_on_nothing_that_runs_are_stalled_and_a_running_one_is_not():
    """(13) The scheduler's tasks, their state and dependencies: a task pinned to a worker
    that is not there (no-worker), and one that waits on it, are stalled; a task that runs
    (processing), or one that waits on it, is not; done tasks are not listed."""
    async def check():
        async with Scheduler(port=0, dashboard=False) as s, \
                Client(s.address, asynchronous=True) as c, Worker(s.address, nthreads=1):
            done = c.submit(_one, 1)
            assert await done == 2
            lost = c.submit(_one, 1, workers=["tcp://127.0.0.1:9"], allow_other_workers=False,
                            pure=False)
            after = c.submit(_one, lost, pure=False)
            slow = c.submit(time.sleep, 3, pure=False)
            later = c.submit(_one, slow, pure=False)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not (
                    getattr(s.tasks.get(lost.key), "state", None) == "no-worker"
                    and getattr(s.tasks.get(slow.key), "state", None) == "processing"
                    and later.key in s.tasks and after.key in s.tasks):
                await asyncio.sleep(0.01)
            assert internals.stalled_tasks([after.key, done.key], s) == {
                after.key: "waiting", lost.key: "no-worker"}
            assert internals.stalled_tasks([later.key], s) == {}
            assert internals.stalled_tasks([done.key], s) == {}
            assert internals.stalled_tasks([after.key], None) is None
    _run(check())


def test_a_copy_a_run_made_is_dropped_and_the_last_copy_never():
    """(11) The scheduler's request_remove_replicas and its tasks' who_has: the copy on the
    worker named goes, the worker of origin keeps its own, and a key held once stays."""
    async def check():
        async with Scheduler(port=0, dashboard=False) as s, \
                Worker(s.address, nthreads=1) as a, Worker(s.address, nthreads=1) as b, \
                Client(s.address, asynchronous=True) as c:
            x = await c.scatter(b"x" * 1000, workers=[a.address])
            alone = await c.scatter(b"y" * 10, workers=[a.address])
            await c.replicate([x], workers=[a.address, b.address])
            assert len(s.tasks[x.key].who_has) == 2
            asked = await c.run_on_scheduler(internals.drop_copies,
                                             [(x.key, b.address), (alone.key, a.address)])
            assert asked == 1
            deadline = time.monotonic() + 10
            while x.key in b.data and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert x.key not in b.data and x.key in a.data and alone.key in a.data
            assert {ws.address for ws in s.tasks[x.key].who_has} == {a.address}
    _run(check())


def test_heartbeats_are_asked_for_at_most_so_many_a_second_and_never_more_often():
    """(14): the heartbeat reply's interval is what a worker waits before its next one;
    wrapped, one worker at 0.5 a second is asked every 2 s (distributed: 0.5 s), and the
    cap, distributed's own longer interval and the scheduler's worker-ttl all hold."""
    async def check(per_second: float, most_s: float, ttl: str | None = None) -> float:
        async with Scheduler(port=0, dashboard=False, worker_ttl=ttl) as s, \
                Worker(s.address) as w:
            await w.heartbeat()
            assert w.periodic_callbacks["heartbeat"].callback_time == 500.0    # distributed's
            assert internals.fewer_heartbeats(s, per_second, most_s)
            assert internals.fewer_heartbeats(s, per_second, most_s)   # wrapped once
            assert getattr(internals.unwrapped(s.handlers["heartbeat_worker"]),
                           "__self__", None) is s
            await w.heartbeat()
            return w.periodic_callbacks["heartbeat"].callback_time
    assert _run(check(0.5, 10.0)) == 2000.0
    assert _run(check(0.5, 1.5)) == 1500.0          # at most most_s
    assert _run(check(100.0, 10.0)) == 500.0        # never more often than distributed asks
    assert _run(check(0.5, 10.0, "2s")) == 1000.0   # a fifth of max(ttl, 10 x 0.5 s)
    assert _run(check(0.5, 10.0, "20s")) == 2000.0

    class NoHandlers:
        pass
    assert internals.fewer_heartbeats(NoHandlers(), 16.0, 10.0) is False
