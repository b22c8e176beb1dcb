"""What ``predict`` and ``evaluate`` read (:mod:`dtrain.inference.inputs`, a loaded model's
checks): a CSV, a ``.npy`` file, NumPy, pandas and Dask input cut into parts of
``--chunk-rows`` rows, a task each on a cluster; a row with a missing or non-finite value is one
line naming the file or array, the row and the column, exit code 2 and no output (a ValueError
in Python), never a row labelled as the first class; columns are read by name.
"""
from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
import pytest

import dtrain
from dtrain.inference.inputs import open_input, read_part
from helpers.cli import run_main
from helpers.tables import SHORT_FEATURES, iris_table, write_csv


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "iris.csv"
    write_csv(path, iris_table())
    out = tmp_path_factory.mktemp("runs") / "iris"
    cfg = dtrain.load_config(None, [f"data.path={path}", "data.dataset=csv",
                                    "graph.strategy=serial", "train.epochs=20"])
    dtrain.train(cfg, out=out, echo=None)
    return out


# --- a bad row --------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_predict_and_evaluate_never_label_a_row_they_could_not_compute(run, tmp_path, capfd,
                                                                       command):
    path = write_csv(tmp_path / "new.csv", iris_table(), {(4, "sw"): "nan", (9, "pl"): ""})
    out = tmp_path / "out.json"
    code, stdout, err = run_main(capfd, command, str(run), "--data", str(path), "--out", str(out))
    assert code == 2 and len(err) == 1, err
    assert f"{path}: line 6, column sw: 'nan', a missing value" in err[0], err
    assert stdout == "" and not out.exists()


def test_predict_to_standard_output_prints_nothing_before_a_bad_row(run, client, tmp_path,
                                                                    capfd):
    """The bad row is in the last of three parts, each a task: the good parts' predictions
    are not printed either."""
    path = write_csv(tmp_path / "new.csv", iris_table(), {(140, "pw"): "inf"})
    code, stdout, err = run_main(capfd, "predict", str(run), "--data", str(path),
                                 "--chunk-rows", "50", "--scheduler-address",
                                 client.scheduler.address)
    assert code == 2 and stdout == "", stdout[:200]
    assert len(err) == 1 and f"{path}: line 142, column pw: 'inf'" in err[0], err


def test_a_npy_input_with_nan_names_its_row(run, tmp_path, capfd):
    x = iris_table()[SHORT_FEATURES].to_numpy().copy()
    x[33, 2] = np.nan
    np.save(tmp_path / "x.npy", x)
    code, stdout, err = run_main(capfd, "predict", str(run), "--data", str(tmp_path / "x.npy"))
    assert code == 2 and stdout == ""
    assert len(err) == 1 and "x.npy: row 33, column 2: NaN" in err[0], err


def test_a_loaded_model_refuses_nan_rows_numpy_pandas_and_dask(run):
    model = dtrain.load(run)
    x = iris_table()[SHORT_FEATURES].to_numpy().copy()
    x[17, 3] = np.inf
    with pytest.raises(ValueError, match=r"X: row 17, column 3 \('pw'\): inf; features must"):
        model.predict(x)
    with pytest.raises(ValueError, match=r"row 17, column 3"):
        model.evaluate(x, iris_table()["species"])
    with pytest.raises(ValueError, match=r"X \(block 1\): row 17, column 3 \('pw'\): inf"):
        model.predict(da.from_array(x, chunks=(10, 4))).compute(scheduler="sync")
    frame = iris_table()
    # by name: columns in another order, the label column beside them
    assert (model.predict(frame[["species", *SHORT_FEATURES[::-1]]]) ==
                  model.predict(frame[SHORT_FEATURES])).all()
    with pytest.raises(ValueError, match="lacks the feature column"):
        model.predict(frame.drop(columns="pw"))           # the label is not read in its place


# --- parts and tasks --------------------------------------------------------------------------

def test_chunk_rows_cuts_exactly_that_many_rows_per_part(run, tmp_path):
    path = write_csv(tmp_path / "new.csv", iris_table())
    spec = dtrain.load(run).spec
    for chunk, parts in ((50, 3), (7, 22), (150, 1), (149, 2), (1, 150)):
        inp = open_input(path, spec, chunk_rows=chunk)
        sizes = [len(read_part(p)[0]) for p in inp.parts]
        assert len(inp.parts) == parts and sum(sizes) == 150, (chunk, sizes)
        assert set(sizes[:-1]) <= {chunk}


def test_predict_reports_as_many_tasks_as_chunks(run, client, tmp_path, capfd):
    path = write_csv(tmp_path / "new.csv", iris_table())
    code, stdout, _ = run_main(capfd, "predict", str(run), "--data", str(path), "--chunk-rows",
                               "50", "--out", str(tmp_path / "p.csv"), "--scheduler-address",
                               client.scheduler.address)
    assert code == 0
    assert stdout.strip() == f"predict: 150 rows of {path} (3 tasks on the cluster) -> " \
                             f"{tmp_path / 'p.csv'}"
