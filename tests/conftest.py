"""Shared fixtures: a real LocalCluster of worker processes, the shared datasets, a SLURM to
submit to, the CLI."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DTRAIN_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def client():
    """Two worker processes, one thread each: the layout of a small real cluster."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    path = SHARED_DATA / "mnist"
    if not (path / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST not found under {path}")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="module")
def slurm() -> None:
    """A SLURM with an idle node to submit to (.ci/slurm.sh starts a single-node one), else the
    test is skipped."""
    if shutil.which("sbatch") is None:
        pytest.skip("no sbatch here (.ci/slurm.sh starts a single-node SLURM)")
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                                timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        states = ""
    if not re.search(r"idle|mixed", states):
        pytest.skip("no SLURM with an idle node here (.ci/slurm.sh starts one)")


def run_cli(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dtrain ARGS`` in a fresh process, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def assert_moved_as_predicted(summary: dict) -> None:
    """Dask moved the bytes the graphs predict: exactly, as a rule.  On a loaded machine Dask
    may drop a replica and fetch a value twice, so a re-fetch or two is tolerated (the
    figures differ then by whole values, a few hundred bytes); a missing transfer is not."""
    predicted, measured = summary["comm_bytes_per_step"], summary["comm_bytes_measured_per_step"]
    assert predicted > 0
    assert predicted <= measured <= predicted * 1.02, (predicted, measured)


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``."""
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def mallinfo2() -> MallInfo2 | None:
    """This process's allocator statistics (``uordblks``: heap bytes in use, ``hblkhd``:
    bytes mapped outside the heaps); None without glibc 2.33+."""
    from dtrain.core.allocator import libc

    fn = getattr(libc(), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = MallInfo2
    return fn()


# --- a window as the engine's builder makes it, run in this process --------------------------
# (tests/test_passes.py, test_span.py, test_spans.py: the passes start from it, through
# dtrain.taskgraph.passes.optimize as the engine submits a window)

RUN = "t0"      # the run id of those windows' keys


def built(sets=(), workers=("w0",), steps=range(14), val=True):
    """The plan of ``sets`` (iris, 2 epochs, by default) and the window its builder makes of
    ``steps`` on ``workers`` (one thread each), from the plan's initial state, its inputs
    named as the builder names its loading tasks: what the engine hands the passes."""
    from dask.task_spec import TaskRef

    from dtrain.core import keys
    from dtrain.core.config import load_config
    from dtrain.taskgraph.placement import Worker
    from dtrain.training.plan import plan

    p = plan(load_config(None, ["train.epochs=2", *sets]))
    placement = p.builder.place([Worker(w, False, 1.0, 2) for w in workers])
    refs = [TaskRef(keys.make(*item.name, run=RUN)) for item in p.builder.data(placement)]
    held = TaskRef(keys.make(keys.LOAD_VAL, run=RUN)) if val else None
    return p, p.builder.window([p.schedule[t] for t in steps], p.initial_state(), refs, held,
                               placement, RUN)


def inputs(p) -> dict:
    """What a window of plan ``p`` reads from outside it: each shard and the validation
    rows, loaded here, by key."""
    from dtrain.core import keys
    from dtrain.data.shards import load_part, load_shard

    shards = {keys.make(keys.LOAD_SHARD, i, run=RUN): load_shard(s)
              for i, s in enumerate(p.sources)}
    return {**shards, keys.make(keys.LOAD_VAL, run=RUN): load_part(
        p.config.data, "val", p.config.model.dtype, norm=p.norm)}


def run_here(win, values) -> dict:
    """Run a window's graph in this process, each task after its inputs; every value by key
    (``values``: its inputs)."""
    from dtrain.taskgraph import fuse

    cache = dict(values)
    for key in fuse.in_order(win.dsk):
        cache[key] = win.dsk[key](cache)
    return cache
