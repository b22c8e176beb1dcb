"""What every deployment sets the same way: the per-run TLS certificate and the dashboard link."""
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
