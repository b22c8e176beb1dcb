"""Datasets as read from disk: MNIST's IDX files, an image folder, a CSV file, the bundled sets.

Each reader returns a :class:`Raw` (all samples, float64 features, int64
labels); :func:`read_raw` picks one by ``data.dataset``.  Workers call them
inside loading tasks (:mod:`dtrain.data.shards`); the driver reads headers
only (:func:`dtrain.data.prepare.describe`).
"""
from __future__ import annotations

import csv
import functools
import gzip
import io
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.core.config import DataConfig
from dtrain.core.errors import DataError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}
SYNTHETIC_BLOCK = 4096


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
    if size and tuple(size) != images.shape[1:]:
        from PIL import Image
        h, w = size
        images = np.stack([np.asarray(Image.fromarray(im).resize((w, h), Image.BILINEAR))
                           for im in images])
    return images.reshape(images.shape[0], -1).astype(np.float64), labels.astype(np.int64)


def _read_mnist(cfg: DataConfig) -> Raw:
    pairs = idx_files(Path(cfg.path))
    size = tuple(cfg.image_size)
    if len(pairs) == 2:  # the official split: train for training, t10k for testing
        x, y = _mnist_pair(*pairs["train"], size)
        return Raw(x, y, 10, _mnist_pair(*pairs["t10k"], size))
    x, y = _mnist_pair(*next(iter(pairs.values())), size)
    return Raw(x, y, 10)


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


def _read_image_folder(cfg: DataConfig) -> Raw:
    from PIL import Image, UnidentifiedImageError
    h, w = cfg.image_size
    xs, ys = [], []
    for label, (_, files) in enumerate(image_classes(Path(cfg.path))):
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


def synthetic_rows(cfg: DataConfig, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    x, y = synthetic_rows(cfg, np.arange(cfg.samples))
    return Raw(x, y, cfg.classes)


# --- split, describe, normalize ---------------------------------------------------------
