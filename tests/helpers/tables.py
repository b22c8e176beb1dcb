"""iris as a table with short column names (``sl sw pl pw species``, in load_iris's order), and
a CSV of a table with chosen cells replaced by other text (a NaN, an empty field)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SHORT_FEATURES = ["sl", "sw", "pl", "pw"]
_SPECIES = np.array(["setosa", "versicolor", "virginica"])


def iris_table() -> pd.DataFrame:
    from sklearn.datasets import load_iris
    x, y = load_iris(return_X_y=True)
    frame = pd.DataFrame(x, columns=SHORT_FEATURES)
    frame["species"] = _SPECIES[y]
    return frame


def write_csv(path: Path, frame: pd.DataFrame, cells: dict[tuple[int, str], str] = {}) -> Path:
    """``frame`` as a CSV whose cells ``(row, column)`` are replaced by the given text."""
    text = frame.astype(object).astype(str)
    for (row, column), value in cells.items():
        text.loc[row, column] = value
    text.to_csv(path, index=False)
    return path
