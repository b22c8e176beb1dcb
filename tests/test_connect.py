"""A cluster dtrain did not start, named by a scheduler file (also one that appears late),
by ``--scheduler-address`` or by Dask's ``scheduler-address`` config
(:mod:`dtrain.deploy.connect`): dtrain trains on it instead of starting a LocalCluster, and a
missing scheduler file or both names at once are one line.  Such clusters launched for real
(``dask scheduler``, ``dask-mpi``): ``tests/test_daskmpi.py``.
"""
from __future__ import annotations

import json
import threading
import time

import dask

import dtrain
from dtrain import cli


QUICK = ["--set", "train.epochs=1", "--set", "data.shards=2"]


def test_a_scheduler_file_names_the_cluster_even_once_it_appears_late(client, tmp_path, capfd):
    """As `dask scheduler --scheduler-file` writes it, a second after dtrain started."""
    path = tmp_path / "scheduler.json"
    info = {"type": "Scheduler", "id": "Scheduler-x", "address": client.scheduler.address}
    threading.Timer(0.5, lambda: path.write_text(json.dumps(info))).start()
    code = cli.main(["--scheduler-file", str(path), *QUICK, "--out", str(tmp_path / "run")])
    out = capfd.readouterr().out
    assert code == 0
    assert f"scheduler: the scheduler of {path}" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["workers"] == 2          # the session cluster's, not a LocalCluster's one


def test_a_missing_scheduler_file_is_one_line_after_the_timeout(tmp_path, capfd):
    start = time.monotonic()
    code = cli.main(["--scheduler-file", str(tmp_path / "none.json"), "--set",
                     "cluster.timeout=1", "--out", str(tmp_path / "run")])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"cluster.scheduler_file = '{tmp_path / 'none.json'}' does not exist after 1 s " \
           f"(cluster.timeout); start the scheduler that writes it" in err[0]
    assert time.monotonic() - start < 10 and not (tmp_path / "run").exists()


def test_dask_scheduler_address_config_is_used_instead_of_a_new_localcluster(client, tmp_path):
    cfg = dtrain.load_config(None, ["train.epochs=1", "data.shards=2"])
    with dask.config.set({"scheduler-address": client.scheduler.address}):
        result = dtrain.train(cfg, out=tmp_path / "run", echo=None)
    assert result.summary["workers"] == 2


def test_scheduler_address_and_file_together_are_refused(tmp_path, capfd):
    code = cli.main(["--scheduler-address", "tcp://127.0.0.1:8786", "--scheduler-file",
                     str(tmp_path / "s.json"), "--out", str(tmp_path / "run")])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "give one of them" in err[0], err
