"""Delimited text tables (CSV and friends): the separator and the header found, then read.

One place decides how a text table is laid out, for training (the ``csv``
dataset) and for predicting on raw files: :func:`sniff` looks at the first
lines only (the separator among ``, ; tab |`` unless given, and whether the
first row is a header), :func:`read_table` reads every row and says which
line, which column and what is wrong when a row does not fit.
"""
from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.core.errors import DataError

CANDIDATES = ",;\t|"
SAMPLE_BYTES = 1 << 16


@dataclass(frozen=True)
class Layout:
    """How a table is written: its ``delimiter``, its ``header`` (column names, or None when
    the first row is data) and its ``width`` (fields per row)."""

    delimiter: str
    header: tuple[str, ...] | None
    width: int

    def column(self, name: str, path: Path, what: str = "data.label") -> int:
        """The index of the column called ``name``."""
        if self.header is None:
            raise DataError(f"{what} = {name!r} but {path} has no header row to name its "
                            f"columns; add one, or leave {what} empty for the last column")
        if name not in self.header:
            raise DataError(f"{what} = {name!r} is not a column of {path}; its columns are "
                            f"{', '.join(self.header)}")
        return self.header.index(name)

    def columns(self, names: str, path: Path, what: str = "data.label") -> list[int]:
        """The indices of the columns named in ``names``, separated by commas (a name that
        is itself a column, commas and all, names that one column)."""
        if self.header is not None and names in self.header:
            return [self.header.index(names)]
        found = [self.column(name.strip(), path, what) for name in names.split(",")]
        if len(set(found)) != len(found):
            raise DataError(f"{what} = {names!r} names a column of {path} twice")
        return found


def text(path: Path, limit: int | None = None) -> str:
    """A file's text (gzipped or not), its first ``limit`` bytes if given."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            blob = f.read(limit) if limit else f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    return blob.decode("utf-8", errors="replace")


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _rows(text: str, delimiter: str) -> list[list[str]]:
    return [[f.strip() for f in r] for r in csv.reader(io.StringIO(text), delimiter=delimiter)
            if any(f.strip() for f in r)]


def _guess_delimiter(lines: list[str]) -> str:
    """The candidate that splits every sample line into the same number (> 1) of fields, the
    most fields winning; ``,`` if none does."""
    best, fields = ",", 1
    for d in CANDIDATES:
        counts = {len(next(csv.reader([line], delimiter=d))) for line in lines}
        if len(counts) == 1 and (n := counts.pop()) > fields:
            best, fields = d, n
    return best


def sniff(path: str | Path, delimiter: str = "") -> Layout:
    """The layout of the table at ``path``, from its first lines.

    The first row is a header when one of its fields is not a number where the
    second row has one (a label column of names is not a header's sign).
    Raises :class:`~dtrain.core.errors.DataError` for a missing or empty file,
    or one whose rows split into a single column.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"CSV file {path} not found; check data.path")
    sample = text(path, SAMPLE_BYTES)
    lines = [line for line in sample.splitlines()[:-1 if len(sample) == SAMPLE_BYTES else None]
             if line.strip()][:20]
    if not lines:
        raise DataError(f"CSV file {path} is empty")
    sep = delimiter or _guess_delimiter(lines)
    rows = _rows("\n".join(lines), sep)
    width = len(rows[0])
    if width < 2:
        raise DataError(f"{path} parses to one column with delimiter {sep!r}: set "
                        f"data.delimiter to the file's separator (e.g. --set 'data.delimiter=;')")
    header = None
    if len(rows) > 1 and any(not _is_number(a) and _is_number(b)
                             for a, b in zip(rows[0], rows[1])):
        header = tuple(rows[0])
    return Layout(sep, header, width)


def read_table(path: str | Path, layout: Layout, label: int | None
               ) -> tuple[np.ndarray, list[str] | None]:
    """Every data row: the features (N, D) as float64 (every column but ``label``) and, if
    ``label`` (a column index, may be negative) is given, that column's text.

    Raises :class:`~dtrain.core.errors.DataError` naming the line and column of
    the first row that has the wrong number of fields or a feature that is not
    a number.
    """
    path = Path(path)
    rows, line = _data_rows(path, layout)
    keep = [j for j in range(layout.width) if label is None or j != label % layout.width]
    return parse(rows, layout, keep, label, line, path)


def read_values(path: str | Path, layout: Layout, targets: list[int]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every data row of a regression's table: the features (N, D) (every column but the
    ``targets``) and the targets (N, T), both float64.

    Raises :class:`~dtrain.core.errors.DataError` as :func:`read_table` does, and
    for a target that is not a finite number.
    """
    path = Path(path)
    rows, line = _data_rows(path, layout)
    keep = [j for j in range(layout.width) if j not in targets]
    return parse_values(rows, layout, keep, targets, line, path)


def _data_rows(path: Path, layout: Layout) -> tuple[list[list[str]], int]:
    """The rows after the header, and the line number of the first."""
    rows = _rows(text(path), layout.delimiter)
    first = 1 if layout.header is not None else 0
    if len(rows) <= first:
        raise DataError(f"CSV file {path} has no data rows")
    return rows[first:], first + 1


def parse(rows: list[list[str]], layout: Layout, columns: list[int], label: int | None,
          line: int, path: Path) -> tuple[np.ndarray, list[str] | None]:
    """Rows already split into fields (the first is line ``line`` of ``path``): the
    ``columns`` as float64 features (N, D), and the ``label`` column's text."""
    x = np.empty((len(rows), len(columns)))                            # (N, D)
    for n, row in enumerate(rows):
        if len(row) != layout.width:
            raise DataError(f"{path}: line {line + n} has {len(row)} fields, the first row "
                            f"{layout.width} (delimiter {layout.delimiter!r}); fix or drop it")
        try:
            x[n] = [float(row[j]) for j in columns]
        except ValueError:
            j = next(j for j in columns if not _is_number(row[j]))
            raise DataError(f"{path}: line {line + n}, column {_name(layout, j)}: {row[j]!r} is "
                            f"not a number; every feature must be numeric") from None
    return x, None if label is None else [row[label] for row in rows]


def parse_values(rows: list[list[str]], layout: Layout, columns: list[int],
                 targets: list[int], line: int, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows already split into fields (the first is line ``line`` of ``path``): the
    ``columns`` as float64 features (N, D) and the ``targets`` columns as float64 real
    values (N, T), a regression's targets."""
    x, _ = parse(rows, layout, columns, None, line, path)              # (N, D)
    t = np.empty((len(rows), len(targets)))                            # (N, T)
    for n, row in enumerate(rows):
        try:
            t[n] = [float(row[j]) for j in targets]
        except ValueError:
            j = next(j for j in targets if not _is_number(row[j]))
            raise DataError(f"{path}: line {line + n}, target column {_name(layout, j)}: "
                            f"{row[j]!r} is not a number; a regression (loss squared-error) "
                            f"needs numeric targets (classes: use loss cross-entropy)") from None
    bad = ~np.isfinite(t)
    if bad.any():
        n, k = (int(v[0]) for v in np.nonzero(bad))
        raise DataError(f"{path}: line {line + n}, target column {_name(layout, targets[k])}: "
                        f"{rows[n][targets[k]]!r} is not a finite number; drop or fix the row")
    return x, t


def _name(layout: Layout, j: int) -> str:
    """Column ``j`` as the error messages name it: its header, else its 1-based number."""
    return layout.header[j] if layout.header else f"{j + 1}"


def split_rows(text: str, delimiter: str) -> list[list[str]]:
    """Lines of text as lists of fields (blank lines dropped)."""
    return _rows(text, delimiter)
