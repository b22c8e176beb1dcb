"""Bad data never becomes a model or a prediction silently (issue 26, items 1-4).

NaN and infinite values, missing labels and a CSV without its label column: one line naming
the file or array, the row and the column, exit code 2 on the command line (a ValueError in
Python), before any cluster starts where the data is read up front and before any output is
written; ``data.missing = "drop"`` and a scikit-learn imputer handle them where asked.
What each test keeps from happening silently: exit 0 with NaN losses, rows predicted as the
first class, petal width trained as 22 classes, the label column read in a missing
feature's place."""
from __future__ import annotations

import json
from pathlib import Path

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import dtrain
from dtrain import cli
from dtrain.inference.inputs import open_input, read_part

FEATURES = ["sl", "sw", "pl", "pw"]
SPECIES = np.array(["setosa", "versicolor", "virginica"])


def _iris() -> pd.DataFrame:
    from sklearn.datasets import load_iris
    x, y = load_iris(return_X_y=True)
    frame = pd.DataFrame(x, columns=FEATURES)
    frame["species"] = SPECIES[y]
    return frame


def _write(path: Path, frame: pd.DataFrame, cells: dict[tuple[int, str], str] = {}) -> Path:
    """``frame`` as a CSV whose cells ``(row, column)`` are replaced by the given text."""
    text = frame.astype(object).astype(str)
    for (row, column), value in cells.items():
        text.loc[row, column] = value
    text.to_csv(path, index=False)
    return path


def _main(capfd, *args: str) -> tuple[int, str, list[str]]:
    code = cli.main(list(args))
    seen = capfd.readouterr()
    return code, seen.out, seen.err.strip().splitlines()


def _csv_args(path: Path, *sets: str) -> list[str]:
    return ["--set", "data.dataset=csv", "--set", f"data.path={path}",
            *(a for s in sets for a in ("--set", s))]


# --- training: CSV read up front, before any cluster -----------------------------------------

@pytest.mark.parametrize("cells, message", [
    ({(3, "pl"): "nan", (10, "pl"): "nan"}, "line 5, column pl: 'nan', a missing value"),
    ({(7, "sw"): "inf"}, "line 9, column sw: 'inf', not a finite number"),
    ({(40, "sl"): ""}, "line 42, column sl: empty; features must be finite numbers"),
    ({(142, "pw"): "NaN"}, "line 144, column pw: 'NaN'"),       # lands in the test split
    ({(5, "species"): ""}, "line 7: the label (column species) is empty; every row needs"),
], ids=["nan", "inf", "empty cell", "nan in the test rows", "empty label"])
def test_a_bad_csv_cell_is_one_line_before_anything_starts(tmp_path, capfd, cells, message):
    path = _write(tmp_path / "iris.csv", _iris(), cells)
    code, out, err = _main(capfd, *_csv_args(path), "--out", str(tmp_path / "run"),
                           "--workers", "1")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"dtrain: error: {path}: {message}"), err
    assert "data.missing = 'drop'" in err[0]
    assert out == "" and not (tmp_path / "run").exists()      # no cluster, no run directory


def test_a_csv_without_its_label_column_is_refused_not_trained_as_22_classes(tmp_path, capfd):
    path = _write(tmp_path / "features.csv", _iris().drop(columns="species"))
    code, _, err = _main(capfd, *_csv_args(path, "model.layers=[3, 16, 22]"),
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
    path = _write(tmp_path / "iris.csv", _iris(), cells)
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


# --- training: partitions read by the workers --------------------------------------------------

@pytest.mark.slow
def test_nan_in_a_parquet_file_names_the_file_row_and_column(client, tmp_path, capfd):
    frame = _iris()
    frame.loc[120, "pw"] = np.nan                       # file 2 holds rows 100-149
    dd.from_pandas(frame, npartitions=3).to_parquet(tmp_path / "pq", write_index=False)
    args = ["--set", "data.dataset=parquet", "--set", f"data.path={tmp_path}/pq/*.parquet",
            "--set", "data.label=species", "--set", "train.epochs=1",
            "--scheduler-address", client.scheduler.address]
    code, _, err = _main(capfd, *args, "--out", str(tmp_path / "run"))
    assert code == 2 and len(err) == 1, err
    assert f"{tmp_path}/pq/part.2.parquet: row 20 (partition 2), column 'pw': NaN; features " \
           f"must be finite numbers" in err[0], err
    assert not (tmp_path / "run").exists()
    code, out, _ = _main(capfd, *args, "--set", "data.missing=drop", "--out",
                         str(tmp_path / "dropped"))
    assert code == 0
    assert "data: 1 row(s) with a missing or non-finite value left out" in out
    summary = json.loads((tmp_path / "dropped" / "summary.json").read_text())
    assert summary["train_samples"] + summary["val_samples"] + summary["test_samples"] == 149


def test_a_csv_glob_names_the_file_and_its_line(client, tmp_path, capfd):
    frame = _iris()
    (tmp_path / "csv").mkdir()
    for i, part in enumerate((frame.iloc[:75], frame.iloc[75:].reset_index(drop=True))):
        _write(tmp_path / "csv" / f"part-{i}.csv", part,
               {(9, "species"): ""} if i == 1 else {})
    code, _, err = _main(capfd, *_csv_args(tmp_path / "csv" / "part-*.csv"),
                         "--scheduler-address", client.scheduler.address,
                         "--out", str(tmp_path / "run"))
    assert code == 2 and len(err) == 1, err
    assert f"{tmp_path}/csv/part-1.csv: line 11 (partition 1): the label (column 'species') " \
           f"is missing; every row needs one" in err[0], err


# --- predicting --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "iris.csv"
    _write(path, _iris())
    out = tmp_path_factory.mktemp("runs") / "iris"
    cfg = dtrain.load_config(None, [f"data.path={path}", "data.dataset=csv",
                                    "graph.strategy=serial", "train.epochs=20"])
    dtrain.train(cfg, out=out, echo=None)
    return out


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_predict_and_evaluate_never_label_a_row_they_could_not_compute(run, tmp_path, capfd,
                                                                       command):
    path = _write(tmp_path / "new.csv", _iris(), {(4, "sw"): "nan", (9, "pl"): ""})
    out = tmp_path / "out.json"
    code, stdout, err = _main(capfd, command, str(run), "--data", str(path), "--out", str(out))
    assert code == 2 and len(err) == 1, err
    assert f"{path}: line 6, column sw: 'nan', a missing value" in err[0], err
    assert stdout == "" and not out.exists()


def test_predict_to_standard_output_prints_nothing_before_a_bad_row(run, client, tmp_path,
                                                                    capfd):
    """The bad row is in the last of three parts, each a task: the good parts' predictions
    are not printed either."""
    path = _write(tmp_path / "new.csv", _iris(), {(140, "pw"): "inf"})
    code, stdout, err = _main(capfd, "predict", str(run), "--data", str(path),
                              "--chunk-rows", "50", "--scheduler-address",
                              client.scheduler.address)
    assert code == 2 and stdout == "", stdout[:200]
    assert len(err) == 1 and f"{path}: line 142, column pw: 'inf'" in err[0], err


def test_a_npy_input_with_nan_names_its_row(run, tmp_path, capfd):
    x = _iris()[FEATURES].to_numpy().copy()
    x[33, 2] = np.nan
    np.save(tmp_path / "x.npy", x)
    code, stdout, err = _main(capfd, "predict", str(run), "--data", str(tmp_path / "x.npy"))
    assert code == 2 and stdout == ""
    assert len(err) == 1 and "x.npy: row 33, column 2: NaN" in err[0], err


def test_a_loaded_model_refuses_nan_rows_numpy_pandas_and_dask(run):
    model = dtrain.load(run)
    x = _iris()[FEATURES].to_numpy().copy()
    x[17, 3] = np.inf
    with pytest.raises(ValueError, match=r"X: row 17, column 3 \('pw'\): inf; features must"):
        model.predict(x)
    with pytest.raises(ValueError, match=r"row 17, column 3"):
        model.evaluate(x, _iris()["species"])
    with pytest.raises(ValueError, match=r"X \(block 1\): row 17, column 3 \('pw'\): inf"):
        model.predict(da.from_array(x, chunks=(10, 4))).compute(scheduler="sync")
    frame = _iris()
    # by name: columns in another order, the label column beside them
    assert (model.predict(frame[["species", *FEATURES[::-1]]]) ==
            model.predict(frame[FEATURES])).all()
    with pytest.raises(ValueError, match="lacks the feature column"):
        model.predict(frame.drop(columns="pw"))           # the label is not read in its place


def test_chunk_rows_cuts_exactly_that_many_rows_per_part(run, tmp_path):
    path = _write(tmp_path / "new.csv", _iris())
    spec = dtrain.load(run).spec
    for chunk, parts in ((50, 3), (7, 22), (150, 1), (149, 2), (1, 150)):
        inp = open_input(path, spec, chunk_rows=chunk)
        sizes = [len(read_part(p)[0]) for p in inp.parts]
        assert len(inp.parts) == parts and sum(sizes) == 150, (chunk, sizes)
        assert set(sizes[:-1]) <= {chunk}


def test_predict_reports_as_many_tasks_as_chunks(run, client, tmp_path, capfd):
    path = _write(tmp_path / "new.csv", _iris())
    code, stdout, _ = _main(capfd, "predict", str(run), "--data", str(path), "--chunk-rows",
                            "50", "--out", str(tmp_path / "p.csv"), "--scheduler-address",
                            client.scheduler.address)
    assert code == 0
    assert stdout.strip() == f"predict: 150 rows of {path} (3 tasks on the cluster) -> " \
                             f"{tmp_path / 'p.csv'}"


# --- estimators --------------------------------------------------------------------------------

def test_a_dask_dataframe_missing_a_feature_column_is_refused_by_name(client):
    frame = _iris()
    clf = dtrain.MLPClassifier(max_iter=5, client=client)
    clf.fit(dd.from_pandas(frame, npartitions=2), "species")
    lacking = dd.from_pandas(frame.drop(columns="pl"), npartitions=2)   # 4 columns: sl sw pw species
    with pytest.raises(ValueError, match="X lacks the feature column.s. 'pl' that "
                                         "MLPClassifier was fitted on"):
        clf.predict(lacking)
    with pytest.raises(ValueError, match=r"X \(partition 1\), row 27 of the block, column "
                                         r"'pl': NaN"):
        clf.predict(dd.from_pandas(frame.assign(pl=frame.pl.where(frame.index != 102)),
                                   npartitions=2)).compute()
    with pytest.raises(ValueError, match=r"X row 102, column 'pl', is NaN"):
        clf.predict(frame.assign(pl=frame.pl.where(frame.index != 102))[FEATURES])


def test_an_imputer_in_a_pipeline_handles_missing_values(client):
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline

    frame = _iris()
    frame.loc[[3, 50, 120], "pl"] = np.nan
    x, y = frame[FEATURES], frame["species"]
    with pytest.raises(ValueError, match=r"X row 3, column 'pl', is NaN: .* an imputer"):
        dtrain.MLPClassifier(max_iter=2, client=client).fit(x, y)
    pipe = make_pipeline(SimpleImputer(), dtrain.MLPClassifier(max_iter=30, client=client))
    assert pipe.fit(x, y).score(x, y) > 0.5
    assert len(pipe.predict(x)) == 150
