"""The saved model: ``model.json`` beside ``params.npz`` makes a run directory a model.

Everything needed to apply a trained network to raw inputs, in one
documented, versioned JSON file (``FORMAT``, ``VERSION``)::

    {
      "format": "dtrain-model",
      "version": 1,
      "network": {"layers": [4, 16, 3], "activation": "tanh", "loss": "cross-entropy",
                  "output": "softmax", "dtype": "float64"},
      "features": {"count": 4, "names": ["sepal length (cm)", ...]},   # names may be null
      "normalization": {"kind": "standardize", "shift": [...], "scale": [...]},
      "classes": ["setosa", "versicolor", "virginica"],
      "training": {"dataset": "iris", "epochs": 40, "best_epoch": 37, ...}
    }

``normalization`` is the one fitted on the training split: an input row ``x``
becomes ``(x - shift) / scale`` in float64, then ``dtype`` (``kind`` "none":
no shift, no scale).  Floats are written as Python's shortest repr, which
reads back to the same bits.  ``classes`` are the labels as the data named
them (strings or integers), in the order of the network's outputs.  The
parameters stay in ``params.npz`` (``W1``, ``b1``, ... with ``W`` as
``(outputs, inputs)``).  This module owns the format; the recorder writes it,
:mod:`dtrain.inference` reads it.

A regression (``loss`` "squared-error", ``output`` "identity": the outputs
are the predictions, targets as given in training, not normalized) has
``"targets": ["price", ...]``, the names of its outputs in order, in place of
``classes``.  That is an optional field added to version 1, not a change of
meaning: a classifier's file is as before, and a dtrain that predates
regression refuses a regressor's file by its unknown loss.

A Poisson regression (``loss`` "poisson", ``output`` "exp") predicts the
exponential of its outputs; otherwise it is a regression as above (and older
dtrains refuse it by its loss).

A ``logistic`` output (loss ``binary-cross-entropy``) is a sigmoid per output:
one output for two ``classes`` (the probability of the second), or one per
label of a multilabel model, whose ``classes`` then name the labels, one per
output.  Also an optional addition: older dtrains refuse it by its loss.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dtrain.core import files, layerspec
from dtrain.core.errors import UserError

FORMAT = "dtrain-model"
VERSION = 1
OUTPUTS = {"cross-entropy": "softmax", "mse": "sigmoid",   # the loss decides the output layer
           "binary-cross-entropy": "logistic", "squared-error": "identity", "poisson": "exp"}
VALUE_OUTPUTS = ("identity", "exp")     # a regression's: its predictions are values
Label = str | int


class ModelFileError(UserError):
    """A run directory that is not a usable model: missing, corrupt or of another version."""


@dataclass(frozen=True, eq=False)
class Normalization:
    """How raw features become network inputs: ``(x - shift) / scale``.

    ``kind`` is ``"standardize"`` (mean, standard deviation), ``"minmax"``
    (minimum, range) or ``"none"`` (``shift`` and ``scale`` None).  A
    constant feature's scale is 1.
    """

    kind: str = "none"
    shift: np.ndarray | None = None     # (D,) float64
    scale: np.ndarray | None = None     # (D,) float64

    def apply(self, x: np.ndarray, dtype: str | np.dtype = np.float64) -> np.ndarray:
        """Raw rows ``x`` (B, D) as the network saw them in training, as ``dtype``."""
        x = np.asarray(x, dtype=np.float64)
        if self.shift is not None:
            x = (x - self.shift) / self.scale                  # (B, D)
        return np.ascontiguousarray(x, dtype=dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind,
                "shift": None if self.shift is None else [float(v) for v in self.shift],
                "scale": None if self.scale is None else [float(v) for v in self.scale]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Normalization:
        if d.get("kind", "none") == "none" or d.get("shift") is None:
            return cls(d.get("kind", "none"))
        return cls(d["kind"], np.asarray(d["shift"], dtype=np.float64),
                   np.asarray(d["scale"], dtype=np.float64))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Normalization) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict()))


@dataclass(frozen=True)
class ModelSpec:
    """What ``model.json`` holds: the network's shape, its input pipeline and its labels.

    A classifier has ``classes`` (one per output); a regression (loss
    ``squared-error``) has none and names its outputs in ``targets``.
    """

    layers: tuple[Any, ...]
    activation: str
    loss: str
    dtype: str
    normalization: Normalization
    classes: tuple[Label, ...]
    feature_names: tuple[str, ...] | None = None
    training: dict[str, Any] = field(default_factory=dict, compare=False)
    targets: tuple[str, ...] = ()
    input_shape: tuple[int, ...] = ()

    @property
    def features(self) -> int:
        return layerspec.features(self.layers, self.input_shape)

    @property
    def weight_shapes(self) -> list[tuple[int, ...]]:
        """``W1, W2, ...``'s shapes (:func:`~dtrain.core.layerspec.weight_shapes`)."""
        return layerspec.weight_shapes(self.layers, self.input_shape)

    @property
    def regression(self) -> bool:
        """Whether the outputs are real-valued predictions (loss squared-error, poisson)."""
        return self.output in VALUE_OUTPUTS

    @property
    def output(self) -> str:
        """``"softmax"`` (cross-entropy), ``"sigmoid"`` (mse), ``"logistic"``
        (binary-cross-entropy), ``"identity"`` (squared-error) or ``"exp"`` (poisson): what
        the outputs pass through."""
        return OUTPUTS[self.loss]

    @property
    def multilabel(self) -> bool:
        """Whether each output is a label of its own (logistic outputs, one per class
        name), rather than one of the classes (two classes: one logistic output)."""
        return self.output == "logistic" and len(self.classes) == self.layers[-1]

    def to_dict(self) -> dict[str, Any]:
        names = {"targets": list(self.targets)} if self.regression \
            else {"classes": [_plain(c) for c in self.classes]}
        return {"format": FORMAT, "version": VERSION,
                "network": {"layers": [layerspec.to_value(v) for v in self.layers],
                            **({"input_shape": list(self.input_shape)}
                               if self.input_shape else {}),
                            "activation": self.activation,
                            "loss": self.loss, "output": self.output, "dtype": self.dtype},
                "features": {"count": self.features,
                             "names": None if self.feature_names is None
                             else list(self.feature_names)},
                "normalization": self.normalization.to_dict(),
                **names,
                "training": self.training}

    def to_json(self) -> str:
        """Indented JSON with each flat list on one line (784 means stay 784 numbers, not
        784 lines)."""
        text = json.dumps(self.to_dict(), indent=1)
        return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]",
                      lambda m: "[" + re.sub(r",\s*\n\s*", ", ", m.group(1)) + "]", text) + "\n"

    @classmethod
    def from_dict(cls, d: Any, where: str = "model.json") -> ModelSpec:
        """Read a ``model.json`` document; :class:`ModelFileError` names what is wrong."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ModelFileError(f"{where} is not a dtrain model file (no \"format\": "
                                 f"\"{FORMAT}\")")
        if d.get("version") != VERSION:
            raise ModelFileError(f"{where} is model format version {d.get('version')}; this "
                                 f"dtrain reads version {VERSION}: use the dtrain that wrote it")
        try:
            net, feats = d["network"], d["features"]
            values = OUTPUTS.get(net["loss"]) in VALUE_OUTPUTS   # a regression needs targets
            spec = cls(tuple(int(n) if isinstance(n, (int, float)) else layerspec.parse(n)
                             for n in net["layers"]), str(net["activation"]),
                       str(net["loss"]), str(net["dtype"]),
                       Normalization.from_dict(d["normalization"]),
                       tuple(d["classes"]) if "classes" in d or not values else (),
                       None if feats.get("names") is None else tuple(map(str, feats["names"])),
                       dict(d.get("training") or {}),
                       tuple(map(str, d["targets"])) if "targets" in d or values else (),
                       tuple(int(n) for n in net.get("input_shape", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{where} is incomplete or malformed ({type(exc).__name__}: "
                                 f"{exc}); it was not written by dtrain, or was edited") from None
        _check(spec, where)
        return spec

    @classmethod
    def read(cls, run_dir: str | Path) -> ModelSpec:
        path = Path(run_dir) / files.MODEL
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ModelFileError(f"{run_dir} has no {files.MODEL}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelFileError(f"{path} is not valid JSON ({exc}); the file is damaged") \
                from None
        return cls.from_dict(doc, str(path))


def _plain(label: Any) -> Label:
    """A label as JSON keeps it: NumPy integers become ints, anything else its text."""
    if isinstance(label, (bool, np.bool_)):
        return str(label)
    if isinstance(label, (int, np.integer)):
        return int(label)
    return str(label)


def _check(spec: ModelSpec, where: str) -> None:
    try:
        layerspec.walk(spec.layers, spec.input_shape)
        bad = len(spec.layers) < 2
    except ValueError:
        bad = True
    if bad:
        raise ModelFileError(f"{where}: network.layers = "
                             f"{[layerspec.to_value(v) for v in spec.layers]} is not a network")
    if spec.loss not in OUTPUTS or spec.dtype not in ("float32", "float64"):
        raise ModelFileError(f"{where}: unknown loss {spec.loss!r} or dtype {spec.dtype!r}")
    names, what = (spec.targets, "targets") if spec.regression else (spec.classes, "classes")
    binary = spec.output == "logistic" and spec.layers[-1] == 1 and len(names) == 2
    if len(names) != spec.layers[-1] and not binary:
        raise ModelFileError(f"{where}: {len(names)} {what} for {spec.layers[-1]} outputs")
    if spec.regression and spec.classes or not spec.regression and spec.targets:
        right, wrong = ("targets", "classes") if spec.regression else ("classes", "targets")
        raise ModelFileError(f"{where}: loss {spec.loss!r} has {right}, not {wrong}")
    norm = spec.normalization
    if norm.shift is not None and (norm.shift.shape != (spec.features,)
                                   or norm.scale is None or norm.scale.shape != (spec.features,)):
        raise ModelFileError(f"{where}: normalization has {norm.shift.shape[0]} features, the "
                             f"network {spec.features}")
    if spec.feature_names is not None and len(spec.feature_names) != spec.features:
        raise ModelFileError(f"{where}: {len(spec.feature_names)} feature names for "
                             f"{spec.features} inputs")
