"""The raw inputs a model is applied to: a CSV file, IDX files, an image folder, a ``.npy``.

:func:`open_input` looks at a path (its header, its shape, its file list, a
CSV's line ends: never holds its rows) and cuts it into :class:`Part`\\ s of
``chunk_rows`` rows; :func:`read_part` reads one part where it runs (in the
driver, or as a Dask task on a worker), so a large input is never held whole
in one place.  Rows come out raw (float64, the model's feature order), with
their labels' text where the input has labels:

* CSV: with or without a header, with or without a label column.  With a
  header and a model that knows its features' names, columns are picked by
  name; otherwise a row has the model's features, plus one label column
  (``label``, or the last).  A regression model's rows may instead carry its
  targets: the columns named as the model names its targets (or ``label``:
  names separated by commas), or the last ``T`` columns; they come out as
  numbers (N, T), not text.
* IDX (MNIST's format, ``.gz`` or raw): an images file, or a folder holding
  one; a labels file beside it gives labels.  Images are resized as in training.
* An image folder: one subfolder per class (labels: the folder names), or
  images directly in it (no labels).
* ``.npy``: a 2-d array of features.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.core.errors import DataError
from dtrain.core.modelfile import ModelSpec
from dtrain.data import tables
from dtrain.data.missing import first_bad, shown
from dtrain.data.readers import (IMAGE_SUFFIXES, idx_count, idx_files, image_rows, read_idx,
                                 read_image)

CHUNK_ROWS = 65536
FIX = "fill it or drop the row; no row is predicted from a value that is not a number"


@dataclass(frozen=True)
class Reading:
    """How every part of one input is read: the format and what the model needs of it."""

    kind: str                                   # "csv", "npy", "idx", "images"
    path: str
    layout: tables.Layout | None = None         # csv
    columns: tuple[int, ...] = ()               # csv: the feature columns, in model order
    label: int | None = None                    # csv: the label column
    targets: tuple[int, ...] = ()               # csv: a regression's target columns
    labels_path: str | None = None              # idx: the labels file
    size: tuple[int, ...] = ()                  # idx, images: resize to (h, w)
    grayscale: bool = True                      # images
    channels_first: bool = False                # images: colour rows (C, H, W), not (H, W, C)
    files: tuple[tuple[str, str | None], ...] = ()   # images: (file, class or None)


@dataclass(frozen=True)
class Part:
    """Rows ``lo:hi`` of an input (for CSV: the lines starting in bytes ``lo:hi``)."""

    reading: Reading
    lo: int
    hi: int


@dataclass(frozen=True)
class Input:
    """An input cut into parts; ``labelled``: its rows come with labels."""

    path: Path
    kind: str
    parts: tuple[Part, ...]
    labelled: bool


def open_input(path: str | Path, spec: ModelSpec, *, delimiter: str = "",
               label: str | None = None, chunk_rows: int = CHUNK_ROWS) -> Input:
    """Look at ``path`` and cut it into parts for a model of ``spec``.

    Raises :class:`~dtrain.core.errors.DataError` for a path that is missing,
    of an unknown kind, or whose rows do not have the model's features.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path} not found; pass a CSV, .npy or IDX file or an image folder")
    if path.is_dir():
        try:
            pairs = idx_files(path)
        except DataError:
            return _images(path, spec, chunk_rows)
        images, labels = pairs["t10k"] if "t10k" in pairs else next(iter(pairs.values()))
        return _idx(images, labels, spec, chunk_rows)
    name = path.name.lower()
    if name.endswith(".npy"):
        return _npy(path, spec, chunk_rows)
    if "idx" in name:
        twin = path.with_name(path.name.replace("images", "labels").replace("idx3", "idx1"))
        return _idx(path, twin if twin != path and twin.exists() else None, spec, chunk_rows)
    return _csv(path, spec, delimiter, label, chunk_rows)


def read_part(part: Part, labels: bool = True
              ) -> tuple[np.ndarray, list[str] | np.ndarray | None]:
    """The raw rows of a part (B, D) float64, and their labels' text (None: unlabelled, or
    not asked for: ``labels`` False), or a regression's targets (B, T) float64.  A missing
    or non-finite feature (or, where asked for, label) is a
    :class:`~dtrain.core.errors.DataError` naming the file, its line or row, and the
    column: no row is predicted from values that are not numbers."""
    r = part.reading
    if r.kind == "csv":
        return _csv_rows(part, labels)
    if r.kind == "npy":
        x = np.asarray(np.load(r.path, mmap_mode="r")[part.lo:part.hi], dtype=np.float64)
        bad = first_bad(x)
        if bad is not None:
            row, column = bad
            raise DataError(f"{r.path}: row {part.lo + row}, column {column}: "
                            f"{shown(x[row, column])}; features must be finite numbers: "
                            f"fill or drop those rows")
        return x, None
    if r.kind == "idx":
        x = image_rows(read_idx(Path(r.path))[part.lo:part.hi], r.size)
        labels = None if r.labels_path is None else \
            [str(v) for v in read_idx(Path(r.labels_path))[part.lo:part.hi]]
        return x, labels
    files = r.files[part.lo:part.hi]
    x = np.stack([read_image(Path(f), r.size, r.grayscale, r.channels_first) for f, _ in files])
    return x, None if files[0][1] is None else [c for _, c in files]


def _cut(rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + chunk_rows, rows)) for lo in range(0, max(rows, 1), chunk_rows)]


def _mismatch(path: Path, found: int, spec: ModelSpec, extra: str = "") -> DataError:
    return DataError(f"{path} has {found} features per row but the model takes "
                     f"{spec.features}{extra}; pass data with the model's features")


# --- the formats --------------------------------------------------------------------------

def _csv(path: Path, spec: ModelSpec, delimiter: str, label: str | None,
         chunk_rows: int) -> Input:
    layout = tables.sniff(path, delimiter)
    names = spec.feature_names
    if spec.regression:
        columns, targets = _value_columns(path, layout, spec, label)
        return _csv_parts(path, layout, Reading("csv", str(path), layout, columns,
                                                targets=targets), chunk_rows)
    if layout.header is not None and names is not None and set(names) <= set(layout.header):
        columns = tuple(layout.header.index(n) for n in names)
        rest = [j for j in range(layout.width) if j not in columns]
        chosen = layout.column(label, path, "--label") if label else \
            rest[-1] if len(rest) == 1 else None
    elif layout.width == spec.features and not label:
        columns, chosen = tuple(range(layout.width)), None
    elif layout.width == spec.features + 1:
        chosen = layout.column(label, path, "--label") if label else layout.width - 1
        columns = tuple(j for j in range(layout.width) if j != chosen)
    else:
        raise _mismatch(path, layout.width, spec, " (plus an optional label column)")
    return _csv_parts(path, layout, Reading("csv", str(path), layout, columns, chosen),
                      chunk_rows)


def _value_columns(path: Path, layout: tables.Layout, spec: ModelSpec,
                   label: str | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A regression model's feature columns and target columns (none: unlabelled rows):
    by name where the header has the model's feature names, else by position."""
    header, names, count = layout.header, spec.feature_names, len(spec.targets)
    if header is not None and names is not None and set(names) <= set(header):
        columns = tuple(header.index(n) for n in names)
        targets = layout.columns(label, path, "--label") if label else \
            [header.index(t) for t in spec.targets] if set(spec.targets) <= set(header) else []
    elif layout.width == spec.features and not label:
        columns, targets = tuple(range(layout.width)), []
    elif layout.width == spec.features + count:
        targets = layout.columns(label, path, "--label") if label else \
            list(range(spec.features, layout.width))
        columns = tuple(j for j in range(layout.width) if j not in targets)
    else:
        raise _mismatch(path, layout.width, spec, f" (plus its {count} optional target "
                                                  f"column{'s' if count > 1 else ''})")
    if targets and len(targets) != count:
        raise DataError(f"--label {label!r} names {len(targets)} column(s) of {path}, but the "
                        f"model predicts {count} target(s): {', '.join(spec.targets)}")
    return columns, tuple(targets)


def _csv_parts(path: Path, layout: tables.Layout, reading: Reading, chunk_rows: int) -> Input:
    """A CSV input cut into parts of ``chunk_rows`` lines each (the last: the rest; a
    gzipped file: one part)."""
    labelled = reading.label is not None or bool(reading.targets)
    size = path.stat().st_size
    if path.suffix == ".gz":
        return Input(path, "csv", (Part(reading, 0, size),), labelled)
    starts = _part_starts(path, chunk_rows, 1 if layout.header is not None else 0)
    return Input(path, "csv", tuple(Part(reading, lo, hi) for lo, hi in
                                    zip(starts, [*starts[1:], size])), labelled)


SCAN_BYTES = 1 << 24


def _part_starts(path: Path, every: int, skip: int) -> list[int]:
    """Byte offsets where the parts of a text file begin: 0, then the start of every
    ``every``-th line after the ``skip`` header lines.  The file is scanned for line ends
    in blocks (its rows are never held), so every part but the last has exactly ``every``
    lines."""
    starts, line, at = [0], 0, 0           # line: the number of the line starting at ``at``
    size = path.stat().st_size
    with open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)   # b"\n"
            numbers = line + 1 + np.arange(len(ends))      # the line that starts after each
            first = (numbers > skip) & ((numbers - skip) % every == 0)
            starts += [at + int(e) + 1 for e in ends[first] if at + int(e) + 1 < size]
            line += len(ends)
            at += len(block)
    return starts


def _csv_rows(part: Part, labels: bool = True
              ) -> tuple[np.ndarray, list[str] | np.ndarray | None]:
    """The rows of the lines that start in bytes ``lo:hi`` (a gzipped file is one part)."""
    r, path = part.reading, Path(part.reading.path)
    label = r.label if labels else None
    if path.suffix == ".gz":
        text, start = tables.text(path), 0
    else:
        with open(path, "rb") as f:
            if part.lo:
                f.seek(part.lo - 1)
                f.readline()                     # the rest of the line before this part
            start, lines = f.tell(), []
            while start + sum(map(len, lines)) < part.hi and (line := f.readline()):
                lines.append(line)
        text = b"".join(lines).decode("utf-8", errors="replace")
    rows = tables.split_rows(text, r.layout.delimiter)
    if start == 0 and r.layout.header is not None:
        rows = rows[1:]

    def parse(line: int) -> tuple[np.ndarray, list[str] | np.ndarray | None]:
        if r.targets and labels:
            return tables.parse_values(rows, r.layout, list(r.columns), list(r.targets),
                                       line, path, FIX)
        return tables.parse(rows, r.layout, list(r.columns), label, line, path, FIX)
    try:
        return parse(0)
    except DataError:                            # name the file's own line numbers
        with open(path, "rb") as f:
            before = f.read(start).count(b"\n") if start else 0
        skip = 1 if start == 0 and r.layout.header is not None else 0
        return parse(before + skip + 1)


def _npy(path: Path, spec: ModelSpec, chunk_rows: int) -> Input:
    try:
        x = np.load(path, mmap_mode="r")
    except ValueError as exc:
        raise DataError(f"cannot read {path} as a NumPy array of numbers: {exc}") from None
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{path} holds a {x.ndim}-d {x.dtype} array; pass rows x features "
                        f"of numbers")
    if x.shape[1] != spec.features:
        raise _mismatch(path, x.shape[1], spec)
    reading = Reading("npy", str(path))
    return Input(path, "npy", tuple(Part(reading, a, b) for a, b in _cut(x.shape[0], chunk_rows)),
                 False)


def _image_size(spec: ModelSpec, path: Path) -> tuple[int, ...]:
    size = tuple(spec.training.get("image_size") or ())
    if not size:
        raise DataError(f"{path} holds images, but the model was not trained on images (it "
                        f"takes rows of {spec.features} features)")
    return size


def _idx(images: Path, labels: Path | None, spec: ModelSpec, chunk_rows: int) -> Input:
    dims = idx_count(images)
    if len(dims) != 3:
        raise DataError(f"{images} holds {len(dims)}-d data; an IDX images file is 3-d")
    size = tuple(spec.training.get("image_size") or ()) or dims[1:]
    if size[0] * size[1] != spec.features:
        raise _mismatch(images, size[0] * size[1], spec, f" ({dims[1]}x{dims[2]} images)")
    if labels is not None and idx_count(labels)[0] != dims[0]:
        raise DataError(f"{images} has {dims[0]} images but {labels} has "
                        f"{idx_count(labels)[0]} labels; use matching files")
    reading = Reading("idx", str(images), labels_path=str(labels) if labels else None,
                      size=tuple(size) if tuple(size) != dims[1:] else ())
    return Input(images, "idx", tuple(Part(reading, a, b) for a, b in _cut(dims[0], chunk_rows)),
                 labels is not None)


def _images(folder: Path, spec: ModelSpec, chunk_rows: int) -> Input:
    size = _image_size(spec, folder)
    grayscale = bool(spec.training.get("grayscale", True))
    if size[0] * size[1] * (1 if grayscale else 3) != spec.features:
        raise _mismatch(folder, size[0] * size[1] * (1 if grayscale else 3), spec)
    flat = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    sub = [(d.name, sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES))
           for d in sorted(folder.iterdir()) if d.is_dir()]
    files = tuple((str(p), None) for p in flat) if flat else \
        tuple((str(p), name) for name, found in sub for p in found)
    if not files:
        raise DataError(f"{folder} holds no images ({'/'.join(sorted(IMAGE_SUFFIXES))}) nor "
                        f"IDX files")
    reading = Reading("images", str(folder), size=size, grayscale=grayscale, files=files,
                      channels_first=bool(spec.training.get("channels_first", False)))
    return Input(folder, "images", tuple(Part(reading, a, b)
                                          for a, b in _cut(len(files), chunk_rows)), not flat)
