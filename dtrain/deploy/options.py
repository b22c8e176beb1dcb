"""What every deployment sets the same way: the per-run TLS certificate, where the HTTP servers
listen, and the dashboard link."""
from __future__ import annotations

from distributed import Security

from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UserError


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


LOOPBACK = "127.0.0.1"
NO_DASHBOARD = f"{LOOPBACK}:0"      # distributed's HTTP servers, which it always starts


def http_address(dashboard: str) -> str:
    """Where the scheduler's HTTP server listens for ``cluster.dashboard_address``.

    distributed starts that server even without a dashboard (``/health``,
    ``/metrics``, the ``/info`` and ``/json`` pages) and binds an address
    without a host to every interface.  So: no dashboard (``''``) is
    ``127.0.0.1`` on a free port; an address without a host (``':8787'``,
    ``'8787'``) is that port on ``127.0.0.1``; an address with a host is
    taken as given (``0.0.0.0:8787`` is what shows it to other machines).
    """
    if not dashboard:
        return NO_DASHBOARD
    parts = [part.strip() for part in dashboard.split(",")]
    return ",".join(f"{LOOPBACK}:{part.lstrip(':')}" if _no_host(part) else part
                    for part in parts)


def _no_host(part: str) -> bool:
    return part.isdigit() or (part.startswith(":") and part[1:].isdigit())


def dashboard_link_config(address: str) -> dict[str, str]:
    """Dask config that makes ``Client.dashboard_link`` name the host the dashboard listens on.

    The link is built from the scheduler's host, which for a deployed
    cluster is the machine's network address, while the dashboard binds to
    ``127.0.0.1`` unless told otherwise (``cluster.dashboard_address``).
    """
    host = http_address(address).split(",")[0].rpartition(":")[0] if address else ""
    if not host or host in ("0.0.0.0", "[::]", "::"):
        return {}
    return {"distributed.dashboard.link": "{scheme}://" + host + ":{port}/status"}
