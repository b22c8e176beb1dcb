"""Deployment without mpiexec: [cluster] keys, TLS on a LocalCluster, rank and GPU rules."""
from __future__ import annotations

import os

import pytest
from distributed import Client, Security

import dtrain
from conftest import run_cli
from dtrain.cli.train import prepare
from dtrain.core.config import ClusterConfig, ConfigError
from dtrain.core.errors import UserError
from dtrain.deploy import mpi, rankgpus
from dtrain.deploy.connect import connect
from dtrain.deploy.options import security_for


@pytest.mark.parametrize("sets, message", [
    (["cluster.tls=maybe"], "cluster.tls = 'maybe'"),
    (["cluster.kind=lsf"], "cluster.kind = 'lsf'"),
    (["cluster.kind=slurm", "cluster.scheduler_address=tcp://x:1"],
     r"cluster.kind = 'slurm' in .* starts its own scheduler"),
    (["cluster.tls=on", "cluster.scheduler_address=tcp://x:1"],
     "takes its TLS files from the Dask config"),
])
def test_cluster_keys_are_checked(sets, message):
    with pytest.raises(ConfigError, match=message):
        dtrain.load_config({}, sets)


def test_jobqueue_file_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = dtrain.load_config(None, ["cluster.jobqueue_file=site.yaml"])
    assert cfg.cluster.jobqueue_file == str(tmp_path / "site.yaml")


@pytest.mark.parametrize("tls, deployed, wanted", [
    ("auto", True, True), ("auto", False, False), ("on", False, True), ("off", True, False)])
def test_tls_is_on_by_default_where_the_cluster_is_deployed(tls, deployed, wanted):
    security = security_for(ClusterConfig(tls=tls), deployed=deployed)
    assert isinstance(security, Security) == wanted
    if wanted:
        assert security.require_encryption and "BEGIN CERTIFICATE" in security.tls_ca_file


def test_local_cluster_over_tls_trains_and_refuses_other_certificates():
    cfg = dtrain.load_config(None, ["cluster.tls=on", "train.epochs=2",
                                    "cluster.dashboard_address="])
    with connect(cfg.cluster) as client:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        result = dtrain.train(cfg, client=client, echo=None)
        with pytest.raises(OSError):
            Client(address, security=Security.temporary(), timeout=3)
    assert result.summary["workers"] == 2 and result.summary["test_accuracy"] is not None


def test_command_line_mistakes_are_one_line(tmp_path):
    proc = run_cli("--bogus", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "dtrain: error: unrecognized arguments: --bogus (see python -m dtrain --help)"]


@pytest.mark.parametrize("strategy, ranks", [("serial", 1), ("allreduce", 2),
                                             ("parameter-server", 3)])
def test_ranks_needed(strategy, ranks):
    job = prepare(["--set", f"graph.strategy={strategy}"])     # what the MPI head runs
    mpi.check_ranks(job, ranks)
    with pytest.raises(UserError, match=f"needs {ranks} MPI ranks .* found {ranks - 1}; "
                                        f"start it with mpirun -n {ranks} or more"):
        mpi.check_ranks(job, ranks - 1)


def test_gpus_are_dealt_round_robin_to_the_worker_ranks_of_a_node(monkeypatch):
    assert [rankgpus.gpu_for(i, ["0", "1", "2"]) for i in range(5)] == ["0", "1", "2", "0", "1"]
    assert rankgpus.gpu_for(0, []) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert rankgpus.visible_gpus() == ["3", "5"]
    assert rankgpus.pin_gpu("cpu", 1) is None
    assert rankgpus.pin_gpu("gpu", 1) == "5"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"     # monkeypatch restores it
