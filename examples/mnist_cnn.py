"""LeNet-5 on MNIST: train ``configs/mnist-cnn.toml``, then load the run as a model, predict
some images, and check its ONNX export with onnxruntime.

    python examples/mnist_cnn.py MNIST_DIR [EPOCHS]

MNIST_DIR holds the IDX files (``t10k-images-idx3-ubyte.gz`` and its labels; with only the
10k set it is split 80/10/10).  The config as it ships trains 12 epochs and reaches a test
accuracy of 0.975 or more; from the shell that is
``python -m dtrain --config configs/mnist-cnn.toml --set data.path=MNIST_DIR``.
"""
import gzip
import sys
from pathlib import Path

import numpy as np

import dtrain
from dtrain.core.config import CONFIG_DIR          # the configs dtrain ships
from dtrain.inference.export import write_onnx


def images(folder: str) -> np.ndarray:
    """The t10k images as rows of 784 raw pixels (N, 784), as the model takes them."""
    with gzip.open(Path(folder) / "t10k-images-idx3-ubyte.gz") as f:
        return np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32)


def main(mnist: str, epochs: int = 12, run_dir: str = "runs/mnist-cnn-example") -> None:
    # 1. train LeNet-5: the layers are in the config's model.layers, beside its input_shape
    cfg = dtrain.load_config(CONFIG_DIR / "mnist-cnn.toml",
                             [f"data.path={mnist}", f"train.epochs={epochs}"])
    result = dtrain.train(cfg, out=run_dir, echo=None)      # echo=None: no console lines
    print(f"trained {epochs} epochs: test accuracy {result.summary['test_accuracy']:.4f}")

    # 2. the run directory is the model: predict raw images (its normalization included)
    model = dtrain.load(run_dir)
    print(model)
    x = images(mnist)
    print("predict:", model.predict(x[:10]))
    print(f"probability of the first's class: {model.predict_proba(x[:1]).max():.4f}")

    # 3. ONNX: Conv, MaxPool, Flatten and Gemm nodes; raw pixels in, probabilities out
    path = write_onnx(model.spec, result.params, f"{run_dir}/model.onnx")
    try:
        import onnxruntime
    except ImportError:
        print(f"wrote {path}; pip install onnxruntime to run it")
        return
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    labels, proba = session.run(["label", "probabilities"], {"input": x[:1000]})
    gap = np.abs(proba - model.predict_proba(x[:1000])).max()
    print(f"onnx: {path}, labels agree: {(labels == model.predict(x[:1000])).all()}, "
          f"largest probability difference {gap:.1e}")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:3]))
