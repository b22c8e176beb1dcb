"""Layer specs: the entries of ``model.layers`` that are not a dense layer's size.

``model.layers`` lists a network from its input to its outputs.  An integer is a dense
layer's size, as it always was (a fully connected net: ``[784, 128, 10]``, input first).
A table names another layer by its first key:

* ``{conv = 6, kernel = 5, stride = 1, padding = 2}``: a 2-D convolution of 6 filters;
* ``{pool = "max", size = 2, stride = 2}`` (or ``"avg"``): pooling, no padding;
* ``"flatten"`` (or ``{flatten = true}``): images (C, H, W) to C H W features;
* ``{dropout = 0.5}``: inverted dropout while training, nothing at evaluation.

A convolutional net gives ``model.input_shape = [channels, height, width]`` and starts
with its image layers; after ``"flatten"`` its dense part is written as a dense net is,
its first size the flattened features (checked), e.g. LeNet-5::

    layers = [{conv = 6, kernel = 5, padding = 2}, {pool = "max", size = 2},
              {conv = 16, kernel = 5}, {pool = "max", size = 2}, "flatten", 400, 120, 84, 10]

The network's activation follows each convolution and each hidden dense layer.
:func:`walk` follows the shapes through the layers and says in one line where they do
not fit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class Conv:
    """A 2-D convolution: ``conv`` filters of ``kernel x kernel``."""

    conv: int
    kernel: int
    stride: int = 1
    padding: int = 0


@dataclass(frozen=True)
class Pool:
    """Max or average pooling over ``size x size`` windows at ``stride`` (0: ``size``)."""

    pool: str
    size: int
    stride: int = 0

    @property
    def step(self) -> int:
        return self.stride or self.size


@dataclass(frozen=True)
class Flatten:
    """Images (C, H, W) to ``C H W`` features, in that order."""

    flatten: bool = True


@dataclass(frozen=True)
class Dropout:
    """Inverted dropout: each entry kept with probability ``1 - dropout``."""

    dropout: float


Spec = Union[Conv, Pool, Flatten, Dropout]
KINDS = {"conv": Conv, "pool": Pool, "flatten": Flatten, "dropout": Dropout}
RULE = ("a list of at least two layers, input first: positive sizes and layer tables "
        "({conv = 6, kernel = 5}, {pool = 'max', size = 2}, 'flatten', "
        "{dropout = 0.5})")


class LayerItem:
    """The config's type of one entry of ``model.layers``: an ``int`` or a :data:`Spec`."""

    @staticmethod
    def coerce(value: Any) -> int | Spec:
        """``value`` as read from TOML, as an ``int`` or a spec; ``ValueError`` (one line)
        when it is neither."""
        return parse(value)


def parse(value: Any) -> int | Spec:
    """One entry of ``model.layers``: an integer, ``"flatten"``, a table, or a spec."""
    if isinstance(value, (Conv, Pool, Flatten, Dropout)):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a layer")
    if isinstance(value, int):
        return value
    if value == "flatten":
        return Flatten()
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{value!r} is not a layer: expected a size or a table whose first "
                         f"key is one of {', '.join(KINDS)}")
    kind = next(iter(value))
    if kind not in KINDS:
        raise ValueError(f"{value!r}: unknown layer '{kind}'; layers: {', '.join(KINDS)}")
    cls = KINDS[kind]
    known = cls.__dataclass_fields__
    extra = [k for k in value if k not in known]
    if extra:
        raise ValueError(f"{value!r}: unknown key '{extra[0]}' of a {kind} layer; its keys: "
                         f"{', '.join(known)}")
    try:
        spec = cls(**value)
    except TypeError:
        raise ValueError(f"{value!r}: a {kind} layer needs "
                         f"{', '.join(k for k, f in known.items() if f.default is f.default_factory)}"
                         ) from None
    _check(spec, value)
    return spec


def _check(spec: Spec, value: Any) -> None:
    def whole(v: Any, low: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    bad = None
    if isinstance(spec, Conv):
        if not (whole(spec.conv, 1) and whole(spec.kernel, 1) and whole(spec.stride, 1)
                and whole(spec.padding, 0)):
            bad = "conv, kernel and stride must be integers >= 1, padding >= 0"
    elif isinstance(spec, Pool):
        if spec.pool not in ("max", "avg"):
            bad = "pool must be 'max' or 'avg'"
        elif not (whole(spec.size, 1) and whole(spec.stride, 0)):
            bad = "size must be an integer >= 1, stride >= 0 (0: the size)"
    elif isinstance(spec, Dropout):
        if isinstance(spec.dropout, bool) or not isinstance(spec.dropout, (int, float)) \
                or not 0 <= spec.dropout < 1:
            bad = "dropout must be a rate in [0, 1)"
    elif spec.flatten is not True:
        bad = "flatten = true, or the string 'flatten'"
    if bad:
        raise ValueError(f"{value!r}: {bad}")


def show(item: int | Spec) -> str:
    """An entry as it is written in TOML."""
    if isinstance(item, int):
        return str(item)
    if isinstance(item, Flatten):
        return "'flatten'"
    fields = [(k, getattr(item, k)) for k in item.__dataclass_fields__]
    return "{" + ", ".join(f"{k} = {v!r}" for k, v in fields) + "}"


def to_value(item: int | Spec) -> Any:
    """An entry as plain JSON/TOML data (an int, ``"flatten"`` or a table)."""
    if isinstance(item, int):
        return item
    if isinstance(item, Flatten):
        return "flatten"
    return {k: getattr(item, k) for k in item.__dataclass_fields__}


def dense_only(layers: tuple) -> bool:
    """Whether every entry is a size: a fully connected net."""
    return all(isinstance(v, int) for v in layers)


@dataclass(frozen=True)
class Step:
    """One layer of a walk: the layer (an ``int``: a dense layer of that many outputs), the
    shape it takes and the shape it gives (each without the batch)."""

    layer: int | Spec
    shape_in: tuple[int, ...]
    shape_out: tuple[int, ...]


def walk(layers: tuple, input_shape: tuple[int, ...] = ()) -> list[Step]:
    """The layers with the shapes between them, from the input to the outputs.

    A net whose first entry is a size takes that many features (``input_shape``, if given,
    must hold as many); one whose first entry is a layer table takes ``input_shape``
    (C, H, W).  Raises ``ValueError`` with one line saying where the shapes do not fit.
    """
    layers = tuple(layers)
    if not layers:
        raise ValueError("model.layers is empty")
    if isinstance(layers[0], int):
        features = layers[0]
        if input_shape and math.prod(input_shape) != features:
            raise ValueError(f"model.input_shape = {list(input_shape)} holds "
                             f"{math.prod(input_shape)} features but model.layers[0] = "
                             f"{features}")
        shape: tuple[int, ...] = (features,)
        rest, flat_size_due = layers[1:], False
    else:
        if len(input_shape) != 3:
            raise ValueError(f"model.layers starts with {show(layers[0])}, which takes images: "
                             f"set model.input_shape = [channels, height, width]")
        shape, rest, flat_size_due = tuple(input_shape), layers, False
    steps: list[Step] = []
    flat_from: tuple[int, ...] = ()             # the images a 'flatten' turned into features
    for n, layer in enumerate(rest, start=len(layers) - len(rest)):
        where = f"model.layers[{n}] = {show(layer)}"
        if isinstance(layer, int):
            if len(shape) != 1:
                raise ValueError(f"{where} is a dense size but its input is "
                                 f"{'x'.join(map(str, shape))} images: put 'flatten' before it")
            if flat_size_due:
                if layer != shape[0]:
                    raise ValueError(f"{where} but 'flatten' gives {shape[0]} features "
                                     f"({' x '.join(map(str, flat_from))}); write {shape[0]}")
                flat_size_due = False
                continue
            steps.append(Step(layer, shape, (layer,)))
            shape = (layer,)
        elif isinstance(layer, (Conv, Pool)):
            if len(shape) != 3:
                raise ValueError(f"{where} takes images (C, H, W) but its input is {shape[0]} "
                                 f"features")
            C, H, W = shape
            if isinstance(layer, Conv):
                k, s, p = layer.kernel, layer.stride, layer.padding
            else:
                k, s, p = layer.size, layer.step, 0
            if k > H + 2 * p or k > W + 2 * p:
                raise ValueError(f"{where}: its {k}x{k} kernel is larger than its "
                                 f"{H}x{W} input" + (f" padded by {p}" if p else ""))
            OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
            out = (layer.conv if isinstance(layer, Conv) else C, OH, OW)
            steps.append(Step(layer, shape, out))
            shape = out
        elif isinstance(layer, Flatten):
            if len(shape) != 3:
                raise ValueError(f"{where}: its input is already {shape[0]} features")
            flat_from = shape
            out = (math.prod(shape),)
            steps.append(Step(layer, shape, out))
            shape, flat_size_due = out, True
        else:
            steps.append(Step(layer, shape, shape))
    if flat_size_due or not steps or not isinstance(layers[-1], int) \
            or not any(isinstance(s.layer, int) for s in steps):
        raise ValueError(f"model.layers ends with {show(layers[-1])}: end with the dense "
                         f"layers' sizes, the classes (or targets) last")
    if any(isinstance(s.layer, int) and s.layer < 1 for s in steps) or \
            (isinstance(layers[0], int) and layers[0] < 1):
        raise ValueError("model.layers: sizes must be positive")
    return steps


def weight_shapes(layers: tuple, input_shape: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Each weighted layer's ``W`` shape, in order: ``(O, I)`` a dense layer's, ``(F, C, K,
    K)`` a convolution's filters (each with biases ``(O,)`` or ``(F,)``): ``params.npz``'s
    ``W1, b1, W2, ...``."""
    if dense_only(layers):
        return list(zip(layers[1:], layers[:-1]))
    out: list[tuple[int, ...]] = []
    for st in walk(layers, input_shape):
        if isinstance(st.layer, int):
            out.append((st.layer, st.shape_in[0]))
        elif isinstance(st.layer, Conv):
            out.append((st.layer.conv, st.shape_in[0], st.layer.kernel, st.layer.kernel))
    return out


def features(layers: tuple, input_shape: tuple[int, ...] = ()) -> int:
    """Features of an input row: ``layers[0]``, or ``C H W`` of ``input_shape``."""
    return layers[0] if isinstance(layers[0], int) else math.prod(input_shape)


def describe(layers: tuple, input_shape: tuple[int, ...] = ()) -> str:
    """The layers in a line, for pictures and pages: ``784-128-10`` for a dense net;
    ``1x28x28 > conv 6@5x5 pad 2 > max-pool 2 > ... > flatten 400 > 120 > 84 > 10``."""
    if dense_only(layers) and not input_shape:
        return "-".join(map(str, layers))
    parts = ["x".join(map(str, input_shape)) if not isinstance(layers[0], int)
             else str(layers[0])]
    for st in walk(layers, input_shape):
        v = st.layer
        if isinstance(v, int):
            parts.append(str(v))
        elif isinstance(v, Conv):
            parts.append(f"conv {v.conv}@{v.kernel}x{v.kernel}"
                         + (f" stride {v.stride}" if v.stride != 1 else "")
                         + (f" pad {v.padding}" if v.padding else ""))
        elif isinstance(v, Pool):
            parts.append(f"{v.pool}-pool {v.size}" + (f" stride {v.stride}"
                                                     if v.stride not in (0, v.size) else ""))
        elif isinstance(v, Flatten):
            parts.append(f"flatten {st.shape_out[0]}")
        else:
            parts.append(f"dropout {v.dropout:g}")
    return " > ".join(parts)
