"""Stopping a run with a signal, for real: Ctrl-C, SIGTERM and SIGUSR1 save a checkpoint at the
next step boundary and end with two lines; resuming gives the same bytes as a run never
stopped, however many times it was stopped; nothing is left running."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import dtrain
from conftest import REPO
from dtrain.core.errors import EXIT_INTERRUPTED, EXIT_STOPPED, Stopped
from dtrain.deploy.signals import AT_ONCE, StopSignals
from dtrain.training.plan import plan
from helpers import mpirun

EPOCHS = 2000          # iris: 14,000 steps, a few seconds in windows of a second or so
LONG = ["--set", f"train.epochs={EPOCHS}", "--dashboard-address", ""]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> bytes:
    """``params.npz`` of the same run, never stopped."""
    out = tmp_path_factory.mktemp("ref") / "run"
    dtrain.train(dtrain.load_config(None, [f"train.epochs={EPOCHS}",
                                           "cluster.dashboard_address="]),
                 out=out, echo=None)
    return (out / "params.npz").read_bytes()


def _start(*args: str, ranks: int = 0) -> subprocess.Popen:
    """``python -m dtrain ARGS`` (under ``mpiexec -n ranks`` if ``ranks``) in a session of
    its own, as a shell would start it."""
    command = mpirun.command(ranks, *args) if ranks else [sys.executable, "-m", "dtrain", *args]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=mpirun.environment() if ranks else None)


def _after_epochs(proc: subprocess.Popen, n: int) -> list[str]:
    """Read the run's lines until ``n`` more epoch lines have come."""
    lines, seen = [], 0
    while seen < n:
        line = proc.stdout.readline()
        assert line, "the run ended early: " + proc.stderr.read()
        lines.append(line)
        seen += line.startswith("epoch")
    return lines


def _stop(proc: subprocess.Popen, sig: signal.Signals, group: bool = False) -> tuple[int, str]:
    family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    time.sleep(0.5)
    alive = [p for p in family if psutil.pid_exists(p) and
             psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running after {sig.name}: {alive}"
    return proc.returncode, err


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_says_two_lines_and_resumes_to_the_same_bytes(
        tmp_path, reference):
    out = tmp_path / "run"
    proc = _start(*LONG, "--out", str(out))
    _after_epochs(proc, 5)
    code, err = _stop(proc, signal.SIGINT, group=True)      # what a terminal's Ctrl-C does
    lines = err.strip().splitlines()
    assert code == EXIT_INTERRUPTED and len(lines) == 2, err
    assert lines[0].startswith("dtrain: stopped by SIGINT after step ")
    step = int(lines[0].split("after step ")[1].split()[0])
    assert f"checkpoint of step {step} saved in {out}" in lines[0] and 0 < step < 7 * EPOCHS
    assert lines[1] == f"dtrain: resume with: python -m dtrain --resume {out}"
    assert (out / "checkpoint.npz").exists() and not (out / "summary.json").exists()
    resumed = subprocess.run([sys.executable, "-m", "dtrain", "--resume", str(out)], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "params.npz").read_bytes() == reference
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, EPOCHS + 1))
    # the resumed part's throughput counts the samples trained after the resume only
    p = plan(dtrain.load_config(out / "config.toml"))
    trained = p.schedule.samples(step, len(p.schedule))
    assert summary["samples_per_second"] * summary["seconds"] == pytest.approx(trained)
    first = rows[step // 7]                                # the epoch the resume began in
    assert first["samples_per_second"] * first["seconds"] == \
        pytest.approx(p.schedule.samples(step, (step // 7 + 1) * 7))


@pytest.mark.slow
def test_sigterm_and_sigusr1_stop_again_and_again_with_no_loss(tmp_path, reference):
    """Preemption as a batch system does it: each stop saves a checkpoint and exits 75; the
    run resumed after any number of them ends with the bytes of one never stopped."""
    out = tmp_path / "run"
    proc = _start(*LONG, "--out", str(out))
    steps = []
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1):
        _after_epochs(proc, 3)
        code, err = _stop(proc, sig)
        lines = err.strip().splitlines()
        assert code == EXIT_STOPPED and len(lines) == 2, err
        assert lines[0].startswith(f"dtrain: stopped by {sig.name} after step "), lines
        steps.append(int(lines[0].split("after step ")[1].split()[0]))
        proc = _start("--resume", str(out))
    assert steps == sorted(steps) and len(set(steps)) == 3
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert (out / "params.npz").read_bytes() == reference


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_quietly(tmp_path):
    out = tmp_path / "run"
    proc = _start(*LONG, "--out", str(out), "--set", "graph.window=2000")   # one long window
    _after_epochs(proc, 2)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    code, err = _stop(proc, signal.SIGINT, group=True)
    lines = err.strip().splitlines()
    assert code == EXIT_INTERRUPTED and len(lines) == 2, err
    assert lines[0].startswith("dtrain: interrupted at once (a second SIGINT); ")
    assert lines[1] == f"dtrain: resume with: python -m dtrain --resume {out}"


@pytest.mark.slow
@pytest.mark.mpi
def test_sigusr1_to_mpiexec_stops_every_rank_and_resumes_under_mpiexec(tmp_path, reference):
    out = tmp_path / "run"
    proc = _start(*LONG, "--out", str(out), ranks=3)
    _after_epochs(proc, 3)
    code, err = _stop(proc, signal.SIGUSR1)                  # mpiexec passes it on
    lines = err.strip().splitlines()
    assert code == EXIT_STOPPED and len(lines) == 2, err
    assert lines[1] == f"dtrain: resume with: mpiexec -n 3 python -m dtrain --scheduler-rank 0 " \
                       f"--resume {out}"
    again = mpirun.run(3, "--resume", str(out), timeout=120)
    assert again.returncode == 0, again.stderr
    assert (out / "params.npz").read_bytes() == reference


# --- a signal before training, and Stopped ----------------------------------------------------

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
