"""dtrain.MLPClassifier and dtrain.MLPRegressor: scikit-learn's estimator API over dtrain runs.

Real fits on real clusters: the session's two-worker LocalCluster (``client``), the
estimators' own embedded cluster (no client), and clusters of 1, 2 and 3 workers for the
promise that the bytes do not depend on the cluster.  Here: going on from a fit, the same
bytes on any cluster, the embedded cluster.  Beside this file, by what they test:
``test_estimators_inputs.py`` (what fit and predict take), ``test_estimators_targets.py``
(what a fit learns to predict), ``test_estimators_stopping.py`` (when it stops),
``test_estimators_lbfgs.py`` (``solver="lbfgs"``) and ``test_estimators_sklearn_api.py``
(scikit-learn's machinery, names and checks).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from distributed import Client, LocalCluster, default_client

import dask.dataframe as dd
import dtrain
from conftest import REPO, run_cli
from dtrain.core.config import ClusterConfig
from dtrain.deploy.layout import local_shape
from helpers.estimators_common import _clf, _frame, _iris, _same_bytes
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


# --- going on ---------------------------------------------------------------------------------

MOMENTUM = {"solver": "sgd", "momentum": 0.9, "batch_size": 150, "learning_rate_init": 0.1}


def test_partial_fit_goes_on_with_the_optimizer_slots(client):
    """Full batches (no shuffle to tell epochs apart): two partial fits are a 2-epoch fit,
    byte for byte, only if the momentum carried over."""
    x, y = _iris()
    straight = _clf(client, max_iter=2, **MOMENTUM).fit(x, y)
    steps = _clf(client, **MOMENTUM)
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        steps.partial_fit(x, y)
    steps.partial_fit(x, y, classes=[0, 1, 2]).partial_fit(x, y)
    assert steps.n_iter_ == 1 and _same_bytes(steps, straight)     # scikit-learn: 1 per call
    assert steps.loss_curve_ == straight.loss_curve_ and steps.t_ == straight.t_ == 300
    # a later batch may lack classes; it keeps the first call's normalization
    first = steps.model_.spec.normalization
    steps.partial_fit(x[y != 2] * 3, y[y != 2])
    assert steps.classes_.tolist() == [0, 1, 2] and steps.model_.spec.normalization == first
    with pytest.raises(ValueError, match="not among the classes"):
        steps.partial_fit(x, np.where(y == 2, 7, y))


def test_warm_start_goes_on_from_the_last_state(client, tmp_path):
    x, y = _iris()
    straight = _clf(client, max_iter=4, **MOMENTUM).fit(x, y)
    warm = _clf(client, max_iter=2, warm_start=True, out=tmp_path / "run", **MOMENTUM)
    warm.fit(x, y).fit(x, y)
    assert warm.n_iter_ == 2 and _same_bytes(warm, straight)      # the last fit's epochs
    assert warm.loss_curve_ == straight.loss_curve_ and warm.loss_ == straight.loss_curve_[-1]
    assert dtrain.load(tmp_path / "run").predict(x).tolist() == warm.predict(x).tolist()
    with pytest.raises(ValueError, match="same classes"):
        warm.fit(x[y != 2], y[y != 2])
    cold = _clf(client, max_iter=2, **MOMENTUM).fit(x, y)
    assert cold.fit(x, y).n_iter_ == 2                   # warm_start=False starts afresh


# --- the same bytes ---------------------------------------------------------------------------

@pytest.mark.slow
def test_the_same_bytes_on_one_two_and_three_workers(client):
    ddf = dd.from_pandas(_frame(), npartitions=5)
    fits = [_clf(client, max_iter=5, batch_size=32).fit(ddf, "species")]
    for n in (1, 3):
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as c:
            fits.append(_clf(c, max_iter=5, batch_size=32).fit(ddf, "species"))
            assert fits[-1].summary_["workers"] == n
    assert all(_same_bytes(fits[0], other) for other in fits[1:])


@pytest.mark.slow
def test_the_same_bytes_as_the_cli_on_the_same_parquet_files(client, tmp_path):
    parquet = tmp_path / "iris"
    dd.from_pandas(_frame(), npartitions=3).to_parquet(parquet, write_index=False)
    clf = _clf(client, max_iter=5, batch_size=32, out=tmp_path / "estimator")
    clf.fit(dd.read_parquet(parquet), "species")
    done = run_cli("--config", str(tmp_path / "estimator" / "config.toml"),
                   "--set", "data.dataset=parquet",
                   "--set", f"data.path={parquet}/*.parquet", "--set", "data.label=species",
                   "--out", str(tmp_path / "cli"), timeout=300)
    assert done.returncode == 0, done.stderr
    ours, theirs = (np.load(tmp_path / d / "params.npz") for d in ("estimator", "cli"))
    assert sorted(ours.files) == sorted(theirs.files)
    assert all(ours[k].tobytes() == theirs[k].tobytes() for k in ours.files)
    assert (tmp_path / "estimator" / "params.npz").read_bytes() == \
        (tmp_path / "cli" / "params.npz").read_bytes()


def test_an_in_process_cluster_trains_the_same_bytes(client):
    """Item 6: what a process that cannot start worker processes gets (this one can): one
    worker of threads in the process, training the bytes a cluster of processes trains."""
    from dtrain.estimators import cluster

    assert cluster.can_start_processes()
    with cluster.in_process(ClusterConfig()) as lc, Client(lc, set_as_default=False) as c:
        info = c.scheduler_info()["workers"]
        assert len(info) == 1 and next(iter(info)).startswith("inproc://")
        fitted = _clf(c, max_iter=3).fit(*_iris())
    assert _same_bytes(fitted, _clf(client, max_iter=3).fit(*_iris()))


# --- without a client -------------------------------------------------------------------------

@pytest.mark.slow
def test_numpy_without_a_client_runs_on_one_shared_embedded_cluster():
    from dtrain.estimators import cluster

    x, y = _iris()
    first = dtrain.MLPClassifier(max_iter=5, random_state=0).fit(x, y)
    embedded = cluster.embedded()
    second = dtrain.MLPClassifier(max_iter=5, random_state=0).fit(x, y)
    assert cluster.embedded() is embedded and _same_bytes(first, second)
    shape = local_shape(ClusterConfig())             # the command line's embedded cluster
    assert (second.summary_["workers"], second.summary_["threads"]) == \
        (shape.workers, shape.workers * shape.threads)
    try:
        current = default_client()
    except ValueError:
        current = None
    assert current is not embedded                    # it is not made the default client


def test_the_embedded_cluster_keeps_dtrains_plugins_between_fits(monkeypatch):
    """dtrain's own cluster: its plugins are registered by the first fit and stay (a user's
    scheduler is left without them: tests/test_plugins.py), so the next fit spends no
    round trips on them, and its scheduler still counts its tasks."""
    from dtrain.estimators import cluster

    x, y = _iris()
    dtrain.MLPClassifier(max_iter=2, random_state=0).fit(x, y)
    embedded = cluster.embedded()
    held = embedded.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))
    assert {"dtrain", "dtrain-step-timer", "dtrain-stranded-tasks"} <= set(held), held
    calls: list = []
    monkeypatch.setattr(embedded, "register_plugin", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(embedded, "unregister_scheduler_plugin", lambda *a: calls.append(a))
    second = dtrain.MLPClassifier(max_iter=2, random_state=0).fit(x, y)
    assert calls == [] and second.summary_["scheduler_tasks_per_step"] > 0


def test_import_dtrain_does_not_import_scikit_learn():
    code = "import sys, dtrain; print('sklearn' in sys.modules, dtrain.MLPClassifier.__module__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.stdout.split() == ["False", "dtrain.estimators.mlp"], done.stderr
