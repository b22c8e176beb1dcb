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
import zipfile
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
    """Where a run stands after ``step`` steps; ``best``: the best epoch's state so far, kept
    for ``train.keep_best`` (see :mod:`dtrain.training.stopping`)."""

    step: int
    epochs_done: int
    state: TrainState
    best: TrainState | None = None


def save(run_dir: Path, ckpt: Checkpoint, config: Config) -> None:
    """Write ``run_dir/checkpoint.npz`` via a temporary file and a rename: a kill at any
    instant leaves the previous checkpoint or this one, never a torn file."""
    meta = {"step": ckpt.step, "epochs_done": ckpt.epochs_done,
            "epoch_loss": ckpt.state.epoch_loss, "epoch_samples": ckpt.state.epoch_samples,
            "epoch_correct": ckpt.state.epoch_correct,
            "config": config.to_dict()}
    best = {} if ckpt.best is None else {"best": to_host(ckpt.best.vector)}
    files.atomic_write(run_dir / FILE, files.npz_bytes(
        vector=to_host(ckpt.state.vector), **best,
        meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)))


def load(run_dir: Path) -> tuple[Checkpoint, dict] | None:
    """The run's checkpoint and the config it was written with, or None if it has none."""
    path = run_dir / FILE
    if not path.exists():
        return None
    try:
        with np.load(path) as f:
            vector, meta = f["vector"], json.loads(f["meta"].tobytes())
            best = TrainState(f["best"]) if "best" in f.files else None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise UserError(f"cannot read checkpoint {path}: {exc}; delete it to restart the run "
                        f"from step 0") from None
    state = TrainState(vector, meta["epoch_loss"], meta["epoch_samples"],
                       meta.get("epoch_correct", 0))      # absent in older checkpoints
    return Checkpoint(meta["step"], meta["epochs_done"], state, best), meta["config"]


FREE_SECTIONS = ("cluster", "track")   # where to run and to log: may change on resume


def resumable(run_dir: Path, config: Config | None) -> Config:
    """Check that ``run_dir`` can be resumed (with ``config``, if given) and return its config.

    A run that was stopped goes on from its checkpoint.  A finished run goes on
    only to more epochs (``train.epochs`` raised), from the checkpoint it kept
    of its last step, unless early stopping ended it.  Besides ``train.epochs``
    only ``[cluster]`` and ``[track]`` keys may change: where to run and to log, not what
    to compute.
    Raises UserError otherwise.
    """
    started(run_dir)
    saved = from_dict(read_toml(run_dir / files.CONFIG), str(run_dir / files.CONFIG))
    wanted = config or saved
    epochs, more = saved.train.epochs, wanted.train.epochs
    if more < epochs:
        raise UserError(f"cannot resume {run_dir} with train.epochs = {more}: it was set to "
                        f"{epochs}, and epochs can only be added")
    if finished(run_dir):
        _check_extension(run_dir, epochs, more)
    changed = [f"{section}.{key}: {old!r} -> {new!r}"
               for section in SECTIONS if section not in FREE_SECTIONS
               for key, old in saved.to_dict()[section].items()
               if (new := wanted.to_dict()[section][key]) != old
               and (section, key) != ("train", "epochs")]
    if changed:
        raise UserError(f"cannot resume {run_dir} with a changed config ({'; '.join(changed)}); "
                        f"only [cluster] and [track] keys and more train.epochs may change on "
                        f"resume")
    return wanted


def started(run_dir: Path) -> None:
    """Check that ``run_dir`` holds a run dtrain started (its ``config.toml`` is there)."""
    if not (run_dir / files.CONFIG).is_file():
        raise UserError(f"cannot resume {run_dir}: no config.toml there; pass the directory "
                        f"of a run started by dtrain")


def finished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` finished (``summary.json``, written last, is there)."""
    return (run_dir / files.SUMMARY).exists()


def _check_extension(run_dir: Path, epochs: int, more: int) -> None:
    """A finished run may go on to ``more`` epochs than its ``epochs``: from its kept last
    checkpoint, and not after early stopping ended it."""
    if more == epochs:
        raise UserError(f"run {run_dir} already finished its {epochs} epoch"
                        f"{'s' if epochs > 1 else ''}; to train it longer: --resume {run_dir} "
                        f"--set train.epochs=N with N > {epochs}")
    try:
        summary = json.loads((run_dir / files.SUMMARY).read_text())
    except (OSError, ValueError):
        summary = {}
    if summary.get("solver"):
        raise UserError(f"run {run_dir} was trained by optim.name = "
                        f"'{summary['solver']['name']}', which keeps no checkpoint (scipy's "
                        f"L-BFGS memory is not saved), so it cannot go on to more iterations; "
                        f"start a new run from its parameters with --init-from {run_dir}")
    if summary.get("stopped_early"):
        raise UserError(f"run {run_dir} was stopped early after epoch "
                        f"{summary['stopped_early']} (train.patience); it cannot go on to "
                        f"more epochs; start a new run from it with --init-from {run_dir}")
    if not (run_dir / FILE).exists():
        raise UserError(f"run {run_dir} finished without keeping its last {FILE} (dtrain 0.1 "
                        f"dropped it), so it cannot go on; start a new run from its parameters "
                        f"with --init-from {run_dir}")


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
