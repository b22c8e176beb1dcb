"""dtrain.taskgraph.collective: a step's sum as an allreduce that keeps the tree's bytes.

Each schedule's programs are run here, one thread per worker with queues for the
mesh, and the result compared with the tree's sum of the same buffers, bit for bit;
their structure (messages, numbers sent, rounds) against what the schedules promise."""
from __future__ import annotations

import gc
import math
import queue
import threading
import weakref

import numpy as np
import pytest

from dtrain.taskgraph import collective
from dtrain.taskgraph.collective import DOUBLING, HALVING, SCHEDULES, TREE
from dtrain.taskgraph.reduction import shape
from dtrain.taskgraph.treesum import flat, nested_sum


def _blocks(shards: int, workers: int) -> tuple[int, ...]:
    return tuple(s * workers // shards for s in range(shards))


def _sums(shards: int, k: int, rank_of, workers: int, schedule: str, n: int = 37,
          collector: int = 0, dtype=np.float32, at_root=None) -> tuple[list, object]:
    """Every worker's result of running its program on random buffers of very different
    magnitudes (so that the order of the additions shows in the bits), and the tree's."""
    rng = np.random.default_rng(shards * 100 + workers)
    bufs = [(rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4)).astype(dtype)
            for _ in range(shards)]
    progs = collective.programs(shards, k, tuple(rank_of), workers, schedule, collector)
    boxes: dict[tuple, queue.Queue] = {}
    lock = threading.Lock()

    def box(key: tuple) -> queue.Queue:
        with lock:
            return boxes.setdefault(key, queue.Queue())

    out: list = [None] * workers
    errors: list = []

    def worker(r: int) -> None:
        try:
            p = progs[r]
            made = [nested_sum(sub, bufs) for _, sub in p.made]
            out[r] = collective.run(p, made, "7",
                                    lambda to, tag, x: box((r, to, tag)).put(np.array(x)),
                                    lambda frm, tag: box((frm, r, tag)).get(timeout=20),
                                    None if at_root is None else
                                    lambda lo, piece, r=r: at_root(r, lo, piece))
        except BaseException as exc:        # pragma: no cover - shown by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out, nested_sum(collective.tree(shards, k), bufs)


def test_the_tree_is_the_reduce_tasks_tree():
    """tree(shards, k) nests the shards as the builders' reduce tasks sum them: level by
    level, k a group, a group of one passed up."""
    assert collective.tree(5, 2) == (((0, 1), (2, 3)), 4)
    assert collective.tree(7, 3) == ((0, 1, 2), (3, 4, 5), 6)
    assert collective.tree(1, 2) == 0
    for shards, k in ((16, 2), (10, 3), (9, 4)):
        got = shape(tuple(f"w{s}" for s in range(shards)), "w0", k, False)
        assert flat(collective.tree(shards, k)) == list(range(shards))
        assert len(got.reduces) == sum(1 for _ in _internal(collective.tree(shards, k)))


def _internal(t):
    if isinstance(t, tuple):
        yield t
        for c in t:
            yield from _internal(c)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("workers", [2, 3, 4, 5, 6, 8, 10])
def test_every_worker_holds_the_trees_bytes(schedule, workers):
    """Whatever the schedule, the worker count, the fan-in and the shards per worker, every
    worker ends with the tree's sum, bit for bit."""
    for per, k in ((1, 2), (3, 2), (4, 4), (2, 3)):
        shards = workers * per
        got, ref = _sums(shards, k, _blocks(shards, workers), workers, schedule,
                         collector=workers - 1)
        assert all(g.tobytes() == ref.tobytes() for g in got), (per, k)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("workers", [2, 3, 4, 5, 8])
def test_what_is_made_of_the_roots_sum_where_it_is_made_is_what_every_worker_ends_with(
        schedule, workers):
    """``at_root`` (the update made where the step's sum is): every number of the root's sum
    passes through it once on each worker that adds it (one segment a worker in the
    halving schedules, whole on the one or two adders in the tree schedules, whole on every
    worker in doubling), and every worker ends with what it made of the tree's sum, whole."""
    seen: list[tuple[int, int, int]] = []

    def at_root(rank, lo, piece):
        seen.append((rank, lo, len(piece)))
        return piece * 3 - np.arange(lo, lo + len(piece), dtype=piece.dtype)

    n = 37
    got, ref = _sums(workers * 2, 2, _blocks(workers * 2, workers), workers, schedule, n,
                     at_root=at_root)
    want = ref * 3 - np.arange(n, dtype=ref.dtype)
    assert all(g.tobytes() == want.tobytes() for g in got)
    adders = {r for r, _, _ in seen}
    for r in adders:            # each adder covers its numbers once, without overlaps
        mine = sorted((lo, lo + size) for q, lo, size in seen if q == r)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))
    covered = sorted((lo, lo + size) for _, lo, size in seen)
    assert sum(b - a for a, b in covered) == n * (1 if schedule in collective.RADIX
                                                  else len(adders))
    if schedule in collective.RADIX:
        assert adders == set(range(workers))
    elif schedule == TREE:
        assert adders == {0}
    elif schedule == DOUBLING:
        assert adders == set(range(workers))
    else:
        assert len(adders) <= 2


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_interleaved_shards_and_float64(schedule):
    """Shards dealt out in turn (a Dask collection left where it is): some workers make
    several subtrees; the bytes stay the tree's."""
    got, ref = _sums(8, 2, (0, 1, 0, 1, 2, 2, 0, 1), 3, schedule, n=101, dtype=np.float64)
    assert all(g.tobytes() == ref.tobytes() for g in got)


def test_the_order_of_the_sum_shows_in_the_bits():
    """The check above can fail: the same buffers summed left to right are other bits."""
    rng = np.random.default_rng(0)
    bufs = [(rng.standard_normal(37) * 10.0 ** rng.integers(-4, 4)).astype(np.float32)
            for _ in range(8)]
    left = bufs[0]
    for b in bufs[1:]:
        left = left + b
    assert left.tobytes() != nested_sum(collective.tree(8, 2), bufs).tobytes()


@pytest.mark.parametrize("workers", [2, 4, 8, 16, 64])
def test_halving_costs_what_an_mpi_allreduce_costs(workers):
    """On a power of two of workers with equal blocks: each worker sends 2 log2 W messages
    and 2 N (W - 1) / W numbers, whatever W: Rabenseifner's reduce-scatter and allgather."""
    n = 100_003
    progs = collective.programs(16 * workers, 2, _blocks(16 * workers, workers), workers,
                                HALVING)
    for p in progs:
        messages, numbers = p.traffic(n)
        assert messages == 2 * int(math.log2(workers))
        assert abs(numbers - 2 * n * (workers - 1) / workers) <= 2 * math.log2(workers) + 1


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_doubling_sends_log2_w_whole_buffers(workers):
    progs = collective.programs(4 * workers, 2, _blocks(4 * workers, workers), workers,
                                DOUBLING)
    assert {p.traffic(1000) for p in progs} == {(int(math.log2(workers)),
                                                1000 * int(math.log2(workers)))}


def test_the_tree_reduces_onto_the_collector_and_sends_down_a_binomial_tree():
    progs = collective.programs(8, 2, _blocks(8, 8), 8, TREE, collector=5)
    sends = {p.rank: [op for op in p.ops if op.kind == collective.SEND] for p in progs}
    down = [op for op in sends[5]]
    assert [op.peer for op in down] == [0, 1, 3]  # binomial, the farthest subtree first ...
    assert all(len(op.items) == 1 for ops in sends.values() for op in ops)   # ... whole


def test_the_schedule_is_chosen_by_its_predicted_time():
    """A small buffer goes by the fewest messages (doubling); a large one on many workers by
    the fewest bytes (halving); the prediction grows slowly with the workers."""
    wire = collective.TCP_WIRE
    small, _ = collective.choose(64, 2, _blocks(64, 4), 4, 133, 4, wire)
    large, times = collective.choose(1024, 2, _blocks(1024, 64), 64, 101_772, 4, wire)
    assert small == DOUBLING and large in collective.RADIX
    assert min(times[h] for h in collective.RADIX) < times[DOUBLING] < times[TREE]
    at = {w: collective.choose(16 * w, 2, _blocks(16 * w, w), w, 101_772, 4, wire)[1][HALVING]
          for w in (16, 256)}
    assert at[256] < 2 * at[16]


@pytest.mark.parametrize("schedule, radix", [(collective.HALVING4, 4), (collective.HALVING8, 8)])
def test_a_higher_radix_sums_several_levels_a_round(schedule, radix):
    """Radix 4 (8) on 64 workers: 3 (2) rounds each way instead of 6, each worker reading
    from radix - 1 others a round; the same numbers sent as radix 2 (within rounding)."""
    n, w = 100_003, 64
    progs = collective.programs(4 * w, 2, _blocks(4 * w, w), w, schedule)
    two = collective.programs(4 * w, 2, _blocks(4 * w, w), w, HALVING)
    rounds = {op.round for op in progs[0].ops}
    assert len(rounds) == 2 * round(math.log(w, radix))
    assert {len([op for op in p.ops if op.kind == collective.RECV and op.round == r])
            for p in progs for r in rounds} == {radix - 1}
    assert abs(progs[0].traffic(n)[1] - two[0].traffic(n)[1]) <= 2 * w


def test_a_worker_without_shards_is_refused():
    with pytest.raises(ValueError, match="every one of 3 workers must hold a shard"):
        collective.programs(4, 2, (0, 0, 1, 1), 3, HALVING)
    with pytest.raises(ValueError, match="no schedule 'ring'"):
        collective.programs(4, 2, (0, 0, 1, 1), 2, "ring")


def test_workers_sharing_a_machines_cores_choose_fewer_messages():
    """32 workers on 2 cores: every message is CPU of both sides on loopback, which the
    machine can only do so fast: the choice takes the fewest messages' worth of CPU, where
    32 workers of their own would take a halving of high radix."""
    args = (1024, 2, _blocks(1024, 32), 32, 25_450, 4, collective.LOCAL_WIRE)
    apart, _ = collective.choose(*args)
    shared, times = collective.choose(*args, cores=2)
    assert apart in collective.RADIX and shared != apart
    progs = {s: collective.programs(1024, 2, _blocks(1024, 32), 32, s) for s in times}
    sent = {s: sum(p.traffic(25_450)[0] for p in ps) for s, ps in progs.items()}
    assert sent[shared] < sent[apart]


@pytest.mark.parametrize("schedule", [collective.TREE2, HALVING])
def test_a_steps_sums_are_freed_as_it_ends_not_by_the_cycle_collector(schedule):
    """No reference cycle holds a step's sums: they are freed as the step's sum returns, so
    the next step's land in the same, warm memory (a cycle kept them until the cyclic
    collector ran, and made the root's adds of P3 nearly three times as slow)."""
    progs = collective.programs(4, 2, (0, 1, 2, 3), 4, schedule, 0)
    bufs = [np.full(64, float(r), np.float32) for r in range(4)]
    sums: list[weakref.ref] = []

    def at_root(lo, piece):         # what the step's sum becomes, kept among its values
        out = piece + 1
        sums.append(weakref.ref(out))
        return out

    gc.disable()
    try:
        for p in progs:             # each rank's program, its peers' messages made up
            collective.run(p, [bufs[p.rank]], "t", lambda to, tag, x: None,
                           lambda frm, tag: np.concatenate(bufs)[:64], at_root)
        alive = sum(ref() is not None for ref in sums)
    finally:
        gc.enable()
    assert sums and not alive
