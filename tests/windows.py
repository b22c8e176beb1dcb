"""Build a window the way the engine does, and run it in this process: what the graph passes'
tests (tests/test_passes.py, tests/test_span.py) start from."""
from __future__ import annotations

from dask.task_spec import TaskRef

from dtrain.core.config import load_config
from dtrain.data.shards import load_part, load_shard
from dtrain.taskgraph import fuse
from dtrain.taskgraph.placement import Worker
from dtrain.training.plan import plan

RUN = "t0"


def window(sets=(), workers=("w0",), steps=range(14), val=True):
    p = plan(load_config(None, ["train.epochs=2", *sets]))
    placement = p.builder.place([Worker(w, False, 1.0, 2) for w in workers])
    refs = [TaskRef(f"load-shard-{i}-{RUN}") for i in range(len(p.ranges))]
    win = p.builder.window([p.schedule[t] for t in steps], p.initial_state(), refs,
                           TaskRef(f"load-val-{RUN}") if val else None, placement, RUN)
    return p, win


def run(win, p, values):
    """Run a window's graph in this process, in an order that respects its edges."""
    cache = dict(values)
    for key in fuse.in_order(win.dsk):
        cache[key] = win.dsk[key](cache)
    return cache


def inputs(p):
    shards = {f"load-shard-{i}-{RUN}": load_shard(s) for i, s in enumerate(p.sources)}
    return {**shards, f"load-val-{RUN}": load_part(p.config.data, "val", p.config.model.dtype,
                                                    norm=p.norm)}

