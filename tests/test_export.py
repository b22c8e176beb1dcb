"""ONNX export: onnxruntime, fed raw rows, gives dtrain's own probabilities and labels."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dtrain
from conftest import REPO
from dtrain.core.errors import UserError
from dtrain.core.modelfile import ModelSpec, Normalization
from dtrain.inference.export import FORMATS, IR_VERSION, OPSET, to_onnx, write_onnx
from dtrain.maths.model import Network, sigmoid

LAYERS = (5, 7, 6, 3)       # two hidden layers: activations between Gemms, none after the last
LABELS = {"str": ("setosa", "versicolor", "virgínica"), "int": (7, -2, 11)}
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def _raw(rng: np.random.Generator, rows: int, kind: str) -> np.ndarray:
    """Raw feature rows (B, D): offset and scaled per feature unless nothing normalizes them."""
    x = rng.normal(size=(rows, LAYERS[0]))                                  # (B, D)
    if kind == "none":
        return x
    return np.linspace(-40, 60, LAYERS[0]) + x * np.linspace(0.5, 8, LAYERS[0])


def _normalization(kind: str) -> Normalization:
    """Fitted on a 'training' sample, as the data pipeline fits it."""
    if kind == "none":
        return Normalization()
    train = _raw(np.random.default_rng(99), 200, kind)                      # (200, D)
    if kind == "standardize":
        return Normalization(kind, train.mean(axis=0), train.std(axis=0))
    return Normalization(kind, train.min(axis=0), np.ptp(train, axis=0))


def _model(activation: str, loss: str, dtype: str, norm: str = "standardize",
           labels: str = "str", seed: int = 0) -> tuple[ModelSpec, Network, np.ndarray]:
    """A spec and its network, initialized, then its weights tripled and biases drawn at
    random so that, like a trained one, it tells the classes apart."""
    net = Network(LAYERS, activation, loss, dtype)
    spec = ModelSpec(LAYERS, activation, loss, dtype, _normalization(norm), LABELS[labels],
                     tuple(f"feature {i}" for i in range(LAYERS[0])))
    flat, rng = net.init(seed), np.random.default_rng(seed)
    for w, b in net.slices:
        flat[w] *= 3
        flat[b] = rng.normal(size=b.stop - b.start)
    return spec, net, flat


def _reference(spec: ModelSpec, net: Network, flat: np.ndarray,
               x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """dtrain's probabilities (B, C) and argmax (B,) of raw rows ``x``, in NumPy."""
    z = net.forward(flat, spec.normalization.apply(x, net.dtype))[-1]        # (B, C)
    if spec.output == "sigmoid":
        return sigmoid(np, z), z.argmax(axis=1)
    e = np.exp(z - z.max(axis=1, keepdims=True))                            # (B, C)
    return e / e.sum(axis=1, keepdims=True), z.argmax(axis=1)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    probabilities, label = _session(model).run(["probabilities", "label"],
                                               {"input": x.astype(dtype)})
    return probabilities, label


@pytest.mark.parametrize("labels", ["str", "int"])
@pytest.mark.parametrize("norm", ["standardize", "minmax", "none"])
@pytest.mark.parametrize("loss", ["cross-entropy", "mse"])
@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_onnxruntime_matches_dtrain(dtype, activation, loss, norm, labels):
    spec, net, flat = _model(activation, loss, dtype, norm, labels)
    x = _raw(np.random.default_rng(1), 64, norm).astype(dtype)              # (64, D)
    probabilities, label = _run(to_onnx(spec, net.named(flat), dtype=dtype), x, dtype)
    expected, index = _reference(spec, net, flat, x)
    assert probabilities.dtype == np.dtype(dtype) and probabilities.shape == (64, 3)
    assert np.abs(probabilities - expected).max() <= TOLERANCE[dtype]
    assert label.tolist() == [LABELS[labels][i] for i in index]
    assert len(set(index)) > 1, "every row gave one class: the labels were not tested"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rows", [1, 1000])
def test_any_batch_size(dtype, rows):
    spec, net, flat = _model("tanh", "cross-entropy", dtype, "minmax", "int", seed=3)
    x = _raw(np.random.default_rng(rows), rows, "minmax").astype(dtype)     # (B, D)
    probabilities, label = _run(to_onnx(spec, net.named(flat), dtype=dtype), x, dtype)
    expected, index = _reference(spec, net, flat, x)
    assert probabilities.shape == (rows, 3) and label.shape == (rows,)
    assert label.dtype == np.int64
    assert np.abs(probabilities - expected).max() <= TOLERANCE[dtype]
    assert np.array_equal(label, np.asarray(LABELS["int"])[index])


def test_float32_normalizes_in_float64_as_dtrain_does():
    """A feature far from zero with a small spread: float32 arithmetic there would lose the
    digits that matter, float64 (as model.json specifies) keeps them."""
    spec, net, flat = _model("tanh", "cross-entropy", "float32")
    norm = Normalization("standardize", np.full(LAYERS[0], 12345.678),
                         np.full(LAYERS[0], 0.01))
    spec = ModelSpec(LAYERS, "tanh", "cross-entropy", "float32", norm, LABELS["str"])
    x = 12345.678 + 0.02 * np.random.default_rng(5).normal(size=(200, LAYERS[0]))
    x = x.astype(np.float32)                                                # (200, D)
    probabilities, _ = _run(to_onnx(spec, net.named(flat)), x, "float32")
    expected, _ = _reference(spec, net, flat, x)
    assert np.abs(probabilities - expected).max() <= 1e-5
    lossy = (x - norm.shift.astype(np.float32)) / norm.scale.astype(np.float32)
    assert np.abs(lossy - norm.apply(x)).max() > 1e-3, "this input does not test the point"


def test_the_graph_is_valid_and_declares_what_it_computes(tmp_path):
    spec, net, flat = _model("relu", "mse", "float32", "standardize", "int")
    path = write_onnx(spec, net.named(flat), tmp_path / "model.onnx")
    assert path == tmp_path / "model.onnx" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["model.onnx"]
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == IR_VERSION == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)] and OPSET == 17
    assert [n.op_type for n in model.graph.node] == [
        "Cast", "Sub", "Div", "Cast", "Gemm", "Relu", "Gemm", "Relu", "Gemm", "Sigmoid",
        "ArgMax", "Gather"]
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["producer"] == "dtrain" and meta["dtrain_version"] == dtrain.__version__
    assert json.loads(meta["classes"]) == [7, -2, 11]
    assert json.loads(meta["feature_names"]) == [f"feature {i}" for i in range(5)]
    assert (meta["normalization"], meta["dtype"], meta["output"]) == \
        ("standardize", "float32", "sigmoid")
    assert model.producer_name == "dtrain" and FORMATS == ("onnx",)


def test_normalization_none_and_float64_add_no_nodes():
    spec, net, flat = _model("sigmoid", "cross-entropy", "float64", "none")
    model = to_onnx(spec, net.named(flat), dtype="float64")
    assert [n.op_type for n in model.graph.node] == [
        "Gemm", "Sigmoid", "Gemm", "Sigmoid", "Gemm", "Softmax", "ArgMax", "Gather"]
    spec, net, flat = _model("sigmoid", "cross-entropy", "float64", "minmax")
    model = to_onnx(spec, net.named(flat), dtype="float64")
    assert [n.op_type for n in model.graph.node][:2] == ["Sub", "Div"]


def test_the_input_is_any_number_of_rows_of_exactly_d_features():
    spec, net, flat = _model("tanh", "cross-entropy", "float32")
    session = _session(to_onnx(spec, net.named(flat)))
    (inp,) = session.get_inputs()
    assert inp.name == "input" and inp.shape == ["N", 5] and inp.type == "tensor(float)"
    assert {o.name: o.shape for o in session.get_outputs()} == \
        {"probabilities": ["N", 3], "label": ["N"]}
    with pytest.raises(Exception, match=r"(?s)invalid dimensions for input.*Got: 6 Expected: 5"):
        session.run(None, {"input": np.zeros((2, 6), dtype=np.float32)})


def test_a_spec_read_back_from_json_exports_the_same_labels():
    """model.json gives plain ints: they become the int64 labels, in the same order."""
    spec, net, flat = _model("tanh", "cross-entropy", "float32", "minmax", "int")
    back = ModelSpec.from_dict(json.loads(spec.to_json()))
    x = _raw(np.random.default_rng(2), 50, "minmax").astype(np.float32)
    assert np.array_equal(_run(to_onnx(back, net.named(flat)), x, "float32")[1],
                          _run(to_onnx(spec, net.named(flat)), x, "float32")[1])


def test_params_that_do_not_fit_and_unknown_dtypes_are_user_errors(tmp_path):
    spec, net, flat = _model("tanh", "cross-entropy", "float32")
    params = net.named(flat)
    with pytest.raises(UserError, match=r"W2 is of shape \(6, 5\), but layers \[5, 7, 6, 3\] "
                                        r"need \(6, 7\)"):
        to_onnx(spec, {**params, "W2": np.zeros((6, 5), dtype=np.float32)})
    with pytest.raises(UserError, match="parameter b3 is missing"):
        to_onnx(spec, {k: v for k, v in params.items() if k != "b3"})
    with pytest.raises(UserError, match="dtype 'float16' is not one of float32, float64"):
        to_onnx(spec, params, dtype="float16")
    with pytest.raises(UserError, match="directory .*nowhere does not exist"):
        write_onnx(spec, params, tmp_path / "nowhere" / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_without_the_onnx_package_it_says_how_to_install_it():
    script = (
        "import sys; sys.modules['onnx'] = None\n"
        "import numpy as np\n"
        "from dtrain.core.errors import UserError\n"
        "from dtrain.core.modelfile import ModelSpec, Normalization\n"
        "from dtrain.inference.export import to_onnx\n"
        "spec = ModelSpec((2, 2), 'tanh', 'mse', 'float32', Normalization(), (0, 1))\n"
        "try:\n"
        "    to_onnx(spec, {'W1': np.eye(2), 'b1': np.zeros(2)})\n"
        "except UserError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(2)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("\n") == 1
    assert "pip install 'dtrain[onnx]'" in done.stdout


# --- regression: identity outputs --------------------------------------------------------------

def _regressor(activation: str, dtype: str, norm: str, targets: int,
               seed: int = 0) -> tuple[ModelSpec, Network, np.ndarray]:
    """A squared-error network with ``targets`` outputs, biases drawn at random."""
    layers = (*LAYERS[:-1], targets)
    net = Network(layers, activation, "squared-error", dtype)
    spec = ModelSpec(layers, activation, "squared-error", dtype, _normalization(norm), (),
                     tuple(f"feature {i}" for i in range(LAYERS[0])),
                     targets=tuple(f"target {j}" for j in range(targets)))
    flat, rng = net.init(seed), np.random.default_rng(seed)
    for _, b in net.slices:
        flat[b] = rng.normal(size=b.stop - b.start)
    return spec, net, flat


@pytest.mark.parametrize("targets", [1, 3])
@pytest.mark.parametrize("norm", ["standardize", "none"])
@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_regressor_exports_its_values_as_variable(dtype, activation, norm, targets):
    """One output, ``variable`` (N, T) as skl2onnx names a regressor's: the last Gemm's
    result, equal to what dtrain.Model.predict computes; no label, no probabilities."""
    spec, net, flat = _regressor(activation, dtype, norm, targets)
    model = to_onnx(spec, net.named(flat), dtype=dtype)
    session = _session(model)
    assert {o.name: o.shape for o in session.get_outputs()} == {"variable": ["N", targets]}
    assert [n.op_type for n in model.graph.node][-1] == "Gemm"
    x = _raw(np.random.default_rng(4), 64, norm).astype(dtype)              # (64, D)
    (values,) = session.run(None, {"input": x})
    predicted = dtrain.Model(spec, net.named(flat)).predict(x)              # (64,) or (64, T)
    assert values.dtype == np.dtype(dtype) and values.shape == (64, targets)
    assert predicted.shape == ((64,) if targets == 1 else (64, targets))
    scale = max(1.0, float(np.abs(predicted).max()))
    assert np.abs(values.reshape(predicted.shape) - predicted).max() <= TOLERANCE[dtype] * scale
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["targets"]) == [f"target {j}" for j in range(targets)]
    assert "classes" not in meta and meta["output"] == "identity"


# --- convolutional nets: Conv, MaxPool/AveragePool, Flatten ------------------------------

CONV_NETS = {
    "lenet": ((1, 28, 28), ({"conv": 6, "kernel": 5, "padding": 2}, {"pool": "max", "size": 2},
                            {"conv": 16, "kernel": 5}, {"pool": "max", "size": 2}, "flatten",
                            400, 120, 84, 10)),
    "colour-strided-avg": ((3, 9, 7), ({"conv": 4, "kernel": 3, "stride": 2, "padding": 1},
                                       {"pool": "avg", "size": 2, "stride": 1},
                                       {"dropout": 0.5}, "flatten", 48, 5, 3)),
}


@pytest.mark.parametrize("dtype", ["float32"])
@pytest.mark.parametrize("name", list(CONV_NETS))
def test_a_convolutional_net_exports_and_onnxruntime_gives_its_probabilities(name, dtype):
    """Within 1e-4 of ``dtrain.Model.predict_proba``, through a normalization, for any
    batch; labels the same.  (float64: refused in one line, as onnxruntime has no float64
    Conv.)"""
    from dtrain.core import layerspec
    from dtrain.inference.model import Model
    shape, layers = CONV_NETS[name]
    layers = tuple(layerspec.parse(v) for v in layers)
    classes = tuple(range(layers[-1]))
    D = int(np.prod(shape))
    rng = np.random.default_rng(3)
    train = rng.uniform(0, 255, (50, D))
    norm = Normalization("standardize", train.mean(axis=0), train.std(axis=0) + 1)
    spec = ModelSpec(layers, "relu", "cross-entropy", dtype, norm, classes, input_shape=shape)
    net = Network(layers, "relu", "cross-entropy", dtype, input_shape=shape)
    flat = net.init(0)
    for w, b in net.slices:
        flat[w] *= 2
        flat[b] = rng.normal(size=b.stop - b.start)
    model = Model(spec, net.named(flat))
    x = rng.uniform(0, 255, (33, D)).astype(dtype)
    probabilities, label = _run(to_onnx(spec, net.named(flat), dtype=dtype), x, dtype)
    expected = model.predict_proba(x)
    assert probabilities.shape == (33, len(classes))
    assert np.abs(probabilities - expected).max() <= (1e-4 if dtype == "float32" else 1e-12)
    assert label.tolist() == model.predict(x).tolist()
    assert len(set(label.tolist())) > 1
    ops = {n.op_type for n in to_onnx(spec, net.named(flat), dtype=dtype).graph.node}
    assert {"Conv", "Flatten", "Reshape"} <= ops and ops & {"MaxPool", "AveragePool"}
    with pytest.raises(UserError, match="float32 only: onnxruntime has no float64 Conv"):
        to_onnx(spec, net.named(flat), dtype="float64")


def test_dense_layers_with_dropout_export_without_it():
    """Dropout is nothing at inference: a dense net with dropout is its Gemms, float64 too."""
    from dtrain.core import layerspec
    from dtrain.inference.model import Model
    layers = (5, layerspec.Dropout(0.5), 7, 3)
    spec = ModelSpec(layers, "tanh", "cross-entropy", "float64", Normalization(), (0, 1, 2))
    net = Network(layers, "tanh", "cross-entropy", "float64")
    flat = net.init(0) + np.random.default_rng(0).normal(size=net.size)
    x = np.random.default_rng(1).normal(size=(20, 5))
    graph = to_onnx(spec, net.named(flat), dtype="float64")
    probabilities, _ = _run(graph, x, "float64")
    assert np.abs(probabilities - Model(spec, net.named(flat)).predict_proba(x)).max() < 1e-12
    assert [n.op_type for n in graph.graph.node][:3] == ["Gemm", "Tanh", "Gemm"]
