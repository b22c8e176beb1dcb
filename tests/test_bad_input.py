"""The bad-input table: each mistake gets one line naming it, exit code 2, no traceback,
and nothing that looks like a finished run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from test_data import make_images, tiny_mnist, write_idx

MNIST = ["--set", "data.dataset=mnist", "--set", "model.layers=[784, 10]"]


def _mnist(tmp: Path, **corrupt) -> list[str]:
    tiny_mnist(tmp, **corrupt)
    return MNIST + ["--set", f"data.path={tmp}"]


def _mismatch(tmp: Path) -> list[str]:
    tiny_mnist(tmp)
    write_idx(tmp / "t10k-labels-idx1-ubyte", np.zeros(39))
    return MNIST + ["--set", f"data.path={tmp}"]


def _images(tmp: Path, broken: bool = False, empty: bool = False) -> list[str]:
    if empty:
        (tmp / "cats").mkdir()
    else:
        make_images(tmp)
    if broken:
        (tmp / "dog" / "broken.png").write_bytes(b"\x89PNG but not really")
    return ["--set", "data.dataset=image-folder", "--set", f"data.path={tmp}",
            "--set", "data.image_size=[4, 4]", "--set", "model.layers=[16, 3]"]


def _bad_toml(tmp: Path) -> list[str]:
    (tmp / "bad.toml").write_text("[train]\nepochs = = 3\n")
    return ["--config", str(tmp / "bad.toml")]


TABLE = [
    ("unknown key", lambda t: ["--set", "data.colour=red"], "unknown key 'data.colour'"),
    ("wrong type", lambda t: ["--set", "train.epochs=many"], "train.epochs = 'many'"),
    ("negative lr", lambda t: ["--set", "optim.lr=-1"], "optim.lr = -1.0"),
    ("zero lr", lambda t: ["--set", "optim.lr=0"], "optim.lr = 0.0"),
    ("batch size 0", lambda t: ["--set", "train.batch_size=0"], "train.batch_size = 0"),
    ("unknown activation", lambda t: ["--set", "model.activation=gelu"], "model.activation = 'gelu'"),
    ("unknown loss", lambda t: ["--set", "model.loss=hinge"], "model.loss = 'hinge'"),
    ("unknown strategy", lambda t: ["--set", "graph.strategy=ring"], "graph.strategy = 'ring'"),
    ("input size", lambda t: ["--set", "model.layers=[5, 8, 3]"],
     "model.layers[0] = 5 but iris has 4 input features"),
    ("output size", lambda t: ["--set", "model.layers=[4, 8, 2]"],
     "model.layers[-1] = 2 but iris has 3 classes"),
    ("too many shards", lambda t: ["--set", "data.shards=500"],
     "data.shards = 500 but there are only 105 training samples"),
    ("missing config", lambda t: ["--config", str(t / "nope.toml")], "nope.toml not found"),
    ("unparsable config", _bad_toml, "is not valid TOML"),
    ("missing data dir", lambda t: MNIST + ["--set", f"data.path={t}/gone"],
     "MNIST directory {t}/gone not found"),
    ("bad IDX magic", lambda t: _mnist(t, magic=b"\x00\x00\x09\x03"), "bad magic number 00000903"),
    ("truncated IDX", lambda t: _mnist(t, cut=1000), "truncated: header promises"),
    ("count mismatch", _mismatch, "has 40 images but"),
    ("empty image folder", lambda t: _images(t, empty=True), "0 class folder(s) with images"),
    ("unreadable image", lambda t: _images(t, broken=True), "cannot read image"),
    ("zero workers", lambda t: ["--workers", "0"], "--workers 0: needs at least 1 worker"),
    ("unreachable scheduler", lambda t: ["--scheduler-address", "tcp://127.0.0.1:9",
                                         "--set", "cluster.timeout=2"],
     "cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 2 s"),
    ("resume nothing", lambda t: ["--resume", str(t / "none")], "no config.toml there"),
    ("parameter server alone", lambda t: ["--set", "graph.strategy=parameter-server",
                                          "--workers", "1"], "needs 2 workers"),
    ("GPU where there is none", lambda t: ["--set", "cluster.device=gpu"],
     "cluster.device = 'gpu' but there is no GPU here: CuPy"),
    ("model-parallel, no hidden layer", lambda t: ["--set", "graph.strategy=model-parallel",
                                                   "--set", "model.layers=[4, 3]"],
     "splits hidden layers, but model.layers = [4, 3] has none"),
    ("more slices than units", lambda t: ["--set", "graph.strategy=model-parallel",
                                          "--set", "graph.slices=20"],
     "graph.slices = 20 but the narrowest split layer has 16 units"),
]


@pytest.mark.parametrize("make_args, message", [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_bad_input(tmp_path, make_args, message):
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "run"
    args = make_args(data)
    proc = run_cli(*args, *([] if "--resume" in args else ["--out", str(out)]),
                   "--dashboard-address", "127.0.0.1:0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dtrain: error: ")
    assert message.format(t=data) in lines[0], lines[0]
    assert not (out / "summary.json").exists() and not (out / "params.npz").exists()
