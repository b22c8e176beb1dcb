"""Data files written for the tests: IDX files (MNIST's format, optionally corrupted), a tiny
MNIST directory, and a folder of images by class."""
from __future__ import annotations

import gzip
import struct

import numpy as np
from PIL import Image


def write_idx(path, array: np.ndarray, magic: bytes | None = None, cut: int = 0):
    """An IDX file (gzipped if the name ends in .gz), optionally corrupted."""
    header = (magic or bytes([0, 0, 8, array.ndim])) + struct.pack(f">{array.ndim}I", *array.shape)
    blob = header + array.astype(np.uint8).tobytes()
    blob = blob[: len(blob) - cut] if cut else blob
    path.write_bytes(gzip.compress(blob) if path.suffix == ".gz" else blob)


def tiny_mnist(directory, n=40, prefix="t10k", **corrupt):
    """``n`` random 28x28 images and labels as MNIST's IDX files (``corrupt``: the images'
    file, as :func:`write_idx` takes it)."""
    rng = np.random.default_rng(0)
    write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)),
              **corrupt)
    write_idx(directory / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n))


def make_images(root, classes=("cat", "dog", "emu"), per_class=4, size=(9, 7)):
    """An image folder: a folder per class under ``root``, ``per_class`` random PNGs each."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
