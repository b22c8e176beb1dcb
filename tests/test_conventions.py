"""Dask's conventions and the command line's small promises (issue 26, items 5 and 7-11).

A scheduler named by a scheduler file or by Dask's ``scheduler-address`` config, dtrain's
plugins gone from a user's scheduler after a run, quiet signals from the first instant,
the exit codes in one table, ``--workers 0``, run directories named after the data, the
serial strategy's summary, and a stop by a signal that ``except Exception`` cannot swallow."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import dask
import pytest

import dtrain
from conftest import REPO
from dtrain import cli
from dtrain.cli import train as train_cli
from dtrain.core.config import DataConfig
from dtrain.core.errors import EXIT_STOPPED, Stopped
from dtrain.deploy import plugins
from dtrain.deploy.signals import AT_ONCE, StopSignals
from dtrain.training.trainer import default_out_dir

QUICK = ["--set", "train.epochs=1", "--set", "data.shards=2"]


def _dtrain_plugins(client) -> tuple[list[str], dict[str, list[str]]]:
    on_scheduler = client.run_on_scheduler(
        lambda dask_scheduler: [n for n in dask_scheduler.plugins if "dtrain" in str(n)])
    on_workers = client.run(lambda dask_worker: [n for n in dask_worker.plugins
                                                 if "dtrain" in str(n)])
    return on_scheduler, on_workers


# --- a running scheduler: scheduler file, Dask's config (item 5) ------------------------------

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


# --- plugins on a user's scheduler (item 7) ---------------------------------------------------

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


# --- signals from the first instant (item 8), Stopped (item 11) --------------------------------

@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "dtrain: interrupted"),
                                             (signal.SIGTERM, EXIT_STOPPED,
                                              "dtrain: stopped by SIGTERM")])
def test_a_signal_during_the_imports_is_quiet_with_its_exit_code(tmp_path, sig, code, line):
    proc = subprocess.Popen([sys.executable, "-m", "dtrain", "--out", str(tmp_path / "run")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)                       # the command line's imports take a second or more
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, (proc.returncode, err)
    assert err.strip().splitlines() == [line] and out == ""


def test_sigterm_before_training_raises_stopped_with_its_exit_code():
    """A command's signals before anything is made (AT_ONCE): SIGTERM raises Stopped where the
    code is, Ctrl-C KeyboardInterrupt; the handlers before are back after."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as raised, StopSignals(AT_ONCE):
        signal.raise_signal(signal.SIGTERM)
    assert raised.value.code == EXIT_STOPPED and raised.value.lines() == ["stopped by SIGTERM"]
    with pytest.raises(KeyboardInterrupt), StopSignals(AT_ONCE):
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_by_a_signal_is_not_swallowed_by_except_exception(tmp_path):
    assert issubclass(Stopped, BaseException) and not issubclass(Stopped, Exception)
    cfg = dtrain.load_config(None, ["graph.strategy=serial", "train.epochs=400",
                                    "graph.window=10"])

    def echo(line: str) -> None:          # the first epoch's line: a SIGTERM arrives
        if line.startswith("epoch") and "  1/" in line.split("train_loss")[0]:
            signal.raise_signal(signal.SIGTERM)

    swallowed = False
    with pytest.raises(Stopped) as raised:
        try:
            dtrain.train(cfg, out=tmp_path / "run", echo=echo)
        except Exception:                 # what a user's broad handler does
            swallowed = True
    assert not swallowed and raised.value.signal == "SIGTERM"
    assert raised.value.code == EXIT_STOPPED


# --- the exit codes (item 9) -------------------------------------------------------------------

def test_the_docs_list_every_exit_code_in_one_table():
    """The exit codes are one table, on the troubleshooting page (README.md is a first visit
    now): a row per code, in order, every code dtrain's errors and the CLI give among them,
    and no second exit-code table on any page to disagree with it."""
    from dtrain.cli.main import EXIT_BROKEN_PIPE
    from dtrain.core.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_USER_ERROR

    docs = REPO / "docs"
    text = (docs / "troubleshooting.md").read_text()
    section = text.split("(exit-codes)=\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    table = re.search(r"^\| exit code \| what happened \| what to do \|\n\| --- \| --- \| --- \|\n"
                      r"((?:\|.*\|\n)+)", section, re.M)
    assert table, "no exit-code table under 'Exit codes' in docs/troubleshooting.md"
    codes = [row.split("|")[1].strip().strip("`") for row in table.group(1).splitlines()]
    assert codes == ["0", "2", "3", "75", "130", "141", "any other"], codes
    assert {str(c) for c in (EXIT_USER_ERROR, EXIT_DIVERGED, EXIT_STOPPED, EXIT_INTERRUPTED,
                             EXIT_BROKEN_PIPE)} <= set(codes)
    assert "Python is still importing Dask" in section and "dtrain.Stopped" in section
    pages = {p.name: p.read_text() for p in [REPO / "README.md", *docs.glob("*.md")]}
    tables = [name for name, page in pages.items()
              for _ in re.finditer(r"^\| (exit )?code \|", page, re.M)]
    assert tables == ["troubleshooting.md"], tables


# --- small promises (item 10) ------------------------------------------------------------------

def test_workers_0_means_the_layouts_default_as_the_config_key_does():
    job = train_cli.prepare(["--workers", "0", "--set", "graph.strategy=serial"])
    assert job.config.cluster.workers == 0
    assert job.config == train_cli.prepare(["--set", "cluster.workers=0", "--set",
                                            "graph.strategy=serial"]).config


def test_a_run_on_a_csv_is_named_after_the_data(tmp_path, monkeypatch, capfd):
    from sklearn.datasets import load_iris

    frame = load_iris(as_frame=True).frame
    frame.to_csv(tmp_path / "flowers.csv", index=False)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["--set", "data.dataset=csv", "--set", "data.path=flowers.csv",
                     "--set", "graph.strategy=serial", "--set", "train.epochs=1"])
    assert code == 0, capfd.readouterr().err
    assert [p.name.split("-", 2)[-1] for p in (tmp_path / "runs").iterdir()] == ["flowers"]
    assert default_out_dir(DataConfig(dataset="parquet", path="/d/sales/part-*.parquet")) \
        .name.endswith("-sales")
    assert default_out_dir(None).name.endswith("-iris")
    assert default_out_dir("configs/mnist.toml").name.endswith("-mnist")


def test_the_serial_strategy_claims_no_efficiency_over_worker_threads():
    seen: list[str] = []
    dtrain.train(dtrain.load_config(None, ["graph.strategy=serial", "train.epochs=1"]),
                 echo=seen.append)
    assert not [line for line in seen if "efficiency" in line or "worker threads" in line], seen
    assert any(line.endswith("(in this process: no workers)") for line in seen), seen
