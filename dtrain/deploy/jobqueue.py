"""Workers as batch jobs: ``python -m dtrain --cluster slurm|pbs``, through dask-jobqueue.

The scheduler and the driver run where the command runs (a login node, or a
job of their own); every Dask worker is one batch job.  The site's settings
(queue, account, memory, walltime, what a job loads) come from a jobqueue
YAML file, ``jobqueue/jobqueue.yaml`` unless ``cluster.jobqueue_file`` names
another, loaded into ``dask.config`` for the cluster's life.  The run config
adds what belongs to the run: one worker process per job with
``cluster.threads_per_worker`` threads, ``cluster.workers`` jobs,
``cluster.interface``, the dashboard address and the per-run TLS certificate.
"""
from __future__ import annotations

import contextlib
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
from dtrain.deploy.options import dashboard_link_config
from dtrain.deploy.tuning import ALLOCATOR_ENV
from dtrain.deploy.workers import wait_for_workers

JOBQUEUE_DIR = shipped("jobqueue")
DEFAULT_FILE = JOBQUEUE_DIR / "jobqueue.yaml"

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


def make_cluster(cfg: ClusterConfig, security: Security | None) -> Any:
    """A SLURMCluster or PBSCluster with no jobs yet; call inside :func:`settings`.

    Its ``job_script()`` is the script each worker job runs.
    """
    options = dict(dask.config.get(f"jobqueue.{cfg.kind}.scheduler-options", None) or {})
    if cfg.dashboard_address:
        options["dashboard_address"] = cfg.dashboard_address
    else:
        options["dashboard"] = False
    # the workers' allocator settings first, so that a site's own prologue lines can override
    prologue = dask.config.get(f"jobqueue.{cfg.kind}.job-script-prologue", None) or []
    exports = "export " + " ".join(f"{k}={v}" for k, v in ALLOCATOR_ENV.items())
    kwargs: dict[str, Any] = {"processes": 1, "cores": cfg.threads_per_worker,
                              "security": security, "scheduler_options": options,
                              "job_script_prologue": [exports, *prologue]}
    if cfg.interface:
        kwargs["interface"] = cfg.interface
    return getattr(_jobqueue(cfg.kind), CLUSTERS[cfg.kind][0])(**kwargs)


@contextlib.contextmanager
def connect(cfg: ClusterConfig, security: Security | None) -> Iterator[Client]:
    """A client on ``cfg.workers`` worker jobs; cancels the jobs on exit."""
    submit = CLUSTERS[cfg.kind][1]
    if shutil.which(submit) is None:
        raise UserError(f"--cluster {cfg.kind} submits worker jobs with {submit}, which is not on "
                        f"PATH; run dtrain on a {cfg.kind.upper()} login node, or use mpirun "
                        f"inside an allocation (jobqueue/{cfg.kind}.sh)")
    with settings(cfg), make_cluster(cfg, security) as jobs, \
            Client(jobs, security=security) as client:
        jobs.scale(jobs=cfg.workers)
        wait_for_workers(client, cfg.workers, cfg.timeout)
        yield client
