"""Checkpoints: the state at a window edge, written atomically, and resuming from one.

A checkpoint holds everything the next step depends on: the state vector
(parameters and optimizer slots), the epoch's running loss and accuracy sums,
the next step's index, how many epochs have their metrics recorded, and the
config.
The data order needs no saved RNG state: every shuffle is derived from
``(data.seed, epoch, shard)``.  Because each step is a pure function of the
state, a resumed run ends with the same bytes as an uninterrupted one.
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.config import SECTIONS, Config, from_dict, read_toml
from dtrain.errors import UserError
from dtrain.optim import TrainState

FILE = "checkpoint.npz"


@dataclass(frozen=True)
class Checkpoint:
    """Where a run stands after ``step`` steps."""

    step: int
    epochs_done: int
    state: TrainState


def save(run_dir: Path, ckpt: Checkpoint, config: Config) -> None:
    """Write ``run_dir/checkpoint.npz`` via a temporary file and a rename: a kill at any
    instant leaves the previous checkpoint or this one, never a torn file."""
    meta = {"step": ckpt.step, "epochs_done": ckpt.epochs_done,
            "epoch_loss": ckpt.state.epoch_loss, "epoch_samples": ckpt.state.epoch_samples,
            "epoch_correct": ckpt.state.epoch_correct,
            "config": config.to_dict()}
    buf = io.BytesIO()
    vector = ckpt.state.vector.get() if hasattr(ckpt.state.vector, "get") else ckpt.state.vector
    np.savez(buf, vector=vector, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    tmp = run_dir / f".{FILE}.tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getbuffer())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / FILE)


def load(run_dir: Path) -> tuple[Checkpoint, dict] | None:
    """The run's checkpoint and the config it was written with, or None if it has none."""
    path = run_dir / FILE
    if not path.exists():
        return None
    try:
        with np.load(path) as f:
            vector, meta = f["vector"], json.loads(f["meta"].tobytes())
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot read checkpoint {path}: {exc}; delete it to restart the run "
                        f"from step 0") from None
    state = TrainState(vector, meta["epoch_loss"], meta["epoch_samples"],
                       meta.get("epoch_correct", 0))      # absent in older checkpoints
    return Checkpoint(meta["step"], meta["epochs_done"], state), meta["config"]


def resumable(run_dir: Path, config: Config | None) -> Config:
    """Check that ``run_dir`` can be resumed (with ``config``, if given) and return its config.

    Raises UserError for a missing or finished run, or a config that changes anything but
    ``[cluster]`` (where and how to run may change; what to compute may not).
    """
    if not (run_dir / "config.toml").is_file():
        raise UserError(f"cannot resume {run_dir}: no config.toml there; pass the directory "
                        f"of a run started by dtrain")
    if (run_dir / "summary.json").exists():
        raise UserError(f"run {run_dir} already finished (summary.json exists); nothing to "
                        f"resume")
    saved = from_dict(read_toml(run_dir / "config.toml"), str(run_dir / "config.toml"))
    if config is None:
        return saved
    changed = [f"{section}.{key}: {old!r} -> {new!r}"
               for section in SECTIONS if section != "cluster"
               for key, old in saved.to_dict()[section].items()
               if (new := config.to_dict()[section][key]) != old]
    if changed:
        raise UserError(f"cannot resume {run_dir} with a changed config ({'; '.join(changed)}); "
                        f"only [cluster] keys may change on resume")
    return config
