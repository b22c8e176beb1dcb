"""Nothing that dtrain starts on one machine listens beyond it unless asked.

Every listening socket of the driver and of every worker process, read with psutil while the
cluster runs, must be on 127.0.0.0/8 or ::1: the command line with and without a dashboard,
``dtrain.train`` and an estimator's embedded cluster.  A dashboard address with a host, or
``cluster.interface``, opens exactly what it asks for.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from distributed import Client

from conftest import REPO
from dtrain.core.config import ClusterConfig
from dtrain.deploy.local import local_cluster, local_gpu_cluster
from dtrain.deploy.options import http_address
from helpers.sockets import family, listening, loopback, outside_loopback, poll_until_exit

TESTS = Path(__file__).resolve().parent

SCRIPT = '''
import json, sys

import psutil
from sklearn.datasets import load_iris

import dtrain
from dtrain.estimators import cluster
from helpers.sockets import Watch, family, listening


def main():
    with Watch(psutil.Process().pid) as watch:        # while dtrain.train's cluster runs
        dtrain.train(dtrain.load_config(None, ["train.epochs=15"]), out=sys.argv[1], echo=None)
    X, y = load_iris(return_X_y=True)
    dtrain.MLPClassifier(hidden_layer_sizes=(8,), max_iter=3).fit(X, y)
    fit = listening(family(psutil.Process().pid))    # the embedded cluster, still up
    workers = cluster.embedded().run(lambda: __import__("os").getpid())
    print(json.dumps({"train": sorted(watch.seen), "fit": sorted(fit),
                      "fit_workers": sorted(workers.values())}))


if __name__ == "__main__":
    main()
'''


def _check(found: set, driver: int, least_workers: int = 1) -> None:
    """``found`` is all on loopback, and holds the driver's listeners (scheduler, its HTTP
    server, a nanny) and at least ``least_workers`` worker processes' (so that the check is
    not vacuous)."""
    assert outside_loopback(found) == [], sorted(found)
    pids = {pid for pid, _, _ in found}
    assert len([1 for pid, _, _ in found if pid == driver]) >= 3, sorted(found)
    assert len(pids - {driver}) >= least_workers, sorted(found)


def _cluster_listeners(cfg: ClusterConfig, gpus: int = 0) -> tuple[set, int, int]:
    """What a running :func:`local_cluster` of ``cfg`` (with ``gpus``: a
    :func:`local_gpu_cluster`, its workers told they have a GPU) listens on: the sockets this
    process opened for it, and its worker processes'; with the scheduler's HTTP port and the
    number of worker processes."""
    me = psutil.Process()
    before = listening([me])
    with (local_gpu_cluster(cfg, gpus) if gpus else local_cluster(cfg)) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(cfg.workers)
        workers = set(client.run(os.getpid).values())
        procs = [p for p in family(me.pid) if p.pid in workers]
        found = (listening([me]) - before) | listening(procs)
        http = cluster.scheduler.http_server.port
    return found, http, len(workers)


@pytest.mark.parametrize("dashboard", ["", ":0"])
def test_an_embedded_cluster_listens_on_loopback_only(dashboard):
    """No dashboard, and a dashboard address without a host (the default, 127.0.0.1:8787, is
    the command line's test below)."""
    cfg = ClusterConfig(workers=1, dashboard_address=dashboard)
    found, http, workers = _cluster_listeners(cfg)
    _check(found, os.getpid())
    assert workers == 1 and any(port == http for _, _, port in found)


def test_an_embedded_gpu_cluster_listens_on_loopback_only():
    """One worker per GPU (here one that only says so) and a CPU worker beside it."""
    found, http, workers = _cluster_listeners(
        ClusterConfig(workers=2, device="auto", dashboard_address=""), gpus=1)
    _check(found, os.getpid(), least_workers=2)
    assert workers == 2 and any(port == http for _, _, port in found)


def test_a_dashboard_host_opens_the_dashboard_and_nothing_else():
    found, http, _ = _cluster_listeners(ClusterConfig(workers=1,
                                                      dashboard_address="0.0.0.0:0"))
    assert outside_loopback(found) == [(os.getpid(), "0.0.0.0", http)]


@pytest.mark.parametrize("given, bound", [
    ("", "127.0.0.1:0"), (":8787", "127.0.0.1:8787"), ("8787", "127.0.0.1:8787"),
    ("127.0.0.1:8787", "127.0.0.1:8787"), ("0.0.0.0:8787", "0.0.0.0:8787"),
    ("[::1]:0", "[::1]:0"), ("myhost:80,:81", "myhost:80,127.0.0.1:81")])
def test_the_scheduler_http_server_address(given, bound):
    assert http_address(given) == bound


def _network_interface() -> tuple[str, str] | None:
    """A non-loopback interface that is up, and its IPv4 address."""
    stats = psutil.net_if_stats()
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family == socket.AF_INET and not loopback(addr.address) and \
                    stats.get(name) and stats[name].isup:
                return name, addr.address
    return None


def test_cluster_interface_puts_the_cluster_on_that_interface():
    found = _network_interface()
    if found is None:
        pytest.skip("no network interface besides loopback")
    name, ip = found
    found, http, _ = _cluster_listeners(ClusterConfig(workers=1, dashboard_address="",
                                                      interface=name))
    outside = outside_loopback(found)
    assert outside and {addr for _, addr, _ in outside} == {ip}, sorted(found)
    # the scheduler's HTTP server stays on loopback: no dashboard was asked for
    assert [addr for _, addr, port in found if port == http] == ["127.0.0.1"]


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--dashboard-address", ""]],
                         ids=["dashboard", "no-dashboard"])
def test_the_command_line_listens_on_loopback_only(tmp_path, args):
    proc = subprocess.Popen([sys.executable, "-m", "dtrain", "--out", str(tmp_path / "run"),
                             "--set", "train.epochs=20", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        found = poll_until_exit(proc)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert ("dashboard: http://127.0.0.1:" in out) == (not args), out
    _check(found, proc.pid)


@pytest.mark.slow
def test_train_and_an_estimator_fit_listen_on_loopback_only(tmp_path):
    script = tmp_path / "listen.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], cwd=REPO,
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    train, fit = ({tuple(item) for item in said[key]} for key in ("train", "fit"))
    assert outside_loopback(train) == [] and outside_loopback(fit) == [], said
    driver = {pid for pid, _, _ in fit} - set(said["fit_workers"])
    assert len(driver) == 1 and len({pid for pid, _, _ in train} - driver) >= 1, said
    _check(fit, driver.pop())
    assert set(said["fit_workers"]) <= {pid for pid, _, _ in fit}
