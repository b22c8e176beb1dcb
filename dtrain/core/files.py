"""Files: writes that are never seen half done, the folders dtrain ships, a run directory's names.

A run directory is a contract between layers: the trainer writes it, the
recorder adds to it, ``--resume`` and ``dtrain.load`` read it.  Its file
names live here, once.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

PACKAGE = Path(__file__).resolve().parents[1]        # dtrain/

# A run directory's files
CONFIG = "config.toml"          # the resolved config, written first
METRICS = "metrics.jsonl"       # one line per epoch, appended as epochs finish
CHECKPOINT = "checkpoint.npz"   # while the run goes: the state at the last window edge
PARAMS = "params.npz"           # the final (or best) parameters
MODEL = "model.json"            # what applying them needs: sizes, normalization, class labels
TIMELINE = "timeline.json"      # a Dask run's task records
REPORT = "report.html"          # the standalone report
SUMMARY = "summary.json"        # written last, only on success: the mark of a finished run
EVALUATION = "evaluation.json"  # what `python -m dtrain evaluate RUN` found (default place)
TENSORBOARD = "tensorboard"     # [track] tensorboard: the run's event files (a folder)
MLFLOW_RUN = "mlflow_run_id"    # [track] mlflow: the MLflow run a resumed run continues


def shipped(name: str) -> Path:
    """A folder dtrain ships beside the package (``configs``, ``jobqueue``): in a source
    checkout it is at the top of the repository; a wheel installs it inside ``dtrain/``."""
    checkout = PACKAGE.parent / name
    return checkout if checkout.is_dir() else PACKAGE / name


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new, never half:
    a temporary file beside it, flushed to disk, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def npz_bytes(**arrays: Any) -> bytes:
    """``np.savez`` of ``arrays`` as bytes (its zip entries carry no time: the same arrays
    give the same bytes)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()
