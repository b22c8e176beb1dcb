"""A run directory's files, written in an order that never looks finished early.

A run directory holds ``config.toml`` (written first), ``metrics.jsonl`` (one
line per epoch, appended as epochs finish), ``checkpoint.npz`` (the state at
the last window edge), and, only when the run succeeds, ``params.npz``,
``model.json`` (:mod:`dtrain.core.modelfile`), ``timeline.json`` (the task
records of a Dask run), ``report.html`` and then ``summary.json``: a
directory without ``summary.json`` is not a finished run.  Files that must not be seen half
written go through a temporary file and a rename.  The names are
:mod:`dtrain.core.files`'.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from dtrain.core import files
from dtrain.core.config import Config
from dtrain.core.errors import UserError
from dtrain.core.modelfile import ModelSpec
from dtrain.observe import htmlreport


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
    """The files of one run.

    A new run starts the directory afresh; a resumed one (``keep_epochs`` set)
    keeps its files and cuts ``metrics.jsonl`` back to the epochs its
    checkpoint covers.
    """

    def __init__(self, path: Path, config: Config, keep_epochs: int | None = None):
        self.path = Path(path)
        self.made = [p for p in (self.path, *self.path.parents) if not p.exists()]
        self._make()
        if keep_epochs is None:
            for stale in (files.SUMMARY, files.REPORT, files.TIMELINE, files.PARAMS,
                          files.METRICS, files.CHECKPOINT):
                (self.path / stale).unlink(missing_ok=True)
            files.atomic_write(self.path / files.CONFIG, config.to_toml().encode())
        else:
            rows = self.epochs()[:keep_epochs]
            files.atomic_write(self.path / files.METRICS,
                               "".join(json.dumps(r) + "\n" for r in rows).encode())
            # going on (where it runs may change, or more epochs): the config says what
            # runs now, and the run is not finished until it ends again
            files.atomic_write(self.path / files.CONFIG, config.to_toml().encode())
            (self.path / files.SUMMARY).unlink(missing_ok=True)

    def _make(self) -> None:
        """Make the directory; one that appeared since :attr:`made` was taken (another run
        given the same new directory at the same moment) is not shared."""
        fresh = self.path in self.made
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.mkdir(exist_ok=not fresh)
        except OSError as exc:
            if fresh and isinstance(exc, FileExistsError) and self.path.is_dir():
                raise UserError(f"run directory {self.path} was made by another run a moment "
                                f"ago; start again") from None
            file = next((p for p in (self.path, *self.path.parents) if p.is_file()), None)
            raise UserError(f"cannot make the run directory {self.path}: "
                            f"{f'{file} is a file' if file else exc.strerror}; pick another "
                            f"directory") from None

    def discard_unused(self) -> bool:
        """After a failed start (no epoch recorded, no checkpoint): remove the folders this
        run made (only if empty, for its parents), or from a folder it found, the files it
        wrote (whoever made that folder may remove it: the command line's new run
        directories).  True if it was unused (and so removed)."""
        if self.epochs() or (self.path / files.CHECKPOINT).exists():
            return False
        if self.path in self.made:
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in self.made[1:]:
                try:
                    parent.rmdir()
                except OSError:
                    break
        else:
            for name in (files.CONFIG, files.MODEL):
                (self.path / name).unlink(missing_ok=True)
        return True

    def epochs(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` written so far."""
        path = self.path / files.METRICS
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    def add_epoch(self, row: dict[str, Any]) -> None:
        with open(self.path / files.METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def finish(self, params: dict[str, np.ndarray], summary: dict[str, Any],
               timeline: dict[str, Any] | None = None, model: ModelSpec | None = None,
               keep_checkpoint: bool = True) -> None:
        """Write ``params.npz``, ``model.json``, ``timeline.json``, ``report.html`` and then
        ``summary.json``, the mark of a finished run.  The last checkpoint stays (``--resume
        DIR --set train.epochs=M`` goes on from it) unless ``keep_checkpoint`` is False."""
        files.atomic_write(self.path / files.PARAMS, files.npz_bytes(**params))
        if model is not None:
            files.atomic_write(self.path / files.MODEL, model.to_json().encode())
        if timeline is not None:
            files.atomic_write(self.path / files.TIMELINE, json.dumps(timeline).encode())
        run = htmlreport.RunData.read(self.path, summary=summary, timeline=timeline)
        htmlreport.write([run], self.path / files.REPORT)
        files.atomic_write(self.path / files.SUMMARY,
                           (json.dumps(summary, indent=2) + "\n").encode())
        if not keep_checkpoint:
            (self.path / files.CHECKPOINT).unlink(missing_ok=True)
