"""The workers a client sees: waiting for them, and listing them in a fixed order."""
from __future__ import annotations

from distributed import Client

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
