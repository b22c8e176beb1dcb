"""Dask users' data stays where it is unless moving it pays: the prediction, and
fits on a real 2-worker LocalCluster whose moved bytes the workers' own counters measure."""
from __future__ import annotations

import subprocess
import sys

import dask.array as da
import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError

import dtrain
from dtrain.taskgraph.placement import Fit, crossings, rebalance

# --- the prediction ------------------------------------------------------------------------


@pytest.mark.parametrize("leaves, messages", [
    ("AAAA", 0), ("AABB", 2), ("ABAB", 3), ("AAAABBBB", 2), ("ABABABAB", 5), ("ABBAABBA", 7)])
def test_crossings_count_the_messages_a_placement_costs_each_step(leaves, messages):
    assert crossings(list(leaves), 2) == messages


def test_a_short_fit_of_a_small_net_leaves_the_data_where_it_is():
    """The issue's fit: 4 partitions of 15.4 MB dealt out in turn, 8 steps of a 1,106-float
    gradient: the crossings saved are about 2 ms, the move about 15."""
    got = rebalance(list("ABAB"), [60_000] * 4, [15_360_000] * 4, ["A", "B"], "auto",
                    Fit(8, 60_000, 1106, 1106 * 4))
    assert got.leaves == tuple("ABAB") and got.moved == ()
    assert got.saving_seconds < got.move_seconds and "does not pay" in got.why


def test_a_long_fit_moves_into_blocks():
    """The benchmark's fit: 20 passes of 800 steps over 8 partitions dealt out in turn."""
    got = rebalance(list("ABABABAB"), [20_000] * 8, [8_000_000] * 8, ["A", "B"], "auto",
                    Fit(16_000, 200, 5302, 5302 * 8))
    assert got.leaves == tuple("AAAABBBB") and len(got.moved) == 4
    assert got.saving_seconds > 100 * got.move_seconds and "moving pays" in got.why


def test_a_few_hundred_steps_pay_for_the_move():
    """8 partitions dealt out in turn, an (8,) net: 6 steps of 60,000 rows stay, 160 steps
    of 2,000 move (measured: 0.34-0.46 s a fit moved, 0.44-0.72 s in place)."""
    args = (list("ABABABAB"), [20_000] * 8, [2_720_000] * 8, ["A", "B"], "auto")
    assert rebalance(*args, Fit(6, 60_000, 290, 290 * 4)).moved == ()
    assert len(rebalance(*args, Fit(160, 2_000, 290, 290 * 4)).moved) == 4


def test_no_worker_gets_more_than_its_free_memory():
    fit = Fit(16_000, 200, 5302, 5302 * 8)
    got = rebalance(list("ABABABAB"), [20_000] * 8, [8_000_000] * 8, ["A", "B"], "auto", fit,
                    {"A": 1e9, "B": 10e6})
    assert got.moved == () and "B has too little free memory" in got.why
    roomy = rebalance(list("ABABABAB"), [20_000] * 8, [8_000_000] * 8, ["A", "B"], "auto",
                      fit, {"A": 1e9, "B": 40e6})
    assert len(roomy.moved) == 4


def test_never_and_always_and_a_partition_whose_worker_is_gone():
    fit = Fit(16_000, 200, 5302, 5302 * 8)
    never = rebalance(list("ABAC"), [10] * 4, [100] * 4, ["A", "B"], "never", fit)
    assert never.leaves[:3] == tuple("ABA") and never.moved == (3,)   # C is gone: it must go
    always = rebalance(list("ABAB"), [10] * 4, [100] * 4, ["A", "B"], "always",
                       Fit(1, 4, 10, 40))
    assert always.leaves in (tuple("AABB"), tuple("BBAA")) and len(always.moved) == 2


# --- fits on a real cluster ----------------------------------------------------------------

def _sent(client) -> int:
    """Bytes the workers have sent one another through Dask so far (their own counters)."""
    return sum(client.run(lambda dask_worker: int(dask_worker.transfer_outgoing_bytes_total))
               .values())


def _dealt_in_turn(client, rows: int, features: int, parts: int):
    """A persisted float32 dask.array of ``parts`` partitions, partition ``i`` and its labels
    on worker ``i % 2`` (as Dask deals them out), and the labels."""
    workers = sorted(client.scheduler_info()["workers"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    step = rows // parts
    xs = [client.scatter(x[i * step:(i + 1) * step], workers=[workers[i % 2]])
          for i in range(parts)]
    ys = [client.scatter(y[i * step:(i + 1) * step], workers=[workers[i % 2]])
          for i in range(parts)]
    dx = da.concatenate([da.from_delayed(f, (step, features), np.float32) for f in xs])
    dy = da.concatenate([da.from_delayed(f, (step,), np.int64) for f in ys])
    return dx, dy, x.nbytes + y.nbytes


@pytest.mark.slow
@pytest.mark.parametrize("rows, features, parts, hidden", [
    (240_000, 64, 4, (16,)),            # the fit
    (160_000, 32, 8, (8,)),             # 8 partitions dealt out in turn
])
def test_auto_moves_under_5_percent_of_a_short_fits_data(client, rows, features, parts,
                                                         hidden):
    x, y, total = _dealt_in_turn(client, rows, features, parts)
    before = _sent(client)
    clf = dtrain.MLPClassifier(hidden_layer_sizes=hidden, max_iter=2, batch_size=60_000,
                               random_state=0, client=client).fit(x, y)
    moved = _sent(client) - before
    assert moved < 0.05 * total, (moved, total, clf.summary_["data_moved"])
    said = clf.summary_["data_moved"]
    assert said["partitions"] == 0 and "does not pay" in said["why"], said


@pytest.mark.slow
def test_never_moves_nothing_and_gives_always_bytes(client):
    """Partitions dealt out in turn trained where they sit (no worker's partitions a block:
    every pair of the tree a message) give the bytes of the same partitions moved into
    blocks; "always" moves half of them, and no moved copy is held twice after the fit."""
    x, y, total = _dealt_in_turn(client, 8_000, 8, 8)
    fits = {}
    for mode in ("never", "always"):
        before = _sent(client)
        clf = dtrain.MLPClassifier(hidden_layer_sizes=(8,), max_iter=3, batch_size=400,
                                   random_state=0, client=client, rebalance=mode).fit(x, y)
        fits[mode] = (_sent(client) - before, clf)
    never, always = fits["never"][1], fits["always"][1]
    assert never.summary_["data_moved"]["partitions"] == 0
    assert "'never'" in never.summary_["data_moved"]["why"]
    assert fits["never"][0] < 0.05 * total, fits["never"][0]
    assert always.summary_["data_moved"]["partitions"] == 4
    assert fits["always"][0] > 0.4 * total * 8 / 9, fits["always"][0]   # half of x
    for a, b in zip(never.coefs_ + never.intercepts_, always.coefs_ + always.intercepts_):
        assert a.tobytes() == b.tobytes()
    held = client.who_has()
    assert all(len(w) <= 1 for w in held.values()), {k: w for k, w in held.items()
                                                     if len(w) > 1}


def test_a_bad_rebalance_is_scikit_learns_invalid_parameter_error():
    x, y = np.zeros((8, 2)), np.arange(8) % 2
    for est in (dtrain.MLPClassifier(rebalance="sometimes"),
                dtrain.MLPRegressor(rebalance="sometimes")):
        with pytest.raises(InvalidParameterError, match="rebalance"):
            est.fit(x, y)


def test_a_bad_rebalance_is_the_configs_one_line_error_from_the_cli():
    out = subprocess.run([sys.executable, "-m", "dtrain", "--set", "data.rebalance=sometimes"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.rebalance" in lines[0] and "'never'" in lines[0], lines


@pytest.mark.slow
def test_a_moved_partition_is_not_held_twice_once_the_fit_ends():
    """A persisted dask.dataframe dealt out in turn, moved into blocks ("always") on a
    cluster whose active memory manager is off: once the fit ends every partition is held
    once, by the worker it was on.  (The engine drops the copies it made as the run ends,
    ``internals.drop_copies``; a worker also drops a fetched copy once no task of its own
    needs it, as the run's shards are released, so this checks what a user sees rather
    than which of the two did it.)"""
    import dask
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client, LocalCluster, futures_of, wait

    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as lc, \
            Client(lc) as c:
        workers = sorted(c.scheduler_info()["workers"])
        rng = np.random.default_rng(0)
        frame = pd.DataFrame(rng.standard_normal((4_000, 4)), columns=list("abcd"))
        frame = frame.assign(label=(frame["a"] > 0).astype(int))
        parts = [c.scatter(frame.iloc[i * 500:(i + 1) * 500], workers=[workers[i % 2]])
                 for i in range(8)]
        ddf = c.persist(dd.from_delayed(parts, meta=frame.iloc[:0], verify_meta=False))
        wait(futures_of(ddf))
        first = c.who_has(ddf)
        clf = dtrain.MLPClassifier(hidden_layer_sizes=(4,), max_iter=1, random_state=0,
                                   client=c, rebalance="always").fit(ddf, "label")
        assert clf.summary_["data_moved"]["partitions"] == 4
        assert c.who_has(ddf) == first, (first, c.who_has(ddf))
