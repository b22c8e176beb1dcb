"""A window as the engine's builder makes it, run in this process: the passes' tests
(test_passes.py, test_span.py, test_spans.py) start from it, through
dtrain.taskgraph.passes.optimize as the engine submits a window; a window cut across
workers runs here over a mesh of real sockets, a thread per worker."""
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


def cut_over_mesh(p, win, workers, **options):
    """``win`` (of plan ``p``, steps 0-13) through the passes as the engine submits it, cut
    over a mesh of real sockets in this process whose ranks follow ``workers``: what the
    passes made of it (``options``: more of :class:`~dtrain.taskgraph.passes.Options`), and
    each worker's node."""
    import numpy as np

    from dtrain.deploy import p2p
    from dtrain.taskgraph import passes

    run, secret = p2p.new_run()
    nodes = {w: p2p.Node(run, secret, r, "127.0.0.1", None, None, True)
             for r, w in enumerate(workers)}
    mesh = p2p.Mesh(run, tuple(workers), tuple(nodes[w].place for w in workers))

    def ours(participants):
        assert set(participants) == set(workers)
        return mesh

    itemsize = np.dtype(p.net.dtype).itemsize
    opts = passes.Options(RUN, 0, 14, itemsize=itemsize, timeout=10.0, mesh=ours, **options)
    return passes.optimize(win, opts), nodes


def run_pieces(cut, nodes, cache, wait):
    """Each worker's task of a cut window in a thread of its own (they talk over the mesh),
    its value into ``cache``; what each that failed raised."""
    import threading

    from dtrain.taskgraph import span

    errors = {}

    def piece(name):
        task = cut.dsk[name]
        try:
            cache[name] = span.run_on(nodes[cut.where[name][0]], task.args[0],
                                      *(cache[a.key] for a in task.args[1:]))
        except Exception as exc:
            errors[name] = exc

    threads = [threading.Thread(target=piece, args=(n,)) for n in cut.pieces]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait)
    return errors


def run_cut(cut, nodes, values):
    """Run a cut window here: each worker's task, then the picks and the meta."""
    cache = dict(values)
    errors = run_pieces(cut, nodes, cache, 60)
    try:
        if errors:
            raise next(iter(errors.values()))
        for key in cut.dsk:
            if key not in cut.pieces:
                cache[key] = cut.dsk[key](cache)
        return cache
    finally:
        for n in nodes.values():
            n.close()
