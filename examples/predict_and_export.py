"""Train a small model, then use it: load, predict, evaluate, predict a Dask array lazily,
export to ONNX and check the export with onnxruntime.

    python examples/predict_and_export.py [RUN_DIR]

A finished run directory is the model: ``model.json`` (layers, normalization, class names)
and ``params.npz``.  The same steps from the shell are ``python -m dtrain evaluate RUN``,
``predict RUN --data FILE`` and ``export RUN --format onnx --out FILE``.
"""
import sys

import dask.array as da
import numpy as np
from sklearn.datasets import load_iris

import dtrain
from dtrain.inference.export import write_onnx


def main(run_dir: str = "runs/iris-example") -> None:
    # 1. train: iris (configs/iris.toml, the default), 20 epochs, into run_dir
    cfg = dtrain.load_config(None, ["train.epochs=20"])
    result = dtrain.train(cfg, out=run_dir, echo=None)     # echo=None: no console lines
    print(f"trained: test accuracy {result.summary['test_accuracy']:.4f} -> {result.out}")

    # 2. load it back, as any later process would
    model = dtrain.load(run_dir)
    print(model)
    iris = load_iris()
    X, y = iris.data, iris.target_names[iris.target]        # labels as the data names them
    print("predict:", model.predict(X[:3]))
    print("predict_proba:", np.round(model.predict_proba(X[:3]), 3).tolist())
    report = model.evaluate(X, y)
    print(f"evaluate on all 150 rows: accuracy {report.accuracy:.4f}")

    # 3. a Dask array is predicted lazily: one task per block, the model one key of the graph
    labels = model.predict(da.from_array(X, chunks=50))
    print("lazy:", labels)
    print("computed:", (labels.compute() == model.predict(X)).all())

    # 4. ONNX: raw features in, probabilities and labels out, normalization included
    path = write_onnx(model.spec, result.params, f"{run_dir}/model.onnx")
    try:
        import onnxruntime
    except ImportError:
        print(f"wrote {path}; pip install onnxruntime to run it")
        return
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    labels_onnx, proba_onnx = session.run(["label", "probabilities"],
                                          {"input": X.astype(np.float32)})
    print(f"onnx: {path}, labels agree: {(labels_onnx == model.predict(X)).all()}, "
          f"largest probability difference {np.abs(proba_onnx - model.predict_proba(X)).max():.1e}")


if __name__ == "__main__":      # the LocalCluster's worker processes import this file
    main(*sys.argv[1:])
