"""The fault sweep's machinery (tests/test_fault_sweep.py): the faults it deals, a run's
life watched from outside (its marks, its stdout and stderr, its worker processes), an
instant dealt its fault, what a process group leaves behind, and the instants drawn over
an undisturbed life's phases."""
from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from conftest import REPO

INT, TERM, USR1, KILL_WORKER, KILL_DRIVER = ("SIGINT to the group", "SIGTERM", "SIGUSR1",
                                             "SIGKILL a worker", "SIGKILL the driver")
SIGNALLED = {INT: signal.SIGINT, TERM: signal.SIGTERM, USR1: signal.SIGUSR1}
LAST_EPOCH = ("epoch 12/12", "Iteration 12,")       # the last epoch's line: a run's, a fit's


@dataclass
class Life:
    """An undisturbed life: what it trained (a digest) and when its marks came."""

    trained: str
    marks: dict[str, float]


@dataclass
class Tried:
    """One instant: the fault, when (seconds after the mark ``anchor``), in which phase, what
    came of it, and what was wrong."""

    fault: str
    at: float
    anchor: str
    phase: str
    state: str = ""
    problems: list[str] = field(default_factory=list)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")]))}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def popen(command: list[str], stdin: bool = False) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin else None,
                            text=True, start_new_session=True)


def group_left(pgid: int, grace: float = 10.0) -> list[str]:
    """The processes of a process group still alive ``grace`` seconds on (killed then, so
    that one failure does not spoil the instants after it)."""
    def alive() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.Error, ProcessLookupError):
                continue
        return found
    deadline = time.monotonic() + grace
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    names = []
    for proc in left:
        try:
            names.append("left running: " + " ".join(proc.cmdline())[:80])
            proc.kill()
        except psutil.Error:
            pass
    return names


def _workers(pid: int) -> list[int]:
    """The Dask worker processes under ``pid`` (spawned by multiprocessing)."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)
                if "spawn_main" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


def tracebacks(err: str) -> list[str]:
    """A traceback on stderr: the first, whole (up to 1,500 characters), and how stderr
    ended."""
    lines = err.strip().splitlines()
    begun = [i for i, line in enumerate(lines)
             if "Traceback" in line or "Exception ignored" in line]
    return [f"a traceback on stderr: {chr(10).join(lines[begun[0]:])[:1500]} ... "
            f"{lines[-1][:200]}"] if begun else []


# --- lives ---------------------------------------------------------------------------------

class Watch:
    """Reads a process's lines as they come, noting when each mark of its life came
    (seconds since ``began``), and deals a fault at its instant from a thread of its own."""

    def __init__(self, proc: subprocess.Popen, began: float, first: str = "start"):
        self.proc, self.began = proc, began
        self.marks: dict[str, float] = {}
        self.events = {name: threading.Event() for name in
                       ("start", "call", "worker", "first", "last", "done", "back")}
        if first == "start":
            self._mark("start")

    def _mark(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = time.monotonic() - self.began
            self.events[name].set()

    def read(self, until_back: bool = False) -> list[str]:
        """Its lines, to ``MARK back`` (a script's call) or to the end."""
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            if line.startswith(("epoch", "Iteration")):
                self._mark("first")
                if line.startswith(LAST_EPOCH):
                    self._mark("last")
            elif line.startswith("done:"):
                self._mark("done")
            elif line.startswith("MARK call"):
                self._mark("call")
            elif line.startswith("MARK back"):
                self._mark("back")
                if until_back:
                    return lines
        self._mark("back")
        return lines

    def ended(self) -> bool:
        return self.events["back"].is_set() or self.proc.poll() is not None

    def watch_workers(self) -> None:
        """Note when the first worker process appears (the cluster is starting)."""
        while not self.ended():
            if _workers(self.proc.pid):
                self._mark("worker")
                return
            time.sleep(0.01)

    def deal(self, tried: Tried) -> None:
        """Deal the fault ``tried.at`` seconds after its phase's first mark came, if the
        process (or the script's call) still goes on then."""
        while not self.events[tried.anchor].wait(0.005):
            if self.ended():
                tried.state = "after the end"
                return
        left = tried.at - (time.monotonic() - self.began - self.marks[tried.anchor])
        if self.events["back"].wait(max(0.0, left)) or self.proc.poll() is not None:
            tried.state = "after the end"
            return
        try:
            if tried.fault == INT:
                os.killpg(self.proc.pid, signal.SIGINT)
            elif tried.fault in SIGNALLED:
                self.proc.send_signal(SIGNALLED[tried.fault])
            elif tried.fault == KILL_DRIVER:
                self.proc.kill()
            else:                   # none yet: the first as soon as there is one
                while not (victims := _workers(self.proc.pid)) and not self.ended():
                    time.sleep(0.005)
                if not victims:
                    tried.state = "no worker before the end"
                    return
                os.kill(victims[0], signal.SIGKILL)
        except ProcessLookupError:
            tried.state = "after the end"

    def watched(self, tried: Tried | None, until_back: bool = False) -> list[str]:
        """:meth:`read`, meanwhile noting the first worker and dealing ``tried``."""
        helpers = [threading.Thread(target=self.watch_workers)]
        helpers += [threading.Thread(target=self.deal, args=(tried,))] if tried else []
        for helper in helpers:
            helper.start()
        lines = self.read(until_back)
        for helper in helpers:
            helper.join()
        return lines


def instants(life: Life, phases: tuple, rng: random.Random, prefix: str = "") -> list[Tried]:
    """Each phase's instants, one drawn in each equal slice of it (as seconds after its
    first mark), its faults dealt round in a shuffled order."""
    out = []
    for name, a, b, n, faults in phases:
        span = life.marks[b] - life.marks[a]
        dealt = rng.sample(faults, len(faults))
        for i in range(n):
            out.append(Tried(dealt[i % len(dealt)], round(span * (i + rng.random()) / n, 3),
                             a, prefix + name))
    return out
