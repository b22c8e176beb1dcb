"""Getting a Dask cluster: an embedded LocalCluster, batch jobs, or a running scheduler.

(The MPI deployment, where the ranks are the cluster, is :mod:`dtrain.mpi`.)
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from distributed import Client, LocalCluster, Security

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
    if cfg.kind != "local":
        from dtrain import batch
        with batch.connect(cfg, security_for(cfg, deployed=True)) as client:
            yield client
        return
    security = security_for(cfg, deployed=False)
    cluster = LocalCluster(n_workers=cfg.workers, threads_per_worker=cfg.threads_per_worker,
                           processes=True, dashboard_address=cfg.dashboard_address or None,
                           silence_logs=logging.ERROR, security=security)
    with cluster, Client(cluster, security=security) as client:
        yield client


def security_for(cfg: ClusterConfig, deployed: bool) -> Security | None:
    """A per-run TLS :class:`~distributed.Security` (self-signed, in memory), or None.

    ``cluster.tls = 'auto'`` means on for clusters that other users of the
    machines could reach (``deployed``: MPI, SLURM, PBS) and off for the
    LocalCluster, which listens on 127.0.0.1 only.
    """
    if cfg.tls == "off" or (cfg.tls == "auto" and not deployed):
        return None
    try:
        return Security.temporary()
    except ImportError:
        raise UserError("cluster.tls needs the 'cryptography' package for its per-run "
                        "certificate; pip install 'dtrain[mpi]', or set cluster.tls = 'off'"
                        ) from None


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


def dashboard_link_config(address: str) -> dict[str, str]:
    """Dask config that makes ``Client.dashboard_link`` name the host the dashboard listens on.

    The link is built from the scheduler's host, which for a deployed
    cluster is the machine's network address, while the dashboard binds to
    ``127.0.0.1`` unless told otherwise (``cluster.dashboard_address``).
    """
    host = address.rpartition(":")[0]
    if not host or host in ("0.0.0.0", "[::]", "::"):
        return {}
    return {"distributed.dashboard.link": "{scheme}://" + host + ":{port}/status"}
