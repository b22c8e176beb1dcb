"""What every deployment sets the same way: the per-run TLS certificate, where the HTTP servers
listen, the dashboard link, and the warning for a cluster dtrain did not start that anyone can
reach."""
from __future__ import annotations

import threading
import warnings

from distributed import Security
from distributed.comm import parse_address

from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UnprotectedCluster, UserError


def security_for(cfg: ClusterConfig) -> Security | None:
    """A per-run TLS :class:`~distributed.Security` for a cluster dtrain starts, or None.

    ``cluster.tls = 'auto'`` (the default) and ``'on'``: a self-signed certificate and key
    made for this run (``distributed.Security.temporary()``), held in memory and handed to
    the processes the cluster starts, and required by every comm of its scheduler, nannies
    and workers.  ``'off'``: plain TCP, which any local user (or, off loopback, anyone on
    the network) can use to run code as you.
    """
    if cfg.tls == "off":
        return None
    try:
        return Security.temporary()
    except ImportError:
        raise UserError("cluster.tls needs the 'cryptography' package for its per-run "
                        "certificate; pip install cryptography, or set cluster.tls = 'off'"
                        ) from None


OPEN_SCHEMES = ("tcp", "ws")        # distributed's comms that anyone who can reach them may use
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_if_open(address: str) -> bool:
    """Warn, once per address and process, that the scheduler at ``address`` (a cluster
    dtrain did not start) takes connections without TLS: anyone who can reach it, every
    user of this machine for a loopback address, can run code on its workers.  Returns
    whether it warned."""
    try:
        scheme = parse_address(address)[0]
    except ValueError:
        return False
    if scheme not in OPEN_SCHEMES:
        return False
    with _warned_lock:
        if address in _warned:
            return False
        _warned.add(address)
    warnings.warn(f"the Dask scheduler at {address} runs without TLS: anyone who can reach "
                  f"that address (on loopback, every user of this machine) can run code on "
                  f"its workers as you; start it with TLS credentials (distributed.Security), "
                  f"or let dtrain start its own cluster", UnprotectedCluster, stacklevel=2)
    return True


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
