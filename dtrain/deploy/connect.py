"""Getting a Dask cluster for a run: an embedded LocalCluster, batch jobs, or a running scheduler.

A running scheduler is named, in this order, by ``cluster.scheduler_address``,
by ``cluster.scheduler_file`` (the JSON file that ``dask scheduler
--scheduler-file``, dask-mpi and dask-jobqueue write), or by Dask's own
``scheduler-address`` config (``DASK_SCHEDULER_ADDRESS``, or what
``dask_mpi.initialize()`` sets); ``cluster.kind = "slurm" | "pbs"`` starts
batch jobs; anything else starts a LocalCluster.  (The MPI deployment, where
the ranks are the cluster, is :mod:`dtrain.deploy.mpi`.)
"""
from __future__ import annotations

import contextlib
import json
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import dask
from distributed import Client
from distributed.comm import parse_address, parse_host_port, registry

from dtrain.core.arrays import gpu_count
from dtrain.core.broadcast import register
from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UserError
from dtrain.deploy import jobqueue, mainguard
from dtrain.deploy.devices import require_gpu
from dtrain.deploy.layout import local_shape
from dtrain.deploy.local import crowded, local_cluster, local_gpu_cluster
from dtrain.deploy.logs import QuietClose, QuietRefusals, mark_closing, quiet_refusals
from dtrain.deploy.options import security_for, started_by_dtrain, warn_if_open
from dtrain.deploy.workers import wait_for_workers


REFUSED_GRACE = 2.0     # seconds a refused connection is retried: a scheduler may be starting
HINT = "check the address or start one with `dask scheduler`"


def check_address(address: str) -> tuple[str, int] | None:
    """The host and port of a scheduler address (None for a scheme that has none), or a
    UserError saying what is wrong with it; nothing is contacted."""
    scheme, loc = parse_address(address)
    if scheme not in registry.backends:
        raise UserError(f"cluster.scheduler_address = {address!r}: unknown scheme '{scheme}://'; "
                        f"a scheduler's address looks like tcp://HOST:8786 (or tls://)")
    if scheme not in ("tcp", "tls"):
        return None
    try:
        host, port = parse_host_port(loc)
    except ValueError:
        raise UserError(f"cluster.scheduler_address = {address!r}: needs a host and a port, "
                        f"e.g. {scheme}://{loc or 'HOST'}:8786") from None
    if not 0 < port < 65536:
        raise UserError(f"cluster.scheduler_address = {address!r}: port {port} is not a TCP port")
    return host, port


def _probe(address: str, host: str, port: int, timeout: float) -> None:
    """Fail fast where nothing can answer: an unknown host, or no one listening (a refused
    connection, retried for :data:`REFUSED_GRACE` s); a host that never answers takes
    ``timeout``."""
    start = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - start)
        try:
            with socket.create_connection((host, port), timeout=max(left, 0.01)):
                return
        except socket.gaierror as exc:
            raise UserError(f"cannot reach the Dask scheduler at {address}: unknown host "
                            f"{host!r} ({exc.strerror}); {HINT}") from None
        except ConnectionRefusedError:
            if time.monotonic() - start + 0.2 > min(REFUSED_GRACE, timeout):
                raise UserError(f"cannot reach the Dask scheduler at {address}: nothing listens "
                                f"on port {port} of {host} (connection refused); {HINT}") from None
            time.sleep(0.2)
        except OSError as exc:              # timed out, no route to the host
            if time.monotonic() - start >= timeout:
                raise UserError(f"cannot reach the Dask scheduler at {address} within "
                                f"{timeout:g} s ({exc.strerror or type(exc).__name__}); "
                                f"{HINT}") from None
            time.sleep(min(0.2, max(left, 0.0)))


def _client(address: str, timeout: float) -> Client:
    """A client of the scheduler at ``address``, within ``timeout`` seconds in all."""
    start = time.monotonic()
    endpoint = check_address(address)
    if endpoint is not None:
        _probe(address, *endpoint, timeout)
    left = max(timeout - (time.monotonic() - start), 1.0)
    try:
        return Client(address, timeout=left)
    except (OSError, TimeoutError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address} within {timeout:g} s "
                        f"({type(exc).__name__}); {HINT}") from None
    except Exception as exc:            # something answered, but not as a scheduler
        raise UserError(f"{address} answered, but not as a Dask scheduler "
                        f"({type(exc).__name__}); is it another service, e.g. the dashboard's "
                        f"port (a scheduler listens on 8786 by default)?") from None


def dask_scheduler_address() -> str:
    """The scheduler address Dask's config names (``scheduler-address``: the variable
    ``DASK_SCHEDULER_ADDRESS``, a YAML file, or ``dask_mpi.initialize()``), or ''."""
    return str(dask.config.get("scheduler-address", None) or "")


def running_scheduler(cfg: ClusterConfig) -> str:
    """How ``cfg`` names a running scheduler to use, in words (e.g. ``the scheduler file
    F``), or '' where dtrain starts its own cluster."""
    if cfg.scheduler_address:
        return cfg.scheduler_address
    if cfg.scheduler_file:
        return f"the scheduler of {cfg.scheduler_file}"
    if cfg.kind == "local" and dask_scheduler_address():
        return f"{dask_scheduler_address()} (Dask's scheduler-address config)"
    return ""


def read_scheduler_file(path: str, timeout: float) -> str:
    """The address in a scheduler file (``{"address": ...}``, as ``dask scheduler
    --scheduler-file`` and dask-mpi write it), waiting up to ``timeout`` seconds for the
    file to appear and hold one (a scheduler started beside dtrain writes it when up)."""
    start, problem = time.monotonic(), "does not exist"
    while True:
        try:
            address = json.loads(Path(path).read_text(encoding="utf-8"))["address"]
            if isinstance(address, str) and address:
                return address
            problem = "holds no scheduler address"
        except FileNotFoundError:
            problem = "does not exist"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problem = f"is not a Dask scheduler file ({type(exc).__name__})"
        if time.monotonic() - start >= timeout:
            raise UserError(f"cluster.scheduler_file = {path!r} {problem} after {timeout:g} s "
                            f"(cluster.timeout); start the scheduler that writes it (`dask "
                            f"scheduler --scheduler-file {path}`, or `mpiexec -n N dask-mpi "
                            f"--scheduler-file {path}`), or check the path")
        time.sleep(0.2)


@contextlib.contextmanager
def connect(cfg: ClusterConfig, min_workers: int = 1, leaves: int = 0) -> Iterator[Client]:
    """A client on a running scheduler (``cfg.scheduler_address``, ``cfg.scheduler_file``, or
    Dask's ``scheduler-address`` config, in that order), or on a cluster dtrain starts (a
    LocalCluster, or batch jobs) shaped by ``cfg.layout`` for a run that needs
    ``min_workers`` workers and computes ``leaves`` shards or slices (0: unknown; see
    :mod:`dtrain.deploy.layout`).

    Closes what it started on exit (a running scheduler and its workers stay).  An
    unreachable scheduler is a :class:`~dtrain.core.errors.UserError` after
    ``cfg.timeout`` seconds.
    """
    address = cfg.scheduler_address or \
        (read_scheduler_file(cfg.scheduler_file, cfg.timeout) if cfg.scheduler_file else "") \
        or (dask_scheduler_address() if cfg.kind == "local" else "")
    if address:
        with contextlib.closing(_client(address, cfg.timeout)) as client:
            warn_if_open(client.scheduler.address)      # its security is the user's
            wait_for_workers(client, 1, cfg.timeout)
            yield client
        return
    if cfg.kind != "local":
        with jobqueue.connect(cfg, security_for(cfg), min_workers,
                              leaves) as client:
            yield started_by_dtrain(client)
        return
    security = security_for(cfg)
    quiet_refusals()        # the scheduler and the nannies run in this process
    gpus = gpu_count() if cfg.device != "cpu" else 0
    if cfg.device == "gpu":
        require_gpu("cluster.device = 'gpu'")
    shape = local_shape(cfg, min_workers, leaves)
    with mainguard.watch(), warnings.catch_warnings():
        # a busy dashboard port: distributed takes another and says so in four lines; the
        # dashboard line the run prints gives the port it got
        warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
        cluster = local_gpu_cluster(cfg, gpus, security, shape) if gpus else \
            local_cluster(cfg, security, shape)
    pin = None if gpus else crowded(shape)
    with cluster, Client(cluster, security=security) as client:
        started_by_dtrain(client)
        register(client, QuietClose())
        register(client, QuietRefusals())
        if pin is not None:
            register(client, pin)
        try:
            yield client
        finally:
            # its workers' heartbeats and fetches that the close cuts are not errors
            with contextlib.suppress(Exception):
                client.run(mark_closing)
