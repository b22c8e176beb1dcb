"""dtrain's plugins on a scheduler and its workers (:mod:`dtrain.deploy.plugins`): registered
once however many runs share a scheduler, and gone from a user's scheduler when the last run
on it ends.
"""
from __future__ import annotations

import dtrain
from dtrain.deploy import plugins


def _dtrain_plugins(client) -> tuple[list[str], dict[str, list[str]]]:
    on_scheduler = client.run_on_scheduler(
        lambda dask_scheduler: [n for n in dask_scheduler.plugins if "dtrain" in str(n)])
    on_workers = client.run(lambda dask_worker: [n for n in dask_worker.plugins
                                                 if "dtrain" in str(n)])
    return on_scheduler, on_workers


def test_dtrains_plugins_are_gone_from_a_users_scheduler_after_the_run(client, tmp_path):
    cfg = dtrain.load_config(None, ["train.epochs=1", "data.shards=2"])
    dtrain.train(cfg, client=client, out=tmp_path / "run", echo=None)
    on_scheduler, on_workers = _dtrain_plugins(client)
    assert on_scheduler == [] and all(v == [] for v in on_workers.values()), \
        (on_scheduler, on_workers)
    again = dtrain.train(cfg, client=client, out=tmp_path / "again", echo=None)   # and back
    assert again.summary["comm_bytes_measured_per_step"] is not None


def test_a_second_engine_on_a_scheduler_registers_its_plugins_without_a_warning(client):
    """Two runs (or a run and an estimator's fit) on one scheduler: dtrain's plugins are
    there once, and distributed says nothing of overwriting one."""
    import warnings

    from dtrain.training.engines import DaskEngine
    from dtrain.training.plan import plan

    p = plan(dtrain.load_config(None, ["train.epochs=1"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DaskEngine(p, client)
        DaskEngine(p, client)
    plugins.remove(client, _dtrain_plugins(client)[0])


def test_the_last_of_concurrent_runs_removes_the_plugins():
    class Scheduler:
        plugins = {"dtrain": 0, "dtrain-step-timer": 0, "shuffle": 0, "dtrainx": 0}
    s = Scheduler()
    assert plugins._enter(s) == 1 and plugins._enter(s) == 2
    assert plugins._leave(s) is None                          # another run goes on
    assert plugins._leave(s) == ["dtrain", "dtrain-step-timer"]
