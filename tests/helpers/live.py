"""Watching a running dtrain from outside: a free port for its dashboard, its pages over HTTP,
its Prometheus gauges, and the process stopped as a user stops it (Ctrl-C)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    """The status and text of ``url``; ``(0, "")`` where nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def gauge(text: str, name: str) -> float | None:
    """The value of the Prometheus gauge ``dtrain_NAME`` in a /metrics ``text``."""
    m = re.search(rf"^dtrain_{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def stop(proc: subprocess.Popen) -> None:
    """Interrupt a process we started (Ctrl-C), then kill its group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
