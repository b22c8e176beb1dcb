"""The seeded split, the normalization and the dataset's sizes.

Order of operations, the same everywhere: read the raw samples -> seeded
split into train / validation / test -> statistics from the training split
-> normalize all three.  :func:`describe` gives the sizes cheaply (file
headers where it can), for the driver.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.core.config import DataConfig
from dtrain.core.modelfile import Normalization
from dtrain.data.readers import (DIGITS, DIGITS_NAMES, IRIS_LABELS, IRIS_NAMES, computed_once,
                                 idx_count, idx_files, image_classes, read_raw,
                                 synthetic_names)


@dataclass(frozen=True)
class DatasetInfo:
    """Sizes of a dataset after the split, before replication; its class ``labels`` as the
    data names them and its features' ``names`` where it has them.  For a regression
    (``data.target = "value"``) ``classes`` counts the targets and ``labels`` names them."""

    name: str
    features: int
    classes: int
    train: int
    val: int
    test: int
    labels: tuple[str | int, ...] = ()
    names: tuple[str, ...] | None = None
    dropped: int = 0            # rows left out for missing values (data.missing = "drop")


def split_sizes(n: int, fractions: tuple[float, ...], has_test: bool) -> tuple[int, int, int]:
    """``(train, val, test)`` counts; with a shipped test set only train/val are split."""
    _, f_val, f_test = fractions
    if has_test:
        val = round(n * f_val / (1 - f_test)) if f_test < 1 else 0
        return n - val, val, 0
    val, test = round(n * f_val), round(n * f_test)
    return n - val - test, val, test


def describe(cfg: DataConfig) -> DatasetInfo:
    """Sizes of the dataset, cheaply: file headers, not the data where possible."""
    if cfg.dataset == "mnist":
        pairs = idx_files(Path(cfg.path))
        counts = {k: idx_count(img) for k, (img, _) in pairs.items()}
        shape = next(iter(counts.values()))
        h, w = cfg.image_size or shape[1:]
        has_test = len(pairs) == 2
        train, val, test = split_sizes(counts["train" if has_test else next(iter(counts))][0],
                                       cfg.split, has_test)
        return DatasetInfo("mnist", h * w, 10, train, val,
                           counts["t10k"][0] if has_test else test, DIGITS)
    if cfg.dataset == "synthetic":
        names = synthetic_names(cfg)
        return DatasetInfo("synthetic", cfg.features, len(names),
                           *split_sizes(cfg.samples, cfg.split, False), names)
    if cfg.dataset == "image-folder":
        classes = image_classes(Path(cfg.path))
        n = sum(len(files) for _, files in classes)
        h, w = cfg.image_size
        return DatasetInfo(Path(cfg.path).name, h * w * (1 if cfg.grayscale else 3),
                           len(classes), *split_sizes(n, cfg.split, False),
                           tuple(name for name, _ in classes))
    if cfg.dataset in BUNDLED:
        size, features, labels, names = BUNDLED[cfg.dataset]
        return DatasetInfo(cfg.dataset, features, len(labels),
                           *split_sizes(size, cfg.split, False), labels, names)
    raw = read_raw(cfg)
    return DatasetInfo(Path(cfg.path).name, raw.x.shape[1], raw.classes,
                       *split_sizes(len(raw.y), cfg.split, False), raw.labels, raw.names,
                       raw.dropped)


# the datasets scikit-learn ships: rows, features, labels, feature names (no need to read them)
BUNDLED = {"iris": (150, 4, IRIS_LABELS, IRIS_NAMES),
           "digits": (1797, 64, DIGITS, DIGITS_NAMES)}


def split_indices(cfg: DataConfig, n: int, has_test: bool) -> list[np.ndarray]:
    """Rows of the raw samples in the training, validation and test splits (seeded)."""
    train, val, test = split_sizes(n, cfg.split, has_test)
    order = np.arange(n) if cfg.dataset == "synthetic" else \
        np.random.default_rng([cfg.seed, 0x5B17]).permutation(n)
    return [order[:train], order[train:train + val], order[train + val:]]


def fit_normalization(x: np.ndarray, kind: str) -> Normalization:
    """The normalization of ``kind`` fitted on the training rows ``x`` (N, D): mean and
    standard deviation, or minimum and range; a constant feature (MNIST's borders) gets
    scale 1 and stays put."""
    if kind == "standardize":
        shift, scale = x.mean(axis=0), x.std(axis=0)                      # (D,), (D,)
    elif kind == "minmax":
        shift, scale = x.min(axis=0), x.max(axis=0) - x.min(axis=0)
    else:
        return Normalization("none")
    return Normalization(kind, shift, np.where(scale > 0, scale, 1.0))


@computed_once(maxsize=2)
def prepared(cfg: DataConfig, norm: Normalization | None = None
             ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], Normalization]:
    """``{"train"|"val"|"test": (x, y)}`` normalized with training-split statistics (or with
    ``norm``, a model's own), and the normalization used."""
    raw = read_raw(cfg)
    train, val, test = split_indices(cfg, len(raw.y), raw.test is not None)
    parts = {"train": (raw.x[train], raw.y[train]), "val": (raw.x[val], raw.y[val]),
             "test": raw.test if raw.test is not None else (raw.x[test], raw.y[test])}
    if norm is None:
        norm = fit_normalization(parts["train"][0], cfg.normalize)
    if norm.shift is None:
        return parts, norm
    return {k: ((x - norm.shift) / norm.scale, y) for k, (x, y) in parts.items()}, norm


def normalization(cfg: DataConfig, norm: Normalization | None = None) -> Normalization:
    """The normalization a run on ``cfg`` trains with: ``norm`` if given, else fitted on the
    training split (a task on a worker, where the data is read anyway)."""
    return norm if norm is not None else prepared(cfg, None)[1]


def clear_cache() -> None:
    """Drop this process's cached datasets (the shards themselves stay)."""
    read_raw.cache_clear()
    prepared.cache_clear()
