"""dtrain.deploy.runtime: a worker process's dtrain state in one object, held by a worker
plugin, made part by part and closed with the worker."""
from __future__ import annotations

import threading

from distributed import Client, LocalCluster

import dtrain
from dtrain.deploy import p2p, runtime
from dtrain.deploy.runtime import Runtime
from dtrain.taskgraph import handoff


def test_a_part_is_made_once_and_closed_with_the_runtime():
    made, closed = [], []

    class Part:
        def __init__(self):
            made.append(self)

        def close(self):
            closed.append(self)

    rt = Runtime()
    parts = [None] * 8

    def ask(i):
        parts[i] = rt.part("x", Part)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(p is made[0] for p in parts)
    assert rt.part("y", list) == [] and rt.parts() == ["x", "y"]
    assert rt.find("x") is made[0] and rt.find("z") is None and "z" not in rt.parts()
    rt.close()
    assert closed == made and rt.parts() == []


def _state(dask_worker):
    plugin = dask_worker.plugins.get(runtime.NAME)
    rt = getattr(plugin, "runtime", None)
    return {"held": rt is runtime.here(), "parts": sorted(runtime.here().parts()),
            "meshes": len(p2p.open_nodes()),
            "kept": len(handoff._kept().states) if "kept" in runtime.here().parts() else 0}


def test_a_runs_worker_state_lives_in_the_plugins_runtime(tmp_path):
    """While a run spans two worker processes, each worker's plugin holds the process's
    runtime, with the parts its windows use (a mesh among them); when the run ends dtrain's
    plugins leave the user's cluster and the runtime closes: no mesh, no kept state."""
    during = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:

        def echo(line: str) -> None:
            if line.startswith("epoch 2/") and not during:
                during.update(c.run(_state))

        dtrain.train(dtrain.load_config(None, ["train.epochs=6", "cluster.layout=flat",
                                               "graph.window=4"]),
                     client=c, out=tmp_path / "r", echo=echo)
        after = c.run(_state)
    assert len(during) == 2
    for got in during.values():
        assert got["held"] and {"runs", "kept", "p2p", "links"} <= set(got["parts"]), got
        assert got["meshes"] == 1
    assert all(got == {"held": False, "parts": [], "meshes": 0, "kept": 0}
               for got in after.values()), after
