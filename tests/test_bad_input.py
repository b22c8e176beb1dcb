"""The bad-input table: each mistake gets one line naming it, exit code 2, no traceback,
and nothing that looks like a finished run.  Rows run in this process, through the command
line's own entry point (``dtrain.cli.main``), with everything written to the process's
stdout and stderr captured; rows marked :class:`Mpiexec` run as an MPI job (``mpiexec -n N
python -m dtrain --scheduler-rank 0``): there every rank must end, within seconds, with the
one line printed once, by the head, before any cluster starts.  (``python -m dtrain`` itself
is run in a fresh process by the CLI tests.)"""
from __future__ import annotations

import importlib.util
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import dtrain
from dtrain import cli
from helpers import mpirun
from helpers.datafiles import make_images, tiny_mnist, write_idx

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


_CONV = ["--set", "model.layers=[{conv = 2, kernel = 3}, {pool = 'max', size = 2}, 'flatten', "
         "72, 3]", "--set", "model.input_shape=[1, 14, 14]"]


def _images_of_another_shape(tmp: Path) -> list[str]:
    """A convolutional net for 14x14 grey images, on colour ones of 14x14."""
    make_images(tmp)
    return ["--set", "data.dataset=image-folder", "--set", f"data.path={tmp}",
            "--set", "data.image_size=[14, 14]", "--set", "data.grayscale=false", *_CONV]


def _csv(tmp: Path, text: str) -> list[str]:
    (tmp / "data.csv").write_text(text)
    return ["--set", "data.dataset=csv", "--set", f"data.path={tmp / 'data.csv'}"]


def _stray_parquet(tmp: Path) -> list[str]:
    """Two Parquet files of a dataset and a stray one of another in the same glob."""
    import pandas as pd

    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0], "label": [0, 1]})
    frame.to_parquet(tmp / "part-0.parquet")
    frame.to_parquet(tmp / "part-1.parquet")
    frame.rename(columns={"b": "c"}).to_parquet(tmp / "part-2.parquet")
    return ["--set", "data.dataset=parquet", "--set", f"data.path={tmp}/part-*.parquet",
            "--set", "model.layers=[2, 3]"]


def _bad_toml(tmp: Path) -> list[str]:
    (tmp / "bad.toml").write_text("[train]\nepochs = = 3\n")
    return ["--config", str(tmp / "bad.toml")]


def _finished(tmp: Path) -> list[str]:
    """--resume of a run that finished (a serial one: no cluster needed to make it)."""
    dtrain.train(dtrain.load_config(None, ["train.epochs=1", "graph.strategy=serial"]),
                 out=tmp / "done", echo=None)
    assert (tmp / "done" / "summary.json").exists()
    return ["--resume", str(tmp / "done")]


def _out_on_finished(tmp: Path) -> list[str]:
    """--out naming the directory of a finished run."""
    return ["--out", _finished(tmp)[1]]


def _out_on_file(tmp: Path) -> list[str]:
    (tmp / "notes.txt").write_text("mine\n")
    return ["--out", str(tmp / "notes.txt")]


def _out_on_other_files(tmp: Path) -> list[str]:
    (tmp / "photos").mkdir()
    (tmp / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    return ["--out", str(tmp / "photos")]


@dataclass(frozen=True)
class Mpiexec:
    """A row launched as an MPI job of ``ranks`` ranks, with ``env`` added to its
    environment; called like the other rows' argument makers."""

    ranks: int
    make_args: Callable[[Path], list[str]] = lambda t: []
    env: dict[str, str] = field(default_factory=dict)

    def __call__(self, tmp: Path) -> list[str]:
        return self.make_args(tmp)


_GPU = ["--set", "cluster.device=gpu"]


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
    ("MPI wire off MPI", lambda t: ["--workers", "2", "--set", "cluster.layout=flat",
                                    "--set", "cluster.p2p=mpi"],
     "cluster.p2p = 'mpi' needs workers that are ranks of dtrain's own MPI job"),
    ("negative workers", lambda t: ["--workers", "-1"],
     "--workers -1: give a number of workers, or 0 for as many as cluster.layout says"),
    ("unreachable scheduler", lambda t: ["--scheduler-address", "tcp://127.0.0.1:9",
                                         "--set", "cluster.timeout=2"],
     "cannot reach the Dask scheduler at tcp://127.0.0.1:9: nothing listens on port 9"),
    ("scheduler address without a port", lambda t: ["--scheduler-address", "10.0.0.5"],
     "cluster.scheduler_address = '10.0.0.5': needs a host and a port, e.g. tcp://10.0.0.5:8786"),
    ("scheduler address over http", lambda t: ["--scheduler-address", "http://127.0.0.1:8787"],
     "unknown scheme 'http://'; a scheduler's address looks like tcp://HOST:8786"),
    ("unknown host", lambda t: ["--scheduler-address", "tcp://no-such-host.invalid:8786"],
     "unknown host 'no-such-host.invalid'"),
    ("--out names a file", _out_on_file, "notes.txt is a file, not a directory"),
    ("--out names a finished run", _out_on_finished,
     "done holds a finished run; give a new directory, train it longer with --resume"),
    ("--out names a folder of other files", _out_on_other_files,
     "photos is not empty and holds no dtrain run; give a new or empty directory"),
    ("--force with --resume", lambda t: ["--resume", str(t), "--force"],
     "--force with --resume"),
    ("--set with a space", lambda t: ["--set", "train.epochs", "5"],
     "--set train.epochs 5: write KEY=VALUE, without spaces: --set train.epochs=5"),
    ("a misspelt command", lambda t: ["reprot", str(t)],
     "unknown command 'reprot'; did you mean `python -m dtrain report`?"),
    ("resume nothing", lambda t: ["--resume", str(t / "none")], "no config.toml there"),
    ("parameter server alone", lambda t: ["--set", "graph.strategy=parameter-server",
                                          "--workers", "1"], "needs 2 workers"),
    ("GPU where there is none", lambda t: _GPU,
     "cluster.device = 'gpu' but there is no GPU here: CuPy"),
    ("too few MPI ranks", Mpiexec(1),
     "graph.strategy = 'allreduce' needs 2 MPI ranks (the head + 1 worker), found 1; start "
     "it with mpirun -n 2 or more"),
    # the slow tier: mpiexec jobs of 2 or 3 ranks (the fast tier keeps the one above)
    pytest.param("too few MPI ranks for a parameter server",
                 Mpiexec(2, lambda t: ["--set", "graph.strategy=parameter-server"]),
                 "needs 3 MPI ranks (the head + a parameter-server worker + 1 trainer), found 2",
                 marks=pytest.mark.slow),
    pytest.param("GPU where there is none, under mpirun",
                 Mpiexec(3, lambda t: _GPU, env={"CUDA_VISIBLE_DEVICES": ""}),
                 "cluster.device = 'gpu' but none of the 2 worker rank(s) has a GPU it can use "
                 "(ranks 1, 2 on {host}: no GPU visible (CUDA_VISIBLE_DEVICES='')); start the "
                 "worker ranks on GPU nodes", marks=pytest.mark.slow),
    pytest.param("GPU listed but no CuPy, under mpirun",
                 Mpiexec(3, lambda t: _GPU, env={"CUDA_VISIBLE_DEVICES": "0"}),
                 "has a GPU it can use (ranks 1, 2 on {host}: GPU 0 visible but CuPy cannot "
                 "be imported", marks=[pytest.mark.slow, pytest.mark.skipif(
                     importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")]),
    pytest.param("resume a finished run, under mpirun", Mpiexec(3, _finished),
                 "already finished its 1 epoch; to train it longer: --resume",
                 marks=pytest.mark.slow),
    ("CSV of one column", lambda t: _csv(t, "5.1 3.5 1.4 0.2 setosa\n4.9 3.0 1.4 0.2 setosa\n"),
     "parses to one column with delimiter ',': set data.delimiter to the file's separator"),
    ("Parquet files of different columns", _stray_parquet,
     "part-2.parquet lacks columns 'b' that {t}/part-0.parquet has; every file of the glob "
     "must have the same columns"),
    ("model-parallel, no hidden layer", lambda t: ["--set", "graph.strategy=model-parallel",
                                                   "--set", "model.layers=[4, 3]"],
     "splits hidden layers, but model.layers = [4, 3] has none"),
    ("a kernel larger than its input", lambda t: [
        "--set", "model.layers=[{conv = 2, kernel = 5}, 'flatten', 2, 3]",
        "--set", "model.input_shape=[1, 2, 2]"],
     "model.layers[0] = {{conv = 2, kernel = 5, stride = 1, padding = 0}}: its 5x5 kernel is "
     "larger than its 2x2 input"),
    ("images of another shape than model.input_shape", _images_of_another_shape,
     "model.input_shape = [1, 14, 14] but the images in {t} are [3, 14, 14] (channels, height, "
     "width: data.image_size, data.grayscale); set model.input_shape = [3, 14, 14]"),
    ("dense sizes on images", lambda t: ["--set", "model.layers=[{conv = 2, kernel = 1}, 8, 3]",
                                         "--set", "model.input_shape=[1, 2, 2]"],
     "model.layers[1] = 8 is a dense size but its input is 2x2x2 images: put 'flatten' "
     "before it"),
    ("model-parallel, a convolution", lambda t: [
        "--set", "graph.strategy=model-parallel", *_CONV[:2], "--set",
        "model.input_shape=[1, 2, 2]", "--set", "model.layers=[{conv = 2, kernel = 1}, "
        "'flatten', 8, 3]"],
     "graph.strategy = 'model-parallel' splits dense layers only"),
    ("more slices than units", lambda t: ["--set", "graph.strategy=model-parallel",
                                          "--set", "graph.slices=20"],
     "graph.slices = 20 but the narrowest split layer has 16 units"),
]


def _params(row) -> object:
    """``pytest.param(make_args, message)`` of a row, named by it, MPI rows marked ``mpi``."""
    if hasattr(row, "marks"):                            # already a pytest.param
        name, make_args, message = row.values
        marks = list(row.marks)
    else:
        (name, make_args, message), marks = row, []
    if isinstance(make_args, Mpiexec):
        marks.append(pytest.mark.mpi)
    return pytest.param(make_args, message, id=name, marks=marks)


@pytest.mark.parametrize("make_args, message", [_params(row) for row in TABLE])
def test_bad_input(tmp_path, make_args, message, capfd):
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "run"
    args = make_args(data)
    args = [*args, *([] if {"--resume", "--out"} & set(args) else ["--out", str(out)]),
            "--dashboard-address", "127.0.0.1:0"]
    if isinstance(make_args, Mpiexec):
        proc = mpirun.run(make_args.ranks, *args, timeout=60, env=make_args.env)
        assert proc.seconds < 30, proc.seconds
        assert proc.stdout == "", proc.stdout    # no rank started anything (no scheduler line)
        assert not out.exists()
    else:
        code = cli.main(args)
        seen = capfd.readouterr()              # file descriptors: logging's too
        proc = SimpleNamespace(returncode=code, stdout=seen.out, stderr=seen.err)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr                  # under mpiexec: once, by the head
    assert lines[0].startswith("dtrain: error: ")
    assert message.format(t=data, host=socket.gethostname()) in lines[0], lines[0]
    assert not (out / "summary.json").exists() and not (out / "params.npz").exists()
