"""A window as the engine's builder makes it, run in this process: the passes' tests
(test_passes.py, test_span.py, test_spans.py) start from it, through
dtrain.taskgraph.passes.optimize as the engine submits a window."""
from __future__ import annotations

RUN = "t0"      # the run id of those windows' keys


def built(sets=(), workers=("w0",), steps=range(14), val=True):
    """The plan of ``sets`` (iris, 2 epochs, by default) and the window its builder makes of
    ``steps`` on ``workers`` (one thread each), from the plan's initial state, its inputs
    named as the builder names its loading tasks: what the engine hands the passes."""
    from dask.task_spec import TaskRef

    from dtrain.core import keys
    from dtrain.core.config import load_config
    from dtrain.taskgraph.placement import Worker
    from dtrain.training.plan import plan

    p = plan(load_config(None, ["train.epochs=2", *sets]))
    placement = p.builder.place([Worker(w, False, 1.0, 2) for w in workers])
    refs = [TaskRef(keys.make(*item.name, run=RUN)) for item in p.builder.data(placement)]
    held = TaskRef(keys.make(keys.LOAD_VAL, run=RUN)) if val else None
    return p, p.builder.window([p.schedule[t] for t in steps], p.initial_state(), refs, held,
                               placement, RUN)


def inputs(p) -> dict:
    """What a window of plan ``p`` reads from outside it: each shard and the validation
    rows, loaded here, by key."""
    from dtrain.core import keys
    from dtrain.data.shards import load_part, load_shard

    shards = {keys.make(keys.LOAD_SHARD, i, run=RUN): load_shard(s)
              for i, s in enumerate(p.sources)}
    return {**shards, keys.make(keys.LOAD_VAL, run=RUN): load_part(
        p.config.data, "val", p.config.model.dtype, norm=p.norm)}


def run_here(win, values) -> dict:
    """Run a window's graph in this process, each task after its inputs; every value by key
    (``values``: its inputs)."""
    from dtrain.taskgraph import fuse

    cache = dict(values)
    for key in fuse.in_order(win.dsk):
        cache[key] = win.dsk[key](cache)
    return cache
