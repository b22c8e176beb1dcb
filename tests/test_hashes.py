"""The bytes are locked: ``params.npz`` of a fixed set of runs has the SHA-256 in
``params_sha256.json``, on 1 and 3 workers (2 and 3 for the parameter server).

The list was recorded before the package was re-laid out (issue 20) and every change since
has kept it.  A change that means to alter the bits (new maths, a new default) rewrites it
with ``python tests/test_hashes.py --write`` and says why in its commit.

OpenBLAS picks its kernels by CPU (``SkylakeX`` on AVX-512 machines, ``Haswell`` on AVX2
ones) and they round differently, so the lock is computed with the kernels pinned
(:data:`PINNED`), in a process of its own whose workers inherit the pinning: the same bytes
on any x86-64 machine with AVX2.  (Within one machine dtrain's bytes never depend on the
worker count; that is tested unpinned elsewhere.)
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
PINNED = {"OPENBLAS_CORETYPE": "Haswell",
          "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL "
                                      "AVX512_ICL AVX512_SPR"}
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
}
DTYPES = ("float32", "float64")


def _hashes(workers: int, tmp: Path) -> dict[str, str]:
    """Train every run on one LocalCluster of ``workers`` processes (in this process)."""
    from distributed import Client, LocalCluster

    import dtrain

    def sha(client: Client, name: str, dtype: str) -> str:
        out = tmp / f"{name}-{dtype}-{workers}"
        cfg = dtrain.load_config(None, [*BASE, *RUNS[name], f"model.dtype={dtype}"])
        dtrain.train(cfg, client=client, echo=None, out=out)
        return hashlib.sha256((out / "params.npz").read_bytes()).hexdigest()

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as client:
        return {f"{name}/{dtype}": sha(client, name, dtype)
                for name in RUNS for dtype in DTYPES
                if workers > 1 or name != "parameter-server"}


def pinned_hashes(workers: int) -> dict[str, str]:
    """:func:`_hashes` in a fresh process with OpenBLAS's and NumPy's kernels pinned."""
    done = subprocess.run([sys.executable, __file__, "--print", str(workers)],
                          env={**os.environ, **PINNED}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_params_bytes_are_locked(workers):
    locked = json.loads(LOCK.read_text())
    assert set(locked) == {f"{n}/{d}" for n in RUNS for d in DTYPES}
    got = pinned_hashes(workers)
    if workers == 2:                    # the parameter server's other worker count
        got = {k: v for k, v in got.items() if k.startswith("parameter-server/")}
    changed = {k: (locked[k][:12], v[:12]) for k, v in got.items() if locked[k] != v}
    assert not changed, f"params.npz changed on {workers} worker(s): {changed}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        LOCK.write_text(json.dumps(dict(sorted(pinned_hashes(3).items())), indent=1) + "\n")
        print(f"wrote {LOCK}")
    elif sys.argv[1:2] == ["--print"]:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(_hashes(int(sys.argv[2]), Path(tmp))))
