"""Using what a run trained: model.json, dtrain.load, predict, evaluate, export, old runs.

A module's worth of small real runs (iris from a CSV with class names, digits as IDX
files, an image folder) trained once on the session's LocalCluster; every command runs
for real, in this process through ``dtrain.cli.main`` or as ``python -m dtrain``.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import dtrain
from conftest import run_cli
from dtrain import cli
from dtrain.core.modelfile import ModelSpec
from dtrain.data.prepare import fit_normalization, prepared
from helpers.datafiles import make_images, write_idx

SPECIES = ("setosa", "versicolor", "virginica")
FEATURES = ("sepal length", "sepal width", "petal length", "petal width")
QUICK = ["train.epochs=20", "cluster.dashboard_address="]


def _iris_rows() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_iris
    x, y = load_iris(return_X_y=True)
    return x, y


def _text(v: float) -> str:
    return repr(float(v))


@pytest.fixture(scope="module")
def named_csv(tmp_path_factory) -> Path:
    """iris as a user writes it: semicolons, a header, species names last."""
    x, y = _iris_rows()
    path = tmp_path_factory.mktemp("data") / "iris.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=";")
        w.writerow([*FEATURES, "species"])
        w.writerows([*map(_text, row), SPECIES[c]] for row, c in zip(x, y))
    return path


@pytest.fixture(scope="module")
def iris_run(tmp_path_factory, named_csv, client) -> Path:
    out = tmp_path_factory.mktemp("runs") / "iris"
    cfg = dtrain.load_config(None, [*QUICK, "data.dataset=csv", f"data.path={named_csv}"])
    dtrain.train(cfg, client=client, out=out, echo=None)
    return out


def _main(capfd, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    seen = capfd.readouterr()
    return code, seen.out, seen.err


# --- the saved model -------------------------------------------------------------------------

def test_a_run_directory_is_a_self_contained_model(iris_run, named_csv):
    spec = ModelSpec.read(iris_run)
    assert spec.classes == SPECIES and spec.feature_names == FEATURES
    assert spec.layers == (4, 16, 3) and spec.output == "softmax" and spec.dtype == "float64"
    # the normalization is the training split's: the same statistics, to the bit
    cfg = dtrain.load_config(iris_run / "config.toml")
    raw = prepared(cfg.data, spec.normalization)[0]["train"][0] * spec.normalization.scale \
        + spec.normalization.shift
    fitted = fit_normalization(raw, "standardize")
    np.testing.assert_allclose(fitted.shift, spec.normalization.shift, rtol=1e-13)
    doc = json.loads((iris_run / "model.json").read_text())
    assert doc["format"] == "dtrain-model" and doc["version"] == 1


def test_load_predicts_like_the_network_it_saved(iris_run):
    model = dtrain.load(iris_run)
    x, y = _iris_rows()
    assert list(model.classes_) == list(SPECIES) and model.n_features_in_ == 4
    proba = model.predict_proba(x)
    assert proba.shape == (150, 3) and np.allclose(proba.sum(axis=1), 1)
    # by hand: normalize, then each layer of params.npz, then softmax
    p, norm = np.load(iris_run / "params.npz"), model.spec.normalization
    h = np.tanh(((x - norm.shift) / norm.scale) @ p["W1"].T + p["b1"])
    z = h @ p["W2"].T + p["b2"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(proba, e / e.sum(axis=1, keepdims=True), rtol=1e-12)
    labels = model.predict(x)
    assert list(labels[:3]) == ["setosa"] * 3
    assert model.score(x, np.array(SPECIES)[y]) == np.mean(labels == np.array(SPECIES)[y]) > 0.8


def test_evaluate_without_data_agrees_exactly_with_the_summary(iris_run, capfd):
    code, out, err = _main(capfd, "evaluate", str(iris_run))
    assert code == 0, err
    summary = json.loads((iris_run / "summary.json").read_text())
    found = json.loads((iris_run / "evaluation.json").read_text())
    assert found["accuracy"] == summary["test_accuracy"] and found["loss"] == summary["test_loss"]
    assert "confusion (rows: true class, columns: predicted)" in out
    assert sum(map(sum, found["confusion"])) == summary["test_samples"]


def test_evaluate_on_data_gives_per_class_figures_as_scikit_learn_does(iris_run, named_csv,
                                                                       tmp_path, capfd):
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support
    code, out, err = _main(capfd, "evaluate", str(iris_run), "--data", str(named_csv),
                           "--out", str(tmp_path / "e.json"))
    assert code == 0, err
    found = json.loads((tmp_path / "e.json").read_text())
    truth = np.array(SPECIES)[_iris_rows()[1]]
    guess = dtrain.load(iris_run).predict(_iris_rows()[0])
    p, r, f, s = precision_recall_fscore_support(truth, guess, labels=list(SPECIES),
                                                 zero_division=0)
    for i, name in enumerate(SPECIES):
        got = found["per_class"][name]
        assert (got["precision"], got["recall"], got["f1"], got["support"]) == \
            pytest.approx((p[i], r[i], f[i], s[i]))
    assert found["confusion"] == confusion_matrix(truth, guess, labels=list(SPECIES)).tolist()
    assert found["accuracy"] == pytest.approx(np.mean(truth == guess))


# --- predict ---------------------------------------------------------------------------------

def _read_predictions(path: Path) -> tuple[list[str], np.ndarray]:
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["label", *(f"p_{s}" for s in SPECIES)]
    return [r[0] for r in rows[1:]], np.array([[float(v) for v in r[1:]] for r in rows[1:]])


def test_predict_reads_every_input_form_the_same(iris_run, tmp_path, capfd):
    """CSV with and without header and label column, in any column order by name, and .npy:
    the same predictions, which are dtrain.load's."""
    x, y = _iris_rows()
    forms = {}
    with open(tmp_path / "bare.csv", "w") as f:                  # no header, no label
        f.writelines(",".join(map(_text, r)) + "\n" for r in x)
    forms["bare"] = tmp_path / "bare.csv"
    with open(tmp_path / "shuffled.csv", "w") as f:              # header, columns reordered
        f.write("species,petal width,petal length,sepal width,sepal length\n")
        f.writelines(f"{SPECIES[c]},{','.join(map(_text, r[::-1]))}\n" for r, c in zip(x, y))
    forms["shuffled"] = tmp_path / "shuffled.csv"
    np.save(tmp_path / "rows.npy", x)
    forms["npy"] = tmp_path / "rows.npy"
    model = dtrain.load(iris_run)
    for name, path in forms.items():
        out = tmp_path / f"{name}.out.csv"
        code, _, err = _main(capfd, "predict", str(iris_run), "--data", str(path),
                             "--out", str(out))
        assert code == 0, (name, err)
        labels, proba = _read_predictions(out)
        assert labels == list(model.predict(x)), name
        np.testing.assert_array_equal(proba, model.predict_proba(x))   # the shortest exact text


def test_a_large_input_is_predicted_in_tasks_on_a_cluster(iris_run, named_csv, tmp_path):
    """More rows than one chunk: one task per chunk on an embedded cluster, the same
    output as in this process."""
    small = run_cli("predict", str(iris_run), "--data", str(named_csv), "--out",
                    str(tmp_path / "one.csv"))
    big = run_cli("predict", str(iris_run), "--data", str(named_csv), "--chunk-rows", "32",
                  "--out", str(tmp_path / "many.csv"), "--workers", "2")
    assert small.returncode == 0 and big.returncode == 0, small.stderr + big.stderr
    assert "in this process" in small.stdout and "5 tasks on the cluster" in big.stdout
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "many.csv").read_bytes()


def test_a_dask_array_in_gives_a_lazy_dask_array_out(iris_run):
    import dask
    import dask.array as da

    x = _iris_rows()[0]
    read = []

    def block(lo: int, hi: int) -> np.ndarray:
        read.append(lo)
        return x[lo:hi]

    X = da.concatenate([da.from_delayed(dask.delayed(block)(lo, lo + 50), (50, 4), float)
                        for lo in (0, 50, 100)])
    model = dtrain.load(iris_run)
    labels, proba = model.predict(X), model.predict_proba(X)
    assert isinstance(labels, da.Array) and isinstance(proba, da.Array) and read == []
    graph = dict(labels.__dask_graph__())
    models = [k for k, v in graph.items() if "Model" in type(getattr(v, "value", v)).__name__
              or (isinstance(k, str) and k.startswith("Model-"))]
    assert labels.numblocks == (3,) and len(models) == 1        # the model is one key
    with dask.config.set(scheduler="sync"):
        got = labels.compute()
    assert sorted(read) == [0, 50, 100]
    assert list(got) == list(model.predict(x))
    np.testing.assert_array_equal(proba.compute(scheduler="sync"), model.predict_proba(x))


@pytest.mark.slow
def test_digits_as_idx_files_and_an_image_folder(tmp_path, client, capfd):
    """The image formats: a model trained on IDX files predicts an IDX file (labels from its
    labels file), one trained on an image folder predicts the folder's images."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    idx = tmp_path / "idx"
    idx.mkdir()
    write_idx(idx / "train-images-idx3-ubyte", (x * 16).clip(0, 255).reshape(-1, 8, 8))
    write_idx(idx / "train-labels-idx1-ubyte", y)
    out = tmp_path / "digits"
    dtrain.train(dtrain.load_config(None, [*QUICK, "data.dataset=mnist", f"data.path={idx}",
                                           "model.layers=[64, 32, 10]"]),
                 client=client, out=out, echo=None)
    code, text, err = _main(capfd, "evaluate", str(out), "--data",
                            str(idx / "train-images-idx3-ubyte"))
    assert code == 0, err
    assert json.loads((out / "evaluation.json").read_text())["accuracy"] > 0.8
    folder = tmp_path / "pictures"
    make_images(folder)
    pictures = tmp_path / "pictures-run"
    dtrain.train(dtrain.load_config(None, [*QUICK, "data.dataset=image-folder",
                                           f"data.path={folder}", "data.image_size=[4, 4]",
                                           "model.layers=[16, 3]"]),
                 client=client, out=pictures, echo=None)
    code, text, err = _main(capfd, "predict", str(pictures), "--data", str(folder))
    assert code == 0, err
    rows = list(csv.reader(text.splitlines()))
    assert rows[0] == ["label", "p_cat", "p_dog", "p_emu"] and len(rows) == 13
    assert {r[0] for r in rows[1:]} <= {"cat", "dog", "emu"}


# --- export ----------------------------------------------------------------------------------

def test_the_onnx_export_runs_in_onnxruntime_as_predict_proba(iris_run, tmp_path, capfd):
    import onnxruntime as ort
    code, out, err = _main(capfd, "export", str(iris_run), "--format", "onnx",
                           "--out", str(tmp_path / "model.onnx"))
    assert code == 0 and "ONNX opset 17" in out, err
    x = _iris_rows()[0]
    session = ort.InferenceSession(str(tmp_path / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    labels, proba = session.run(["label", "probabilities"], {"input": x.astype(np.float32)})
    model = dtrain.load(iris_run)
    assert np.abs(proba - model.predict_proba(x)).max() <= 1e-5
    assert list(labels) == list(model.predict(x))


# --- mistakes --------------------------------------------------------------------------------

def _broken(run: Path, tmp: Path, what: str) -> Path:
    copy = tmp / what
    shutil.copytree(run, copy)
    blob = (copy / "params.npz").read_bytes()
    (copy / "params.npz").write_bytes(blob[: len(blob) // 2] if what == "truncated"
                                      else b"PK\x03\x04" + bytes(200))
    return copy


@pytest.mark.parametrize("case", ["wrong features", "not a run", "truncated params",
                                  "corrupt params", "unknown format", "unseen labels",
                                  "unfinished run"])
def test_mistakes_get_one_line_exit_2_and_no_output_file(case, iris_run, tmp_path, capfd):
    out = tmp_path / "out.csv"
    wide = tmp_path / "wide.csv"
    wide.write_text("1,2,3,4,5,6\n7,8,9,10,11,12\n")
    unseen = tmp_path / "unseen.csv"
    unseen.write_text("5.1,3.5,1.4,0.2,rose\n6.7,3.0,5.2,2.3,setosa\n")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.toml").write_text("")
    args, message = {
        "wrong features": (["predict", str(iris_run), "--data", str(wide)],
                           "has 6 features per row but the model takes 4"),
        "not a run": (["predict", str(tmp_path), "--data", str(wide)],
                      "is not a dtrain run directory"),
        "truncated params": (["predict", str(_broken(iris_run, tmp_path, "truncated")),
                              "--data", str(wide)], "params.npz is corrupt or truncated"),
        "corrupt params": (["evaluate", str(_broken(iris_run, tmp_path, "corrupt"))],
                           "params.npz is corrupt or truncated"),
        "unknown format": (["export", str(iris_run), "--format", "pmml"],
                           "argument --format: invalid choice: 'pmml'"),
        "unseen labels": (["evaluate", str(iris_run), "--data", str(unseen)],
                          "labels rose were never seen in training"),
        "unfinished run": (["predict", str(unfinished), "--data", str(wide)],
                           "has not finished (no params.npz)"),
    }[case]
    code, stdout, err = _main(capfd, *args, "--out", str(out))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("dtrain: error: "), err
    assert message in lines[0], lines[0]
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_a_run_from_before_model_json_still_loads(iris_run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(iris_run, old)
    (old / "model.json").unlink()
    model, new = dtrain.load(old), dtrain.load(iris_run)
    assert model.spec.normalization == new.spec.normalization
    assert list(model.classes_) == list(new.classes_)
    x = _iris_rows()[0]
    np.testing.assert_array_equal(model.predict_proba(x), new.predict_proba(x))
    cfg = (old / "config.toml").read_text()
    (old / "config.toml").write_text(cfg.replace(str(json.loads(
        (iris_run / "model.json").read_text())["training"]["data_path"]), str(tmp_path / "gone.csv")))
    with pytest.raises(dtrain.UserError, match="written by dtrain 0.1 .* cannot be read"):
        dtrain.load(old)
