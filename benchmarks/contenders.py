"""The contenders: what each one is, what it needs, and the command that runs it.

``workers`` always counts the processes (or, for ``dtrain-threads``, the threads)
that hold data and compute gradients: the shards, one each.  A parameter server
adds one process that only reduces and updates; dtrain on a LocalCluster or
under mpiexec adds the driver/scheduler process.  ``dtrain-default`` leaves the
cluster's shape to ``cluster.layout`` (hybrid: one worker process with a
thread per core of this machine, at most one per shard).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtrain.core.config import ClusterConfig, Config
from dtrain.deploy.layout import local_shape

from benchmarks.workloads import Workload

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[1]
LOCAL_SGD_SYNC_EVERY = 4          # graph.sync_every of dtrain-local-sgd
AUTO_WORKERS = 4                  # dtrain-auto's Dask workers: the GPU's and CPU workers


def torch_unsupported(cfg: Config) -> str | None:
    """Why the PyTorch contender cannot run ``cfg`` with the same maths, or None."""
    m, o = cfg.model, cfg.optim
    if m.loss != "cross-entropy" or m.l2 or o.name not in ("sgd", "momentum"):
        return "torch-ddp runs softmax + cross-entropy with SGD or momentum, no L2"
    return None


def gpu_name() -> str:
    """The first GPU ``nvidia-smi`` lists, or "" where there is none."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ""
    done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() \
        else ""


@dataclass(frozen=True)
class Tools:
    """What this machine offers the contenders, found once per invocation."""

    mpiexec: str | None
    open_mpi: bool
    mpi4py: bool
    torch: bool
    scheduler_rank: bool          # dtrain's CLI has --scheduler-rank (issue 3)
    gpu: str = ""                 # the first NVIDIA GPU nvidia-smi lists ("": none)
    cupy: bool = False

    @classmethod
    def discover(cls) -> Tools:
        beside = Path(PYTHON).parent / "mpiexec"          # the venv's own (the mpich wheel)
        mpiexec = str(beside) if beside.is_file() else shutil.which("mpiexec")
        open_mpi = False
        if mpiexec:
            version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True)
            text = (version.stdout + version.stderr).lower()    # 4.x says OpenRTE, open-mpi.org
            open_mpi = any(w in text for w in ("open mpi", "open-mpi", "openrte"))
        helptext = subprocess.run([PYTHON, "-m", "dtrain", "--help"], capture_output=True,
                                  text=True, cwd=REPO).stdout
        return cls(mpiexec, open_mpi, importlib.util.find_spec("mpi4py") is not None,
                   importlib.util.find_spec("torch") is not None, "--scheduler-rank" in helptext,
                   gpu_name(), importlib.util.find_spec("cupy") is not None)

    def mpi_command(self, ranks: int) -> list[str]:
        extra = ["--oversubscribe"] if self.open_mpi else []
        return [self.mpiexec, *extra, "-n", str(ranks)]

    def environment(self) -> dict[str, str]:
        """One BLAS/OpenMP thread per process, for every contender; Open MPI allowed as root."""
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
                       filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        if self.open_mpi:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env


@dataclass(frozen=True)
class Contender:
    """One way of training the same network on the same data.

    ``kind``: ``local`` (dtrain in-process or on a LocalCluster), ``mpi``
    (benchmarks.mpi_trainers), ``torch`` (benchmarks.torch_ddp), ``dtrain-mpi``
    (``python -m dtrain --scheduler-rank 0`` under mpiexec) or ``floor``
    (benchmarks.floor: dtrain's step graph with no maths, on dtrain's LocalCluster).
    ``threads``: one Dask worker process whose ``workers`` threads hold the
    ``workers`` shards (a node's shards sharing memory), instead of one process each.
    ``layout``: the cluster's shape left to ``cluster.layout`` (``cluster.workers`` and
    ``cluster.threads_per_worker`` 0), as ``python -m dtrain`` starts it on this machine.
    ``fuse``: its ``graph.fuse_shards`` ("" leaves the default, ``auto``), with
    ``graph.fuse_steps`` off: one worker's window would otherwise be one task either way,
    and these contenders measure what a step's own tasks cost.
    """

    name: str
    title: str
    kind: str
    strategy: str                 # graph.strategy in its config
    driver: bool = False          # a driver/scheduler process besides the workers
    threads: bool = False         # one worker process, one thread per training worker
    layout: bool = False          # the shape cluster.layout gives on this machine
    fuse: str = ""                # graph.fuse_shards
    device: str = ""              # cluster.device: "gpu" (one GPU worker), "auto" (GPU + CPUs)
    p2p: str = ""                 # cluster.p2p ("" leaves the default, auto)
    reduce: str = ""              # graph.reduce ("" leaves the default, tree)

    @property
    def trains(self) -> bool:
        """Leaves parameters (``params.npz``) to compare with serial's; the floor and the
        chain do not."""
        return self.kind not in ("floor", "chain")

    @property
    def server(self) -> bool:
        return self.strategy == "parameter-server"

    @property
    def synchronous(self) -> bool:
        """Computes the synchronous minibatch step, so its parameters must match serial's.

        Local SGD averages every ``sync_every`` local steps: another algorithm, whose
        parameters differ from the serial reference's by design (not checked)."""
        return self.trains and self.strategy != "local-sgd"

    @property
    def on_gpu(self) -> bool:
        """Needs a CUDA GPU."""
        return bool(self.device) or self.kind in ("torch-gpu", "cupy")

    def dask_workers(self, workers: int) -> int:
        """cluster.workers for a LocalCluster: the server is a Dask worker too (0: as the
        layout says)."""
        if self.device:
            return AUTO_WORKERS if self.device == "auto" else 1
        if self.layout:
            return 0
        return 1 if self.threads else workers + self.server

    def shape(self, workers: int) -> tuple[int, int]:
        """(worker processes, threads each) of its LocalCluster on this machine."""
        if self.kind in ("torch-gpu", "cupy"):
            return 1, 1
        if self.device:
            return self.dask_workers(workers), 1
        if self.layout:
            s = local_shape(ClusterConfig(), 1 + self.server, workers)
            return s.workers, s.threads
        return (1, workers) if self.threads else (workers + self.server, 1)

    def processes(self, workers: int) -> int:
        """Processes that compete for the cores while it trains (1 for serial)."""
        if self.strategy == "serial" or self.kind in ("torch-gpu", "cupy"):
            return 1
        return self.shape(workers)[0] + self.driver

    def busy(self, workers: int) -> int:
        """Processes and compute threads that compete for the cores: ``processes``, but
        counting each training thread of a threaded worker (at most one per shard)."""
        if self.strategy == "serial":
            return 1
        procs, threads = self.shape(workers)
        return min(procs * threads, workers + self.server) + self.driver \
            if threads > 1 else self.processes(workers)

    def overrides(self, workers: int) -> dict[str, Any]:
        """Config keys of this contender on top of the workload's, at ``workers`` workers."""
        graph = {"strategy": self.strategy}
        if self.strategy == "local-sgd":
            graph["sync_every"] = LOCAL_SGD_SYNC_EVERY
        if self.strategy == "model-parallel":
            graph["slices"] = workers
        if self.fuse:
            graph.update(fuse_shards=self.fuse, fuse_steps=False)
        if self.reduce:
            graph["reduce"] = self.reduce
        cluster = {"workers": self.dask_workers(workers)}
        if self.threads:
            cluster["threads_per_worker"] = workers
        if self.layout:
            cluster["threads_per_worker"] = 0
        if self.kind == "dtrain-mpi":           # N worker ranks, each a single-thread worker
            cluster["layout"] = "flat"
        if self.device:                         # CPU workers (auto): the node's cores shared
            cluster.update(device=self.device, threads_per_worker=0)
        if self.p2p:
            cluster["p2p"] = self.p2p
        return {"graph": graph, "cluster": cluster}

    def config_for(self, wl: Workload, workers: int, data_dir: Path) -> Config:
        """The dtrain config this contender trains for workload ``wl`` at ``workers``."""
        return wl.config_for(workers, self.strategy, self.dask_workers(workers), data_dir,
                             self.overrides(workers))

    def unavailable(self, tools: Tools, cfg: Config) -> str | None:
        """Why it cannot run here (a note for the table), or None."""
        if self.kind in ("mpi", "dtrain-mpi") and not (tools.mpiexec and tools.mpi4py):
            return "needs mpiexec and mpi4py: pip install -e '.[bench]'"
        if self.kind == "dtrain-mpi" and not tools.scheduler_rank:
            return "this dtrain has no --scheduler-rank yet (issue 3)"
        if self.on_gpu and not tools.gpu:
            return "no NVIDIA GPU here (nvidia-smi lists none)"
        if self.on_gpu and self.kind != "torch-gpu" and not tools.cupy:
            return "CuPy is not installed: pip install 'dtrain[gpu]'"
        if self.kind in ("torch", "torch-gpu"):
            return "torch is not installed: pip install torch==2.13.0" if not tools.torch \
                else torch_unsupported(cfg)
        return None

    def formula_bytes(self, parameters: int, itemsize: int, workers: int,
                      buffer: int) -> float | None:
        """Pencil-and-paper bytes between processes per step, for the contenders that are not
        dtrain (dtrain measures its own), or None.

        mpi4py Allreduce and DDP: a ring allreduce sends ``2 (W - 1) / W`` buffers per rank,
        ``2 (W - 1)`` in all (the buffer is dtrain's gradient buffer of ``buffer`` numbers,
        ``P + 2``: the gradient, the loss and the correct count; DDP's is the ``P``
        gradient); the
        parameter server gathers ``W`` buffers and broadcasts ``W`` parameter vectors.  One
        worker moves nothing."""
        w, grad = workers, buffer * itemsize
        if self.kind == "mpi" and self.strategy == "allreduce":
            return 2 * (w - 1) * grad if w > 1 else 0.0
        if self.kind == "mpi" and self.server:
            return w * (grad + parameters * itemsize)
        if self.kind == "torch":
            return 2 * (w - 1) * parameters * itemsize if w > 1 else 0.0
        if self.kind == "floor":                    # every worker fetches every other's buffer
            return w * (w - 1) * grad
        if self.kind == "chain":                    # the tree's sums, the final task's output
            return 0.0 if self.threads else 2 * (w - 1) * grad
        return None

    def command(self, tools: Tools, run_dir: Path, workers: int) -> list[str]:
        """The command line that trains ``run_dir/config.toml`` with ``workers`` workers."""
        if self.kind == "local":
            return [PYTHON, "-m", "benchmarks.local", str(run_dir)]
        if self.kind == "torch":
            return [PYTHON, "-m", "benchmarks.torch_ddp", str(run_dir), str(workers)]
        if self.kind == "torch-gpu":
            return [PYTHON, "-m", "benchmarks.torch_gpu", str(run_dir)]
        if self.kind == "cupy":
            return [PYTHON, "-m", "benchmarks.cupy_floor", str(run_dir)]
        if self.kind in ("floor", "chain"):
            return [PYTHON, "-m", "benchmarks.floor", str(run_dir), self.kind]
        ranks = self.processes(workers)
        if self.kind == "mpi":
            return [*tools.mpi_command(ranks), PYTHON, "-m", "mpi4py",   # an error aborts every rank
                    "-m", "benchmarks.mpi_trainers", str(run_dir)]
        return [*tools.mpi_command(ranks), PYTHON, "-m", "benchmarks.rank_rss", str(run_dir),
                "dtrain", "--scheduler-rank", "0", "--config", str(run_dir / "config.toml"),
                "--out", str(run_dir), "--force"]     # the run directory holds its config


CONTENDERS = [
    Contender("serial", "dtrain serial reference (NumPy, one process)", "local", "serial"),
    Contender("mpi-allreduce", "mpi4py Allreduce, hand-written", "mpi", "allreduce"),
    Contender("mpi-ps", "mpi4py parameter server (Gather/Bcast), hand-written", "mpi",
              "parameter-server"),
    Contender("torch-ddp", "PyTorch DistributedDataParallel, gloo, CPU", "torch", "allreduce"),
    Contender("dtrain-allreduce", "dtrain allreduce on a LocalCluster", "local", "allreduce",
              driver=True),
    Contender("dtrain-allreduce-tcp", "dtrain-allreduce with its worker-to-worker messages "
              "over TCP, as between machines (cluster.p2p = tcp)", "local", "allreduce",
              driver=True, p2p="tcp"),
    Contender("dtrain-allreduce-segments", "dtrain-allreduce with each step's sums reduced in "
              "segments worker to worker (graph.reduce = segments: a reduce-scatter and an "
              "allgather)", "local", "allreduce", driver=True, reduce="segments"),
    Contender("dtrain-ps", "dtrain parameter-server on a LocalCluster", "local",
              "parameter-server", driver=True),
    Contender("dask-floor", "dtrain-allreduce's step graph with no maths: Dask's own cost",
              "floor", "allreduce", driver=True),
    Contender("dtrain-threads", "dtrain allreduce on a LocalCluster of one worker process, "
              "one thread per shard (the hybrid layout)", "local", "allreduce", driver=True,
              threads=True),
    Contender("dtrain-threads-tasks", "dtrain-threads with a task per shard "
              "(graph.fuse_shards = false, graph.fuse_steps = false)", "local", "allreduce", driver=True, threads=True,
              fuse="false"),
    Contender("dtrain-threads-fused", "dtrain-threads with a worker's shards in one task "
              "(graph.fuse_shards = true, graph.fuse_steps = false)", "local", "allreduce", driver=True, threads=True,
              fuse="true"),
    Contender("dtrain-default", "dtrain allreduce on the LocalCluster python -m dtrain starts "
              "here (cluster.layout = hybrid: one worker process, a thread per core)", "local",
              "allreduce", driver=True, layout=True),
    Contender("dask-chain", "a bare Dask chain of the same width: a task per shard, a fan-in 2 "
              "sum tree, one final task, on dtrain-allreduce's cluster", "chain", "allreduce",
              driver=True),
    Contender("dask-chain-threads", "dask-chain on dtrain-threads' cluster (one worker "
              "process, a thread per shard)", "chain", "allreduce", driver=True, threads=True),
    Contender("dtrain-local-sgd", f"dtrain local-sgd (sync_every = {LOCAL_SGD_SYNC_EVERY}) on a "
              "LocalCluster", "local", "local-sgd", driver=True),
    Contender("dtrain-model-parallel", "dtrain model-parallel (slices = workers) on a "
              "LocalCluster", "local", "model-parallel", driver=True),
    Contender("dtrain-mpi-allreduce", "dtrain allreduce under mpiexec (--scheduler-rank 0)",
              "dtrain-mpi", "allreduce", driver=True),
    Contender("dtrain-mpi-allreduce-tcp", "dtrain-mpi-allreduce with its worker-to-worker "
              "messages over TCP and TLS, as between machines (cluster.p2p = tcp)",
              "dtrain-mpi", "allreduce", driver=True, p2p="tcp"),
    Contender("dtrain-mpi-ps", "dtrain parameter-server under mpiexec (--scheduler-rank 0)",
              "dtrain-mpi", "parameter-server", driver=True),
]
GPU_CONTENDERS = [
    Contender("dtrain-gpu", "dtrain allreduce on one GPU worker (cluster.device = gpu): the "
              "shards in GPU memory, a window of steps one task", "local", "allreduce",
              driver=True, device="gpu"),
    Contender("dtrain-auto", f"dtrain allreduce with cluster.device = auto: the GPU worker and "
              f"CPU workers ({AUTO_WORKERS} in all), the shards where the predicted step is "
              f"shortest", "local", "allreduce", driver=True, device="auto"),
    Contender("torch-gpu", "a plain PyTorch loop of the same net on the GPU (the training set "
              "on the GPU, each epoch's rows one index array there)", "torch-gpu", "allreduce"),
    Contender("cupy-floor", "dtrain's maths on CuPy in a plain loop, no Dask: the floor under "
              "dtrain-gpu", "cupy", "allreduce"),
]
CONTENDERS += GPU_CONTENDERS
BY_NAME = {c.name: c for c in CONTENDERS}
