"""Datasets as read from disk: MNIST's IDX files, an image folder, a CSV file, the bundled sets.

Each reader returns a :class:`Raw` (all samples, float64 features, int64
labels, or float64 targets where ``data.target`` is ``"value"``: a
regression); :func:`read_raw` picks one by ``data.dataset``.  Targets are
used as given: nothing normalizes them.  Workers call them
inside loading tasks (:mod:`dtrain.data.shards`); the driver reads headers
only (:func:`dtrain.data.prepare.describe`).
"""
from __future__ import annotations

import functools
import gzip
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dtrain.core.config import DataConfig
from dtrain.core.errors import DataError
from dtrain.data import tables

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}
SYNTHETIC_BLOCK = 4096


@dataclass(frozen=True)
class Raw:
    """Samples as read: ``x`` (N, D) float64, ``y`` (N,) int64 indices into ``labels`` (the
    classes as the data names them: strings or ints), or for a regression ``y`` (N, T)
    float64 targets and ``labels`` the targets' names; ``names`` the features' names where
    the data has them; ``test`` if the source ships one; ``dropped`` the rows left out for
    missing values."""

    x: np.ndarray
    y: np.ndarray
    labels: tuple[str | int, ...]
    test: tuple[np.ndarray, np.ndarray] | None = None
    names: tuple[str, ...] | None = None
    dropped: int = 0                 # rows left out for missing values (data.missing = "drop")

    @property
    def classes(self) -> int:
        return len(self.labels)


DIGITS = tuple(range(10))
IRIS_NAMES = ("sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)")
IRIS_LABELS = ("setosa", "versicolor", "virginica")
DIGITS_NAMES = tuple(f"pixel_{r}_{c}" for r in range(8) for c in range(8))


# --- readers -------------------------------------------------------------------------

IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def idx_files(directory: Path) -> dict[str, tuple[Path, Path]]:
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


def idx_count(path: Path) -> tuple[int, ...]:
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
    return image_rows(images, size), labels.astype(np.int64)


def image_rows(images: np.ndarray, size: tuple[int, ...] = ()) -> np.ndarray:
    """IDX images (N, h, w) uint8 as rows (N, H * W) float64, resized to ``size`` if given."""
    if size and tuple(size) != images.shape[1:]:
        from PIL import Image
        h, w = size
        images = np.stack([np.asarray(Image.fromarray(im).resize((w, h), Image.BILINEAR))
                           for im in images])
    return images.reshape(images.shape[0], -1).astype(np.float64)


def _read_mnist(cfg: DataConfig) -> Raw:
    pairs = idx_files(Path(cfg.path))
    size = tuple(cfg.image_size)
    if len(pairs) == 2:  # the official split: train for training, t10k for testing
        x, y = _mnist_pair(*pairs["train"], size)
        return Raw(x, y, DIGITS, _mnist_pair(*pairs["t10k"], size))
    x, y = _mnist_pair(*next(iter(pairs.values())), size)
    return Raw(x, y, DIGITS)


def image_classes(directory: Path) -> list[tuple[str, list[Path]]]:
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


def read_image(path: Path, size: tuple[int, int], grayscale: bool,
               channels_first: bool = True) -> np.ndarray:
    """One image file as a row (channels * H * W,) float64, resized to ``size``: a colour
    image's three channels one after the other, (C, H, W) as a convolution takes it
    (``channels_first``; False: (H, W, C), the order of the models saved before issue 52,
    which ``model.json`` marks by its absent ``training.channels_first``)."""
    from PIL import Image, UnidentifiedImageError
    h, w = size
    try:
        with Image.open(path) as im:
            im = im.convert("L" if grayscale else "RGB").resize((w, h), Image.BILINEAR)
            pixels = np.asarray(im, dtype=np.float64)                  # (H, W) or (H, W, C)
            if pixels.ndim == 3 and channels_first:
                pixels = pixels.transpose(2, 0, 1)                     # (C, H, W)
            return pixels.reshape(-1)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"cannot read image {path}: {exc}; remove or replace it") from None


def _read_image_folder(cfg: DataConfig) -> Raw:
    h, w = cfg.image_size
    xs, ys = [], []
    classes = image_classes(Path(cfg.path))
    for label, (_, files) in enumerate(classes):
        for path in files:
            xs.append(read_image(path, (h, w), cfg.grayscale))
            ys.append(label)
    return Raw(np.stack(xs), np.array(ys, dtype=np.int64), tuple(name for name, _ in classes))


def _read_csv(cfg: DataConfig) -> Raw:
    """A CSV file: one sample per row, the label in ``data.label``'s column (the last if
    empty), the separator and a header row found by :func:`dtrain.data.tables.sniff`.  A
    regression's targets are real numbers, in one or more columns (``data.label``: their
    names separated by commas).  A missing or non-finite value is a
    :class:`~dtrain.core.errors.DataError` naming its line and column, or its row is left
    out with ``data.missing = "drop"``; so is a classifier's label column that holds real
    numbers (a file without its label column: the last feature would be taken for it)."""
    path = Path(cfg.path)
    layout = tables.sniff(path, cfg.delimiter)
    if cfg.target == "value":
        return _read_csv_values(cfg, path, layout)
    label = layout.column(cfg.label, path) if cfg.label else layout.width - 1
    x, text, dropped = tables.read_table(path, layout, label, cfg.missing, MISSING_FIX)
    _not_real_numbers(cfg, path, layout, label, text)
    names = class_order(set(text))
    index = {name: i for i, name in enumerate(names)}
    features = None if layout.header is None else \
        tuple(h for j, h in enumerate(layout.header) if j != label)
    return Raw(x, np.array([index[t] for t in text], dtype=np.int64), label_values(names),
               names=features, dropped=dropped)


MISSING_FIX = "fill it or drop the row (or set data.missing = 'drop' to leave such rows out)"


def _not_real_numbers(cfg: DataConfig, path: Path, layout: tables.Layout, label: int,
                      text: list[str]) -> None:
    """A classifier's labels are classes: a label column of real numbers (``0.2``, ``1.5``)
    is a feature taken for the label, or a regression's target."""
    for t in text:
        try:
            value = float(t)
        except ValueError:
            continue
        if not value.is_integer():
            name = layout.header[label] if layout.header else f"{label + 1}"
            which = f"data.label = {cfg.label!r}" if cfg.label else \
                f"the label column ({name!r}, the last)"
            raise DataError(f"{path}: {which} holds real numbers such as {t}, not "
                            f"classes: name the label column with data.label"
                            f"{' (the columns: ' + ', '.join(layout.header) + ')' if layout.header else ''}"
                            f", or learn the values as a regression with "
                            f"model.loss = 'squared-error'")


def _read_csv_values(cfg: DataConfig, path: Path, layout: tables.Layout) -> Raw:
    """A regression's CSV: the targets' columns (``data.label``, the last if empty) as
    float64 (N, T), named by the header (``"y"`` for a last column without one)."""
    targets = layout.columns(cfg.label, path) if cfg.label else [layout.width - 1]
    if len(targets) >= layout.width:
        raise DataError(f"data.label = {cfg.label!r} names every column of {path} as a "
                        f"target; leave some features")
    x, t, dropped = tables.read_values(path, layout, targets, cfg.missing, MISSING_FIX)
    header = layout.header
    names = ("y",) if header is None else tuple(header[j] for j in targets)
    features = None if header is None else \
        tuple(h for j, h in enumerate(header) if j not in targets)
    return Raw(x, t, names, names=features, dropped=dropped)


def class_order(names: set[str]) -> list[str]:
    """Label texts in the order of the network's outputs: by value if every one is an
    integer, else as text (scikit-learn's ``classes_`` order, ``np.unique``'s)."""
    try:
        return sorted(names, key=int)
    except ValueError:
        return sorted(names)


def label_values(names: list[str]) -> tuple[str | int, ...]:
    """Class labels read as text, as the data means them: integers if every one is one."""
    try:
        return tuple(int(n) for n in names)
    except ValueError:
        return tuple(names)


def _bundled_file(name: str) -> Path:
    """scikit-learn's copy of a bundled dataset, found without importing scikit-learn (an
    import of a second or more in every worker that loads iris)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DataError(f"dataset '{name}' is read from scikit-learn's bundled copy, but "
                        f"scikit-learn is not installed; pip install scikit-learn")
    return Path(spec.origin).parent / "datasets" / "data" / name


def _read_bundled(cfg: DataConfig) -> Raw:
    """iris and digits, from the files scikit-learn ships (its loaders read the same)."""
    if cfg.dataset == "iris":
        table = np.loadtxt(_bundled_file("iris.csv"), delimiter=",", skiprows=1)  # (150, 5)
        return Raw(table[:, :-1], table[:, -1].astype(np.int64), IRIS_LABELS,
                   names=IRIS_NAMES)
    table = np.loadtxt(_bundled_file("digits.csv.gz"), delimiter=",")           # (1797, 65)
    return Raw(table[:, :-1], table[:, -1].astype(np.int64), DIGITS, names=DIGITS_NAMES)


def _synthetic_block_rows(cfg: DataConfig, rows: np.ndarray, width: int) -> np.ndarray:
    """Rows (N, width) of seeded standard normals, drawn block by block so any subset is
    cheap: the features first, then per-row extras."""
    out = np.empty((rows.size, width))
    blocks = rows // SYNTHETIC_BLOCK
    for block in np.unique(blocks):
        rng = np.random.default_rng([cfg.seed, int(block)])
        data = rng.standard_normal((SYNTHETIC_BLOCK, width))
        pick = blocks == block
        out[pick] = data[rows[pick] % SYNTHETIC_BLOCK]
    return out


def synthetic_rows(cfg: DataConfig, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the synthetic set, generated block by block so any subset is cheap: classes
    (N,) int64 from a seeded linear teacher, or, with ``data.target = "value"``, real
    targets (N, T) float64 from a seeded one-hidden-layer teacher plus a little noise."""
    if cfg.target == "value":
        return _synthetic_values(cfg, rows)
    teacher = np.random.default_rng([cfg.seed, 0xDA7A]).standard_normal((cfg.features, cfg.classes))
    x = np.ascontiguousarray(_synthetic_block_rows(cfg, rows, cfg.features + cfg.classes)
                             [:, : cfg.features])                      # (N, D)
    noise = 0.5 * np.random.default_rng([cfg.seed, 0x5EED]).standard_normal(cfg.classes)
    y = (x @ teacher + noise).argmax(axis=1)
    return x, y.astype(np.int64)


SYNTHETIC_HIDDEN = 16     # units of the regression teacher's hidden layer
SYNTHETIC_NOISE = 0.1     # standard deviation of the regression targets' noise


def _synthetic_values(cfg: DataConfig, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``t = x c + tanh(x A) B + noise``: a linear part, a smooth nonlinear part, and noise
    of :data:`SYNTHETIC_NOISE` drawn with the row (the best R^2 is about 0.99)."""
    f, k, h = cfg.features, cfg.targets, SYNTHETIC_HIDDEN
    rng = np.random.default_rng([cfg.seed, 0xDA7A, 1])
    c = rng.standard_normal((f, k)) / np.sqrt(f)                      # (D, T)
    a = rng.standard_normal((f, h)) / np.sqrt(f)                      # (D, H)
    b = rng.standard_normal((h, k)) / np.sqrt(h)                      # (H, T)
    data = _synthetic_block_rows(cfg, rows, f + k)
    x = data[:, :f]                                                   # (N, D)
    t = x @ c + np.tanh(x @ a) @ b + SYNTHETIC_NOISE * data[:, f:]    # (N, T)
    return np.ascontiguousarray(x), t


def synthetic_names(cfg: DataConfig) -> tuple[str | int, ...]:
    """The synthetic set's class labels (0, 1, ...) or target names (``y``, or ``y0``,
    ``y1``, ...)."""
    if cfg.target != "value":
        return tuple(range(cfg.classes))
    return ("y",) if cfg.targets == 1 else tuple(f"y{j}" for j in range(cfg.targets))


F = TypeVar("F", bound=Callable[..., Any])


def computed_once(maxsize: int) -> Callable[[F], F]:
    """``functools.lru_cache(maxsize)``, except that threads asking for the same arguments at
    once compute them once: the others wait for the first.  (``lru_cache`` lets each compute
    its own copy: a worker's threads loading their shards side by side read the dataset once
    per thread, a thread per core times its size in memory.)"""
    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        guard, locks = threading.Lock(), {}

        @functools.wraps(fn)
        def once(*args: Any) -> Any:
            with guard:
                lock = locks.setdefault(args, threading.Lock())
            with lock:
                return cached(*args)

        def cache_clear() -> None:
            with guard:
                cached.cache_clear()
                locks.clear()

        once.cache_clear = cache_clear            # type: ignore[attr-defined]
        once.cache_info = cached.cache_info       # type: ignore[attr-defined]
        return once                               # type: ignore[return-value]
    return wrap


@computed_once(maxsize=2)
def read_raw(cfg: DataConfig) -> Raw:
    """All samples of the configured dataset, as read from disk (cached per process)."""
    if cfg.dataset == "collection":
        raise DataError("data.dataset = 'collection': the run trained on a Dask collection "
                        "handed in from Python, and has no file to read; use it from Python, "
                        "or evaluate it with --data")
    if cfg.dataset in ("iris", "digits"):
        return _read_bundled(cfg)
    if cfg.dataset == "mnist":
        return _read_mnist(cfg)
    if cfg.dataset == "image-folder":
        return _read_image_folder(cfg)
    if cfg.dataset == "csv":
        return _read_csv(cfg)
    x, y = synthetic_rows(cfg, np.arange(cfg.samples))
    return Raw(x, y, synthetic_names(cfg))


# --- split, describe, normalize ---------------------------------------------------------
