"""Missing and non-finite values: what counts as one, where the first one is, how it is named.

A feature that is NaN or infinite cannot be trained on or predicted from (a
NaN row would come out as the first class), so every reader and every input
check finds the first one and names it: the file and line, or the array,
row and column.  A text field counts as missing when it is one of pandas'
default missing-value markers (:data:`MISSING_TEXT`: an empty field, ``NA``,
``nan``, ``null``, ...), so a CSV read up front by dtrain and the same CSV
read partition by partition through dask.dataframe agree on what is missing.
``data.missing = "drop"`` drops such rows instead (:func:`dropped_rows`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from dtrain.core.errors import DataError


# pandas.read_csv's default na_values (pandas/_libs/parsers.pyx, STR_NA_VALUES), and the
# empty field
MISSING_TEXT = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan",
                          "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a",
                          "nan", "null"})


def is_missing_text(field: str) -> bool:
    """Whether a text field is a missing value (pandas' markers, or empty)."""
    return field.strip() in MISSING_TEXT


def is_bad_text(field: str) -> bool:
    """Whether a text field is missing or a number that is not finite (``inf``, ``1e999``)."""
    if is_missing_text(field):
        return True
    try:
        return not math.isfinite(float(field))
    except ValueError:
        return False


def first_bad(x: np.ndarray) -> tuple[int, int] | None:
    """``(row, column)`` of the first NaN or infinite value of a 2-d array (in row order), or
    None where every value is finite (integers and booleans always are)."""
    if x.dtype.kind not in "fc" or x.size == 0:
        return None
    finite = np.isfinite(x)
    if finite.all():
        return None
    row, column = np.argwhere(~finite)[0]
    return int(row), int(column)


def shown(value: Any) -> str:
    """A non-finite value as the messages name it: ``NaN``, ``inf`` or ``-inf`` (the words
    scikit-learn's input checks match)."""
    if isinstance(value, str) and not value.strip():
        return "empty"
    try:
        v = float(value)
    except (TypeError, ValueError):            # None, pandas.NA, text
        return "missing" if value is None or str(value) == "<NA>" else repr(value)
    if math.isnan(v):
        return "NaN"
    return repr(value) if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def array_cell(name: str, row: int, column: int, value: Any,
               columns: tuple[Any, ...] | None = None) -> str:
    """Where a bad value of an in-memory array or frame is: ``X[17, 2] is NaN`` or ``X row
    17, column 'petal width (cm)', is NaN``."""
    if columns is not None:
        return f"{name} row {row}, column {columns[column]!r}, is {shown(value)}"
    return f"{name}[{row}, {column}] is {shown(value)}"


def check_finite(x: np.ndarray, name: str = "X", columns: tuple[Any, ...] | None = None,
                 fix: str = "fill or drop those rows") -> None:
    """Raise :class:`~dtrain.core.errors.DataError` (a ``ValueError``) naming the first NaN
    or infinite value of ``x`` (rows, features)."""
    bad = first_bad(x)
    if bad is not None:
        r, c = bad
        raise DataError(f"{array_cell(name, r, c, x[r, c], columns)}: features must be finite "
                        f"numbers; {fix}")


def dropped_rows(x: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """A mask (N,) of the rows of ``x`` (N, D) that hold a NaN or infinite feature, or (with
    ``labels``) whose label is missing: the rows ``data.missing = "drop"`` leaves out."""
    bad = ~np.isfinite(x).all(axis=1) if x.dtype.kind in "fc" and x.size else \
        np.zeros(len(x), dtype=bool)
    if labels is not None:
        bad |= missing_labels(labels)
    return bad


def missing_labels(y: np.ndarray) -> np.ndarray:
    """A mask of the labels that are missing: NaN, None, or empty text."""
    y = np.asarray(y)
    if y.dtype.kind == "f":
        return np.isnan(y) if y.ndim == 1 else ~np.isfinite(y).all(axis=tuple(range(1, y.ndim)))
    if y.dtype.kind in "OUS":        # None, NaN, pandas.NA or blank text
        return np.fromiter((v is None or str(v) == "<NA>" or v != v
                            or (isinstance(v, str) and not v.strip()) for v in y.tolist()),
                           dtype=bool, count=len(y))
    return np.zeros(len(y), dtype=bool)
