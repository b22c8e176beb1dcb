"""A run directory read as a model: ``model.json`` and ``params.npz``, both checked.

:func:`read_run` is the one way in: it says in one line what is wrong with a
directory that is not a usable model (not a run, not finished, a corrupt or
truncated ``params.npz``, parameters that do not fit the network).  A run
written before ``model.json`` existed (dtrain 0.1) is read from its
``config.toml``: the normalization is fitted again from the data it names,
which gives the same statistics bit for bit, or it fails saying so.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from dtrain.core import files, layerspec
from dtrain.core.config import from_dict, read_toml
from dtrain.core.errors import UserError
from dtrain.core.modelfile import ModelFileError, ModelSpec
from dtrain.data.prepare import describe, normalization


def read_run(run_dir: str | Path) -> tuple[ModelSpec, dict[str, np.ndarray]]:
    """The model a finished run directory holds: its spec and its named parameters.

    Raises
    ------
    ModelFileError
        For a path that is not a finished dtrain run, a damaged file, or
        parameters that do not fit the network ``model.json`` describes.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ModelFileError(f"{run} is not a directory; pass a run directory (as written by "
                             f"python -m dtrain --out DIR)")
    if not (run / files.PARAMS).exists():
        if (run / files.CONFIG).exists():
            raise ModelFileError(f"{run} holds a run that has not finished (no {files.PARAMS}); "
                                 f"finish it with python -m dtrain --resume {run}")
        raise ModelFileError(f"{run} is not a dtrain run directory (no {files.MODEL} or "
                             f"{files.PARAMS}); pass the directory a run wrote")
    spec = ModelSpec.read(run) if (run / files.MODEL).exists() else legacy_spec(run)
    return spec, read_params(run / files.PARAMS, spec)


def read_params(path: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    """``W1, b1, ...`` from ``params.npz``, checked against the network's shapes."""
    try:
        with np.load(path) as f:
            params = {name: f[name] for name in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelFileError(f"{path} is corrupt or truncated ({type(exc).__name__}: {exc}); "
                             f"train the run again or restore the file") from None
    layers = [layerspec.to_value(v) for v in spec.layers]
    want = {f"{k}{n}": shape for n, W in enumerate(spec.weight_shapes, start=1)
            for k, shape in (("W", W), ("b", W[:1]))}
    if set(params) != set(want):
        raise ModelFileError(f"{path} holds {sorted(params)}, the network "
                             f"{list(layers)} needs {sorted(want)}")
    for name, shape in want.items():
        if params[name].shape != shape:
            raise ModelFileError(f"{path}: {name} is {params[name].shape}, the network "
                                 f"{list(layers)} needs {shape}")
    return params


def legacy_spec(run: Path) -> ModelSpec:
    """The spec of a run from before ``model.json``, from its config and its data."""
    try:
        cfg = from_dict(read_toml(run / files.CONFIG), str(run / files.CONFIG))
    except UserError as exc:
        raise ModelFileError(f"{run} has no {files.MODEL} and its {files.CONFIG} cannot be "
                             f"read ({exc})") from None
    try:
        info, norm = describe(cfg.data), normalization(cfg.data)
    except UserError as exc:
        raise ModelFileError(f"{run} was written by dtrain 0.1 (no {files.MODEL}) and the "
                             f"data it was trained on cannot be read to recover its "
                             f"normalization: {exc}") from None
    m = cfg.model
    return ModelSpec(tuple(m.layers), m.activation, m.loss, m.dtype, norm, info.labels,
                     info.names, {"dataset": info.name, "recovered_from": files.CONFIG},
                     input_shape=tuple(m.input_shape))
