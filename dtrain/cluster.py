"""Getting a Dask cluster: an embedded LocalCluster, or a running scheduler."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from distributed import Client, LocalCluster, WorkerPlugin

from dtrain.config import ClusterConfig
from dtrain.errors import UserError


@contextlib.contextmanager
def connect(cfg: ClusterConfig) -> Iterator[Client]:
    """A client on ``cfg.scheduler_address``, or on a LocalCluster of worker processes.

    Closes what it started on exit.  An unreachable scheduler is a
    :class:`~dtrain.errors.UserError` after ``cfg.timeout`` seconds.
    """
    if cfg.scheduler_address:
        try:
            client = Client(cfg.scheduler_address, timeout=cfg.timeout)
        except (OSError, TimeoutError) as exc:
            raise UserError(f"cannot reach the Dask scheduler at {cfg.scheduler_address} within "
                            f"{cfg.timeout:g} s ({type(exc).__name__}); check the address or start "
                            f"one with `dask scheduler`") from None
        with contextlib.closing(client):
            wait_for_workers(client, 1, cfg.timeout)
            yield client
        return
    # without a dashboard the scheduler still serves /health and /metrics: on any free port
    http = {} if cfg.dashboard_address else {"scheduler_kwargs": {"dashboard_address": ":0"}}
    cluster = LocalCluster(n_workers=cfg.workers, threads_per_worker=cfg.threads_per_worker,
                           processes=True, dashboard_address=cfg.dashboard_address or None,
                           silence_logs=logging.ERROR, **http)
    with cluster, Client(cluster) as client:
        yield client


def wait_for_workers(client: Client, n: int, timeout: float) -> None:
    """Block until ``n`` workers are connected, or raise a UserError saying how many came."""
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError:
        found = len(client.scheduler_info()["workers"])
        raise UserError(f"needs {n} Dask worker(s), found {found} after {timeout:g} s; start more "
                        f"workers or lower the count") from None


def _natural(name: object) -> tuple:
    text = str(name)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def worker_addresses(client: Client) -> list[str]:
    """Addresses of the connected workers, ordered by worker name (0, 1, 2, ... for
    LocalCluster and dask-mpi ranks)."""
    workers = client.scheduler_info()["workers"]
    return sorted(workers, key=lambda addr: _natural(workers[addr].get("name", addr)))


class _ReportedByDriver(logging.Filter):
    """Drop a worker's "Compute Failed" log for dtrain's own errors: the driver reports
    those once, as one line; any other exception is still logged."""

    OURS = ("Diverged(", "UserError(", "DataError(", "ConfigError(")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith("Compute Failed") and len(args) > 3
                    and str(args[3]).startswith(self.OURS))


class QuietUserErrors(WorkerPlugin):
    """Installs :class:`_ReportedByDriver` on every worker, restarted ones included."""

    name = "dtrain-quiet-user-errors"
    idempotent = True

    def setup(self, worker) -> None:
        log = logging.getLogger("distributed.worker")
        if not any(isinstance(f, _ReportedByDriver) for f in log.filters):
            log.addFilter(_ReportedByDriver())
