"""Task-graph pictures: graphs/ is up to date, the CLI draws what the trainer submits."""
from __future__ import annotations

import html
import re
import shutil

import pytest

import dtrain
from conftest import REPO, run_cli
from dtrain.training import pictures

GRAPHS = REPO / "graphs"


@pytest.mark.parametrize("name", sorted(pictures.gallery()))
def test_graphs_folder_is_up_to_date(name):
    """The committed DOT source equals what the code draws today (pure Python, no `dot`)."""
    dot = pictures.gallery()[name]
    committed = GRAPHS / f"{name}.dot"
    assert committed.read_text() == dot.source, (
        f"graphs/{name}.dot is stale: run `python -m dtrain graph --gallery graphs`")
    assert (GRAPHS / f"{name}.svg").is_file()
    assert f"{name}.svg" in (GRAPHS / "README.md").read_text()


def _cluster(source: str, i: int) -> str:
    return re.search(rf"subgraph cluster_{i} {{(.*?)\n\t}}", source, re.S).group(1)


def test_a_workers_shards_are_one_task_in_its_box():
    cfg = dtrain.load_config(None, ["data.shards=8", "cluster.workers=4", "graph.fan_in=2",
                                    "graph.update=root"])
    source = pictures.step_graph(cfg).source
    for i in range(4):
        box = _cluster(source, i)
        nodes = set(re.findall(r'^\t\t"([\w-]+)" \[', box, re.M))
        assert {n for n in nodes if n.startswith("forward-backward")} == \
            {f"forward-backward-0-{2 * i}"}
        assert f"step 0, shards {2 * i}-{2 * i + 1}" in box
        assert not any(n.startswith("reduce-0-1-") for n in nodes)   # summed inside
    edges = set(re.findall(r'^\t"([\w-]+)" -> "([\w-]+)"$', source, re.M))
    assert ("forward-backward-0-2", "reduce-0-2-0") in edges
    assert ("load-shard-3", "forward-backward-0-2") in edges


def test_tasks_sit_in_their_workers_boxes():
    cfg = dtrain.load_config(None, ["data.shards=8", "cluster.workers=4", "graph.fan_in=2",
                                    "graph.update=root", "graph.fuse_shards=false"])
    source = pictures.step_graph(cfg).source
    boxes = [_cluster(source, i) for i in range(4)]
    for i, box in enumerate(boxes):                 # two shards per worker, in blocks
        nodes = set(re.findall(r'^\t\t"([\w-]+)" \[', box, re.M))
        fb = {n for n in nodes if n.startswith("forward-backward")}
        assert fb == {f"forward-backward-0-{2 * i}", f"forward-backward-0-{2 * i + 1}"}
        assert f"load-shard-{2 * i}" in nodes and f"reduce-0-1-{2 * i}" in nodes
    assert '"update-0"' in boxes[0] and '"state-0"' in boxes[0]
    assert '"reduce-0-2-4"' in boxes[2]
    edges = set(re.findall(r'^\t"([\w-]+)" -> "([\w-]+)"$', source, re.M))
    assert ("reduce-0-2-0", "update-0") in edges and ("reduce-0-2-4", "update-0") in edges
    assert ("state-0", "forward-backward-0-7") in edges
    assert 'fillcolor="#0072B2"' in source and "fan-in 2" in source


def test_replicated_updates_sit_on_every_worker():
    cfg = dtrain.load_config(None, ["data.shards=8", "cluster.workers=4", "graph.fan_in=2"])
    source = pictures.step_graph(cfg).source
    for i, box in enumerate(_cluster(source, w) for w in range(4)):
        nodes = set(re.findall(r'^\t\t"([\w-]+)" \[', box, re.M))
        assert f"update-0-{2 * i}" in nodes                   # this worker's copy of step 0
        assert {f"forward-backward-{s}-{2 * i}" for s in (0, 1)} <= nodes   # shards 2i, 2i+1
    edges = set(re.findall(r'^\t"([\w-]+)" -> "([\w-]+)"$', source, re.M))
    # step 1's maths reads the sum of step 0 directly, not an update task: the root level
    # summed once, on the root, for the 4 workers that read it
    assert ("reduce-0-3-0", "forward-backward-1-0") in edges
    assert ("reduce-0-2-4", "reduce-0-3-0") in edges
    assert not any(a == "reduce-0-2-4" and b.startswith("forward-backward-1-")
                   for a, b in edges)
    assert not any(a.startswith("update-0-") and b.startswith("forward-backward-1-")
                   for a, b in edges)
    assert "replicated updates" in source


def test_parameter_server_head_holds_no_shard():
    cfg = dtrain.load_config(None, ["graph.strategy=parameter-server", "data.shards=4",
                                    "cluster.workers=3"])
    head = _cluster(pictures.step_graph(cfg).source, 0)
    assert "head: reduce and update" in head and "forward-backward" not in head
    assert '"update-0"' in head


def test_graph_command_draws_svg(tmp_path):
    if shutil.which("dot") is None:
        pytest.skip("needs Graphviz's dot program (apt-get install graphviz)")
    out = tmp_path / "g.svg"
    proc = run_cli("graph", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    svg = html.unescape(out.read_text())
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    # iris: 4 shards on 2 workers, fan-in 2, replicated updates, two steps: 4 forward-backward
    # (each worker's two shards in one), no reduce (summed inside them), step 0's update on
    # both workers and step 1's on the root (+ the legend)
    counts = {t: svg.count(f">{t}</text>") for t in ("forward-backward", "reduce", "update")}
    assert counts == {"forward-backward": 5, "reduce": 0, "update": 4}


def test_graph_command_writes_dot_without_graphviz(tmp_path):
    out = tmp_path / "g.dot"
    proc = run_cli("graph", "--set", "graph.strategy=parameter-server", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith('digraph "dtrain-parameter-server"')


@pytest.mark.parametrize("args, message", [
    (["--set", "graph.strategy=serial", "--out", "x.svg"], "runs without a task graph"),
    (["--out", "x.jpg"], "--out x.jpg: unknown picture format '.jpg'"),
    (["--set", "graph.strategy=parameter-server", "--set", "cluster.workers=1", "--out",
      "x.svg"], "needs 2 workers"),
    (["--set", "graph.fan_in=1", "--out", "x.svg"], "graph.fan_in = 1"),
    (["--out", "no/such/dir/x.dot"], "cannot write no/such/dir/x.dot: No such file"),
])
@pytest.mark.slow
def test_graph_command_bad_input(tmp_path, args, message):
    proc = run_cli("graph", *args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtrain: error: ") and message in lines[0]
    assert not list(tmp_path.iterdir())
