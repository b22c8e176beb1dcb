"""Tuning a cluster for short, dependent steps (``dtrain.deploy.tuning``): control streams
without batching delay, quiet worker callbacks, tasks run in a worker's event loop, and an
allocator that keeps freed memory; on real LocalClusters of worker processes."""
from __future__ import annotations

import threading

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dtrain
from dtrain.core import internals
from dtrain.deploy import tuning
from dtrain.deploy.local import local_cluster
from dtrain.taskgraph.placement import place
from dtrain.training.engines import DaskEngine, inline_kinds
from dtrain.training.plan import plan


def test_one_thread_workers_run_medium_forward_backward_inline(client):
    """The engine reads the workers' threads: on one-thread workers a 3.8 MFLOP step runs in
    the event loop; the same step on the plan alone (threads unknown) is handed to a thread."""
    p = plan(dtrain.load_config(None, ["model.layers=[4,5000,3]", "train.batch_size=64"]))
    cluster = DaskEngine(p, client).cluster     # the data and its placement
    cluster.place()
    assert cluster.inline and "forward-backward" in cluster.inline_kinds
    assert "forward-backward" not in inline_kinds(p, cluster.placement)


def test_low_latency_streams_and_timing_summary(tmp_path):
    """cluster.low_latency sets every control stream's batching interval to 0 and slows the
    workers' profiler and tick (tuning.QUIET_MS); the summary says where the time went.
    On a user's cluster the plugins go when the run ends (issue 26): what they set on the
    worker stays, a worker that joins afterwards is Dask's own."""
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        before = tuning.stream_intervals(c)
        assert min(before["workers"] + before["to-workers"]) > 0     # distributed batches
        r = dtrain.train(dtrain.load_config(None, ["train.epochs=2"]), client=c, echo=None)
        first = list(c.scheduler_info()["workers"])
        lc.scale(2)
        c.wait_for_workers(2)
        assert tuning.stream_intervals(c) == {"client": 0.0, "workers": [0.0, 0.002],
                                               "to-workers": [0.0, 0.005], "to-clients": [0.0]}
        assert tuning.callback_periods(c) == {"profile": [10.0, tuning.QUIET_MS["profile"]],
                                              "tick": [20.0, tuning.QUIET_MS["tick"]]}
        assert c.run_on_scheduler(_scheduler_tick_and_heartbeats) == (
            tuning.QUIET_MS["tick"], True)
        assert not tuning.inline_executor(c)      # the joining worker has no plugin to run
        where = {}
        for name in (tuning.INLINE, "default"):
            with dask.annotate(executor=name):
                where[name] = c.submit(_thread, pure=False, workers=first).result()
        assert where == {tuning.INLINE: "MainThread", "default": "pool"}   # loop, not a pool
        assert set(c.run(_new_mappings, workers=first).values()) == {0}   # heap, not mmap
    s = r.summary
    assert s["task_seconds"]["forward_backward"] > 0 and s["task_seconds"]["update"] > 0
    assert 0 < s["efficiency"] < 1
    assert s["step_seconds"] == pytest.approx(s["seconds"] / s["steps"])
    assert s["overhead_per_step"] == pytest.approx(s["step_seconds"] - s["compute_per_step"])
    assert set(s["worker_peak_rss_mb"]) == {"0"} and s["driver_peak_rss_mb"] > 10


def _scheduler_tick_and_heartbeats(dask_scheduler) -> tuple[float | None, bool]:
    handler = dask_scheduler.handlers["heartbeat_worker"]
    return internals.callback_ms(dask_scheduler, "tick"), internals.unwrapped(handler) is not handler


def _new_mappings() -> int:
    """Memory mappings a fresh 4 MiB array adds to this process (0: it came from the heap)."""
    def count() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    np.ones(1 << 19).sum()                  # the heap may grow once
    before = count()
    a = np.ones(1 << 19)                    # 4 MiB, above glibc's default 128 KiB threshold
    after = count()
    del a
    return after - before


def _mapped_while_held(mib: int) -> float | None:
    """MiB that glibc has mapped outside its heaps while this task holds a fresh ``mib`` MiB
    array (``mallinfo2().hblkhd``); None without glibc 2.33+."""
    from helpers.memory import mallinfo2

    if mallinfo2() is None:
        return None
    a = np.ones(mib << 17)                                   # mib MiB of float64
    held = mallinfo2().hblkhd / 2**20
    del a
    return held


@pytest.mark.slow
def test_workers_take_a_full_batchs_arrays_from_the_heap(monkeypatch):
    """dtrain's local workers start with glibc settings under which a 200 MiB array made in a
    task thread comes from the reusable heap (no fresh page-faulting mapping each step), where
    Dask's defaults map it afresh."""
    ours = dtrain.load_config(None, ["cluster.workers=1", "cluster.dashboard_address=''"])
    clusters = {"dask": lambda: LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                             dashboard_address=None),
                "dtrain": lambda: local_cluster(ours.cluster)}
    mapped = {}
    for name, make in clusters.items():
        for var in tuning.ALLOCATOR_ENV:    # a nanny leaves what it set in this process's
            monkeypatch.delenv(var, raising=False)     # environment, which outranks config
        with make() as lc, Client(lc) as c:
            mapped[name] = c.submit(_mapped_while_held, 200, pure=False).result()
    if mapped["dask"] is None:
        pytest.skip("no glibc 2.33+ (mallinfo2) here")
    assert mapped["dask"] >= 200 and mapped["dtrain"] < 200, mapped


def _thread() -> str:
    """'MainThread' where a worker's event loop runs; 'pool' in its executor's threads."""
    from distributed import get_worker
    get_worker()                          # a task run inline still sees its worker
    name = threading.current_thread().name
    return name if name == "MainThread" else "pool"


def test_short_tasks_run_in_the_event_loop():
    """Reduces and updates of a small state run inline; forward-backward tasks too while a
    task's step (all the shards it computes) stays under INLINE_MAX_FLOPS, or under
    INLINE_ALONE_FLOPS where every worker has one thread; nothing does for a state over 1 MiB."""
    small = ("update", "reduce", "kept", "state")     # and the state's hand-over, each window

    def kinds(*sets):
        return inline_kinds(plan(dtrain.load_config(None, list(sets))))
    assert kinds() == (*small, "forward-backward")                      # iris: 131 params
    wide = "model.layers=[4,5000,3]"                                     # 40k params, 320 KB
    assert kinds(wide) == (*small, "forward-backward")                  # 4 rows: 1 MFLOP
    assert kinds(wide, "train.batch_size=64") == small                  # 16 rows: 4 MFLOP
    assert kinds("model.layers=[4,40000,3]") == ()                       # a 2.6 MB state
    # one thread per worker: the task runs alone anyway, so up to 200 MFLOP go inline
    for batch, threads, fb in ((64, 1, True), (1024, 1, True), (4096, 1, False), (64, 2, False),
                               (64, None, False)):
        p = plan(dtrain.load_config(None, [wide, f"train.batch_size={batch}"]))  # 4 shards
        assert inline_kinds(p, None, threads) == \
            (*small, *(("forward-backward",) if fb else ())), (batch, threads)
    assert inline_kinds(plan(dtrain.load_config(None, ["model.layers=[4,40000,3]"])),
                        None, 1) == ()
    # a worker's shards in one task count together: 4 shards of 4 rows on one worker
    four = [wide, "data.shards=4", "train.batch_size=16"]
    for fuse, fb in (("true", ()), ("false", ("forward-backward",))):
        p = plan(dtrain.load_config(None, [*four, f"graph.fuse_shards={fuse}"]))
        assert inline_kinds(p, place(["w"], 4)) == (*small, *fb)
        assert inline_kinds(p, place(["a", "b", "c", "d"], 4)) == (*small, "forward-backward")


def test_low_latency_falls_back_when_distributed_changes():
    """Where a stream has no numeric ``interval`` or a worker no ``executors`` (another
    distributed), nothing is touched."""
    class Stream:
        pass
    tuning.LowLatencyWorker().setup(Stream())      # no batched_stream, executors, callbacks
    assert internals.slow_callback(Stream(), "tick", 250.0) is False
    assert internals.set_batch_interval(None, 0.0) is False
    assert internals.set_batch_interval(Stream(), 0.0) is False
    s = Stream()
    s.interval = "5ms"
    assert internals.set_batch_interval(s, 0.0) is False and s.interval == "5ms"
    s.interval = 0.005
    assert internals.set_batch_interval(s, 0.0) is True and s.interval == 0.0


def test_a_runs_nannies_wake_the_driver_seldom(tmp_path):
    """On a LocalCluster the nannies live in the driver's process: once a run registered
    its plugins, each nanny's tick, memory check, system monitor, tick cycle and counters'
    shift run at QUIET_NANNY_MS, not distributed's 20, 100, 500, 1,000 and 5,000 ms (and
    the worker still has its nanny)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        before = {n: cb.callback_time for nanny in lc.workers.values()
                  for n, cb in nanny.periodic_callbacks.items()}
        dtrain.train(dtrain.load_config(None, ["train.epochs=1"]), client=c,
                     out=tmp_path / "r", echo=None)
        after = [{n: nanny.periodic_callbacks[n].callback_time for n in tuning.QUIET_NANNY_MS}
                 for nanny in lc.workers.values()]
    assert before["tick"] == 20 and before["memory_monitor"] == 100
    assert before["ticks"] == 1000 and before["shift_counters"] == 5000
    assert after == [tuning.QUIET_NANNY_MS] * 2
