"""The command line as a user meets it: exit codes, one-line errors, run directories."""
from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import pytest

import dtrain
from conftest import REPO, run_cli
from dtrain import cli
from dtrain.cli import advice, train
from dtrain.core.config import DataConfig
from dtrain.core.errors import EXIT_STOPPED
from dtrain.training.trainer import default_out_dir
from helpers.datafiles import make_images
from helpers.live import free_port


def test_train_writes_a_run_directory(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("--set", "train.epochs=3", "--workers", "2", "--out", str(out),
                   "--dashboard-address", "127.0.0.1:0")
    assert proc.returncode == 0, proc.stderr
    assert "epoch 3/3" in proc.stdout and "test_accuracy" in proc.stdout
    assert f"run directory: {out}" in proc.stdout
    assert json.loads((out / "summary.json").read_text())["epochs"] == 3
    assert "Traceback" not in proc.stderr


def test_default_run_directory_is_under_runs(tmp_path):
    proc = run_cli("--set", "train.epochs=1", "--set", "graph.strategy=serial", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-iris") and (run / "summary.json").exists()


# --- what a newcomer meets first ---------------------------------------------------------------

def _hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _serial_run(out: Path, epochs: int = 1) -> None:
    dtrain.train(dtrain.load_config(None, [f"train.epochs={epochs}", "graph.strategy=serial"]),
                 out=out, echo=None)


def _main(capfd, *args: str) -> tuple[int, list[str], str]:
    """``python -m dtrain ARGS`` in this process: exit code, stderr lines, stdout."""
    code = cli.main(list(args))
    seen = capfd.readouterr()
    return code, seen.err.strip().splitlines(), seen.out


def test_out_refuses_an_existing_run_and_leaves_it_as_it_was(tmp_path, capfd):
    run = tmp_path / "done"
    _serial_run(run)
    before = _hashes(run)
    assert {"summary.json", "params.npz", "config.toml"} <= set(before)
    code, err, _ = _main(capfd, "--out", str(run), "--set", "graph.strategy=serial")
    assert code == 2
    assert err == [f"dtrain: error: --out {run} holds a finished run; give a new directory, "
                   f"train it longer with --resume {run} --set train.epochs=N, or add --force "
                   f"to replace its results"]
    assert _hashes(run) == before
    (run / "summary.json").unlink()              # a run dtrain would resume: offer that
    before = _hashes(run)
    code, err, _ = _main(capfd, "--out", str(run), "--set", "graph.strategy=serial")
    assert code == 2 and len(err) == 1
    assert f"holds an unfinished run; continue it with --resume {run}" in err[0]
    assert _hashes(run) == before


def test_force_replaces_the_run_and_an_empty_directory_is_fine(tmp_path, capfd):
    run, empty = tmp_path / "done", tmp_path / "empty"
    _serial_run(run)
    old = _hashes(run)
    code, err, _ = _main(capfd, "--out", str(run), "--force", "--set", "graph.strategy=serial",
                         "--set", "train.epochs=2")
    assert (code, err) == (0, [])
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert _hashes(run)["params.npz"] != old["params.npz"]
    empty.mkdir()
    code, err, _ = _main(capfd, "--out", str(empty), "--set", "graph.strategy=serial",
                         "--set", "train.epochs=1")
    assert (code, err) == (0, [])
    assert (empty / "summary.json").exists()


def _csv_with_a_broken_row(tmp: Path) -> list[str]:
    rows = [f"{i % 3}.5,{i % 5}.0,{i % 7}.0,{i % 2}.0,{'ab'[i % 2]}" for i in range(30)]
    rows[17] = "1.0,oops,2.0,3.0,a"
    (tmp / "table.csv").write_text("\n".join(rows) + "\n")
    return ["--set", "data.dataset=csv", "--set", f"data.path={tmp / 'table.csv'}",
            "--set", "model.layers=[4, 2]"]


def _unreadable_image(tmp: Path) -> list[str]:
    """Found only when a worker's loading task reads the images, after the cluster started."""
    make_images(tmp / "pics")
    (tmp / "pics" / "dog" / "broken.png").write_bytes(b"\x89PNG but not really")
    return ["--set", "data.dataset=image-folder", "--set", f"data.path={tmp / 'pics'}",
            "--set", "data.image_size=[4, 4]", "--set", "model.layers=[16, 3]"]


TYPOS = {   # what each leaves on stderr
    "bad --set value": (lambda t: ["--set", "train.epochs=many"], "train.epochs = 'many'"),
    "missing data path": (lambda t: ["--config", str(REPO / "configs" / "mnist.toml"),
                                     "--set", f"data.path={t / 'gone'}"], "not found"),
    "bad layers": (lambda t: ["--set", "model.layers=[5, 8, 3]"], "model.layers[0] = 5"),
    "broken CSV row": (_csv_with_a_broken_row, "table.csv"),
    "unreadable image (found on a worker)": (_unreadable_image, "cannot read image"),
    "nothing at the scheduler address": (
        lambda t: ["--scheduler-address", f"tcp://127.0.0.1:{free_port()}"], "nothing listens"),
    "parameter server on one worker": (
        lambda t: ["--set", "graph.strategy=parameter-server", "--workers", "1"],
        "needs 2 workers"),
}


@pytest.mark.slow
@pytest.mark.parametrize("runs_before", [False, True], ids=["no runs/", "runs/ with a run"])
def test_failed_commands_leave_runs_as_it_was(tmp_path, capfd, monkeypatch, runs_before):
    data = tmp_path / "data"
    data.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    if runs_before:
        (work / "runs" / "20250101-000000-iris").mkdir(parents=True)
        (work / "runs" / "20250101-000000-iris" / "config.toml").write_text("# mine\n")
    before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    monkeypatch.chdir(work)
    for name, (make_args, message) in TYPOS.items():
        code, err, _ = _main(capfd, *make_args(data), "--dashboard-address", "127.0.0.1:0")
        assert code == 2 and len(err) == 1 and message in err[0], (name, err)
        assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == before, name


@pytest.mark.slow      # the fast tier: test_bad_input's "unreachable scheduler"
def test_unreachable_scheduler_fails_within_the_timeout(tmp_path):
    start = time.monotonic()
    proc = run_cli("--scheduler-address", f"tcp://127.0.0.1:{free_port()}",
                   "--set", "cluster.timeout=10", "--out", str(tmp_path / "run"))
    seconds = time.monotonic() - start             # the whole command, imports included
    assert proc.returncode == 2, proc.stderr
    assert seconds < 10, seconds
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("dtrain: error: cannot reach the Dask scheduler at tcp://127.0.0.1:")
    assert "nothing listens" in line
    assert not (tmp_path / "run").exists()


def test_layout_warnings_say_what_they_cost():
    assert advice.layout_warnings(2, 1, 4, 2) == []
    assert advice.layout_warnings(8, 1, 8, 2) == [
        "8 workers on 2 cores: they take turns; expect slower steps"]
    assert advice.layout_warnings(1, 4, 4, 2) == [
        "1 worker of 4 threads on 2 cores: they take turns; expect slower steps"]
    assert advice.layout_warnings(6, 1, 4, 16) == [
        "6 workers for 4 shards: 2 workers hold no shard and only add messages"]
    assert advice.layout_warnings(3, 1, 2, 16) == [
        "3 workers for 2 shards: 1 worker holds no shard and only adds messages"]
    assert advice.layout_warnings(3, 1, 2, 16, spare=1) == []      # a parameter server
    assert advice.layout_warnings(4, 1, 2, 16, "slice") == [
        "4 workers for 2 slices: 2 workers hold no slice and only add messages"]


def test_too_many_workers_get_one_warning_line_each(capfd):
    cores = advice.cores()
    train.prepare(["--workers", str(cores + 1), "--set", f"data.shards={cores + 4}"])
    assert capfd.readouterr().err.splitlines() == [
        f"dtrain: warning: {cores + 1} workers on {cores} cores: they take turns; expect "
        f"slower steps"]
    train.prepare(["--workers", "6", "--set", "data.shards=4"])
    err = capfd.readouterr().err
    assert "dtrain: warning: 6 workers for 4 shards: 2 workers hold no shard and only add " \
           "messages" in err.splitlines()
    train.prepare(["--workers", "1", "--set", "graph.strategy=serial"])
    assert capfd.readouterr().err == ""
    train.prepare(["--workers", "1", "--scheduler-address", "tcp://127.0.0.1:8786"])
    assert capfd.readouterr().err.splitlines() == [
        "dtrain: warning: --workers 1 does nothing with a running scheduler: the run uses the "
        "workers of tcp://127.0.0.1:8786"]


def test_version():
    proc = run_cli("--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"dtrain {dtrain.__version__}\n", "")


@pytest.mark.parametrize("command", [[], ["report"], ["graph"], ["predict"], ["evaluate"],
                                     ["export"]],
                         ids=["train", "report", "graph", "predict", "evaluate", "export"])
def test_each_command_has_its_own_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([*command, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: {' '.join(['python -m dtrain', *command])} ")
    if command:
        assert "--resume" not in text                # not the main help
    else:
        commands = text.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert [line.split()[3] for line in commands] == ["[options]", "report", "graph",
                                                          "predict", "evaluate", "export"]


def test_a_run_directory_that_cannot_be_made_is_a_user_error(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    cfg = dtrain.load_config(None, ["train.epochs=1", "graph.strategy=serial"])
    for out in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "run"):
        with pytest.raises(dtrain.UserError, match=f"{tmp_path / 'notes.txt'} is a file"):
            dtrain.train(cfg, out=out, echo=None)
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


# --- exit codes, --workers 0, the run directory's name ----------------------------------------

def test_the_docs_list_every_exit_code_in_one_table():
    """The exit codes are one table, on the troubleshooting page (README.md is a first visit
    now): a row per code, in order, every code dtrain's errors and the CLI give among them,
    and no second exit-code table on any page to disagree with it."""
    from dtrain.cli.main import EXIT_BROKEN_PIPE
    from dtrain.core.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_USER_ERROR

    docs = REPO / "docs"
    text = (docs / "troubleshooting.md").read_text()
    section = text.split("(exit-codes)=\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    table = re.search(r"^\| exit code \| what happened \| what to do \|\n\| --- \| --- \| --- \|\n"
                      r"((?:\|.*\|\n)+)", section, re.M)
    assert table, "no exit-code table under 'Exit codes' in docs/troubleshooting.md"
    codes = [row.split("|")[1].strip().strip("`") for row in table.group(1).splitlines()]
    assert codes == ["0", "2", "3", "75", "130", "141", "any other"], codes
    assert {str(c) for c in (EXIT_USER_ERROR, EXIT_DIVERGED, EXIT_STOPPED, EXIT_INTERRUPTED,
                             EXIT_BROKEN_PIPE)} <= set(codes)
    assert "Python is still importing Dask" in section and "dtrain.Stopped" in section
    pages = {p.name: p.read_text() for p in [REPO / "README.md", *docs.glob("*.md")]}
    tables = [name for name, page in pages.items()
              for _ in re.finditer(r"^\| (exit )?code \|", page, re.M)]
    assert tables == ["troubleshooting.md"], tables


def test_workers_0_means_the_layouts_default_as_the_config_key_does():
    job = train.prepare(["--workers", "0", "--set", "graph.strategy=serial"])
    assert job.config.cluster.workers == 0
    assert job.config == train.prepare(["--set", "cluster.workers=0", "--set",
                                        "graph.strategy=serial"]).config


def test_a_run_on_a_csv_is_named_after_the_data(tmp_path, monkeypatch, capfd):
    from sklearn.datasets import load_iris

    frame = load_iris(as_frame=True).frame
    frame.to_csv(tmp_path / "flowers.csv", index=False)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["--set", "data.dataset=csv", "--set", "data.path=flowers.csv",
                     "--set", "graph.strategy=serial", "--set", "train.epochs=1"])
    assert code == 0, capfd.readouterr().err
    assert [p.name.split("-", 2)[-1] for p in (tmp_path / "runs").iterdir()] == ["flowers"]
    assert default_out_dir(DataConfig(dataset="parquet", path="/d/sales/part-*.parquet")) \
        .name.endswith("-sales")
    assert default_out_dir(None).name.endswith("-iris")
    assert default_out_dir("configs/mnist.toml").name.endswith("-mnist")
