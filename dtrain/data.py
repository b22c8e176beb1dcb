"""Datasets, the seeded split, normalization, shards and minibatch order.

The driver only calls :func:`describe` (sizes, read from file headers) and
:func:`epoch_bounds` (which rows of each shard form each minibatch).  The
data itself is read on the workers, inside loading tasks
(:func:`load_shard`, :func:`load_part`), so a lost shard can be rebuilt by
running its task again and the driver never holds the training set.

Order of operations, the same everywhere: read the raw samples -> seeded
split into train / validation / test -> statistics from the training split
-> normalize all three -> repeat the training split ``replicate`` times ->
cut it into ``shards`` contiguous shards.
"""
from __future__ import annotations

import csv
import functools
import gzip
import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from dask.sizeof import sizeof

from dtrain.config import DataConfig
from dtrain.device import on_device
from dtrain.errors import UserError
from dtrain.model import align_on_unpickle

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}
SYNTHETIC_BLOCK = 4096


class DataError(UserError):
    """Missing, corrupt or inconsistent data files."""


@dataclass(frozen=True)
class DatasetInfo:
    """Sizes of a dataset after the split, before replication."""

    name: str
    features: int
    classes: int
    train: int
    val: int
    test: int


@dataclass(frozen=True)
class Raw:
    """Samples as read: ``x`` (N, D) float64, ``y`` (N,) int64; ``test`` if the source ships one."""

    x: np.ndarray
    y: np.ndarray
    classes: int
    test: tuple[np.ndarray, np.ndarray] | None = None


# --- readers -------------------------------------------------------------------------

IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _idx_files(directory: Path) -> dict[str, tuple[Path, Path]]:
    """``{"train": (images, labels), "t10k": ...}`` for the pairs present."""
    if not directory.is_dir():
        raise DataError(f"MNIST directory {directory} not found; set data.path to the folder "
                        f"holding t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz")
    pairs = {}
    for prefix, (img, lab) in IDX_NAMES.items():
        images, labels = _find(directory, img), _find(directory, lab)
        if images and labels:
            pairs[prefix] = (images, labels)
        elif images or labels:
            missing = lab if images else img
            raise DataError(f"{directory}: found {(images or labels).name} but not {missing}[.gz]")
    if not pairs:
        raise DataError(f"no MNIST IDX files in {directory}: expected train-images-idx3-ubyte[.gz] "
                        f"and/or t10k-images-idx3-ubyte[.gz] with their label files")
    return pairs


def _idx_header(path: Path, blob: bytes) -> tuple[int, ...]:
    if len(blob) < 4 or blob[:2] != b"\0\0" or blob[2] != 0x08 or blob[3] not in (1, 3):
        raise DataError(f"{path} is not an IDX file of unsigned bytes (bad magic number "
                        f"{blob[:4].hex() or 'empty'}); expected 00000801 or 00000803")
    ndim = blob[3]
    if len(blob) < 4 + 4 * ndim:
        raise DataError(f"{path} is truncated: its header ends early")
    return struct.unpack(f">{ndim}I", blob[4:4 + 4 * ndim])


def _read_bytes(path: Path, limit: int | None = None) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read(limit) if limit else f.read()
        with open(path, "rb") as f:
            return f.read(limit) if limit else f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (raw or gzipped) as a uint8 array, with its header checked."""
    blob = _read_bytes(path)
    dims = _idx_header(path, blob)
    start, need = 4 + 4 * len(dims), int(np.prod(dims))
    if len(blob) - start < need:
        raise DataError(f"{path} is truncated: header promises {need} bytes of data, "
                        f"file has {len(blob) - start}")
    return np.frombuffer(blob, dtype=np.uint8, count=need, offset=start).reshape(dims)


def _idx_count(path: Path) -> tuple[int, ...]:
    return _idx_header(path, _read_bytes(path, limit=16))


def _mnist_pair(images_path: Path, labels_path: Path, size: tuple[int, ...]):
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1:
        raise DataError(f"{images_path} must hold 3-d images and {labels_path} 1-d labels")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{images_path} has {images.shape[0]} images but {labels_path} has "
                        f"{labels.shape[0]} labels; use matching files")
    if labels.size and labels.max() > 9:
        raise DataError(f"{labels_path} has label {labels.max()}; MNIST labels are 0-9")
    if size and tuple(size) != images.shape[1:]:
        from PIL import Image
        h, w = size
        images = np.stack([np.asarray(Image.fromarray(im).resize((w, h), Image.BILINEAR))
                           for im in images])
    return images.reshape(images.shape[0], -1).astype(np.float64), labels.astype(np.int64)


def _read_mnist(cfg: DataConfig) -> Raw:
    pairs = _idx_files(Path(cfg.path))
    size = tuple(cfg.image_size)
    if len(pairs) == 2:  # the official split: train for training, t10k for testing
        x, y = _mnist_pair(*pairs["train"], size)
        return Raw(x, y, 10, _mnist_pair(*pairs["t10k"], size))
    x, y = _mnist_pair(*next(iter(pairs.values())), size)
    return Raw(x, y, 10)


def _image_classes(directory: Path) -> list[tuple[str, list[Path]]]:
    if not directory.is_dir():
        raise DataError(f"image folder {directory} not found; set data.path to a directory "
                        f"with one subfolder of images per class")
    classes = [(d.name, sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES))
               for d in sorted(directory.iterdir()) if d.is_dir()]
    classes = [(name, files) for name, files in classes if files]
    if len(classes) < 2:
        raise DataError(f"image folder {directory} has {len(classes)} class folder(s) with images; "
                        f"it needs at least 2 subfolders holding "
                        f"{'/'.join(sorted(s[1:] for s in IMAGE_SUFFIXES))} files")
    return classes


def _read_image_folder(cfg: DataConfig) -> Raw:
    from PIL import Image, UnidentifiedImageError
    h, w = cfg.image_size
    xs, ys = [], []
    for label, (_, files) in enumerate(_image_classes(Path(cfg.path))):
        for path in files:
            try:
                with Image.open(path) as im:
                    im = im.convert("L" if cfg.grayscale else "RGB").resize((w, h), Image.BILINEAR)
                    xs.append(np.asarray(im, dtype=np.float64).reshape(-1))
            except (UnidentifiedImageError, OSError, ValueError) as exc:
                raise DataError(f"cannot read image {path}: {exc}; remove or replace it") from None
            ys.append(label)
    return Raw(np.stack(xs), np.array(ys, dtype=np.int64), label + 1)


def _read_csv(cfg: DataConfig) -> Raw:
    path = Path(cfg.path)
    if not path.is_file():
        raise DataError(f"CSV file {path} not found; set data.path to a CSV file whose last "
                        f"column is the class label")
    text = _read_bytes(path).decode("utf-8", errors="replace")
    rows = [r for r in csv.reader(io.StringIO(text)) if r]

    def numeric(row):
        try:
            [float(v) for v in row[:-1]]
            return True
        except ValueError:
            return False

    if rows and not numeric(rows[0]):
        rows = rows[1:]  # a header line
    if not rows:
        raise DataError(f"CSV file {path} has no data rows")
    width = len(rows[0])
    for n, row in enumerate(rows, start=1):
        if len(row) != width or not numeric(row):
            raise DataError(f"{path}: data row {n} has {len(row)} fields or a non-number; "
                            f"every row needs {width - 1} numbers and a label")
    names = sorted({r[-1].strip() for r in rows}, key=lambda s: (len(s), s))
    index = {name: i for i, name in enumerate(names)}
    x = np.array([[float(v) for v in r[:-1]] for r in rows])
    return Raw(x, np.array([index[r[-1].strip()] for r in rows], dtype=np.int64), len(names))


def _read_bundled(cfg: DataConfig) -> Raw:
    from sklearn import datasets
    loader = {"iris": datasets.load_iris, "digits": datasets.load_digits}[cfg.dataset]
    x, y = loader(return_X_y=True)
    return Raw(x.astype(np.float64), y.astype(np.int64), int(y.max()) + 1)


def _synthetic_rows(cfg: DataConfig, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the synthetic set, generated block by block so any subset is cheap."""
    teacher = np.random.default_rng([cfg.seed, 0xDA7A]).standard_normal((cfg.features, cfg.classes))
    x = np.empty((rows.size, cfg.features))
    blocks = rows // SYNTHETIC_BLOCK
    for block in np.unique(blocks):
        rng = np.random.default_rng([cfg.seed, int(block)])
        data = rng.standard_normal((SYNTHETIC_BLOCK, cfg.features + cfg.classes))
        pick = blocks == block
        x[pick] = data[rows[pick] % SYNTHETIC_BLOCK, : cfg.features]
    noise = 0.5 * np.random.default_rng([cfg.seed, 0x5EED]).standard_normal(cfg.classes)
    y = (x @ teacher + noise).argmax(axis=1)
    return x, y.astype(np.int64)


@functools.lru_cache(maxsize=2)
def read_raw(cfg: DataConfig) -> Raw:
    """All samples of the configured dataset, as read from disk (cached per process)."""
    if cfg.dataset in ("iris", "digits"):
        return _read_bundled(cfg)
    if cfg.dataset == "mnist":
        return _read_mnist(cfg)
    if cfg.dataset == "image-folder":
        return _read_image_folder(cfg)
    if cfg.dataset == "csv":
        return _read_csv(cfg)
    x, y = _synthetic_rows(cfg, np.arange(cfg.samples))
    return Raw(x, y, cfg.classes)


# --- split, describe, normalize ---------------------------------------------------------

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
        pairs = _idx_files(Path(cfg.path))
        counts = {k: _idx_count(img) for k, (img, _) in pairs.items()}
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
        classes = _image_classes(Path(cfg.path))
        n = sum(len(files) for _, files in classes)
        h, w = cfg.image_size
        return DatasetInfo(Path(cfg.path).name, h * w * (1 if cfg.grayscale else 3),
                           len(classes), *split_sizes(n, cfg.split, False))
    raw = read_raw(cfg)
    return DatasetInfo(cfg.dataset if cfg.dataset != "csv" else Path(cfg.path).name,
                       raw.x.shape[1], raw.classes, *split_sizes(len(raw.y), cfg.split, False))


def _split_indices(cfg: DataConfig, n: int, has_test: bool) -> list[np.ndarray]:
    train, val, test = split_sizes(n, cfg.split, has_test)
    order = np.arange(n) if cfg.dataset == "synthetic" else \
        np.random.default_rng([cfg.seed, 0x5B17]).permutation(n)
    return [order[:train], order[train:train + val], order[train + val:]]


@functools.lru_cache(maxsize=1)
def prepared(cfg: DataConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train"|"val"|"test": (x, y)}``, normalized with training-split statistics."""
    raw = read_raw(cfg)
    train, val, test = _split_indices(cfg, len(raw.y), raw.test is not None)
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


# --- shards and minibatches ----------------------------------------------------------

@align_on_unpickle
@dataclass(frozen=True)
class Shard:
    """One fixed slice of the (replicated) training set, living on a worker."""

    index: int
    x: Any            # (n, D)
    y: Any            # (n,)
    _arrays = ("x", "y")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def batch(self, epoch: int, lo: int, hi: int, seed: int | None):
        """Rows ``lo:hi`` of this epoch's order (shuffled when ``seed`` is not None)."""
        if seed is None:
            return self.x[lo:hi], self.y[lo:hi]
        rows = _epoch_order(seed, epoch, self.index, len(self))[lo:hi]
        return self.x[rows], self.y[rows]


@sizeof.register(Shard)
def _sizeof_shard(shard: Shard) -> int:
    return int(shard.x.nbytes + shard.y.nbytes)


@functools.lru_cache(maxsize=64)
def _epoch_order(seed: int, epoch: int, shard: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, shard]).permutation(n)


def shard_ranges(n_train: int, replicate: int, shards: int) -> list[tuple[int, int]]:
    """``(start, stop)`` rows of each shard in the replicated training set."""
    total = n_train * replicate
    if shards > total:
        raise DataError(f"data.shards = {shards} but there are only {total} training samples; "
                        f"use at most {total} shards")
    bounds = np.linspace(0, total, shards + 1).round().astype(int)  # contiguous, near-equal
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _training_rows(cfg: DataConfig, start: int, stop: int, n_train: int):
    base = np.arange(start, stop) % n_train  # replication repeats the training split
    if cfg.dataset == "synthetic" and cfg.normalize == "none":
        return _synthetic_rows(cfg, base)  # generate only these rows
    x, y = prepared(cfg)["train"]
    return x[base], y[base]


def load_shard(cfg: DataConfig, index: int, start: int, stop: int, n_train: int,
               dtype: str, gpu: bool = False) -> Shard:
    """Loading task: build shard ``index`` (training rows ``start:stop``) on this worker,
    in GPU memory if ``gpu`` and the worker has a usable GPU."""
    x, y = _training_rows(cfg, start, stop, n_train)
    return Shard(index, on_device(np.ascontiguousarray(x, dtype=dtype), gpu), on_device(y, gpu))


def load_shards(cfg: DataConfig, ranges: tuple[tuple[int, int], ...], n_train: int,
                dtype: str) -> list[Shard]:
    """Loading task: every shard, on one worker (model parallelism shares the whole set)."""
    return [load_shard(cfg, i, a, b, n_train, dtype) for i, (a, b) in enumerate(ranges)]


def load_part(cfg: DataConfig, part: str, dtype: str, gpu: bool = False) -> Shard:
    """Loading task: the ``"val"`` or ``"test"`` split as one shard."""
    x, y = prepared(cfg)[part]
    return Shard(-1, on_device(np.ascontiguousarray(x, dtype=dtype), gpu), on_device(y, gpu))


def epoch_bounds(sizes: list[int], batch_size: int) -> np.ndarray:
    """Which rows of each shard make up each minibatch of an epoch.

    Returns ``c`` of shape ``(steps + 1, shards)``: step ``t`` takes rows
    ``c[t, i]:c[t + 1, i]`` of shard ``i``'s epoch order.  The shards are
    interleaved in proportion to their sizes (sample ``r`` of a shard of
    ``n`` sits at position ``(r + 1/2) / n``, ties by shard id), so every
    minibatch has exactly ``batch_size`` samples (the last one the rest) and
    draws evenly from all shards, whatever their sizes.
    """
    sizes = np.asarray(sizes)
    total = int(sizes.sum())
    shard = np.repeat(np.arange(sizes.size), sizes)                    # (N,)
    rank = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    key = (2 * rank + 1) / (2 * sizes[shard])                          # (N,)
    order = shard[np.lexsort((shard, key))]                            # shard id at each position
    by_shard = np.argsort(order, kind="stable")                        # positions, grouped by shard
    steps = -(-total // batch_size)
    cuts = np.minimum(np.arange(steps + 1) * batch_size, total)        # (steps + 1,)
    counts = np.empty((steps + 1, sizes.size), dtype=np.int64)
    for i, start in enumerate(np.cumsum(sizes) - sizes):
        counts[:, i] = np.searchsorted(by_shard[start:start + sizes[i]], cuts)
    return counts
