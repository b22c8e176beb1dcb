"""The workers a client sees: waiting for them, and listing them in a fixed order."""
from __future__ import annotations

import time

from distributed import Client, Future, wait

from dtrain.core import internals
from dtrain.core.errors import UserError


def wait_for_workers(client: Client, n: int, timeout: float) -> None:
    """Block until ``n`` workers are connected, or raise a UserError saying how many came."""
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError:
        found = len(internals.scheduler_workers(client))
        raise UserError(f"needs {n} Dask worker(s), found {found} after {timeout:g} s; start more "
                        f"workers or lower the count") from None


def gather(client: Client, futures: list[Future], timeout: float, after: str = "") -> list:
    """``client.gather(futures)``, except that a cluster left with no worker for ``timeout``
    seconds raises a UserError (``after`` ends its message) instead of waiting for ever:
    the scheduler keeps tasks that no worker can run until one comes, and none may."""
    alone: float | None = None                      # since when no worker has been there
    while True:
        try:
            with client.as_current():               # distributed.wait asks the default client
                wait(futures, timeout=min(timeout, 1.0))
            return client.gather(futures)
        except TimeoutError:
            if internals.scheduler_workers(client):
                alone = None
            elif alone is None:
                alone = time.monotonic()
            elif time.monotonic() - alone >= timeout:
                raise UserError(f"every Dask worker left the cluster and none joined within "
                                f"{timeout:g} s (cluster.timeout){after}") from None


def _natural(name: object) -> tuple:
    text = str(name)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def worker_addresses(client: Client) -> list[str]:
    """Addresses of the connected workers, ordered by worker name (0, 1, 2, ... for
    LocalCluster and dask-mpi ranks)."""
    return list(workers(client))


def workers(client: Client) -> dict[str, dict]:
    """``{address: info}`` of the connected workers, ordered by worker name."""
    info = internals.scheduler_workers(client)
    return {a: info[a] for a in sorted(info, key=lambda a: _natural(info[a].get("name", a)))}
