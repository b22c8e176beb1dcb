"""The bytes are locked: ``params.npz`` of a fixed set of runs has the SHA-256 in
``params_sha256.json``, on 1 and 3 workers (2 and 3 for the parameter server).

A change keeps these bytes unless it means to alter them (new maths, a new default); such a
change rewrites the list with ``python tests/test_hashes.py --write`` and says why in its
commit.

Two libraries pick their kernels by CPU, and the kernels round differently, so the lock is
computed with both pinned (:data:`PINNED`) to what every x86-64 machine with AVX2 (and FMA,
which comes with it) runs, in a process of its own whose workers inherit the pinning; the
process fails unless the pinning took (:func:`check_pinned`):

* OpenBLAS (``OPENBLAS_CORETYPE=Haswell``): ``SkylakeX`` kernels on AVX-512 machines,
  ``Haswell`` (or ``Zen``) ones on AVX2 machines.
* NumPy's dispatch (``NPY_DISABLE_CPU_FEATURES``: every AVX-512 target this NumPy has,
  ``X86_V4 AVX512_ICL AVX512_SPR`` from NumPy 2.4 on, ``AVX512F AVX512_SKX ...`` before).
  Its AVX-512 targets have float64 ``exp``, ``log``, ``expm1``, ``log1p`` (and float32
  ``expm1``, ``log1p``) of their own; its AVX2 target (``X86_V3``) calls the C library's
  float64 ones, glibc's FMA variants on every CPU with AVX2 and FMA (its SSE2 ones round
  ``exp`` differently; not pinned, as no AVX2 CPU lacks FMA).  Float32 ``exp``, ``log``
  and ``tanh`` of both targets agree.

Why the names follow the NumPy installed: NumPy ignores target names it does not know (an
ImportWarning, silent by default), and a pinning that did not take would leave AVX-512
machines their own float64 ``exp`` and ``log``, so that an AVX2-only machine (an AMD EPYC)
gives other bytes for every float64 run with a softmax.  The lock is what AVX2 machines compute; the float32 runs and
the relu/MSE float64 one (no ``exp`` or ``log``) are the same either way.

Checked: natively on an AMD EPYC with AVX-512 (Zen 4; Debian 12's glibc 2.36, NumPy 2.4.6,
its OpenBLAS 0.3.31), and on AVX2-only CPUs emulated in user mode (qemu 7.2:
``qemu-x86_64 -cpu Haswell-v1``, ``Skylake-Client-v1``, ``EPYC-Rome``, ``EPYC-Milan``, with
:data:`PINNED` set, ``python tests/test_hashes.py --print 1 threads``, and the parameter
server on two threaded workers with ``graph.fuse_steps=false``): the same bytes.  (Within
one machine dtrain's bytes never depend on the worker count; that is tested unpinned
elsewhere.)
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

LOCK = Path(__file__).with_name("params_sha256.json")


def _avx512_targets() -> str:
    """NumPy's AVX-512 dispatch targets, by this NumPy's names."""
    from numpy._core._multiarray_umath import __cpu_dispatch__
    return " ".join(t for t in __cpu_dispatch__ if t == "X86_V4" or t.startswith("AVX512"))


PINNED = {"OPENBLAS_CORETYPE": "Haswell", "NPY_DISABLE_CPU_FEATURES": _avx512_targets()}
BASE = ["train.epochs=3", "data.shards=4", "train.batch_size=16"]
RUNS: dict[str, list[str]] = {          # name -> --set overrides on BASE
    "allreduce": [],
    "parameter-server": ["graph.strategy=parameter-server"],
    "local-sgd": ["graph.strategy=local-sgd"],
    "model-parallel": ["graph.strategy=model-parallel"],
    "serial": ["graph.strategy=serial"],
    "allreduce-adam-root": ["optim.name=adam", "optim.lr=0.01", "graph.update=root"],
    "allreduce-momentum-step-unfused": ["optim.name=momentum", "optim.schedule=step",
                                        "optim.decay_every=1", "graph.fuse_shards=false",
                                        "model.l2=0.001"],
    "allreduce-relu-mse-fanin3": ["model.activation=relu", "model.loss=mse", "graph.fan_in=3",
                                  "data.shards=5"],
    "digits-deep-allreduce": ["data.dataset=digits", "model.layers=[64,32,16,10]",
                              "data.shards=6", "train.batch_size=64"],
    "digits-deep-model-parallel": ["data.dataset=digits", "model.layers=[64,32,16,10]",
                                   "graph.strategy=model-parallel", "graph.slices=3",
                                   "train.batch_size=64"],
    "local-sgd-adam-sync2": ["graph.strategy=local-sgd", "graph.sync_every=2",
                             "optim.name=adam", "optim.lr=0.01"],
    "digits-conv-dropout": ["data.dataset=digits", "model.input_shape=[1, 8, 8]",     # issue 52
                            "model.layers=[{conv = 4, kernel = 3, padding = 1}, "
                            "{pool = 'max', size = 2}, 'flatten', 64, {dropout = 0.25}, 10]",
                            "model.activation=relu", "data.shards=6", "train.batch_size=64"],
}
DTYPES = ("float32", "float64")


def check_pinned() -> None:
    """Fail unless this process runs OpenBLAS's Haswell kernels and none of NumPy's AVX-512
    ones (a pin NumPy or OpenBLAS ignores must not pass unseen)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    from threadpoolctl import threadpool_info

    on = [t for t in __cpu_dispatch__
          if __cpu_features__.get(t) and (t == "X86_V4" or t.startswith("AVX512"))]
    blas = {i.get("architecture") for i in threadpool_info() if i["internal_api"] == "openblas"}
    assert not on and blas == {"Haswell"}, f"not pinned: NumPy runs {on}, OpenBLAS {blas}"


def _hashes(workers: int, tmp: Path, processes: bool = True, only: str = ""
            ) -> dict[str, str]:
    """Train every run (whose name starts with ``only``) on one LocalCluster of ``workers``
    processes (in this process), or where not ``processes`` of ``workers`` threads of this
    process, which user-mode emulation covers too (``qemu-x86_64 -cpu Haswell-v1 python
    tests/test_hashes.py --print 1 threads``; one worker only: a window across workers
    needs their p2p mesh, one per process)."""
    from distributed import Client, LocalCluster

    import dtrain

    def sha(client: Client, name: str, dtype: str) -> str:
        out = tmp / f"{name}-{dtype}-{workers}"
        cfg = dtrain.load_config(None, [*BASE, *RUNS[name], f"model.dtype={dtype}"])
        dtrain.train(cfg, client=client, echo=None, out=out)
        return hashlib.sha256((out / "params.npz").read_bytes()).hexdigest()

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                      dashboard_address=None) as lc, Client(lc) as client:
        return {f"{name}/{dtype}": sha(client, name, dtype)
                for name in RUNS for dtype in DTYPES
                if (workers > 1 or name != "parameter-server") and name.startswith(only)}


def pinned_hashes(workers: int, only: str = "") -> dict[str, str]:
    """:func:`_hashes` in a fresh process with OpenBLAS's and NumPy's kernels pinned."""
    done = subprocess.run([sys.executable, __file__, "--print", str(workers), "processes",
                           only],
                          env={**os.environ, **PINNED}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_params_bytes_are_locked(workers):
    locked = json.loads(LOCK.read_text())
    assert set(locked) == {f"{n}/{d}" for n in RUNS for d in DTYPES}
    # 2: the parameter server's other worker count (every other run's bytes at 2 workers
    # are the fast tier's, unpinned)
    got = pinned_hashes(workers, "parameter-server" if workers == 2 else "")
    assert got and all(k in locked for k in got)
    changed = {k: (locked[k][:12], v[:12]) for k, v in got.items() if locked[k] != v}
    assert not changed, f"params.npz changed on {workers} worker(s): {changed}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        LOCK.write_text(json.dumps(dict(sorted(pinned_hashes(3).items())), indent=1) + "\n")
        print(f"wrote {LOCK}")
    elif sys.argv[1:2] == ["--print"]:
        check_pinned()
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(_hashes(int(sys.argv[2]), Path(tmp), sys.argv[3:4] != ["threads"],
                                     *sys.argv[4:5])))
