"""Launching real ``mpiexec`` jobs from the tests: the venv's MPICH, or Open MPI if that is what
is found.  Used by every test that runs mpiexec."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from conftest import REPO

RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


@functools.cache
def launcher() -> tuple[tuple[str, ...], dict[str, str]]:
    """The mpiexec command (with the options this small machine needs) and its environment."""
    exe = Path(sys.executable).parent / "mpiexec"
    found = str(exe) if exe.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec next to the Python or on PATH (pip install -e '.[mpi]')")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (pip install -e '.[mpi]')")
    version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        return (found, "--oversubscribe"), {"OMPI_ALLOW_RUN_AS_ROOT": "1",
                                            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return (found,), {}


def is_mpich() -> bool:
    return "--oversubscribe" not in launcher()[0]


def command(n: int, *args: str, script: tuple[str, ...] = ("-m", "dtrain"),
            mpi_options: tuple[str, ...] = ()) -> list[str]:
    """``mpiexec -n N python -m dtrain --scheduler-rank 0 ARGS``."""
    exe, _ = launcher()
    return [*exe, *mpi_options, "-n", str(n), sys.executable, *script, "--scheduler-rank", "0",
            *args]


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, **launcher()[1], **extra}


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run(n: int, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
        **kwargs) -> Job:
    """Run an MPI job to the end, as a user would from the repository (``env``: variables
    to set for it, on top of this process's environment)."""
    start = time.monotonic()
    proc = subprocess.run(command(n, *args, **kwargs), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=environment(**(env or {})))
    return Job(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def rank_processes(pid: int) -> dict[int, psutil.Process]:
    """The rank processes under the launcher ``pid``, by rank."""
    ranks = {}
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        for var in RANK_VARS:
            if var in env and "python" in proc.name():
                ranks[int(env[var])] = proc
    return ranks


def leftovers(marker: str, grace: float = 5.0) -> list[psutil.Process]:
    """Processes whose command line mentions ``marker`` (e.g. a run directory) and that are
    still alive ``grace`` seconds from now (mpiexec may return while its ranks are dying)."""
    found = [proc for proc in psutil.process_iter(["cmdline"])
             if any(marker in part for part in proc.info["cmdline"] or ())]
    _, alive = psutil.wait_procs(found, timeout=grace)
    return [proc for proc in alive if proc.status() != psutil.STATUS_ZOMBIE]
