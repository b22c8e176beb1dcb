"""Delimited text tables (CSV and friends): the separator and the header found, then read.

One place decides how a text table is laid out, for training (the ``csv``
dataset) and for predicting on raw files: :func:`sniff` looks at the first
lines only (the separator among ``, ; tab |`` unless given, and whether the
first row is a header), :func:`read_table` reads every row and says which
line, which column and what is wrong when a row does not fit (a field that is not a
number, a missing or non-finite value, an empty label), or drops the rows with
missing values where ``data.missing = "drop"`` asks for it.
"""
from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtrain.core.errors import DataError
from dtrain.data.missing import first_bad, is_bad_text, is_missing_text

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


FIX = "fill it or drop the row"


def read_table(path: str | Path, layout: Layout, label: int | None, missing: str = "error",
               fix: str = FIX) -> tuple[np.ndarray, list[str] | None, int]:
    """Every data row: the features (N, D) as float64 (every column but ``label``), the
    ``label`` column's text (a column index, may be negative; None: no label), and how
    many rows ``missing = "drop"`` left out.

    Raises :class:`~dtrain.core.errors.DataError` naming the line and column of
    the first row that has the wrong number of fields, a feature that is not a
    number, a missing or non-finite feature, or an empty label (``missing =
    "error"``; ``fix`` says how to mend it).
    """
    path = Path(path)
    rows, line = _data_rows(path, layout)
    keep = [j for j in range(layout.width) if label is None or j != label % layout.width]
    needed = keep + ([label % layout.width] if label is not None else [])
    rows, lines, dropped = _kept(rows, layout, needed, line, missing)
    x, text = parse(rows, layout, keep, label, lines, path, fix)
    return x, text, dropped


def read_values(path: str | Path, layout: Layout, targets: list[int], missing: str = "error",
                fix: str = FIX) -> tuple[np.ndarray, np.ndarray, int]:
    """Every data row of a regression's table: the features (N, D) (every column but the
    ``targets``) and the targets (N, T), both float64, and the rows ``missing = "drop"``
    left out.

    Raises :class:`~dtrain.core.errors.DataError` as :func:`read_table` does, and
    for a target that is not a finite number.
    """
    path = Path(path)
    rows, line = _data_rows(path, layout)
    keep = [j for j in range(layout.width) if j not in targets]
    rows, lines, dropped = _kept(rows, layout, keep + list(targets), line, missing)
    x, t = parse_values(rows, layout, keep, targets, lines, path, fix)
    return x, t, dropped


def _kept(rows: list[list[str]], layout: Layout, needed: list[int], line: int, missing: str
          ) -> tuple[list[list[str]], list[int], int]:
    """The rows to read, their line numbers, and how many were dropped: with ``missing =
    "drop"``, the rows with a missing or non-finite value in a ``needed`` column go (a row
    of the wrong width stays, to be reported)."""
    lines = list(range(line, line + len(rows)))
    if missing != "drop":
        return rows, lines, 0
    keep = [n for n, row in enumerate(rows)
            if len(row) != layout.width or not any(is_bad_text(row[j]) for j in needed)]
    if not keep:
        raise DataError("every data row has a missing or non-finite value, so "
                        "data.missing = 'drop' leaves none")
    return [rows[n] for n in keep], [lines[n] for n in keep], len(rows) - len(keep)


def _data_rows(path: Path, layout: Layout) -> tuple[list[list[str]], int]:
    """The rows after the header, and the line number of the first."""
    rows = _rows(text(path), layout.delimiter)
    first = 1 if layout.header is not None else 0
    if len(rows) <= first:
        raise DataError(f"CSV file {path} has no data rows")
    return rows[first:], first + 1


def _line(line: int | Sequence[int], n: int) -> int:
    """The line number of row ``n``: ``line`` counts from the first row, or lists them."""
    return line + n if isinstance(line, int) else line[n]


def parse(rows: list[list[str]], layout: Layout, columns: list[int], label: int | None,
          line: int | Sequence[int], path: Path, fix: str = FIX
          ) -> tuple[np.ndarray, list[str] | None]:
    """Rows already split into fields (the first is line ``line`` of ``path``, or row ``n``
    is line ``line[n]``): the ``columns`` as float64 features (N, D), and the ``label``
    column's text.  A field that is not a number, is missing or is not finite, and an
    empty label, are :class:`~dtrain.core.errors.DataError`\\ s naming the line and column
    (``fix``: how to mend it)."""
    x = np.empty((len(rows), len(columns)))                            # (N, D)
    for n, row in enumerate(rows):
        if len(row) != layout.width:
            raise DataError(f"{path}: line {_line(line, n)} has {len(row)} fields, the first "
                            f"row {layout.width} (delimiter {layout.delimiter!r}); fix or "
                            f"drop it")
        try:
            x[n] = [float(row[j]) for j in columns]
        except ValueError:                # a missing value (NaN, reported below) or text
            wrong = next((j for j in columns if not _is_number(row[j])
                          and not is_missing_text(row[j])), None)
            if wrong is not None:
                raise DataError(f"{path}: line {_line(line, n)}, column "
                                f"{_name(layout, wrong)}: {row[wrong]!r} is not a number; "
                                f"every feature must be numeric") from None
            x[n] = [float(row[j]) if _is_number(row[j]) else np.nan for j in columns]
    bad = first_bad(x)                    # the first missing or non-finite value, in order
    if bad is not None:
        n, k = bad
        raise _missing(path, _line(line, n), layout, columns[k], rows[n][columns[k]], fix)
    if label is None:
        return x, None
    text = [row[label] for row in rows]
    for n, t in enumerate(text):
        if is_missing_text(t):
            raise DataError(f"{path}: line {_line(line, n)}: the label (column "
                            f"{_name(layout, label % layout.width)}) is "
                            f"{'empty' if not t.strip() else repr(t)}; every row needs a "
                            f"label: {fix}")
    return x, text


def _missing(path: Path, line: int, layout: Layout, j: int, field: str, fix: str) -> DataError:
    what = "empty" if not field.strip() else f"{field!r}, " + \
        ("a missing value" if is_missing_text(field) else "not a finite number")
    return DataError(f"{path}: line {line}, column {_name(layout, j)}: {what}; features must "
                     f"be finite numbers: {fix}")


def parse_values(rows: list[list[str]], layout: Layout, columns: list[int],
                 targets: list[int], line: int | Sequence[int], path: Path, fix: str = FIX
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Rows already split into fields (the first is line ``line`` of ``path``, or row ``n``
    is line ``line[n]``): the ``columns`` as float64 features (N, D) and the ``targets``
    columns as float64 real values (N, T), a regression's targets."""
    x, _ = parse(rows, layout, columns, None, line, path, fix)         # (N, D)
    t = np.empty((len(rows), len(targets)))                            # (N, T)
    for n, row in enumerate(rows):
        try:
            t[n] = [float(row[j]) for j in targets]
        except ValueError:
            j = next(j for j in targets if not _is_number(row[j]))
            if is_missing_text(row[j]):
                raise DataError(f"{path}: line {_line(line, n)}, target column "
                                f"{_name(layout, j)}: {'empty' if not row[j].strip() else repr(row[j])}; "
                                f"every row needs its targets: {fix}") from None
            raise DataError(f"{path}: line {_line(line, n)}, target column {_name(layout, j)}: "
                            f"{row[j]!r} is not a number; a regression (loss squared-error) "
                            f"needs numeric targets (classes: use loss cross-entropy)") from None
    bad = ~np.isfinite(t)
    if bad.any():
        n, k = (int(v[0]) for v in np.nonzero(bad))
        raise DataError(f"{path}: line {_line(line, n)}, target column "
                        f"{_name(layout, targets[k])}: {rows[n][targets[k]]!r} is not a finite "
                        f"number; {fix}")
    return x, t


def _name(layout: Layout, j: int) -> str:
    """Column ``j`` as the error messages name it: its header, else its 1-based number."""
    return layout.header[j] if layout.header else f"{j + 1}"


def split_rows(text: str, delimiter: str) -> list[list[str]]:
    """Lines of text as lists of fields (blank lines dropped)."""
    return _rows(text, delimiter)
