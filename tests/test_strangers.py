"""Nobody else on the machine runs code in a cluster dtrain starts.

While a run of the command line, ``dtrain.train`` and an estimator's embedded cluster go on,
another process (``tests/helpers/stranger.py``) calls ``distributed.Client`` on every TCP port that
the driver and its children listen on, with no certificate and with another run's: none
may run code.  Refused handshakes are one DEBUG line each, not a warning per try; a cluster
dtrain did not start is the user's, and dtrain warns once where it has no TLS.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, Security
from distributed.comm import connect, listen

import dtrain
from conftest import REPO
from dtrain.core.errors import UnprotectedCluster
from dtrain.deploy.logs import RefusedOnce, quiet_refusals
from dtrain.deploy.options import warn_if_open

TESTS = Path(__file__).resolve().parent
STRANGER = [sys.executable, str(TESTS / "helpers" / "stranger.py")]
ENV = {**os.environ, "PYTHONPATH": str(TESTS)}

SCRIPT = '''
import json, os, subprocess, sys

import psutil
from sklearn.datasets import load_iris

import dtrain
from dtrain.estimators import cluster
from helpers.sockets import family, listening

me = os.getpid()
said = {}


def echo(line):
    """While dtrain.train's cluster runs: the stranger, from another process, once."""
    if "train" in said or len({p for p, _, _ in listening(family(me))} - {me}) < 1:
        return
    done = subprocess.run([sys.executable, sys.argv[2], str(me), "1"], capture_output=True,
                          text=True, timeout=120)
    said["train"] = json.loads(done.stdout.strip().splitlines()[-1])


def main():
    dtrain.train(dtrain.load_config(None, ["train.epochs=30"]), out=sys.argv[1], echo=echo)
    X, y = load_iris(return_X_y=True)
    dtrain.MLPClassifier(hidden_layer_sizes=(8,), max_iter=3).fit(X, y)
    done = subprocess.run([sys.executable, sys.argv[2], str(me), "1"], capture_output=True,
                          text=True, timeout=120)      # the embedded cluster stays up
    said["fit"] = json.loads(done.stdout.strip().splitlines()[-1])
    said["fit_workers"] = sorted(cluster.embedded().run(os.getpid).values())
    print(json.dumps(said))


if __name__ == "__main__":
    main()
'''


def _no_way_in(said: dict, least: int) -> None:
    """The stranger tried at least ``least`` ports on a running cluster, and ran nothing."""
    assert said["alive"], said                 # the attempts met a running cluster
    assert len(said["tried"]) >= least, said
    assert said["ran"] == [], said
    assert said["refused"] >= 2 * least - said["hung"], said


@pytest.mark.slow
def test_a_stranger_cannot_run_code_in_the_command_lines_cluster(tmp_path):
    """The issue's run: two single-thread workers; the stranger knows only the process."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "dtrain", "--out", str(run), "--workers",
                             "2", "--set", "cluster.layout=flat", "--set", "train.epochs=2500"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stranger = subprocess.run([*STRANGER, str(proc.pid), "2"], capture_output=True,
                                  text=True, timeout=180, env=ENV)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert stranger.returncode == 0, stranger.stderr[-3000:]
    said = json.loads(stranger.stdout.strip().splitlines()[-1])
    # the scheduler, a nanny per worker and the HTTP server in the driver; a worker and
    # its HTTP server in each worker process
    _no_way_in(said, 7)
    assert proc.returncode == 0, err[-3000:]
    assert "TLS handshake" not in err and "SSL" not in err, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["worker_to_worker"] == ["unix"]


@pytest.mark.slow
def test_a_stranger_cannot_run_code_in_train_or_an_estimators_cluster(tmp_path):
    script = tmp_path / "strangers.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"),
                           str(TESTS / "helpers" / "stranger.py")], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("train", "fit"):
        _no_way_in(said[key], 4)
    assert set(said["fit_workers"]) <= {pid for pid, _, _ in map(tuple, said["fit"]["tried"])}
    assert "TLS handshake" not in proc.stderr, proc.stderr[-3000:]


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_refused_handshakes_are_one_debug_line_each():
    """No certificate, and another run's, three times each at one TLS listener: one DEBUG
    record for each reason, no warning; a logger above DEBUG shows nothing."""
    ours, theirs = Security.temporary(), Security.temporary()

    async def knock(address: str) -> None:
        for _ in range(3):
            for scheme, security in (("tcp", None), ("tls", theirs)):
                args = security.get_connection_args("client") if security else {}
                with pytest.raises(Exception):
                    comm = await connect(f"{scheme}://{address}", timeout=2, **args)
                    await comm.read()
                await asyncio.sleep(0.05)

    async def listening() -> None:
        async def handler(comm):
            await comm.close()
        listener = listen("tls://127.0.0.1:0", handler, **ours.get_listen_args("scheduler"))
        await listener.start()
        await knock(listener.contact_address.removeprefix("tls://"))
        await asyncio.sleep(0.2)
        listener.stop()

    quiet_refusals()
    log = logging.getLogger("distributed.comm.tcp")
    once = next(f for f in log.filters if isinstance(f, RefusedOnce))
    kept, level = _Kept(), log.level
    log.addHandler(kept)
    try:
        for shown in (logging.DEBUG, logging.WARNING):
            once.seen.clear()
            kept.records.clear()
            log.setLevel(shown)
            asyncio.run(listening())
            said = [r for r in kept.records if "TLS handshake failed" in r.getMessage()]
            if shown == logging.DEBUG:
                assert [r.levelno for r in said] == [logging.DEBUG] * 2, said
                assert len({str(r.args[-1]) for r in said}) == 2, said
            else:
                assert said == []
    finally:
        log.removeHandler(kept)
        log.setLevel(level)


def test_a_cluster_dtrain_did_not_start_without_tls_is_said_once():
    """``client=`` on a plain-TCP scheduler (on loopback: every user of the machine can
    reach it) warns once; one on TLS, or in-process, does not."""
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                      host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        address = client.scheduler.address
        cfg = dtrain.load_config(None, ["train.epochs=1"])
        with pytest.warns(UnprotectedCluster, match=f"{address} runs without TLS"):
            dtrain.train(cfg, client=client, echo=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dtrain.train(cfg, client=client, echo=None)     # once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_open("tls://127.0.0.1:8786")
        assert not warn_if_open("inproc://127.0.0.1/1/1")


def test_the_command_line_says_it_in_one_line(client, tmp_path):
    """``--scheduler-address`` of a plain-TCP scheduler (the suite's own cluster)."""
    done = subprocess.run([sys.executable, "-m", "dtrain", "--scheduler-address",
                           client.scheduler.address, "--set", "train.epochs=1", "--out",
                           str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "without TLS" in line]
    assert said == [f"dtrain: warning: the Dask scheduler at {client.scheduler.address} runs "
                    f"without TLS: anyone who can reach that address (on loopback, every user "
                    f"of this machine) can run code on its workers as you; start it with TLS "
                    f"credentials (distributed.Security), or let dtrain start its own "
                    f"cluster"], done.stderr


def test_a_cluster_dtrain_started_without_tls_is_not_warned_about():
    """``cluster.tls = 'off'`` is the user's word for a cluster dtrain starts (as under
    ``mpirun``, which hands its client to the run): no warning, there or on a client of it."""
    from dtrain.deploy.connect import connect

    cfg = dtrain.load_config(None, ["cluster.tls=off", "train.epochs=1", "cluster.workers=1",
                                    "cluster.dashboard_address="])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with connect(cfg.cluster) as client:
            assert client.scheduler.address.startswith("tcp://")
            dtrain.train(cfg, client=client, echo=None)
