"""The seeded split, the normalization and the dataset's sizes.

Order of operations, the same everywhere: read the raw samples -> seeded
split into train / validation / test -> statistics from the training split
-> normalize all three.  :func:`describe` gives the sizes cheaply (file
headers where it can), for the driver.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.core.config import DataConfig
from dtrain.data.readers import idx_count, idx_files, image_classes, read_raw

@dataclass(frozen=True)
class DatasetInfo:
    """Sizes of a dataset after the split, before replication."""

    name: str
    features: int
    classes: int
    train: int
    val: int
    test: int


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
                           counts["t10k"][0] if has_test else test)
    if cfg.dataset == "synthetic":
        return DatasetInfo("synthetic", cfg.features, cfg.classes,
                           *split_sizes(cfg.samples, cfg.split, False))
    if cfg.dataset == "image-folder":
        classes = image_classes(Path(cfg.path))
        n = sum(len(files) for _, files in classes)
        h, w = cfg.image_size
        return DatasetInfo(Path(cfg.path).name, h * w * (1 if cfg.grayscale else 3),
                           len(classes), *split_sizes(n, cfg.split, False))
    raw = read_raw(cfg)
    return DatasetInfo(cfg.dataset if cfg.dataset != "csv" else Path(cfg.path).name,
                       raw.x.shape[1], raw.classes, *split_sizes(len(raw.y), cfg.split, False))


def split_indices(cfg: DataConfig, n: int, has_test: bool) -> list[np.ndarray]:
    """Rows of the raw samples in the training, validation and test splits (seeded)."""
    train, val, test = split_sizes(n, cfg.split, has_test)
    order = np.arange(n) if cfg.dataset == "synthetic" else \
        np.random.default_rng([cfg.seed, 0x5B17]).permutation(n)
    return [order[:train], order[train:train + val], order[train + val:]]


@functools.lru_cache(maxsize=1)
def prepared(cfg: DataConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train"|"val"|"test": (x, y)}``, normalized with training-split statistics."""
    raw = read_raw(cfg)
    train, val, test = split_indices(cfg, len(raw.y), raw.test is not None)
    parts = {"train": (raw.x[train], raw.y[train]), "val": (raw.x[val], raw.y[val]),
             "test": raw.test if raw.test is not None else (raw.x[test], raw.y[test])}
    xt = parts["train"][0]
    if cfg.normalize == "standardize":
        shift, scale = xt.mean(axis=0), xt.std(axis=0)
    elif cfg.normalize == "minmax":
        shift, scale = xt.min(axis=0), xt.max(axis=0) - xt.min(axis=0)
    else:
        return parts
    scale = np.where(scale > 0, scale, 1.0)  # constant features (MNIST borders) stay put
    return {k: ((x - shift) / scale, y) for k, (x, y) in parts.items()}


def clear_cache() -> None:
    """Drop this process's cached datasets (the shards themselves stay)."""
    read_raw.cache_clear()
    prepared.cache_clear()
