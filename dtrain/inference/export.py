"""Export a trained network to ONNX: one graph from raw features to probabilities and labels
(a regression: to its predicted values).

The graph is built with the ``onnx`` package (``pip install 'dtrain[onnx]'``),
imported only when an export is asked for.  It uses the default ONNX domain at
**opset 17** and **IR version 8** (ONNX 1.12), which onnxruntime has run since
1.13, so today's onnxruntime and older runtimes both load it.  With ``L``
layers, ``D`` features, ``C`` classes and ``N`` rows (a dynamic batch
dimension, named ``"N"``), and ``T`` the export's float type (``float32`` or
``float64``) it computes::

    input           (N, D) T       raw features, in model.json's feature order
    x = (input - shift) / scale    Sub, Div by constant (D,) float64 initializers, in
                                   float64 as model.json specifies (a float32 graph
                                   Casts its input to float64 and the result back to
                                   float32); left out for normalization kind "none"
    h_n = act(h_{n-1} W_n^T + b_n) Gemm(transB=1) with initializers W_n (O, I), b_n (O,),
                                   then Tanh | Sigmoid | Relu | Identity, for n = 1 .. L-1
    z = h_{L-1} W_L^T + b_L        Gemm(transB=1): the logits (N, C)
    probabilities   (N, C) T       Softmax(z, axis=1) (loss cross-entropy)
                                   or Sigmoid(z) (loss mse), as ``predict_proba``
    label           (N,)           Gather(classes, ArgMax(z, axis=1, keepdims=0)):
                                   int64 when every class label is an integer,
                                   else string; ties go to the first class, as in NumPy

A convolutional net (layer tables in ``model.json``, an ``input_shape`` (C, H, W))
Reshapes the normalized rows to (N, C, H, W) and runs its layers in order: ``Conv``
(initializers W_n (F, C, K, K), b_n (F,); its strides and pads) and the activation,
``MaxPool`` or ``AveragePool`` (no padding), ``Flatten``, and its dense layers as above;
dropout is nothing at inference and has no node.  Such a net exports as float32 only:
onnxruntime implements ``Conv`` for float32, not float64.

A logistic output (loss binary-cross-entropy) of two classes is one column
``z`` (N, 1): ``probabilities`` is Concat(1 - Sigmoid(z), Sigmoid(z)) (N, 2) and
``label`` Gather(classes, Cast(Greater(z, 0)) squeezed to (N,)); a multilabel
model's ``probabilities`` is Sigmoid(z) (N, L) and its ``label`` the int64
indicators Cast(Greater(z, 0)) (N, L), as ``predict`` gives them.

The outputs are named as skl2onnx names a classifier's (``label``,
``probabilities``).  A regression (loss squared-error, output identity) has
one output instead, named as skl2onnx names a regressor's::

    variable        (N, T) T       z itself: the predicted values, one column per target
                                   (N, 1 for one target), as ``predict`` computes them
                                   (loss poisson, output exp: Exp(z))

and no ``label`` or ``probabilities``.  The input must be fed as ``T``.
Apart from the normalization, all arithmetic is in ``T``, with the parameters
rounded to ``T``.  The model's ``metadata_props`` hold ``producer``
("dtrain"), ``dtrain_version``, ``classes`` (a regression: ``targets``, the
targets' names) and ``feature_names`` (JSON; names may be null),
``normalization`` (the kind), ``activation``, ``loss``, ``output`` and
``dtype`` (the export's ``T``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dtrain.core import files, layerspec
from dtrain.core.errors import UserError
from dtrain.core.modelfile import ModelSpec
from dtrain.core.version import __version__
from dtrain.maths.dense import ACTIVATIONS

if TYPE_CHECKING:
    import onnx

FORMATS = ("onnx",)
OPSET = 17          # default-domain operator set of the graph
IR_VERSION = 8      # the ONNX IR version that goes with opset 17 (ONNX 1.12)
DTYPES = ("float32", "float64")
_ACTIVATION_OPS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu",
                   "identity": "Identity"}
_OUTPUT_OPS = {"softmax": "Softmax", "sigmoid": "Sigmoid"}
REGRESSION_OUTPUT = "variable"   # a regressor's output, as skl2onnx names it


def to_onnx(spec: ModelSpec, params: dict[str, np.ndarray], *,
            dtype: str = "float32") -> onnx.ModelProto:
    """Build the ONNX graph of a trained network, checked by ``onnx.checker``.

    Parameters
    ----------
    spec
        The saved model's description (``model.json``): layers, activation,
        loss, normalization, classes, feature names.
    params
        ``{"W1": (O, I), "b1": (O,), ...}`` as in ``params.npz``.
    dtype
        The graph's float type, ``"float32"`` or ``"float64"``: the input's,
        the outputs', the parameters' and every operation's but the
        normalization's (float64, as in training).

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (N, D); outputs ``probabilities`` (N, C) and
        ``label`` (N,), as the module docstring describes; a regression's
        one output ``variable`` (N, T).

    Raises
    ------
    UserError
        The ``onnx`` package is missing, ``dtype`` is unknown, or ``params``
        do not fit ``spec``'s layers.
    """
    onnx = _import_onnx()
    _check(spec, params, dtype)
    model = _model(onnx, spec, params, np.dtype(dtype))
    onnx.checker.check_model(model, full_check=True)
    return model


def write_onnx(spec: ModelSpec, params: dict[str, np.ndarray], path: str | Path, *,
               dtype: str = "float32") -> Path:
    """Write the ONNX graph of a trained network to ``path``, atomically.

    Parameters
    ----------
    spec, params, dtype
        As for :func:`to_onnx`.
    path
        The ``.onnx`` file to write; its directory must exist.  Readers see
        the old file or the whole new one, never a partial one.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    UserError
        As for :func:`to_onnx`, or ``path``'s directory does not exist.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: the directory {path.parent} does not exist; "
                        f"create it first")
    model = to_onnx(spec, params, dtype=dtype)
    files.atomic_write(path, model.SerializeToString())
    return path


def _import_onnx() -> Any:
    """The ``onnx`` module, or a one-line UserError saying how to install it."""
    try:
        import onnx
        import onnx.checker
        import onnx.helper
        import onnx.numpy_helper
    except ImportError as exc:
        raise UserError(f"exporting to ONNX needs the onnx package ({exc}): "
                        f"pip install 'dtrain[onnx]'") from None
    return onnx


def _check(spec: ModelSpec, params: dict[str, np.ndarray], dtype: str) -> None:
    """Raise UserError unless ``dtype`` is known and ``params`` fit ``spec``'s layers."""
    if dtype not in DTYPES:
        raise UserError(f"ONNX export dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if spec.activation not in ACTIVATIONS:
        raise UserError(f"activation {spec.activation!r} has no ONNX form; "
                        f"known: {', '.join(ACTIVATIONS)}")
    if dtype == "float64" and any(isinstance(v, layerspec.Conv) for v in spec.layers):
        raise UserError("a convolutional net exports as float32 only: onnxruntime has no "
                        "float64 Conv; export with dtype float32")
    for n, W in enumerate(spec.weight_shapes, start=1):
        for name, shape in ((f"W{n}", W), (f"b{n}", W[:1])):
            got = params.get(name)
            if got is None or np.shape(got) != shape:
                what = "missing" if got is None else f"of shape {np.shape(got)}"
                raise UserError(f"parameter {name} is {what}, but layers {_shown(spec)} "
                                f"need {shape}; params.npz does not belong to this model.json")


def _shown(spec: ModelSpec) -> list[Any]:
    return [layerspec.to_value(v) for v in spec.layers]


def _model(onnx: Any, spec: ModelSpec, params: dict[str, np.ndarray], dtype: np.dtype) -> Any:
    """The ModelProto: graph, opset, IR version and metadata."""
    h = onnx.helper
    nodes, constants = _nodes_and_constants(onnx, spec, params, dtype)
    outputs = [_value(onnx, REGRESSION_OUTPUT, dtype, ["N", spec.layers[-1]])] \
        if spec.regression else [_value(onnx, "probabilities", dtype, ["N", len(spec.classes)]),
                                 _label_value(onnx, spec)]
    graph = h.make_graph(nodes, "dtrain",
                         inputs=[_value(onnx, "input", dtype, ["N", spec.features])],
                         outputs=outputs, initializer=constants)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)],
                         producer_name="dtrain", producer_version=__version__)
    model.ir_version = IR_VERSION
    model.doc_string = (f"dtrain network {_shown(spec)}, {spec.activation} hidden "
                        f"layers, {spec.output} outputs")
    h.set_model_props(model, _metadata(spec, dtype))
    return model


def _nodes_and_constants(onnx: Any, spec: ModelSpec, params: dict[str, np.ndarray],
                         dtype: np.dtype) -> tuple[list[Any], list[Any]]:
    """Nodes from ``input`` to ``probabilities`` and ``label`` (a regression: to
    ``variable``), and their initializers."""
    h, const = onnx.helper, onnx.numpy_helper.from_array
    nodes, inits, x = [], [], "input"
    norm = spec.normalization
    if norm.shift is not None:                  # as Normalization.apply decides
        nodes, inits, x = _normalization(onnx, norm.shift, norm.scale, dtype)
    if not layerspec.dense_only(spec.layers):
        more_nodes, more_inits = _image_layers(onnx, spec, params, dtype, x)
        nodes, inits = nodes + more_nodes, inits + more_inits
        layers = 0
    else:
        layers = len(spec.layers) - 1
    for n in range(1, layers + 1):
        inits += [const(np.asarray(params[f"W{n}"], dtype=dtype), f"W{n}"),   # (O, I)
                  const(np.asarray(params[f"b{n}"], dtype=dtype), f"b{n}")]   # (O,)
        last = REGRESSION_OUTPUT if spec.output == "identity" else "logits"
        z = last if n == layers else f"z{n}"
        nodes.append(h.make_node("Gemm", [x, f"W{n}", f"b{n}"], [z], name=f"layer{n}",
                                 transB=1))                                  # (N, O)
        x = z
        if n < layers:
            x = f"a{n}"
            nodes.append(h.make_node(_ACTIVATION_OPS[spec.activation], [z], [x],
                                     name=f"{spec.activation}{n}"))
    if spec.output == "exp":                     # a Poisson regression: exp of the Gemm's
        nodes.append(h.make_node("Exp", ["logits"], [REGRESSION_OUTPUT], name="exp"))
        return nodes, inits
    if spec.regression:                          # identity outputs: the last Gemm's result
        return nodes, inits
    if spec.output == "logistic":
        more_nodes, more_inits = _logistic(onnx, spec, dtype)
        return nodes + more_nodes, inits + more_inits
    out = _OUTPUT_OPS[spec.output]
    nodes.append(h.make_node(out, ["logits"], ["probabilities"], name=spec.output,
                             **({"axis": 1} if out == "Softmax" else {})))   # (N, C)
    inits.append(_classes_tensor(onnx, spec.classes))                       # (C,)
    nodes += [h.make_node("ArgMax", ["logits"], ["index"], name="argmax", axis=1,
                          keepdims=0),                                       # (N,) int64
              h.make_node("Gather", ["classes", "index"], ["label"], name="label",
                          axis=0)]                                           # (N,)
    return nodes, inits


def _image_layers(onnx: Any, spec: ModelSpec, params: dict[str, np.ndarray], dtype: np.dtype,
                  x: str) -> tuple[list[Any], list[Any]]:
    """The nodes of a net with layer tables (a convolutional net, or dense layers with
    dropout) from the normalized rows ``x`` (N, D) to ``logits`` (a regression: its
    output), and their initializers."""
    h, const = onnx.helper, onnx.numpy_helper.from_array
    steps = layerspec.walk(spec.layers, spec.input_shape)
    nodes, inits, n = [], [], 0
    if not isinstance(spec.layers[0], int):              # images: rows to (N, C, H, W)
        inits.append(const(np.array([-1, *spec.input_shape], np.int64), "image_shape"))
        nodes.append(h.make_node("Reshape", [x, "image_shape"], ["images"], name="images"))
        x = "images"
    last = max(k for k, st in enumerate(steps) if isinstance(st.layer, int))
    for k, st in enumerate(steps):
        layer = st.layer
        if isinstance(layer, (int, layerspec.Conv)):
            n += 1
            inits += [const(np.asarray(params[f"W{n}"], dtype=dtype), f"W{n}"),
                      const(np.asarray(params[f"b{n}"], dtype=dtype), f"b{n}")]
            z = (REGRESSION_OUTPUT if spec.output == "identity" else "logits") if k == last \
                else f"z{n}"
            if isinstance(layer, int):
                nodes.append(h.make_node("Gemm", [x, f"W{n}", f"b{n}"], [z], name=f"layer{n}",
                                         transB=1))                          # (N, O)
            else:
                K, s, p = layer.kernel, layer.stride, layer.padding
                nodes.append(h.make_node("Conv", [x, f"W{n}", f"b{n}"], [z], name=f"conv{n}",
                                         kernel_shape=[K, K], strides=[s, s],
                                         pads=[p, p, p, p]))                 # (N, F, OH, OW)
            x = z
            if k != last:
                x = f"a{n}"
                nodes.append(h.make_node(_ACTIVATION_OPS[spec.activation], [z], [x],
                                         name=f"{spec.activation}{n}"))
        elif isinstance(layer, layerspec.Pool):
            op = "MaxPool" if layer.pool == "max" else "AveragePool"
            nodes.append(h.make_node(op, [x], [f"pool{k}"], name=f"pool{k}",
                                     kernel_shape=[layer.size] * 2,
                                     strides=[layer.step] * 2))              # (N, C, OH, OW)
            x = f"pool{k}"
        elif isinstance(layer, layerspec.Flatten):
            nodes.append(h.make_node("Flatten", [x], ["flat"], name="flatten", axis=1))
            x = "flat"                                                       # (N, C H W)
    return nodes, inits


def _logistic(onnx: Any, spec: ModelSpec, dtype: np.dtype) -> tuple[list[Any], list[Any]]:
    """From ``logits`` to ``probabilities`` and ``label`` for logistic outputs: two classes
    in one column, or a multilabel model's indicators."""
    h, const = onnx.helper, onnx.numpy_helper.from_array
    nodes = [h.make_node("Sigmoid", ["logits"], ["p"], name="logistic"),             # (N, C)
             h.make_node("Greater", ["logits", "zero"], ["on"], name="above_half"),  # (N, C)
             h.make_node("Cast", ["on"], ["index" if not spec.multilabel else "label"],
                         name="as_int64", to=onnx.TensorProto.INT64)]
    inits = [const(np.zeros(1, dtype=dtype), "zero")]
    if spec.multilabel:
        nodes.append(h.make_node("Identity", ["p"], ["probabilities"], name="probabilities"))
        return nodes, inits
    inits += [const(np.ones(1, dtype=dtype), "one"), const(np.array([1], np.int64), "axis1"),
              _classes_tensor(onnx, spec.classes)]
    nodes += [h.make_node("Sub", ["one", "p"], ["q"], name="first_class"),          # (N, 1)
              h.make_node("Concat", ["q", "p"], ["probabilities"], name="probabilities",
                          axis=1),                                                   # (N, 2)
              h.make_node("Squeeze", ["index", "axis1"], ["flat"], name="squeeze"),  # (N,)
              h.make_node("Gather", ["classes", "flat"], ["label"], name="label", axis=0)]
    return nodes, inits


def _normalization(onnx: Any, shift: np.ndarray, scale: np.ndarray,
                   dtype: np.dtype) -> tuple[list[Any], list[Any], str]:
    """``(input - shift) / scale`` in float64, as :meth:`Normalization.apply`, then ``dtype``."""
    h, const = onnx.helper, onnx.numpy_helper.from_array
    double = onnx.TensorProto.DOUBLE
    inits = [const(shift.astype(np.float64), "norm_shift"),                 # (D,)
             const(scale.astype(np.float64), "norm_scale")]                 # (D,)
    nodes, x = [], "input"
    if dtype != np.float64:
        nodes.append(h.make_node("Cast", [x], ["input_f64"], name="to_float64", to=double))
        x = "input_f64"
    nodes += [h.make_node("Sub", [x, "norm_shift"], ["centred"], name="shift"),  # (N, D)
              h.make_node("Div", ["centred", "norm_scale"], ["scaled"], name="scale")]
    if dtype == np.float64:
        return nodes, inits, "scaled"
    kind = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    nodes.append(h.make_node("Cast", ["scaled"], ["normalized"], name="to_dtype", to=kind))
    return nodes, inits, "normalized"


def _int_labels(classes: tuple[Any, ...]) -> bool:
    """True when every label is an integer (not a bool): the ``label`` output is int64."""
    return all(isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_))
               for c in classes)


def _classes_tensor(onnx: Any, classes: tuple[Any, ...]) -> Any:
    """The class labels as a (C,) int64 or string constant named ``classes``."""
    h = onnx.helper
    if _int_labels(classes):
        return onnx.numpy_helper.from_array(np.array([int(c) for c in classes],
                                                     dtype=np.int64), "classes")
    return h.make_tensor("classes", onnx.TensorProto.STRING, [len(classes)],
                         [str(c).encode("utf-8") for c in classes])


def _label_value(onnx: Any, spec: ModelSpec) -> Any:
    if spec.multilabel:                         # 0/1 per label
        return onnx.helper.make_tensor_value_info("label", onnx.TensorProto.INT64,
                                                  ["N", len(spec.classes)])
    kind = onnx.TensorProto.INT64 if _int_labels(spec.classes) else onnx.TensorProto.STRING
    return onnx.helper.make_tensor_value_info("label", kind, ["N"])


def _value(onnx: Any, name: str, dtype: np.dtype, shape: list[Any]) -> Any:
    kind = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    return onnx.helper.make_tensor_value_info(name, kind, shape)


def _metadata(spec: ModelSpec, dtype: np.dtype) -> dict[str, str]:
    """The ``metadata_props``: strings, lists as JSON."""
    labels = [int(c) if _int_labels(spec.classes) else str(c) for c in spec.classes]
    names = {"targets": json.dumps(list(spec.targets))} if spec.regression \
        else {"classes": json.dumps(labels)}
    return {"producer": "dtrain", "dtrain_version": __version__, **names,
            "feature_names": json.dumps(None if spec.feature_names is None
                                        else list(spec.feature_names)),
            "normalization": spec.normalization.kind,
            "activation": spec.activation, "loss": spec.loss, "output": spec.output,
            "dtype": dtype.name}
