"""Inference: a finished run used as a model: loaded, applied, evaluated, exported.

Holds reading a run directory as a model (:mod:`~dtrain.inference.saved`:
``model.json`` and ``params.npz``, checked), the loaded model with
``predict``/``predict_proba``/``score`` on NumPy and Dask arrays
(:mod:`~dtrain.inference.model`), the raw inputs a model is applied to (CSV,
IDX, image folders, ``.npy``: :mod:`~dtrain.inference.inputs`), the metrics of
an evaluation (:mod:`~dtrain.inference.metrics`) and export to ONNX
(:mod:`~dtrain.inference.export`).  It never trains and never starts a
cluster: a Dask client, if any, is handed in.

May import: :mod:`dtrain.core`, :mod:`dtrain.maths`, :mod:`dtrain.data`.
"""
