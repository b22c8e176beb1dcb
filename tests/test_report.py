"""What a run leaves to read: report.html (checked in a real browser), the report
subcommand, the step-time split, the console progress on a terminal and off it."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

import dtrain
from conftest import REPO, run_cli
from dtrain.core.keys import kind_of
from dtrain.observe import htmlpage, htmlreport
from helpers.browser import bokeh_figures, errors, open_browser, screenshot

QUICK = ["train.epochs=3", "data.shards=4"]


@pytest.fixture(scope="module")
def run_dir(client, tmp_path_factory):
    """A finished Dask run's directory, with every task type (one task per shard: no
    reduce is summed inside a forward-backward; every step's tasks, not a window's)."""
    out = tmp_path_factory.mktemp("run") / "iris-ar"
    dtrain.train(dtrain.load_config(None, QUICK + ["graph.fuse_shards=false",
                                                   "graph.fuse_steps=false"]),
                 client=client, out=out, echo=None)
    return out


def test_report_is_standalone_with_the_run_in_it(run_dir):
    page = (run_dir / "report.html").read_text()
    assert not re.search(r"<script[^>]+src=", page), "report.html must not load scripts"
    assert "cdn.bokeh.org" not in page
    page += htmlpage.unpack(page, "dtrain-figures")     # the figures' document, packed
    for name in ("report-loss", "report-accuracy", "report-step-time", "report-timeline"):
        assert name in page, name
    assert "train accuracy" in page and "validation accuracy" in page      # legend labels
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["train_accuracy"] <= 1 for r in rows)
    timeline = json.loads((run_dir / "timeline.json").read_text())
    kinds = {kind_of(row[0]) for row in timeline["rows"]}
    assert {"forward-backward", "reduce", "update", "load-shard", "evaluate"} <= kinds


def test_report_renders_in_chromium(run_dir):
    with open_browser() as browser:
        browser.get((run_dir / "report.html").as_uri())
        figs = bokeh_figures(browser, 5)
        screenshot(browser, "report.png")
        assert errors(browser) == []
    drawn = {f["name"]: f for f in figs if f["width"] > 100 and f["height"] > 100}
    assert set(drawn) == {"report-loss", "report-accuracy", "report-rate", "report-step-time",
                          "report-timeline"}
    assert all(sum(f["rows"]) > 0 for f in drawn.values()), drawn
    assert drawn["report-loss"]["rows"][0] == 3          # three epochs on the loss curve


@pytest.mark.slow
def test_report_command_rebuilds_and_overlays(run_dir, tmp_path):
    serial = tmp_path / "serial"
    dtrain.train(dtrain.load_config(None, QUICK + ["graph.strategy=serial"]), out=serial,
                 echo=None)
    assert not (serial / "timeline.json").exists()       # no task stream without Dask
    (serial / "report.html").unlink()
    proc = run_cli("report", str(serial))
    assert proc.returncode == 0, proc.stderr
    assert "No task record of each step" in (serial / "report.html").read_text()
    out = tmp_path / "both.html"
    proc = run_cli("report", str(run_dir), str(serial), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    page += htmlpage.unpack(page, "dtrain-figures")
    assert f"{run_dir.name}: train loss" in page and "serial: train loss" in page
    assert "keys that differ" in page and "graph.strategy" in page


def test_report_command_needs_a_writable_out(run_dir, tmp_path):
    proc = run_cli("report", str(run_dir), "--out", str(tmp_path / "no" / "r.html"))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"dtrain: error: cannot write the report to {tmp_path}/no/")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_report_command_rejects_a_directory_that_is_no_run(tmp_path):
    proc = run_cli("report", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"dtrain: error: {tmp_path} is not a dtrain run directory "
                                   "(it needs config.toml and metrics.jsonl); pass a directory "
                                   "written by python -m dtrain")


def test_step_time_split():
    """Compute is the critical path: slowest forward-backward + slowest reduce per level +
    update; wall is update end to update end; overhead the rest."""
    rows = []
    for step, t in ((0, 10.0), (1, 10.1)):
        rows += [[f"forward-backward-{step}-{i}-r", "w", 1, "compute", t, t + d]
                 for i, d in enumerate((0.010, 0.030, 0.020, 0.010))]
        rows += [[f"reduce-{step}-1-{i}-r", "w", 1, "compute", t + 0.04, t + 0.04 + d]
                 for i, d in ((0, 0.002), (2, 0.005))]
        rows += [[f"update-{step}-r", "w", 1, "compute", t + 0.05, t + 0.054],
                 [f"update-{step}-r", "w", 1, "transfer", t + 0.045, t + 0.049]]
    times = htmlreport.step_times({"columns": ["key", "worker", "thread", "action", "start",
                                               "stop"], "rows": rows})
    assert times["step"] == [0, 1]
    assert times["compute"] == pytest.approx([39.0, 39.0])
    assert times["wall"] == pytest.approx([54.0, 100.0])
    assert times["overhead"] == pytest.approx([15.0, 61.0])


def test_console_without_a_terminal_is_plain_lines(tmp_path):
    proc = run_cli("--set", "train.epochs=2", "--out", str(tmp_path / "r"),
                   "--dashboard-address", "127.0.0.1:0")
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stdout and not re.search(r"\d+/\d+ steps", proc.stdout)
    assert re.search(r"^epoch 2/2  train_loss [\d.]+  train_acc [\d.]+  val_loss [\d.]+  "
                     r"val_acc [\d.]+", proc.stdout, re.M)
    assert not re.search(r"^step \d+/", proc.stdout, re.M)     # a short run: no progress lines


def test_console_without_a_terminal_prints_progress_lines_in_a_long_epoch(client, monkeypatch):
    """Off a terminal, a plain progress line comes once ``PLAIN_EVERY`` seconds pass without a
    console line (here almost at once: every ask for the newest step event prints one)."""
    from dtrain.observe import console
    monkeypatch.setattr(console, "PLAIN_EVERY", 1e-6)
    lines: list[str] = []
    # every step its own graph: the run lasts long enough to be asked about (a window of 14
    # steps as a task per worker is over in a few milliseconds)
    dtrain.train(dtrain.load_config(None, ["train.epochs=2", "graph.fuse_steps=false"]),
                 client=client, echo=lines.append)
    progress = [line for line in lines if line.startswith("step ")]
    assert progress, lines
    assert all(re.fullmatch(r"step +\d+/14  epoch [12]/2  loss [\d.]+  train_acc [\d.]+  "
                            r"(-|[\d,]+) samples/s", line) for line in progress), progress
    assert sum(line.startswith("epoch ") for line in lines) == 2      # as well as the epochs


def test_plain_progress_waits_for_silence():
    from dtrain.observe.console import PlainProgress
    said: list[str] = []
    plain = PlainProgress(said.append, 2, 7, 105, every=30.0)
    msg = {"kind": "step", "step": 1, "epoch": 1, "loss": 1.0, "epoch_loss": 1.0,
           "epoch_accuracy": 0.5, "seen": 16, "t": 0.0}
    plain.step(msg)
    assert said == []                               # less than 30 s since the start
    plain.last -= 31
    plain.step({**msg, "step": 2, "seen": 32, "t": 1.0})
    assert said == ["step  2/14  epoch 1/2  loss 1.0000  train_acc 0.5000  16 samples/s"]
    plain.step({**msg, "step": 3, "seen": 48, "t": 2.0})
    assert len(said) == 1                           # the line restarted the silence


def test_progress_bar_labels_val_accuracy_with_its_epoch():
    from dtrain.observe.console import Progress
    bar = Progress(3, 7, 105)
    try:
        bar.epoch({"epoch": 1, "train_loss": 0.9, "train_accuracy": 0.6, "val_accuracy": 0.73,
                   "samples_per_second": 100.0})
        bar.step({"kind": "step", "step": 9, "epoch": 2, "loss": 0.5, "epoch_loss": 0.6,
                  "epoch_accuracy": 0.7, "seen": 32, "t": 0.0})
        assert bar.info["epoch"] == "2/3" and bar.info["train_acc"] == "0.7000"
        assert bar.info["val_acc"] == "0.7300 (ep 1)"
    finally:
        bar.close()


@pytest.mark.slow
def test_console_on_a_terminal_shows_a_progress_bar(tmp_path):
    """Under a real pseudo-terminal: a tqdm bar over the steps, with epoch, loss, val_acc
    and samples/s, under the epoch lines."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 160 columns
    proc = subprocess.Popen([sys.executable, "-m", "dtrain", "--set", "train.epochs=4",
                             "--out", str(tmp_path / "r"), "--dashboard-address", "127.0.0.1:0"],
                            cwd=REPO, stdout=follower, stderr=subprocess.PIPE,
                            env={k: v for k, v in os.environ.items() if k not in ("COLUMNS",
                                                                                 "LINES")})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:          # the terminal closed: the process is done
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    proc.stderr.close()
    screen = b"".join(chunks).decode(errors="replace")
    assert "28/28 steps" in screen                  # 4 epochs x 7 steps, all counted
    bar = [line for line in re.split(r"[\r\n]", screen) if "28/28 steps" in line][-1]
    for part in ("epoch 4/4", "loss ", "train_acc ", "val_acc ", "samples/s"):
        assert part in bar, bar
    assert re.search(r"val_acc [\d.]+ \(ep 4\)", bar), bar
    assert "epoch 4/4  train_loss" in screen and "test_accuracy" in screen


def test_peak_memory_is_the_processs_own_not_its_parents():
    """A driver started by a big process (a benchmark, a notebook) reports its own peak:
    ``ru_maxrss`` kept the forked copy of the parent's 400 MB across ``exec``."""
    import numpy as np

    ballast = np.ones(400 << 17)                                     # 400 MB, touched
    out = subprocess.run([sys.executable, "-c", "from dtrain.observe.metrics import "
                          "peak_rss_mb; print(peak_rss_mb())"], capture_output=True, text=True)
    assert ballast.sum() > 0 and out.returncode == 0, out.stderr
    assert 10 < float(out.stdout) < 300, out.stdout


# --- the console's lines ----------------------------------------------------------------------

def test_the_serial_strategy_claims_no_efficiency_over_worker_threads():
    seen: list[str] = []
    dtrain.train(dtrain.load_config(None, ["graph.strategy=serial", "train.epochs=1"]),
                 echo=seen.append)
    assert not [line for line in seen if "efficiency" in line or "worker threads" in line], seen
    assert any(line.endswith("(in this process: no workers)") for line in seen), seen
