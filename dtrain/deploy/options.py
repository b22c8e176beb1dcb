"""What every deployment sets the same way: the per-run TLS certificate, where the HTTP servers
listen, the dashboard link, and the warning for a cluster dtrain did not start that anyone can
reach."""
from __future__ import annotations

import datetime
import threading
import warnings
import weakref
from concurrent.futures import Future
from typing import Any

from distributed import Security
from distributed.comm import parse_address

from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UnprotectedCluster, UserError


_ahead: list[Future[Security]] = []     # credentials made ahead (make_ahead), at most one
_ahead_lock = threading.Lock()


def make_ahead(cfg: ClusterConfig) -> None:
    """Start making the credentials the next :func:`security_for` takes, in a thread: the
    command line and :func:`dtrain.train` call it before they plan the run, so that
    importing ``cryptography`` (50-80 ms) happens while the data is read, not while the
    cluster starts."""
    if cfg.tls == "off":
        return
    with _ahead_lock:
        if _ahead:
            return
        made: Future[Security] = Future()
        _ahead.append(made)

    def make() -> None:
        try:
            made.set_result(temporary())
        except BaseException as exc:        # said by security_for, which reads it
            made.set_exception(exc)

    threading.Thread(target=make, name="dtrain-credentials", daemon=True).start()


def security_for(cfg: ClusterConfig) -> Security | None:
    """A per-run TLS :class:`~distributed.Security` for a cluster dtrain starts, or None.

    ``cluster.tls = 'auto'`` (the default) and ``'on'``: a self-signed certificate and key
    made for this run (:func:`temporary`; by :func:`make_ahead` if it was called), held in
    memory and handed to the processes the cluster starts, and required by every comm of
    its scheduler, nannies and workers.  ``'off'``: plain TCP, which any local user (or, off
    loopback, anyone on the network) can use to run code as you.
    """
    if cfg.tls == "off":
        return None
    with _ahead_lock:
        ahead = _ahead.pop() if _ahead else None
    try:
        return ahead.result() if ahead is not None else temporary()
    except ImportError:
        raise UserError("cluster.tls needs the 'cryptography' package for its per-run "
                        "certificate; pip install cryptography, or set cluster.tls = 'off'"
                        ) from None


def temporary(days: int = 365) -> Security:
    """``distributed.Security.temporary()``'s credentials, on an elliptic-curve key.

    The same self-signed certificate for every role (``dask-internal``, the cluster's only
    CA), in memory, with ``require_encryption``; but a P-256 key where Dask makes an RSA one
    of 2048 bits: made in a millisecond instead of 20-100, and cheaper in each handshake's
    signatures (the cluster's start makes a dozen), at a strength RSA would need 3072 bits
    for.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dask-internal")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("dask-internal")]),
                           critical=False)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))   # clocks a little apart
            .not_valid_after(now + datetime.timedelta(days=days))
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    return Security(require_encryption=True, tls_ca_file=cert_pem,
                    **{f"tls_{role}_{part}": pem for role in ("client", "scheduler", "worker")
                       for part, pem in (("key", key_pem), ("cert", cert_pem))})


OPEN_SCHEMES = ("tcp", "ws")        # distributed's comms that anyone who can reach them may use
_warned: set[str] = set()
_warned_lock = threading.Lock()
_own: weakref.WeakSet[Any] = weakref.WeakSet()     # clients of clusters dtrain started


def started_by_dtrain(client: Any) -> Any:
    """Mark ``client`` as one of a cluster dtrain started (its TLS is ``cluster.tls``'s,
    :func:`warn_if_open` says nothing of it); returns it."""
    _own.add(client)
    return client


def warn_if_theirs(client: Any) -> bool:
    """:func:`warn_if_open` for ``client``'s scheduler, unless dtrain started its cluster
    (:func:`started_by_dtrain`)."""
    return False if client in _own else warn_if_open(client.scheduler.address)


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
