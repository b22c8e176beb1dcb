"""Training on data where it already sits: Dask collections and Parquet/CSV files read by
the workers.  Real LocalClusters; what crossed between workers is read from the workers'
own transfer logs."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster, wait

import dtrain
from conftest import run_cli
from dtrain.data import partitions
from dtrain.data.partitions import Columns, PartSpec
from dtrain.deploy.workers import worker_addresses
from dtrain.training import collections
from dtrain.training.trainer import train_on

SPECIES = np.array(["setosa", "versicolor", "virginica"])
SETS = ["train.epochs=6", "cluster.dashboard_address=", "data.split=[0.8, 0.1, 0.1]"]


def _iris_frame() -> pd.DataFrame:
    from sklearn.datasets import load_iris
    x, y = load_iris(return_X_y=True)
    frame = pd.DataFrame(x, columns=["sl", "sw", "pl", "pw"])
    frame["species"] = SPECIES[y]
    return frame


def _sha(path: Path) -> str:
    return hashlib.sha256((path / "params.npz").read_bytes()).hexdigest()


def _fit(client, data, out: Path, sets: list[str] = SETS) -> dtrain.RunResult:
    return train_on(dtrain.load_config(None, sets), data, client=client, out=out, echo=None)


def test_statistics_merge_in_a_tree_to_the_whole_sets():
    """Chan's update over parts in any grouping gives the one-pass mean and deviation."""
    rng = np.random.default_rng(0)
    x = rng.normal(3, 2, (97, 5))
    frame = pd.DataFrame(x, columns=list("abcde")).assign(y=rng.integers(0, 3, 97))
    spec = PartSpec(Columns(tuple("abcde"), "y"))
    parts = [partitions.part_stats(spec, i, frame.iloc[a:b])
             for i, (a, b) in enumerate([(0, 10), (10, 11), (11, 60), (60, 97)])]
    flat = partitions.merge(*parts)
    tree = partitions.merge(partitions.merge(*parts[:2]), partitions.merge(*parts[2:]))
    norm = partitions.normalization(flat, "standardize")
    np.testing.assert_allclose(norm.shift, x.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(norm.scale, x.std(axis=0), rtol=1e-13)
    np.testing.assert_allclose(partitions.normalization(tree, "standardize").scale, norm.scale,
                               rtol=1e-13)
    assert flat.sizes == (10, 1, 49, 37) and flat.labels == (0, 1, 2)
    mm = partitions.normalization(flat, "minmax")
    np.testing.assert_array_equal(mm.shift, x.min(axis=0))


def _on(client, frame: pd.DataFrame, owners: list[int]) -> dd.DataFrame:
    """``frame`` in ``len(owners)`` partitions of consecutive rows, partition ``i`` on the
    worker ``owners[i]`` (an index into the sorted addresses)."""
    workers = sorted(client.scheduler_info()["workers"])
    parts = np.array_split(np.arange(len(frame)), len(owners))
    futures = [client.scatter(frame.iloc[p], workers=[workers[o]])
               for p, o in zip(parts, owners)]
    return dd.from_delayed(futures, meta=frame.iloc[:0], verify_meta=False)


def _crossed(client, before: dict) -> list[str]:
    """The partitions and shards that went from worker to worker since ``before``."""
    log = client.run(lambda dask_worker: [[str(k) for k in entry["keys"]]
                                          for entry in dask_worker.transfer_incoming_log])
    arrived = [k for w, entries in log.items() for entry in entries[before.get(w, 0):]
               for k in entry]                                      # this run's transfers
    return [k for k in arrived
            if "from_pandas" in k or "frompandas" in k or "fromdelayed" in k
            or "load-shard" in k or "_pair" in k or k.startswith("DataFrame-")]   # scattered


def test_a_dataframes_partitions_train_where_they_sit(client, tmp_path):
    """Four partitions, two on each worker in order: no training partition crosses between
    them, and the run learns."""
    ddf = _on(client, _iris_frame(), [0, 0, 1, 1])
    before = client.run(lambda dask_worker: len(dask_worker.transfer_incoming_log))
    run = _fit(client, lambda c: collections.from_frame(c, ddf, "species"), tmp_path / "run")
    assert run.summary["shards"] == 4 and run.summary["test_accuracy"] > 0.8
    assert run.summary["data_moved"]["partitions"] == 0, run.summary["data_moved"]
    assert "already sit in blocks" in run.summary["data_moved"]["why"]
    assert _crossed(client, before) == []
    spec = json.loads((tmp_path / "run" / "model.json").read_text())
    assert spec["classes"] == list(SPECIES) and spec["features"]["names"] == ["sl", "sw", "pl",
                                                                               "pw"]


def test_files_are_read_in_blocks_and_never_move(client, tmp_path):
    """Files dtrain reads (six Parquet files): each worker reads a block of consecutive
    ones (Dask alone deals them out in turn), so the run moves none and each worker's
    shards are one stacked task."""
    dd.from_pandas(_iris_frame(), npartitions=6).to_parquet(tmp_path / "pq", write_index=False)
    cfg = dtrain.load_config(None, [*SETS, "data.dataset=parquet", "data.label=species",
                                    f"data.path={tmp_path}/pq/*.parquet"])
    coll = collections.from_files(client, cfg.data)
    wait(coll.futures)
    workers = worker_addresses(client)                          # in name order
    assert [tuple(client.who_has(f)[f.key]) for f in coll.futures] == \
        [(workers[0],)] * 3 + [(workers[1],)] * 3
    run = train_on(cfg, lambda c: collections.from_files(c, cfg.data), client=client,
                   out=tmp_path / "run", echo=None)
    assert run.summary["data_moved"]["partitions"] == 0
    assert run.summary["fused_shards"]["fused"] is True


def test_partitions_among_another_workers_move_into_blocks(client, tmp_path):
    """Partitions dealt out in turn (0 and 2 on one worker, 1 and 3 on the other, as Dask
    often leaves them) would make every pair of the reduce tree a message between the
    workers, each step: with ``data.rebalance = "always"`` two move once, so that each
    worker holds a block of consecutive partitions and computes them as one stacked task;
    the summary says what moved.  ("auto" leaves them: 6 epochs of iris would not pay.)"""
    ddf = _on(client, _iris_frame(), [0, 1, 0, 1])
    run = _fit(client, lambda c: collections.from_frame(c, ddf, "species"), tmp_path / "run",
               [*SETS, "data.rebalance=always"])
    moved = run.summary["data_moved"]
    assert moved["partitions"] == 2 and "consecutive partitions" in moved["why"], moved
    workers = sorted(client.scheduler_info()["workers"])
    owner = [workers[o] for o in (0, 1, 0, 1)]
    for m in moved["moves"]:
        assert owner[m["partition"]] == m["from"]
        owner[m["partition"]] = m["to"]
    assert owner[0] == owner[1] != owner[2] == owner[3], owner
    assert run.summary["fused_shards"]["fused"] is True, run.summary["fused_shards"]


@pytest.mark.slow
def test_the_same_partitions_give_the_same_bytes_on_one_two_and_three_workers(tmp_path):
    frame = _iris_frame()
    shas = {}
    for n in (1, 2, 3):
        with LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None) as lc, \
                Client(lc) as c:
            ddf = dd.from_pandas(frame, npartitions=5)
            _fit(c, lambda cl: collections.from_frame(cl, ddf, "species"), tmp_path / str(n))
            x = da.from_array(frame[["sl", "sw", "pl", "pw"]].to_numpy(), chunks=(30, 4))
            y = da.from_array(frame["species"].to_numpy(), chunks=30)
            _fit(c, lambda cl: collections.from_arrays(cl, x, y), tmp_path / f"a{n}")
        shas[n] = (_sha(tmp_path / str(n)), _sha(tmp_path / f"a{n}"))
    assert len(set(shas.values())) == 1, shas
    assert shas[1][0] == shas[1][1]          # a frame and arrays of the same blocks: the same


@pytest.mark.slow
def test_parquet_files_read_by_the_workers_match_the_same_partitions_in_python(client,
                                                                               tmp_path):
    """The CLI on Parquet files and train_on on the dataframe they were written from: the
    same partitions, the same config, the same bytes; evaluate agrees with the summary."""
    ddf = dd.from_pandas(_iris_frame(), npartitions=3)
    ddf.to_parquet(tmp_path / "pq", write_index=False)
    _fit(client, lambda c: collections.from_frame(c, ddf, "species"), tmp_path / "py")
    cli = run_cli("--set", "data.dataset=parquet", "--set", f"data.path={tmp_path}/pq/*.parquet",
                  "--set", "data.label=species", *(a for s in SETS for a in ("--set", s)),
                  "--out", str(tmp_path / "cli"), timeout=180)
    assert cli.returncode == 0, cli.stderr
    assert _sha(tmp_path / "py") == _sha(tmp_path / "cli")
    ev = run_cli("evaluate", str(tmp_path / "cli"), timeout=120)
    assert ev.returncode == 0, ev.stderr
    found = json.loads((tmp_path / "cli" / "evaluation.json").read_text())
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert (found["accuracy"], found["loss"]) == (summary["test_accuracy"], summary["test_loss"])


def test_partitions_all_on_one_worker_are_balanced_and_the_move_is_reported(client, tmp_path):
    first = sorted(client.scheduler_info()["workers"])[0]
    ddf = client.persist(dd.from_pandas(_iris_frame(), npartitions=4), workers=[first])
    seen: list[str] = []
    run = train_on(dtrain.load_config(None, [*SETS, "data.rebalance=always"]),
                   lambda c: collections.from_frame(c, ddf, "species"), client=client,
                   out=tmp_path / "run", echo=seen.append)
    moved = run.summary["data_moved"]
    assert moved["partitions"] == 2 and moved["bytes"] > 0
    assert {m["from"] for m in moved["moves"]} == {first} and "'always'" in moved["why"]
    line = next(s for s in seen if s.startswith("moved "))
    assert line.startswith("moved 2 partitions (") and f"off {first} to balance" in line


@pytest.mark.parametrize("case, message", [
    ("nan", "row 120 (row 7 of partition 3), column 'pw': NaN; features must be finite"),
    ("real labels", "the label column 'species' holds real numbers such as 0.1, not classes"),
    ("no label", "row 60 (row 22 of partition 1): the label (column 'species') is missing"),
    ("text feature", "feature column 'sw' of the dataframe is not numeric"),
    ("one class", "the labels hold 1 class (setosa); a classifier needs at least 2"),
    ("too few rows", "3 training samples for 4 partitions"),
    ("missing label", "the label column 'kind' is not a column of the dataframe"),
])
def test_bad_collections_are_one_clear_error(case, message, client):
    frame = _iris_frame()
    label = "species"
    if case == "nan":
        frame.loc[120, "pw"] = np.nan
    elif case == "text feature":
        frame["sw"] = frame["sw"].astype(str)
    elif case == "one class":
        frame["species"] = "setosa"
    elif case == "real labels":                 # a frame without its label column
        frame["species"] = frame.pop("pw")
    elif case == "no label":
        frame.loc[60, "species"] = None
    elif case == "missing label":
        label = "kind"
    ddf = dd.from_pandas(frame, npartitions=4)
    if case == "too few rows":                  # three rows in four partitions, one empty
        ddf = dd.from_map(lambda i: frame.iloc[i:i + 1] if i < 3 else frame.iloc[:0], range(4))
    with pytest.raises(dtrain.UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _fit(client, lambda c: collections.from_frame(c, ddf, label), None)


def test_files_are_checked_before_anything_starts(tmp_path, capfd):
    from dtrain import cli
    ddf = dd.from_pandas(_iris_frame(), npartitions=2)
    ddf.to_parquet(tmp_path / "pq", write_index=False)
    glob = f"data.path={tmp_path}/pq/*.parquet"
    for sets, message in [
        (["data.label=kind"], "data.label = 'kind' is not a column of"),
        (["data.label=species", "model.layers=[5, 16, 3]"],
         "model.layers[0] = 5 but"),
        (["data.label=sl"], "feature column 'species' of"),
    ]:
        code = cli.main(["--set", "data.dataset=parquet", "--set", glob,
                         *(a for s in sets for a in ("--set", s)), "--out", str(tmp_path / "x")])
        err = capfd.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err
        assert not (tmp_path / "x").exists()


def test_a_parquet_files_index_is_not_a_feature(client, tmp_path):
    """dask's to_parquet writes its index as a column (``__null_dask_index__``), pandas' a
    named index too (``id``); the pandas metadata names them index columns, so the check of
    the files, the label by default and the workers' read all see 64 features, not 65."""
    from sklearn.datasets import load_digits

    from dtrain.core.config import DataConfig

    frame = load_digits(as_frame=True).frame.iloc[:300]                 # 64 pixels, "target"
    dd.from_pandas(frame, npartitions=3).to_parquet(tmp_path / "dask")  # index written
    named = frame.set_axis(pd.Index((frame.index * 7) % 301, name="id"))    # not a range
    named.to_parquet(tmp_path / "named.parquet")
    for path, index in [(tmp_path / "dask" / "*.parquet", "__null_dask_index__"),
                        (tmp_path / "named.parquet", "id")]:
        cfg = DataConfig(dataset="parquet", path=str(path))             # label: the last
        collections.check_files(cfg, (64, 16, 10))     # the index is not a feature (not 65)
        coll = collections.from_files(client, cfg)
        assert coll.columns.label == "target" and coll.features == 64, (path, coll.columns)
        assert coll.names == tuple(frame.columns[:-1]) and index not in coll.names


@pytest.mark.slow
def test_a_regression_trains_on_dask_arrays_where_they_sit(client, tmp_path):
    """Real-valued targets through the same pipeline: y float (rows,) blocks beside X."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=400)
    X, Y = da.from_array(x, chunks=(100, 3)), da.from_array(y, chunks=100)
    run = train_on(dtrain.load_config(None, [
        "data.dataset=synthetic", "model.loss=squared-error", "model.layers=[3, 8, 1]",
        "train.epochs=30", "optim.name=adam", "optim.lr=0.01", "cluster.dashboard_address="]),
        lambda c: collections.from_arrays(c, X, Y), client=client, out=tmp_path / "r",
        echo=None)
    assert run.summary["test_r2"] > 0.95 and run.summary["test_accuracy"] is None
    assert json.loads((tmp_path / "r" / "model.json").read_text())["targets"] == ["y"]
