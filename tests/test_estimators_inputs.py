"""What the estimators' fit and predict take (:mod:`dtrain.estimators.inputs`): NumPy, pandas,
sparse X, Dask arrays and dataframes (trained where their partitions sit, predicted lazily), and
sample weights; and what they refuse: a ValueError that says what is wrong and where.

Real fits on the session's two-worker LocalCluster (``client``) unless a test says otherwise.
"""
from __future__ import annotations

import os
import signal
import warnings

import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster, default_client

import dask
import dask.array as da
import dask.dataframe as dd
import dtrain
from dtrain.core import keys
from helpers.estimators_common import FEATURES, QUICK, SPECIES, _clf, _frame, _iris, _same_bytes
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)
from helpers.tables import SHORT_FEATURES, iris_table

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


# --- NumPy and pandas -------------------------------------------------------------------------

def test_numpy_fit_predict_and_fitted_attributes(client):
    x, y = _iris()
    clf = _clf(client).fit(x, y)
    assert clf.score(x, y) >= 0.9
    assert clf.classes_.tolist() == [0, 1, 2] and clf.n_features_in_ == 4
    assert not hasattr(clf, "feature_names_in_")
    assert len(clf.loss_curve_) == clf.n_iter_ == 20 and clf.best_loss_ == min(clf.loss_curve_)
    assert clf.loss_curve_[-1] < clf.loss_curve_[0]
    assert [c.shape for c in clf.coefs_] == [(4, 8), (8, 3)]
    assert [b.shape for b in clf.intercepts_] == [(8,), (3,)]
    assert clf.predict(x).dtype == y.dtype
    proba = clf.predict_proba(x)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert (clf.classes_[proba.argmax(axis=1)] == clf.predict(x)).all()
    assert clf.summary_["shards"] == 1 and clf.summary_["train_samples"] == 150   # tiny step


def test_pandas_with_string_labels_and_a_label_column(client):
    df = _frame()
    clf = _clf(client).fit(df[FEATURES], df["species"])
    assert clf.classes_.tolist() == SPECIES.tolist()
    assert clf.feature_names_in_.tolist() == FEATURES
    assert set(clf.predict(df[FEATURES])) <= set(SPECIES) and clf.score(df[FEATURES],
                                                                       df["species"]) >= 0.9
    by_name = _clf(client).fit(df, "species")             # y: the name of X's label column
    assert by_name.feature_names_in_.tolist() == FEATURES and _same_bytes(clf, by_name)
    # the label column may stay in X at predict time: the features are picked by name
    assert (by_name.predict(df) == clf.predict(df[FEATURES])).all()


def test_integer_column_names_and_unknown_chunk_sizes(client):
    x, y = _iris()
    ddf = dd.from_pandas(pd.DataFrame(x).assign(label=y), npartitions=3)    # columns 0..3
    X, Y = ddf[[0, 1, 2, 3]].to_dask_array(), ddf["label"].to_dask_array()  # nan chunks
    from_frame = _clf(client).fit(ddf, "label")
    from_arrays = _clf(client).fit(X, Y)
    assert not hasattr(from_frame, "feature_names_in_")
    assert _same_bytes(from_frame, from_arrays)


def test_a_dataframe_is_predicted_by_column_name(client):
    df = _frame()
    ddf = dd.from_pandas(df, npartitions=3)
    clf = _clf(client).fit(ddf, "species")
    shuffled = ddf[["species", *FEATURES[::-1]]]         # other order, label column kept
    assert (clf.predict(shuffled).compute() == clf.predict(df[FEATURES])).all()
    np.testing.assert_allclose(clf.predict_proba(shuffled).compute(),
                               clf.predict_proba(df[FEATURES]))


def test_sparse_x_is_made_dense_block_by_block(client):
    """Item 8: a scipy.sparse X trains as its dense rows (the same bytes) and predicts."""
    from scipy import sparse

    x, y = _iris()
    x = np.where(x < 1.5, 0.0, x)
    dense = _clf(client).fit(x, y)
    for kind in (sparse.csr_matrix, sparse.csc_array):
        fitted = _clf(client).fit(kind(x), y)
        assert _same_bytes(fitted, dense)
        assert (fitted.predict(kind(x)) == dense.predict(x)).all()


def test_three_rows_fit(client):
    """Item 5: the default shard count follows the data: three rows fit, where four shards
    would not."""
    x, y = _iris()
    clf = dtrain.MLPClassifier(client=client, max_iter=5).fit(x[[0, 60, 120]], y[[0, 60, 120]])
    assert clf.summary_["shards"] == 1 and clf.predict(x[:2]).shape == (2,)   # a tiny step
    assert dtrain.MLPClassifier().shards == "auto"


@pytest.mark.slow
def test_in_memory_data_goes_in_its_graph_unwarned_and_outlives_a_lost_worker():
    """A 12 MB ``X`` reaches the workers inside the graph that makes its partitions, on
    purpose and without distributed's "Sending large graph" warning: the scheduler keeps each
    block's task, so the blocks of a worker that dies are made again (scattered data, the
    warning's advice, would be gone with it)."""
    from distributed import wait
    from dtrain.estimators.inputs import training_data
    x = np.random.default_rng(0).standard_normal((30_000, 50))       # (N, F) float64, 12 MB
    y = (x[:, 0] > 0).astype(np.int64)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as c:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            coll = training_data(x, y, shards=4, classifier=True).collection(c)
            wait(coll.futures)
        assert not [w for w in seen if "large graph" in str(w.message)]
        holder = coll.holders(c)[0]
        os.kill(c.run(os.getpid, workers=[holder])[holder], signal.SIGKILL)  # with its blocks
        parts = c.gather(coll.futures)
        assert holder not in c.scheduler_info()["workers"]
    assert np.concatenate([p[0] for p in parts]).tobytes() == x.tobytes()
    assert np.concatenate([p[1] for p in parts]).tobytes() == y.tobytes()


# --- Dask collections -------------------------------------------------------------------------

def test_dask_array_input_predicts_lazily(client):
    x, y = _iris()
    X, Y = da.from_array(x, chunks=(50, 4)), da.from_array(y, chunks=50)
    clf = _clf(client).fit(X, Y)
    assert clf.summary_["shards"] == 3                   # the array's own blocks
    predicted = clf.predict(X)
    assert isinstance(predicted, da.Array) and predicted.numblocks == (3,)
    assert (predicted.compute() == clf.predict(x)).all()
    assert clf.score(X, Y) == clf.score(x, y)


def _incoming(dask_worker) -> list[list[str]]:
    return [[str(k) for k in entry["keys"]] for entry in dask_worker.transfer_incoming_log]


def test_a_dataframe_trains_where_its_partitions_sit(client):
    """Two partitions on each worker: no training partition crosses to the other."""
    df = _frame()
    workers = sorted(client.scheduler_info()["workers"])
    parts = [df.iloc[a:b] for a, b in ((0, 38), (38, 76), (76, 113), (113, 150))]
    futures = [client.scatter(p, workers=[workers[i // 2]]) for i, p in enumerate(parts)]
    ddf = dd.from_delayed(futures, meta=df.iloc[:0], verify_meta=False)
    before = client.run(_incoming)
    clf = _clf(client, batch_size=150, max_iter=10).fit(ddf, "species")
    after = client.run(_incoming)
    moved = {k for w in after for entry in after[w][len(before[w]):] for k in entry}
    kinds = {keys.kind_of(k) for k in moved}
    # only gradients, states and the partitions' statistics travelled (a window that spans
    # workers sends its gradients worker to worker, not as Dask transfers): no data
    assert kinds <= {keys.FORWARD_BACKWARD, keys.REDUCE, keys.UPDATE, keys.STATE,
                     keys.EVALUATE, keys.PART_STATS, keys.MERGE_STATS}, moved
    assert clf.summary_["data_moved"]["partitions"] == 0 and clf.summary_["workers"] == 2
    where = client.who_has(futures)                    # and they are still where they were
    assert [where[f.key] for f in futures] == [(workers[i // 2],) for i in range(4)]
    assert clf.score(dd.from_pandas(df, npartitions=2), "species") >= 0.8


def test_a_partition_moves_only_to_balance_and_the_summary_says_so(client):
    """All on one worker: "auto" leaves a 2-epoch iris fit there (the move would not pay
    for itself) and says why; "always" moves half to the other worker."""
    df = _frame()
    workers = sorted(client.scheduler_info()["workers"])
    parts = [df.iloc[a:b] for a, b in ((0, 38), (38, 76), (76, 113), (113, 150))]
    futures = [client.scatter(p, workers=[workers[0]]) for p in parts]    # all on one
    ddf = dd.from_delayed(futures, meta=df.iloc[:0], verify_meta=False)
    stays = _clf(client, max_iter=2).fit(ddf, "species").summary_["data_moved"]
    assert stays["partitions"] == 0 and "does not pay" in stays["why"], stays
    moved = _clf(client, max_iter=2, rebalance="always").fit(ddf, "species") \
        .summary_["data_moved"]
    assert moved["partitions"] == 2 and "'always'" in moved["why"]
    assert {m["from"] for m in moved["moves"]} == {workers[0]}
    assert moved["bytes"] == sum(m["bytes"] for m in moved["moves"]) > 0


@pytest.mark.parametrize("strategy", ["parameter-server", "local-sgd"])
def test_the_other_strategies_that_train_on_partitions(strategy, client):
    clf = _clf(client, strategy=strategy).fit(*_iris())
    assert clf.summary_["strategy"] == strategy and clf.score(*_iris()) >= 0.85


def test_auto_keeps_the_synchronous_step_on_partitions_spread_over_workers(client):
    """strategy="auto" is scikit-learn's synchronous step wherever the partitions sit: the
    same dask.dataframe fit on the client's two workers (each window a task per worker,
    the sums worker to worker) and on a one-worker cluster gives the same bytes."""
    from distributed import futures_of, wait
    df = _frame()
    params = {**QUICK, "random_state": 0, "max_iter": 30}
    ddf = client.persist(dd.from_pandas(df, npartitions=4))
    wait(futures_of(ddf))
    assert len({min(w) for w in client.who_has(futures_of(ddf)).values() if w}) == 2
    spread = dtrain.MLPClassifier(client=client, **params).fit(ddf, "species")
    assert spread.summary_["strategy"] == "allreduce"
    assert spread.summary_["spanned_windows"] > 0 and spread.summary_["workers"] == 2
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None) as lc, Client(lc) as one:
        alone = dtrain.MLPClassifier(client=one, **params).fit(
            one.persist(dd.from_pandas(df, npartitions=4)), "species")
        assert alone.summary_["spanned_windows"] == 0
    for a, b in zip(spread.coefs_ + spread.intercepts_, alone.coefs_ + alone.intercepts_):
        assert a.tobytes() == b.tobytes()
    x = df[FEATURES]
    assert spread.predict_proba(x).tobytes() == alone.predict_proba(x).tobytes()


def test_dask_input_without_a_client_uses_the_default_client(client):
    from distributed import get_task_stream

    x, y = _iris()
    assert default_client() is client
    with get_task_stream(client) as stream:
        clf = _clf(None, max_iter=2).fit(da.from_array(x, chunks=50), da.from_array(y, chunks=50))
    assert any(keys.kind_of(t["key"]) in (keys.FORWARD_BACKWARD, keys.WINDOW) for t in stream.data)
    assert clf.client is None


def test_statistics_of_a_partition_with_nan_warn_nothing_and_name_it():
    from dtrain.data import partitions

    spec = partitions.PartSpec(partitions.Columns(("a", "b"), "y"))
    part = pd.DataFrame({"a": [1.0, np.nan, 3.0], "b": [np.inf, 1.0, 2.0], "y": [0, 1, 0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = partitions.merge(partitions.part_stats(spec, 4, part.iloc[[0, 2]].fillna(0)),
                                 partitions.part_stats(spec, 5, part))
    bad = stats.bad                         # the first partition with a non-finite feature
    assert (bad.column, bad.partition, bad.row, bad.value) == ("b", 4, 0, "inf")


def test_predict_on_a_collection_computes_nothing_until_asked(client, tmp_path):
    x, y = _iris()
    clf = _clf(client).fit(x, y)
    log = tmp_path / "reads.txt"

    def read(i: int) -> np.ndarray:                  # a source that says when it is read
        with open(log, "a") as f:
            f.write(f"{i}\n")
        return x[i * 50:(i + 1) * 50]

    X = da.concatenate([da.from_delayed(dask.delayed(read)(i), (50, 4), x.dtype)
                        for i in range(3)])
    labels, proba = clf.predict(X), clf.predict_proba(X)
    assert not log.exists()
    graph = dict(labels.__dask_graph__())
    models = [k for k in graph if str(k).startswith("Model-")]
    assert len(models) == 1                          # the parameters: one key, shipped once
    assert labels.numblocks == (3,) and proba.chunks == ((50, 50, 50), (3,))
    assert (labels.compute() == clf.predict(x)).all()
    assert sorted(log.read_text().split()) == ["0", "1", "2"]
    np.testing.assert_array_equal(proba.compute(), clf.predict_proba(x))


# --- sample weights ---------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Got `batch_size` larger than sample size")
def test_sample_weights_are_repeated_rows(client):
    """Item 2: integer weights train as the rows repeated that many times (a weight 0 as the
    row left out): the normalization, the loss, the gradient and alpha's term; in fit and
    partial_fit."""
    x, y = _iris()
    w = np.random.default_rng(3).integers(0, 4, len(y))
    full = {"batch_size": 1000, "max_iter": 5, "solver": "adam", "learning_rate_init": 0.01}
    weighted = _clf(client, **full).fit(x, y, sample_weight=w)
    repeated = _clf(client, **full).fit(x.repeat(w, axis=0), y.repeat(w))
    np.testing.assert_allclose(weighted.predict_proba(x), repeated.predict_proba(x), rtol=1e-9)
    assert weighted.loss_curve_ == pytest.approx(repeated.loss_curve_, rel=1e-9)
    step = _clf(client, **full).partial_fit(x, y, sample_weight=w, classes=[0, 1, 2])
    once = _clf(client, **full).partial_fit(x.repeat(w, axis=0), y.repeat(w), classes=[0, 1, 2])
    np.testing.assert_allclose(step.predict_proba(x), once.predict_proba(x), rtol=1e-9)
    ones = _clf(client, max_iter=3).fit(x, y, sample_weight=np.ones(len(y)))
    np.testing.assert_allclose(ones.predict_proba(x), _clf(client, max_iter=3).fit(x, y)
                               .predict_proba(x), rtol=1e-9)             # weights 1: as none


def test_sample_weights_of_dask_inputs_travel_with_their_partitions(client):
    x, y = _iris()
    w = np.random.default_rng(3).integers(0, 4, len(y)).astype(float)
    in_memory = _clf(client, max_iter=3, shards=3).fit(x, y, sample_weight=w)
    arrays = _clf(client, max_iter=3).fit(da.from_array(x, chunks=(50, 4)),
                                          da.from_array(y, chunks=50),
                                          sample_weight=da.from_array(w, chunks=50))
    frame = dd.from_pandas(pd.DataFrame(x).assign(label=y, w=w), npartitions=3)
    frames = _clf(client, max_iter=3).fit(frame[[0, 1, 2, 3]], frame["label"],
                                          sample_weight=frame["w"])
    assert _same_bytes(in_memory, arrays) and _same_bytes(in_memory, frames)


@pytest.mark.parametrize("weights, message", [
    (-np.ones(150), "NaN, infinite or negative"),
    (np.zeros(150), "(?i)sample weights must contain at least one non-zero"),
    (np.ones(149), "149"),
    ((_iris()[1] == 2).astype(float), "leaves 1 class of positive weight"),
])
def test_bad_sample_weights_say_what_is_wrong(weights, message, client):
    with pytest.raises(ValueError, match=message):
        _clf(client, max_iter=2).fit(*_iris(), sample_weight=weights)


# --- bad input --------------------------------------------------------------------------------

def _with(row: int, column: str, value: float) -> pd.DataFrame:
    df = _frame()
    df.loc[row, column] = value
    return df


BAD = {
    "lengths": (lambda: (_iris()[0], _iris()[1][:-1]), "150 rows but y has 149"),
    "lengths (dask)": (lambda: (da.from_array(_iris()[0], chunks=50),
                                da.from_array(_iris()[1][:-1], chunks=50)), "149"),
    "nan": (lambda: (np.where(np.arange(600).reshape(150, 4) == 401, np.nan, _iris()[0]),
                     _iris()[1]), r"X\[100, 1\] is NaN"),
    "inf (dask.dataframe)": (lambda: (dd.from_pandas(_with(140, "sepal width", np.inf),
                                                     npartitions=3), "species"),
                             r"row 140 \(row 40 of partition 2\), column 'sepal width': inf"),
    "nan (pandas)": (lambda: (_with(120, "petal width", np.nan), "species"),
                     "X row 120, column 'petal width', is NaN"),
    "text column": (lambda: (_frame().assign(colour="red"), "species"),
                    "feature column 'colour' of X is not numeric"),
    "text column (dask)": (lambda: (dd.from_pandas(_frame().assign(colour="red"),
                                                   npartitions=2), "species"),
                           "feature column 'colour' of X is not numeric"),
    "fewer rows than shards": (lambda: (_iris()[0][:3], _iris()[1][:3]),
                               "3 samples for shards = 4"),
    "fewer rows than partitions (dask)": (lambda: (
        da.from_array(_iris()[0][:3], chunks=((1, 1, 1, 0), (4,))),
        da.from_array(_iris()[1][:3], chunks=((1, 1, 1, 0),))),
        "3 training samples for 4 partitions"),
    "one class": (lambda: (_iris()[0], np.zeros(150)), "1 class"),
    "one class (dask)": (lambda: (da.from_array(_iris()[0], chunks=50),
                                  da.zeros(150, chunks=50)), "1 class"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_value_error_that_says_what_and_where(case, client):
    make, message = BAD[case]
    X, y = make()
    with pytest.raises(ValueError, match=message):
        _clf(client, max_iter=2, shards=4).fit(X, y)


def test_predict_with_the_wrong_number_of_features(client):
    x, y = _iris()
    clf = _clf(client, max_iter=2).fit(x, y)
    with pytest.raises(ValueError, match="X has 3 features, but MLPClassifier is expecting 4"):
        clf.predict(x[:, :3])
    with pytest.raises(ValueError, match="X has 3 features"):
        clf.predict_proba(da.from_array(x[:, :3], chunks=50))
    with pytest.raises(ValueError, match="NaN"):
        clf.predict(np.where(x > 7, np.nan, x))


def test_a_dask_dataframe_missing_a_feature_column_is_refused_by_name(client):
    frame = iris_table()
    clf = dtrain.MLPClassifier(max_iter=5, client=client)
    clf.fit(dd.from_pandas(frame, npartitions=2), "species")
    lacking = dd.from_pandas(frame.drop(columns="pl"), npartitions=2)  # sl sw pw species
    with pytest.raises(ValueError, match="X lacks the feature column.s. 'pl' that "
                                         "MLPClassifier was fitted on"):
        clf.predict(lacking)
    with pytest.raises(ValueError, match=r"X \(partition 1\), row 27 of the block, column "
                                         r"'pl': NaN"):
        clf.predict(dd.from_pandas(frame.assign(pl=frame.pl.where(frame.index != 102)),
                                   npartitions=2)).compute()
    with pytest.raises(ValueError, match=r"X row 102, column 'pl', is NaN"):
        clf.predict(frame.assign(pl=frame.pl.where(frame.index != 102))[SHORT_FEATURES])


def test_an_imputer_in_a_pipeline_handles_missing_values(client):
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline

    frame = iris_table()
    frame.loc[[3, 50, 120], "pl"] = np.nan
    x, y = frame[SHORT_FEATURES], frame["species"]
    with pytest.raises(ValueError, match=r"X row 3, column 'pl', is NaN: .* an imputer"):
        dtrain.MLPClassifier(max_iter=2, client=client).fit(x, y)
    pipe = make_pipeline(SimpleImputer(), dtrain.MLPClassifier(max_iter=30, client=client))
    assert pipe.fit(x, y).score(x, y) > 0.5
    assert len(pipe.predict(x)) == 150
