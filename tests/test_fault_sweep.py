"""Faults at every instant of a run's life, for real: a sweep from the first instant of the
process to its exit, in steps that land in every phase (imports, the cluster's start, the
data's loading, the first window, window edges and checkpoints, the final evaluation, the
files, the teardown), of each fault a batch system or a user deals a run: Ctrl-C to the
process group, SIGTERM and SIGUSR1 to the driver, SIGKILL to a worker, SIGKILL to the
driver followed by ``--resume``.

At every instant: no traceback, nothing on stderr but the documented lines, and an exit
code that says the run's state: 0 with every file complete (a late signal changes nothing),
or 75/130 with the checkpoint kept and how to go on, and ``--resume`` ends with the bytes of
the run never disturbed (or, stopped before it made anything, no run directory at all);
never a directory that looks finished and is not; nothing left running.  The same on
``dtrain.train()`` and an estimator's ``fit`` in a user's script (``helpers/sweep_child.py``,
one process, call after call): they return, or raise ``dtrain.Stopped`` (a Ctrl-C before
anything was made: ``KeyboardInterrupt``), a stopped run resumes to the same bytes, no
signal reaches the script's own handlers while dtrain's call runs, and no process, thread or
socket is left behind.

The instants are drawn by a seeded RNG over the measured life of an undisturbed run, a
fixed number in each of its phases, one in each equal slice (the training itself is a tenth
of the life: it gets its share by count, not by length), each phase dealt every fault that
can land in it; an instant is a time after its phase's first mark, in each life as in the
undisturbed one, so that a machine's load moves it with its phase.  The figures print at
the end (``-s``, or in the terminal's summary).  ``DTRAIN_SWEEP_KINDS=cli,train,fit`` and
``DTRAIN_SWEEP_ONLY=3,17`` run a part again; ``DTRAIN_SWEEP_VERBOSE=1`` says each instant.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.sweep import (INT, KILL_DRIVER, KILL_WORKER, SIGNALLED, TERM, USR1, Life, Tried,
                           Watch, group_left, instants, popen, sha, tracebacks)

SEED = 38
# iris, 12 epochs of 7 steps in windows of 7: a window edge and a checkpoint each epoch
SETTINGS = ["train.epochs=12", "graph.window=7"]
ARGS = [arg for s in SETTINGS for arg in ("--set", s)] + ["--dashboard-address", ""]
CHILD = Path(__file__).parent / "helpers" / "sweep_child.py"
CODES = {INT: 130, TERM: 75, USR1: 75}
BEFORE = {INT: "interrupted", TERM: "stopped by SIGTERM", USR1: "stopped by SIGUSR1"}
LIMIT = 120                 # seconds a run, or a resume, may take before it is a failure

# The phases of a life, between the marks of an undisturbed one: (name, first mark, last
# mark, instants, the faults that can land there).  A command line's marks are seconds
# since its start; a script's, since its call.
ALL = (INT, TERM, USR1, KILL_WORKER, KILL_DRIVER)
CLI_PHASES = (("imports, planning", "start", "worker", 6, (INT, TERM, USR1, KILL_DRIVER)),
              ("the cluster's start, loading, the first window", "worker", "first", 6, ALL),
              ("windows, checkpoints", "first", "last", 6, ALL),
              ("evaluation, teardown, files", "last", "done", 5, ALL),
              ("summary, exit", "done", "exit", 5, (INT, TERM, USR1, KILL_DRIVER)))
PY = (INT, TERM, USR1, KILL_WORKER)
TRAIN_PHASES = (("planning, the cluster's start", "call", "worker", 2, PY),
                ("the cluster's start, loading, the first window", "worker", "first", 2, PY),
                ("windows, checkpoints", "first", "last", 2, PY),
                ("evaluation, teardown, files", "last", "back", 2, PY))
# an estimator's epochs come back with its last window: its training is the second phase
FIT_PHASES = (("checks, the embedded cluster's start", "call", "worker", 2, PY),
              ("the cluster's start, the data, its statistics, training", "worker", "first",
               3, PY),
              ("the fitted model", "first", "back", 1, PY))


# --- the command line -------------------------------------------------------------------

def _cli(args: list[str], tried: Tried | None = None) -> tuple[Watch, str, str, list[str]]:
    """``python -m dtrain ARGS`` to its end, ``tried`` dealt: its watch, stdout, stderr, and
    what was wrong (hung, left running)."""
    began = time.monotonic()
    watch = Watch(popen([sys.executable, "-m", "dtrain", *args]), began)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(watch.proc.stderr))
    reader.start()
    hung = threading.Timer(LIMIT, os.killpg, (watch.proc.pid, signal.SIGKILL))
    hung.start()
    got = "".join(watch.watched(tried))
    watch.proc.wait()
    hung.cancel()
    reader.join()
    wrong = [f"still running after {LIMIT} s"] if time.monotonic() - began >= LIMIT else []
    return watch, got, "".join(err), wrong + group_left(watch.proc.pid)


def _measure_cli(out: Path) -> Life:
    watch, _, err, wrong = _cli(["--out", str(out), *ARGS])
    assert watch.proc.returncode == 0 and not err and not wrong, (err, wrong)
    watch.marks["exit"] = time.monotonic() - watch.began
    return Life(sha(out / "params.npz"), watch.marks)


def _complete(out: Path, life: Life) -> list[str]:
    """What is wrong with a run directory whose summary says it finished."""
    wrong = [f"finished without {name}" for name in
             ("params.npz", "model.json", "report.html", "metrics.jsonl", "config.toml")
             if not (out / name).is_file()]
    if not wrong and sha(out / "params.npz") != life.trained:
        wrong.append("finished with other bytes than the undisturbed run's")
    if not wrong:
        rows = (out / "metrics.jsonl").read_text().splitlines()
        if [json.loads(r)["epoch"] for r in rows] != list(range(1, 13)):
            wrong.append(f"finished with {len(rows)} epoch rows")
    return wrong


def _resumed(out: Path, life: Life) -> list[str]:
    """``--resume``, as the hint says: exit 0, nothing on stderr, the undisturbed bytes."""
    watch, _, err, wrong = _cli(["--resume", str(out)])
    wrong += tracebacks(err)
    if watch.proc.returncode != 0:
        return wrong + [f"--resume exited {watch.proc.returncode}: {err.strip()[-200:]}"]
    if err.strip():
        wrong.append(f"--resume said on stderr: {err.strip()[:200]}")
    return wrong + _complete(out, life)


def _judge_cli(tried: Tried, out: Path, life: Life, code: int, got: str, err: str) -> None:
    bad, lines = tried.problems, err.strip().splitlines()
    finished = (out / "summary.json").exists()
    if tried.fault == KILL_DRIVER and code == -signal.SIGKILL:
        if err.strip() and not tracebacks(err):    # (a traceback is said already)
            bad.append(f"stderr after the driver was killed: {err.strip()[:300]}")
        if finished:
            tried.state = "killed when finished"
            bad += _complete(out, life)
        elif (out / "config.toml").exists():
            tried.state = "killed, resumed"
            bad += _resumed(out, life)
        else:
            tried.state = "killed before it made anything"
        return
    if code == 0:
        late = "came too late to stop the run" in got
        tried.state = tried.state or ("finished, said the signal came late" if late
                                      else "finished")
        if err.strip():
            bad.append(f"exit 0 and stderr: {err.strip()[:200]}")
        bad += _complete(out, life) if finished else ["exit 0 without summary.json"]
        return
    if tried.fault not in SIGNALLED or code != CODES[tried.fault]:
        bad.append(f"exit {code} after {tried.fault}: {err.strip()[-300:]}")
        return
    if finished:
        bad.append(f"exit {code} and yet summary.json: a finished run said it stopped")
    if lines == [f"dtrain: {BEFORE[tried.fault]}"]:
        tried.state = "stopped before it made anything"
        if (out / "config.toml").exists():
            bad.append(f"'{lines[0]}' and yet a run directory was left in {out}")
        return
    name = SIGNALLED[tried.fault].name
    if len(lines) != 2 or lines[1] != f"dtrain: resume with: python -m dtrain --resume {out}" \
            or not lines[0].startswith(f"dtrain: stopped by {name} after step "):
        bad.append(f"exit {code} said {lines}")
        return
    tried.state = "stopped, resumed"
    bad += _resumed(out, life)


def _try_cli(tried: Tried, out: Path, life: Life) -> None:
    watch, got, err, wrong = _cli(["--out", str(out), *ARGS], tried)
    tried.problems += tracebacks(err) + wrong
    _judge_cli(tried, out, life, watch.proc.returncode, got, err)


# --- a user's script ----------------------------------------------------------------------

class Script:
    """A user's script (``helpers/sweep_child.py``) in one Python process, call after call:
    each call must leave the process as it found it.  A process that died or hung is started
    again."""

    def __init__(self, mode: str):
        self.mode, self.err = mode, []
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        self.proc = popen([sys.executable, str(CHILD), self.mode], stdin=True)
        self.err = []
        proc = self.proc
        threading.Thread(target=lambda: self.err.extend(proc.stderr), daemon=True).start()
        for line in proc.stdout:
            if line.startswith("MARK ready"):
                return

    def call(self, out: Path, tried: Tried | None = None) -> tuple[Watch, dict | None, str]:
        """One call into ``out``, ``tried``'s fault dealt at its instant: what the watch saw,
        the result, and the stderr meanwhile."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        seen = len(self.err)
        watch = Watch(self.proc, time.monotonic(), first="call")
        hung = threading.Timer(LIMIT, os.killpg, (self.proc.pid, signal.SIGKILL))
        hung.start()
        try:
            self.proc.stdin.write(f"go {out}\n")
            self.proc.stdin.flush()
            watch.watched(tried, until_back=True)
            self.proc.stdin.write("on\n")
            self.proc.stdin.flush()
            result = next((json.loads(line[7:]) for line in self.proc.stdout
                           if line.startswith("RESULT ")), None)
        except OSError:                     # its stdin closed: it died
            result = None
        finally:
            hung.cancel()
        time.sleep(0.05)                    # (the stderr reader's last lines)
        return watch, result, "".join(self.err[seen:])

    def close(self) -> list[str]:
        """End the process; what was wrong as it ended."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        self.proc.stdin.close()
        try:
            self.proc.wait(LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return [f"the script did not end within {LIMIT} s"]
        return tracebacks("".join(self.err)) + group_left(self.proc.pid)


def _measure_script(script: Script, out: Path) -> Life:
    """A first call (a process's first imports what dtrain imports as it is used), then a
    second, undisturbed, whose marks are the life's (seconds since the call)."""
    for n in (1, 2):
        watch, result, err = script.call(out / str(n))
        assert result and result["ended"]["how"] == "returned" and not tracebacks(err), err
    call = watch.marks["call"]
    return Life(result["trained"], {k: v - call for k, v in watch.marks.items()})


def _try_script(tried: Tried, script: Script, out: Path, life: Life) -> None:
    _, result, err = script.call(out, tried)
    bad = tried.problems
    bad += tracebacks(err)
    if result is None:
        bad.append(f"the script died or hung: {err.strip()[-300:]}")
        script.close()
        return
    ended = result["ended"]
    bad += [f"left behind: {kind}: {what}" for kind, what in result["left"].items() if what]
    if result["during"]:
        bad.append(f"{result['during']} reached the script's handler during dtrain's call")
    if ended["how"] == "returned":
        tried.state = tried.state or "returned"
        if result["trained"] != life.trained:
            bad.append("returned with other bytes than the undisturbed run's")
        return
    if tried.fault not in SIGNALLED:
        bad.append(f"{tried.fault}: {ended}")
        return
    if ended["how"] == "KeyboardInterrupt":
        tried.state = "KeyboardInterrupt before it made anything"
        if tried.fault != INT:
            bad.append(f"KeyboardInterrupt after {tried.fault}")
        if (out / "config.toml").exists():
            bad.append("KeyboardInterrupt, and yet a run directory was left")
        return
    if ended["code"] != CODES[tried.fault] or ended["signal"] != SIGNALLED[tried.fault].name:
        bad.append(f"{tried.fault} raised {ended}")
    elif ended["lines"] == [BEFORE[tried.fault]]:
        tried.state = "Stopped before it made anything"
        if (out / "config.toml").exists():
            bad.append("Stopped before it made anything, and yet a run directory was left")
    elif script.mode == "fit":
        tried.state = "Stopped"                 # an estimator's run keeps no files
    elif result["resumed"] != life.trained:
        bad.append(f"Stopped ({ended['lines']}), resumed to other bytes")
    else:
        tried.state = "Stopped, resumed"


# --- the sweep -----------------------------------------------------------------------------

def _figures(name: str, tried: list[Tried], seconds: float) -> str:
    passed = sum(not t.problems for t in tried)
    states: dict[str, int] = {}
    for t in tried:
        states[t.state] = states.get(t.state, 0) + 1
    said = ", ".join(f"{n} {s}" for s, n in sorted(states.items(), key=lambda x: -x[1]))
    return (f"[sweep] {name}: {len(tried)} instants x faults, {passed} passed ({said}); "
            f"{seconds:.0f} s")


def _chosen(tried: list[Tried]) -> list[tuple[int, Tried]]:
    """All of them, or those ``DTRAIN_SWEEP_ONLY`` lists (``3,17``: to look at one again)."""
    only = os.environ.get("DTRAIN_SWEEP_ONLY")
    return [(i, t) for i, t in enumerate(tried) if not only or str(i) in only.split(",")]


def _sweep(kind: str, name: str, phases: tuple, tmp_path: Path, script: Script | None,
           say: list[str], wrong: list[str], verbose: bool) -> None:
    """One kind's sweep: its undisturbed life measured, then each instant tried."""
    began = time.monotonic()
    life = _measure_cli(tmp_path / kind) if script is None else \
        _measure_script(script, tmp_path / kind)
    tried = instants(life, phases, random.Random(f"{SEED}-{kind}"),
                      "" if script is None else "py: ")
    chosen = _chosen(tried)
    for i, one in chosen:
        out = tmp_path / f"{kind}-{i}"
        if script is None:
            _try_cli(one, out, life)
        else:
            _try_script(one, script, out, life)
        if verbose:
            print(f"\n{name} {i}: {one}", flush=True)
    if script is not None:
        wrong += [f"{name}: {p}" for p in script.close()]
    say.append(_figures(name, [t for _, t in chosen], time.monotonic() - began))
    say.append("[sweep]   its undisturbed life: " + ", ".join(
        f"{k} {v:.2f} s" for k, v in sorted(life.marks.items(), key=lambda x: x[1])))
    wrong += [f"{name}, {t.fault} {t.at:.3f} s after {t.anchor} ({t.phase}; {t.state}): {p}"
              for _, t in chosen for p in t.problems]


@pytest.mark.slow
def test_every_instant_of_a_run_from_the_command_line_and_from_python(tmp_path, capsys):
    """The command line's sweep and the scripts' (``train()``'s, then ``fit``'s) side by
    side: two process trees on two cores, whose instants move with the load as any other's
    (each is a time after its phase's first mark)."""
    kinds = os.environ.get("DTRAIN_SWEEP_KINDS", "cli,train,fit").split(",")
    verbose = bool(os.environ.get("DTRAIN_SWEEP_VERBOSE"))
    scripts = {mode: Script(mode) for mode in ("train", "fit") if mode in kinds}
    said: dict[str, list[str]] = {"cli": [], "train": [], "fit": []}
    wrong: dict[str, list[str]] = {"cli": [], "train": [], "fit": []}
    sweeps = {"cli": ("python -m dtrain", CLI_PHASES), "train": ("dtrain.train()", TRAIN_PHASES),
              "fit": ("MLPClassifier.fit", FIT_PHASES)}

    def run(*these: str) -> None:
        for kind in these:
            if kind in kinds:
                name, phases = sweeps[kind]
                try:
                    _sweep(kind, name, phases, tmp_path, scripts.get(kind), said[kind],
                           wrong[kind], verbose)
                except Exception as exc:        # (an undisturbed life that failed)
                    wrong[kind].append(f"{name}: {type(exc).__name__}: {exc}")

    began = time.monotonic()
    beside = threading.Thread(target=run, args=("train", "fit"))
    try:
        with capsys.disabled() if verbose else contextlib.nullcontext():
            beside.start()
            run("cli")
            beside.join()
    finally:
        for script in scripts.values():
            script.close()
    with capsys.disabled():
        print("\n" + "\n".join(said["cli"] + said["train"] + said["fit"]) +
              f"\n[sweep] in all: {time.monotonic() - began:.0f} s")
    problems = wrong["cli"] + wrong["train"] + wrong["fit"]
    assert not problems, "\n".join(problems)
