"""Workers as batch jobs: ``python -m dtrain --cluster slurm|pbs``, through dask-jobqueue.

The scheduler and the driver run where the command runs (a login node, or a
job of their own); every Dask worker is one batch job.  The site's settings
(queue, account, memory, walltime, cores booked, what a job loads) come from a
jobqueue YAML file, ``jobqueue/jobqueue.yaml`` unless ``cluster.jobqueue_file``
names another, loaded into ``dask.config`` for the cluster's life.  The run
config adds what belongs to the run: the layout of a job (hybrid: one worker
process with a thread per booked core; flat: a single-thread worker process
per booked core; see :mod:`dtrain.deploy.layout`), ``cluster.workers`` jobs,
``cluster.interface``, the dashboard address, one BLAS thread per worker and
the per-run TLS certificate.
"""
from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import yaml
from distributed import Client, Security

from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UserError
from dtrain.core.files import shipped
from dtrain.deploy.layout import job_shape
from dtrain.deploy.options import NO_DASHBOARD, dashboard_link_config, http_address
from dtrain.deploy.tuning import ALLOCATOR_ENV
from dtrain.deploy.workers import wait_for_workers

JOBQUEUE_DIR = shipped("jobqueue")
DEFAULT_FILE = JOBQUEUE_DIR / "jobqueue.yaml"

# one BLAS thread per worker: result bits depend on BLAS's thread count (dtrain.deploy.layout)
ONE_BLAS_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

CLUSTERS = {"slurm": ("SLURMCluster", "sbatch"), "pbs": ("PBSCluster", "qsub")}


def settings_path(cfg: ClusterConfig) -> Path:
    """The jobqueue YAML this run uses."""
    return Path(cfg.jobqueue_file) if cfg.jobqueue_file else DEFAULT_FILE


def read_settings(path: Path, kind: str) -> dict[str, Any]:
    """The ``jobqueue.<kind>`` table of a jobqueue YAML file; one-line user errors if unusable."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"jobqueue file {path} not found; set cluster.jobqueue_file to a copy "
                        f"of {DEFAULT_FILE} edited for your site") from None
    except (OSError, yaml.YAMLError) as exc:
        reason = str(exc).replace("\n", " ")
        raise UserError(f"cannot read jobqueue file {path}: {reason}") from None
    section = data.get("jobqueue", {}).get(kind) if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise UserError(f"jobqueue file {path} has no 'jobqueue: {kind}:' table; see "
                        f"{DEFAULT_FILE} for one")
    return section


def _jobqueue(kind: str) -> Any:
    try:
        import dask_jobqueue
    except ImportError:
        raise UserError(f"--cluster {kind} needs dask-jobqueue; install it with "
                        f"pip install 'dtrain[jobqueue]'") from None
    return dask_jobqueue


@contextlib.contextmanager
def settings(cfg: ClusterConfig) -> Iterator[None]:
    """``jobqueue.<kind>.*`` from the run's jobqueue file (and the dashboard link) set in
    dask.config meanwhile."""
    _jobqueue(cfg.kind)     # its defaults must be in dask.config before ours go on top
    section = read_settings(settings_path(cfg), cfg.kind)
    values = {f"jobqueue.{cfg.kind}.{key}": value for key, value in section.items()}
    with dask.config.set({**values, **dashboard_link_config(cfg.dashboard_address)}):
        yield


def booked_cores(kind: str) -> int:
    """Cores a worker job books, from the jobqueue settings in force: ``job-cpu`` (SLURM) or
    ``ncpus`` in ``resource-spec`` (PBS), else ``cores``."""
    if kind == "slurm" and dask.config.get("jobqueue.slurm.job-cpu", None):
        return int(dask.config.get("jobqueue.slurm.job-cpu"))
    spec = dask.config.get(f"jobqueue.{kind}.resource-spec", None) or ""
    found = re.search(r"ncpus=(\d+)", str(spec))
    if found:
        return int(found.group(1))
    return int(dask.config.get(f"jobqueue.{kind}.cores", None) or 1)


def make_cluster(cfg: ClusterConfig, security: Security | None, min_workers: int = 1,
                 leaves: int = 0) -> Any:
    """A SLURMCluster or PBSCluster with no jobs yet; call inside :func:`settings`.

    Its ``job_script()`` is the script each worker job runs (one worker, or with the flat
    layout one per booked core).
    """
    options = dict(dask.config.get(f"jobqueue.{cfg.kind}.scheduler-options", None) or {})
    # without a dashboard the scheduler still serves /health and /metrics: on 127.0.0.1
    options["dashboard_address"] = http_address(cfg.dashboard_address)
    if not cfg.dashboard_address:
        options["dashboard"] = False
    # the workers' allocator settings first, so that a site's own prologue lines can override
    prologue = dask.config.get(f"jobqueue.{cfg.kind}.job-script-prologue", None) or []
    exports = "export " + " ".join(f"{k}={v}" for k, v in {**ALLOCATOR_ENV,
                                                           **ONE_BLAS_THREAD}.items())
    _, shape = job_shape(cfg, booked_cores(cfg.kind), min_workers, leaves)
    kwargs: dict[str, Any] = {"processes": shape.workers, "cores": shape.workers * shape.threads,
                              "security": security, "scheduler_options": options,
                              "job_script_prologue": [exports, *prologue],
                              "worker_extra_args": _worker_args(cfg.kind)}
    if cfg.interface:
        kwargs["interface"] = cfg.interface
    return getattr(_jobqueue(cfg.kind), CLUSTERS[cfg.kind][0])(**kwargs)


def _worker_args(kind: str) -> list[str]:
    """The site's ``worker-extra-args``, and no worker dashboard: each worker's own HTTP server
    (``/health``, ``/metrics``) on 127.0.0.1 instead of every interface of its node."""
    extra = list(dask.config.get(f"jobqueue.{kind}.worker-extra-args", None) or [])
    return [*extra, "--no-dashboard", "--dashboard-address", NO_DASHBOARD]


@contextlib.contextmanager
def connect(cfg: ClusterConfig, security: Security | None, min_workers: int = 1,
            leaves: int = 0) -> Iterator[Client]:
    """A client on the run's worker jobs (``cfg.workers``, or as the layout says); cancels the
    jobs on exit."""
    submit = CLUSTERS[cfg.kind][1]
    if shutil.which(submit) is None:
        raise UserError(f"--cluster {cfg.kind} submits worker jobs with {submit}, which is not on "
                        f"PATH; run dtrain on a {cfg.kind.upper()} login node, or use mpirun "
                        f"inside an allocation (jobqueue/{cfg.kind}.sh)")
    with settings(cfg), make_cluster(cfg, security, min_workers, leaves) as jobs, \
            Client(jobs, security=security) as client:
        count, shape = job_shape(cfg, booked_cores(cfg.kind), min_workers, leaves)
        jobs.scale(jobs=count)
        wait_for_workers(client, count * shape.workers, cfg.timeout)
        yield client
