"""Nothing outlives a run or a window: the scheduler forgets finished tasks, the workers
hold only the live window's data, and memory does not grow with runs or steps."""
from __future__ import annotations

import gc
import math
import time

import dask
import pytest
from distributed import Client, LocalCluster, get_task_stream

import dtrain
from dtrain.deploy.workers import gather


def _worker_memory() -> tuple[int, float, float | None]:
    """This worker's (Python objects, RSS in MB, heap in use in MB), after a collection.

    The heap in use (glibc's ``mallinfo2``: allocated chunks plus mmapped blocks) counts
    live allocations only, so unlike the RSS it does not move with what the allocator keeps
    after a free (dtrain's workers keep freed memory); None where there is no glibc 2.33+.
    """
    import gc

    import psutil

    from helpers.memory import mallinfo2

    gc.collect()
    info = mallinfo2()
    heap = None if info is None else (info.uordblks + info.hblkhd) / 2**20
    return len(gc.get_objects()), psutil.Process().memory_info().rss / 2**20, heap


def _forget_task_names() -> None:
    """Empty dask's ``key_split`` cache: an LRU cache of 100,000 task keys that every key a
    worker sees passes through.  dtrain's keys are unique per step and run, so it fills by a
    few keys per step (about 1.6 MB per 1000 steps on these workers) up to its bound of some
    25 MB; emptied before each measurement, it does not read as growth."""
    from dask.utils import key_split
    key_split.cache_clear()


def _cluster_load(c) -> tuple[int, int, float, int, float | None]:
    """(tasks the scheduler knows, keys held by workers, largest worker RSS in MB, most
    Python objects in a worker, largest worker heap in use in MB)."""
    tasks = c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    held = sum(c.run(lambda dask_worker: len(dask_worker.data)).values())
    memory = list(c.run(_worker_memory).values())
    heaps = [m[2] for m in memory]
    return (tasks, held, max(m[1] for m in memory), max(m[0] for m in memory),
            None if None in heaps else max(heaps))


def _settled(c, timeout=5.0) -> tuple[int, int, float, int, float | None]:
    deadline = time.time() + timeout
    while True:
        c.run(_forget_task_names)
        load = _cluster_load(c)
        if load[:2] == (0, 0) or time.time() > deadline:
            return load
        time.sleep(0.05)


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_long_wait_leaves_no_futures_for_the_garbage_collector(client):
    """A window that takes longer than gather's one-second poll: once the driver drops its
    futures, the scheduler forgets the tasks at once, with the garbage collector off (a
    polled ``distributed.wait`` left them in a reference cycle of its TimeoutError, and a
    CI soak run saw a whole window of tasks outlive the run)."""
    futures = [client.submit(_sleep, 1.6, pure=False) for _ in range(2)]
    keys = {f.key for f in futures}
    gc.disable()
    try:
        assert gather(client, futures, timeout=30) == [1.6, 1.6]
        del futures
        deadline = time.time() + 5
        while time.time() < deadline and keys & set(client.run_on_scheduler(_scheduler_keys)):
            time.sleep(0.05)
        assert not keys & set(client.run_on_scheduler(_scheduler_keys))
    finally:
        gc.enable()


def _scheduler_keys(dask_scheduler) -> list:
    return list(dask_scheduler.tasks)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


LONG_SOAK = ["train.batch_size=4", "graph.window=50", "optim.lr=0.01", "data.shards=4"]


SHORT_RUNS = 15


@pytest.fixture
def unlogged_client():
    """Two workers that keep none of distributed's bounded logs (state-machine, stimulus and
    transfer logs, 1000 entries each; log records, 10,000): how fast those fill depends on
    the machine's load (work stealing on a busy machine adds transfers and their events),
    and until full they read as a few hundred objects of growth per run."""
    quiet = {"distributed.admin.low-level-log-length": 0, "distributed.admin.log-length": 0}
    with dask.config.set(quiet), LocalCluster(n_workers=2, threads_per_worker=1,
                                              processes=True, dashboard_address=None) as lc, \
            Client(lc) as c:
        yield c


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_soak_many_short_runs_and_long_runs(unlogged_client, capsys):
    """Nothing accumulates across runs or across steps: the scheduler forgets finished windows,
    workers hold only the live window's data, and memory does not grow with steps.

    Figures are taken after a warm-up (imports, caches), on workers that keep no logs of
    distributed's (see ``unlogged_client``); per-step growth is the median over three
    repeats, each comparing a run of L steps with one of 3L steps."""
    client = unlogged_client
    short = dtrain.load_config(None, ["train.epochs=2", "graph.window=5"])
    for _ in range(6):                                     # imports, caches
        dtrain.train(short, client=client, echo=None)
    _, _, rss0, objects0, _ = before = _settled(client)
    per_run = []
    for _ in range(SHORT_RUNS):
        dtrain.train(short, client=client, echo=None)
        tasks, held, rss, objects, _ = after = _settled(client)
        assert (tasks, held) == (0, 0)                     # every future released
        per_run.append(after[3] - before[3])
        before = after
    runs_growth, runs_objects = rss - rss0, objects - objects0

    def long_run(epochs: int, samples: list | None = None) -> tuple[int, tuple]:
        cfg = dtrain.load_config(None, LONG_SOAK + [f"train.epochs={epochs}"])
        echo = None if samples is None else (lambda line: samples.append(_cluster_load(client))
                                             if line.startswith("epoch") else None)
        r = dtrain.train(cfg, client=client, echo=echo)
        load = _settled(client)
        assert load[:2] == (0, 0)
        return r.summary["steps"], load

    # the tasks of one window, as this version of the graphs builds them (loading and
    # evaluation tasks included, so a little over)
    with get_task_stream(client=client) as ts:
        steps, _ = long_run(2)
    per_window = math.ceil(len({t["key"] for t in ts.data}) / steps * 50)

    # Runs of L and 3L steps: whatever a run leaves behind once (k) cancels out, and whatever
    # each step leaves behind (r) shows: growth(3L) - growth(L) = 2 r L.
    samples: list[tuple] = []
    _, (_, _, rss_a, obj_a, heap_a) = long_run(45, samples)     # warm-up: the longest run
    rss, objects, heap = [], [], []
    for _ in range(3):
        steps, (_, _, rss_b, obj_b, heap_b) = long_run(15)
        _, (_, _, rss_c, obj_c, heap_c) = long_run(45, samples)
        # growth over the 3L run (b -> c) less that over the L run (a -> b), per 1000 steps
        per_1000 = 1000 / (2 * steps)
        rss.append(((rss_c - rss_b) - (rss_b - rss_a)) * per_1000)
        objects.append(((obj_c - obj_b) - (obj_b - obj_a)) * per_1000)
        if heap_a is not None:
            heap.append(((heap_c - heap_b) - (heap_b - heap_a)) * per_1000)
        rss_a, obj_a, heap_a = rss_c, obj_c, heap_c
    mb, obj, heap_mb = _median(rss), _median(objects), _median(heap) if heap else None
    with capsys.disabled():
        print(f"\n[soak] {SHORT_RUNS} short runs: worker RSS {runs_growth:+.1f} MB, "
              f"{runs_objects:+d} objects (median {_median(per_run):+d} per run); long runs "
              f"of {steps} and {3 * steps} steps, median of 3: RSS {mb:+.3f} MB, heap in use "
              f"{'n/a' if heap_mb is None else f'{heap_mb:+.3f} MB'}, {obj:+.0f} objects per "
              f"1000 steps (each repeat: RSS {', '.join(f'{x:+.2f}' for x in rss)}; objects "
              f"{', '.join(f'{x:+.0f}' for x in objects)}); at most "
              f"{max(s[0] for s in samples)} scheduler tasks ({per_window} per window) and "
              f"{max(s[1] for s in samples)} worker keys in flight")
    # bounded by the windows: the one running, the next one, the tail of the one before
    assert max(s[0] for s in samples) <= 3 * per_window
    assert max(s[1] for s in samples) <= per_window + 10
    assert runs_growth < 10 and _median(per_run) < 100 and runs_objects < SHORT_RUNS * 150
    assert abs(obj) < 500 and abs(mb) < 2.0
    assert heap_mb is None or abs(heap_mb) < 0.5      # a leaked state (1 KB) per step: 1 MB
