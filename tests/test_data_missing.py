"""Missing and non-finite values in training data (:mod:`dtrain.data.missing`) never become a
model silently: NaN and infinite values, missing labels and a CSV without its label column are
one line naming the file, the line or row and the column, exit code 2 on the command line (a
ValueError in Python), before any cluster starts where the data is read up front and before any
output is written; ``data.missing = "drop"`` leaves those rows out and says how many.

What each test keeps from happening silently: exit 0 with NaN losses, petal width trained as 22
classes.  Predicting from such rows: ``tests/test_inference_inputs.py``; an estimator's fit:
``tests/test_estimators_inputs.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pytest

import dtrain
from helpers.cli import run_main
from helpers.tables import iris_table, write_csv


def _csv_args(path: Path, *sets: str) -> list[str]:
    return ["--set", "data.dataset=csv", "--set", f"data.path={path}",
            *(a for s in sets for a in ("--set", s))]


# --- training: CSV read up front, before any cluster ------------------------------------------

@pytest.mark.parametrize("cells, message", [
    ({(3, "pl"): "nan", (10, "pl"): "nan"}, "line 5, column pl: 'nan', a missing value"),
    ({(7, "sw"): "inf"}, "line 9, column sw: 'inf', not a finite number"),
    ({(40, "sl"): ""}, "line 42, column sl: empty; features must be finite numbers"),
    ({(142, "pw"): "NaN"}, "line 144, column pw: 'NaN'"),       # lands in the test split
    ({(5, "species"): ""}, "line 7: the label (column species) is empty; every row needs"),
], ids=["nan", "inf", "empty cell", "nan in the test rows", "empty label"])
def test_a_bad_csv_cell_is_one_line_before_anything_starts(tmp_path, capfd, cells, message):
    path = write_csv(tmp_path / "iris.csv", iris_table(), cells)
    code, out, err = run_main(capfd, *_csv_args(path), "--out", str(tmp_path / "run"),
                              "--workers", "1")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"dtrain: error: {path}: {message}"), err
    assert "data.missing = 'drop'" in err[0]
    assert out == "" and not (tmp_path / "run").exists()      # no cluster, no run directory


def test_a_csv_without_its_label_column_is_refused_not_trained_as_22_classes(tmp_path, capfd):
    path = write_csv(tmp_path / "features.csv", iris_table().drop(columns="species"))
    code, _, err = run_main(capfd, *_csv_args(path, "model.layers=[3, 16, 22]"),
                            "--out", str(tmp_path / "run"))
    assert code == 2 and len(err) == 1, err
    assert "the label column ('pw', the last) holds real numbers such as 0.2, not classes: " \
           "name the label column with data.label" in err[0], err
    # as a regression the same file is fine: the values are what it learns
    cfg = dtrain.load_config(None, [f"data.path={path}", "data.dataset=csv",
                                    "model.loss=squared-error", "model.layers=[3, 8, 1]",
                                    "graph.strategy=serial", "train.epochs=1"])
    assert dtrain.train(cfg, echo=None).summary["test_r2"] is not None


def test_missing_drop_leaves_the_rows_out_and_says_how_many(tmp_path):
    cells = {(r, "pl"): "nan" for r in (3, 10, 40)} | {(77, "species"): "", (120, "sw"): "inf"}
    path = write_csv(tmp_path / "iris.csv", iris_table(), cells)
    seen: list[str] = []
    cfg = dtrain.load_config(None, [f"data.path={path}", "data.dataset=csv",
                                    "data.missing=drop", "graph.strategy=serial",
                                    "train.epochs=2"])
    result = dtrain.train(cfg, echo=seen.append)
    said = [line for line in seen if line.startswith("data: ")]
    assert said == ["data: 5 row(s) with a missing or non-finite value left out "
                    "(data.missing = 'drop')"], seen
    s = result.summary
    assert s["train_samples"] + s["val_samples"] + s["test_samples"] == 145
    assert np.isfinite(s["test_loss"]) and np.isfinite(s["final_train_loss"])


# --- training: partitions read by the workers -------------------------------------------------

@pytest.mark.slow
def test_nan_in_a_parquet_file_names_the_file_row_and_column(client, tmp_path, capfd):
    frame = iris_table()
    frame.loc[120, "pw"] = np.nan                       # file 2 holds rows 100-149
    dd.from_pandas(frame, npartitions=3).to_parquet(tmp_path / "pq", write_index=False)
    args = ["--set", "data.dataset=parquet", "--set", f"data.path={tmp_path}/pq/*.parquet",
            "--set", "data.label=species", "--set", "train.epochs=1",
            "--scheduler-address", client.scheduler.address]
    code, _, err = run_main(capfd, *args, "--out", str(tmp_path / "run"))
    assert code == 2 and len(err) == 1, err
    assert f"{tmp_path}/pq/part.2.parquet: row 20 (partition 2), column 'pw': NaN; features " \
           f"must be finite numbers" in err[0], err
    assert not (tmp_path / "run").exists()
    code, out, _ = run_main(capfd, *args, "--set", "data.missing=drop", "--out",
                            str(tmp_path / "dropped"))
    assert code == 0
    assert "data: 1 row(s) with a missing or non-finite value left out" in out
    summary = json.loads((tmp_path / "dropped" / "summary.json").read_text())
    assert summary["train_samples"] + summary["val_samples"] + summary["test_samples"] == 149


def test_a_csv_glob_names_the_file_and_its_line(client, tmp_path, capfd):
    frame = iris_table()
    (tmp_path / "csv").mkdir()
    for i, part in enumerate((frame.iloc[:75], frame.iloc[75:].reset_index(drop=True))):
        write_csv(tmp_path / "csv" / f"part-{i}.csv", part,
                  {(9, "species"): ""} if i == 1 else {})
    code, _, err = run_main(capfd, *_csv_args(tmp_path / "csv" / "part-*.csv"),
                            "--scheduler-address", client.scheduler.address,
                            "--out", str(tmp_path / "run"))
    assert code == 2 and len(err) == 1, err
    assert f"{tmp_path}/csv/part-1.csv: line 11 (partition 1): the label (column 'species') " \
           f"is missing; every row needs one" in err[0], err
