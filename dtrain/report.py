"""Run output: the run directory's files and the console lines.

A run directory holds ``config.toml`` (written first), ``metrics.jsonl``
(one line per epoch, appended as epochs finish), and, only when the run
succeeds, ``params.npz`` and then ``summary.json``: a directory without
``summary.json`` is not a finished run.  Files that must not be seen half
written go through a temporary file and a rename.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np

from dtrain import checkpoint
from dtrain.config import Config

Echo = Callable[[str], None]


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def new_run_dir(base: Path, label: str) -> Path:
    """A fresh ``base/<time>-<label>`` directory (suffixed if that exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = base / (f"{stamp}-{label}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a new run directory under {base}")


class RunDir:
    """The files of one run, written in an order that never looks finished early.

    A new run starts the directory afresh; a resumed one (``keep_epochs`` set)
    keeps its files and cuts ``metrics.jsonl`` back to the epochs its
    checkpoint covers.
    """

    def __init__(self, path: Path, config: Config, keep_epochs: int | None = None):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        if keep_epochs is None:
            for stale in ("summary.json", "params.npz", "metrics.jsonl", checkpoint.FILE):
                (self.path / stale).unlink(missing_ok=True)
            atomic_write(self.path / "config.toml", config.to_toml().encode())
        else:
            rows = self.epochs()[:keep_epochs]
            atomic_write(self.path / "metrics.jsonl",
                         "".join(json.dumps(r) + "\n" for r in rows).encode())

    def epochs(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` written so far."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    def add_epoch(self, row: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def finish(self, params: dict[str, np.ndarray], summary: dict[str, Any]) -> None:
        """Write ``params.npz``, then ``summary.json`` (the mark of a finished run), then drop
        the checkpoint, which a finished run no longer needs."""
        tmp = self.path / ".params.npz.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **params)
        os.replace(tmp, self.path / "params.npz")
        atomic_write(self.path / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        (self.path / checkpoint.FILE).unlink(missing_ok=True)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """One console line per epoch."""
    return (f"epoch {row['epoch']:>{len(str(epochs))}}/{epochs}"
            f"  train_loss {_fmt(row.get('train_loss'), '.4f')}"
            f"  val_loss {_fmt(row.get('val_loss'), '.4f')}"
            f"  val_acc {_fmt(row.get('val_accuracy'), '.4f')}"
            f"  {_fmt(row.get('samples_per_second'), ',.0f')} samples/s"
            f"  {row['seconds']:.3f} s")


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The final console summary."""
    return [
        f"done: {summary['strategy']} on {summary['workers']} worker(s), "
        f"{summary['shards']} shards, {summary['epochs']} epochs, {summary['steps']} steps "
        f"in {summary['seconds']:.2f} s ({_fmt(summary['samples_per_second'], ',.0f')} samples/s)",
        f"test_accuracy {_fmt(summary['test_accuracy'], '.4f')}  "
        f"test_loss {_fmt(summary['test_loss'], '.4f')}  "
        f"on {summary['test_samples']} test samples",
        f"efficiency {_fmt(summary.get('efficiency'), '.1%')} (time in forward-backward / wall "
        f"time, over workers)  step {_ms(summary.get('step_seconds'))}  overhead "
        f"{_ms(summary.get('overhead_per_step'))} per step",
    ]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


class Recorder:
    """Everything a run reports, in one place: console lines and the run directory.

    The trainer calls :meth:`attach` once a cluster is up, :meth:`epoch` as
    each epoch's evaluation arrives, :meth:`checkpoint` at window edges, and
    :meth:`finish` after training.  ``resume_epochs`` reopens an interrupted
    run's directory instead of starting a new one.
    """

    def __init__(self, config: Config, out: str | Path | None, echo: Echo | None = print,
                 resume_epochs: int | None = None):
        self.config = config
        self.echo = echo
        self.run_dir = RunDir(Path(out), config, resume_epochs) if out is not None else None
        self.metrics: list[dict[str, Any]] = self.run_dir.epochs() if self.run_dir else []
        self.saved: checkpoint.Checkpoint | None = None

    @property
    def path(self) -> Path | None:
        return self.run_dir.path if self.run_dir else None

    def say(self, line: str) -> None:
        if self.echo is not None:
            self.echo(line)

    def attach(self, client: Any) -> None:
        """Called with the Dask client before training starts (not for ``serial``)."""
        cfg = self.config.cluster
        if cfg.dashboard_address or cfg.scheduler_address:
            if client.scheduler_info().get("services", {}).get("dashboard"):
                self.say(f"dashboard: {client.dashboard_link}")

    def epoch(self, row: dict[str, Any]) -> None:
        if self.run_dir is not None:
            self.run_dir.add_epoch(row)
        self.say(epoch_line(row, self.config.train.epochs))

    def checkpoint(self, ckpt: checkpoint.Checkpoint) -> None:
        if self.run_dir is not None:
            checkpoint.save(self.run_dir.path, ckpt, self.config)
            self.saved = ckpt

    def checkpoint_note(self) -> str:
        """Where the last good checkpoint is, for error messages."""
        if self.saved is None:
            return ""
        return (f"; the last good checkpoint (step {self.saved.step}) is kept in "
                f"{self.run_dir.path / checkpoint.FILE}")

    def finish(self, params: dict[str, np.ndarray], summary: dict[str, Any]) -> None:
        if self.run_dir is not None:
            self.run_dir.finish(params, summary)
        for line in summary_lines(summary):
            self.say(line)
