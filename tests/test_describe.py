"""Described windows (dtrain.taskgraph.describe on the driver, dtrain.taskgraph.expand on the
workers): their structure, what the driver's work grows with, the chains the workers
build, a description a worker cannot read, and the bytes against the step-by-step graph."""
from __future__ import annotations

import json
import time

import pytest
from distributed import Client, LocalCluster

import dtrain
from dtrain.deploy import p2p
from dtrain.taskgraph import collective, describe, expand, handoff
from dtrain.taskgraph.expand import DescriptionError, Described, Description
from dtrain.training.plan import plan
from helpers.transfers import assert_moved_as_predicted

SETS = ["train.epochs=2", "data.shards=8", "train.batch_size=16"]


def _layout(workers: int, sets=(), one_machine=True):
    p = plan(dtrain.load_config(None, [*SETS, *sets]))
    names = [f"tcp://10.0.0.{i}:1" for i in range(workers)]
    placement = p.builder.place(names)
    mesh = p2p.Mesh("m", tuple(names), (p2p.Place("", 0),) * workers)
    lay = describe.layout(p.recipe, placement, one_machine, mesh.workers)
    return p, placement, mesh, lay


def _window(lay, p, first, last, start=None):
    return describe.window(first, last, "r", lay, [f"context-0-{r}-r" for r in range(len(lay.workers))],
                           start or handoff.Handed("r", first), handoff.Handed("r", last + 1),
                           30.0, None, None, {}, p.recipe.state_bytes, (False, ""))


def test_a_window_is_a_task_per_worker_pinned_there_and_the_end_on_the_collector():
    p, placement, mesh, lay = _layout(4)
    win = _window(lay, p, 0, 99)
    assert win.pieces == tuple(f"window-0-99-w{r}-r" for r in range(4))
    assert [win.where[k][0] for k in win.pieces] == list(lay.workers)
    assert win.ends == ["kept-100-r"] and win.where["kept-100-r"] == [placement.root]
    assert win.meta == "kept-100-r" and win.end_in_meta    # the end brings the meta: one task
    assert all(win.dsk[k].dependencies == {f"context-0-{r}-r"} for r, k in enumerate(win.pieces))


def test_a_literal_state_is_one_node_every_worker_reads():
    p, placement, mesh, lay = _layout(3)
    state = p.initial_state()
    win = _window(lay, p, 5, 9, start=state)
    assert win.dsk["state-5-r"].value is state and win.where["state-5-r"] == [placement.root]
    assert all("state-5-r" in win.dsk[k].dependencies for k in win.pieces)


def test_the_driver_sends_the_same_few_hundred_bytes_whatever_the_steps():
    """The description of a window of 10 steps and of 100,000: the same few hundred bytes
    (but for the digits of the step numbers); the driver's work per window does not grow
    with its steps."""
    p, _, _, lay = _layout(4)
    sizes, nodes = {}, {}
    for last in (9, 99_999):
        win = _window(lay, p, 0, last)
        sizes[last] = len(win.dsk[win.pieces[0]].args[0].data)
        nodes[last] = sorted(k.replace(str(last), "L").replace(str(last + 1), "E")
                             for k in win.dsk)
    assert max(sizes.values()) < 512 and abs(sizes[9] - sizes[99_999]) <= 16
    assert nodes[9] == nodes[99_999] and len(nodes[9]) == len(lay.workers) + 1
    # (how long the driver takes per window: benchmarks.costacross.driver_seconds)


@pytest.mark.parametrize("workers", [2, 5])
def test_each_worker_builds_its_steps_and_the_collector_evaluates(workers):
    p, placement, mesh, lay = _layout(workers)
    made = describe.setups(p.recipe, p.schedule, placement, lay, mesh, None)
    spe = p.schedule.steps_per_epoch
    desc = Description("r", 0, 2 * spe - 1, handoff.Handed("r", 0), handoff.Handed("r", 2 * spe),
                       30.0)
    for w, setup, mine, held in made:
        ctx = expand.Context(setup, tuple(range(len(mine))), ())
        chain, to, frm = expand.chain(ctx, desc)
        keys = [k for k, _, _ in chain.nodes]
        assert keys[0] == "state-0-r" and keys[-1] == f"kept-{2 * spe}-r"
        updates = [k for k in keys if k.startswith("update-")]
        assert updates == [f"update-{t}-{mine[0]}-r" for t in range(2 * spe)]
        assert sum(k.startswith("allreduce-") for k in keys) == 2 * spe
        fb = [k for k in keys if k.startswith("forward-backward-")]
        assert len(fb) == 2 * spe * len(setup.program.made)
        evals = [k for k in keys if k.startswith("evaluate-")]
        here = setup.rank == lay.collector
        assert evals == (["evaluate-1-r", "evaluate-2-r"] if here else [])
        assert chain.outputs == ((f"kept-{2 * spe}-r", *evals) if here else ())
        assert (to, frm) == setup.program.peers()
        assert chain.inputs == tuple(f"shard-{s}" for s in mine)


def test_auto_makes_a_plain_sgd_update_where_its_sum_is_made():
    """graph.update = "auto" and plain SGD: each worker's setup says so, whatever the
    schedule; momentum, Adam or graph.update = "replicated": every worker updates whole."""
    for sets, where in (((), True), (["graph.update=replicated"], False),
                        (["optim.name=momentum"], False), (["optim.name=adam"], False)):
        p, placement, mesh, lay = _layout(4, sets)
        assert lay.where_made is where, sets
        made = describe.setups(p.recipe, p.schedule, placement, lay, mesh, None)
        assert all(setup.where_made is where for _, setup, _, _ in made)
        ctx = expand.Context(made[1][1], tuple(range(len(made[1][2]))), ())
        chain, _, _ = expand.chain(ctx, Description("r", 0, 3, handoff.Handed("r", 0),
                                                    handoff.Handed("r", 4), 30.0))
        fns = {fn.__name__ for _, fn, _ in chain.nodes}
        assert ("step_sum_update" in fns and "adopt_update" in fns) is where
        assert ("step_sum" in fns and "update_state" in fns) is not where


def test_the_schedule_depends_on_the_net_and_the_workers():
    assert _layout(4)[3].schedule == "doubling"                 # iris: 133 numbers
    assert _layout(4, ["model.layers=[4, 8192, 3]"])[3].schedule in collective.RADIX


def test_a_description_from_another_version_or_truncated_is_refused_in_one_line():
    desc = Description("r", 0, 9, None, handoff.Handed("r", 10), 30.0)
    good = Described.of(desc)
    assert expand.read(good, "w") == desc
    bad = {"format": Described(good.data[:4] + b"\x00\x09" + good.data[6:]),
           "truncated": Described(good.data[:-7]),
           "garbage": Described(b"not a description")}
    said = {}
    for name, d in bad.items():
        with pytest.raises(DescriptionError) as got:
            expand.read(d, "tcp://10.1.2.3:4567")
        said[name] = str(got.value)
    assert all("\n" not in s and "tcp://10.1.2.3:4567" in s for s in said.values())
    assert f"has format 9, this worker's dtrain reads format {expand.FORMAT}" in said["format"]
    assert f"truncated ({len(good.data) - 7 - 10} of {len(good.data) - 10} bytes)" in \
        said["truncated"]
    assert "not a dtrain window description" in said["garbage"]


@pytest.mark.slow
def test_a_run_whose_worker_cannot_build_its_window_fails_at_once_naming_it(monkeypatch,
                                                                             tmp_path):
    """The driver hands out truncated descriptions: the run fails with the worker's one line,
    at once (the peers stop too), not after retries or the peer timeout."""
    class Truncated(Described):
        @classmethod
        def of(cls, desc):
            return Described(Described.of(desc).data[:-5])

    monkeypatch.setattr(describe, "Described", Truncated)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        start = time.monotonic()
        with pytest.raises(DescriptionError, match=r"worker tcp://127\.0\.0\.1:\d+ cannot build "
                                                   r"its window: the description is truncated"):
            dtrain.train(dtrain.load_config(None, SETS), client=c, out=tmp_path / "r", echo=None)
        assert time.monotonic() - start < 30


def _bytes(c, name, sets, tmp_path):
    r = tmp_path / name
    dtrain.train(dtrain.load_config(None, [*SETS, *sets]), client=c, out=r, echo=None)
    return (r / "params.npz").read_bytes(), json.loads((r / "summary.json").read_text())


@pytest.mark.slow
def test_described_windows_give_the_step_by_step_bytes(tmp_path, monkeypatch):
    """4 worker processes: described windows, their step's sum by each schedule (forced on
    the driver, where the engine chooses it), every worker updating whole or (auto, plain
    SGD) each update made where its sum is, the step-by-step graph, cut windows with the
    update at the root, and one worker give the same bytes, and the described windows send
    what their programs say."""
    sets = ["model.layers=[4, 512, 3]", "train.epochs=3", "graph.update=replicated"]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        one, _ = _bytes(c, "one", sets, tmp_path)
    choose = collective.choose
    runs = {}
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        steps, plain = _bytes(c, "steps", [*sets, "graph.fuse_steps=false"], tmp_path)
        for schedule in (collective.DOUBLING, collective.HALVING, collective.HALVING4,
                         collective.TREE2, collective.TREE):
            monkeypatch.setattr(describe.collective, "choose",
                                lambda *a, s=schedule, **k: (s, choose(*a, **k)[1]))
            runs[schedule, False] = _bytes(c, schedule, sets, tmp_path)
            runs[schedule, True] = _bytes(c, f"{schedule}-made", [*sets, "graph.update=auto"],
                                          tmp_path)
        monkeypatch.undo()
        root, at_root = _bytes(c, "root", [*sets, "graph.update=root"], tmp_path)
    assert not at_root["update_where_summed"] and at_root["described_windows"] == 0
    assert at_root["spanned_windows"] > 0 and root == one
    assert plain["described_windows"] == 0 and steps == one
    for (schedule, made), (blob, summary) in runs.items():
        assert summary["described_windows"] > 0 and summary["step_sum"] == schedule
        assert summary["update_where_summed"] is made
        assert_moved_as_predicted(summary)     # (a loaded machine: a Dask re-fetch or two)
        assert blob == one, (schedule, made)
