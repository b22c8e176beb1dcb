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

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.core import files
from dtrain.core.arrays import to_host
from dtrain.core.config import SECTIONS, Config, from_dict, read_toml
from dtrain.core.errors import UserError
from dtrain.maths.optim import TrainState

FILE = files.CHECKPOINT


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
    files.atomic_write(run_dir / FILE, files.npz_bytes(
        vector=to_host(ckpt.state.vector),
        meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)))


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
    ``[cluster]`` and ``[track]`` (where and how to run, and where to log, may change; what
    to compute may not).
    """
    if not (run_dir / files.CONFIG).is_file():
        raise UserError(f"cannot resume {run_dir}: no config.toml there; pass the directory "
                        f"of a run started by dtrain")
    if (run_dir / files.SUMMARY).exists():
        raise UserError(f"run {run_dir} already finished (summary.json exists); nothing to "
                        f"resume")
    saved = from_dict(read_toml(run_dir / files.CONFIG), str(run_dir / files.CONFIG))
    if config is None:
        return saved
    changed = [f"{section}.{key}: {old!r} -> {new!r}"
               for section in SECTIONS if section not in ("cluster", "track")
               for key, old in saved.to_dict()[section].items()
               if (new := config.to_dict()[section][key]) != old]
    if changed:
        raise UserError(f"cannot resume {run_dir} with a changed config ({'; '.join(changed)}); "
                        f"only [cluster] and [track] keys may change on resume")
    return config


class Checkpoints:
    """Where a run's engine saves its checkpoints: ``run_dir`` (None: nowhere), telling
    ``told(step, path)`` after each."""

    def __init__(self, run_dir: Path | None, config: Config, told=None):
        self.run_dir, self.config, self.told = run_dir, config, told

    def save(self, ckpt: Checkpoint) -> None:
        if self.run_dir is not None:
            save(self.run_dir, ckpt, self.config)
            if self.told is not None:
                self.told(ckpt.step, self.run_dir / FILE)
