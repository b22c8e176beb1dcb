"""report.html as a user sees it, in Chromium: legends off the data, the epoch charts of
one size, a step-time axis that a slow step does not flatten, the work split with real
values, long series thinned (and saying so) and the default iris run's page under 500 kB."""
from __future__ import annotations

import base64
import json
import random
import re
import shutil
import time
from html.parser import HTMLParser

import pytest
from bokeh.models import ColumnDataSource, Legend

import dtrain
from conftest import run_cli
from dtrain.observe import figures, htmlpage
from helpers.browser import ARTIFACTS, bokeh_figures, errors, open_browser

# Every Bokeh figure on the page, as its model says: where its legends are, its y range,
# the texts above it (title and notes) and the rows of data per renderer.
MODELS_JS = """
return [...Bokeh.index.all_views()].filter(v => v.model.type === "Figure").map(v => {
  const m = v.model, legends = (panel) => panel.filter(x => x.type === "Legend").length;
  return {name: m.name, center: legends(m.center),
          outside: legends(m.below) + legends(m.right) + legends(m.above) + legends(m.left),
          y_start: m.y_range.start, y_end: m.y_range.end,
          texts: [m.title ? m.title.text : ""].concat(
            m.above.filter(x => x.type === "Title").map(x => x.text)).join(" | "),
          rows: m.renderers.filter(r => r.data_source)
                 .map(r => r.data_source.get_length() || 0)};
});
"""
EPOCH_FIGURES = ("report-loss", "report-accuracy", "report-rate")


def _look(page, shot: str | None = None, count: int = 5) -> dict:
    """Open ``page`` in Chromium: its figures (sizes, models), JS errors, and a screenshot
    of the whole page under test-artifacts/ when ``shot`` names one."""
    with open_browser() as browser:
        browser.get(page.as_uri())
        sizes = bokeh_figures(browser, count)
        models = browser.execute_script(MODELS_JS)
        if shot:
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.set_window_size(1400, height + 150)
            time.sleep(1.0)                                     # Bokeh lays out again
            ARTIFACTS.mkdir(exist_ok=True)
            browser.save_screenshot(str(ARTIFACTS / shot))
        return {"sizes": sizes, "models": models, "errors": errors(browser)}


def _by_name(figs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in figs:
        out.setdefault(f["name"], []).append(f)
    return out


class _Tables(HTMLParser):
    """The page's HTML tables, each with the heading before it: (heading, rows of cells)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.heading, self.text, self.cell = "", "", None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("h2", "h3"):
            self.text = ""
        elif tag == "table":
            self.tables.append((self.heading, []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "h3"):
            self.heading = self.text.strip()
        elif tag in ("td", "th") and self.cell is not None:
            self.tables[-1][1][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        self.text += data
        if self.cell is not None:
            self.cell += data


@pytest.fixture(scope="module")
def default_run(client, tmp_path_factory):
    """The default job (iris, 40 epochs, 280 steps) on a real two-worker cluster."""
    out = tmp_path_factory.mktemp("iris") / "iris-default"
    dtrain.train(dtrain.load_config(None, []), client=client, out=out, echo=None)
    return out


@pytest.fixture(scope="module")
def iris_page(default_run):
    """What Chromium draws of it; the whole page lands in test-artifacts/report-iris.png."""
    return _look(default_run / "report.html", shot="report-iris.png", count=4)   # no step split


@pytest.fixture(scope="module")
def short_run(client, tmp_path_factory):
    """A short run on two workers, every step's tasks recorded (graph.fuse_steps = false)."""
    out = tmp_path_factory.mktemp("short") / "iris-short"
    dtrain.train(dtrain.load_config(None, ["train.epochs=3", "graph.fuse_steps=false"]),
                 client=client, out=out, echo=None)
    return out


@pytest.fixture(scope="module")
def short_page(short_run):
    """What Chromium draws of the short run's report."""
    return _look(short_run / "report.html")


@pytest.mark.slow
def test_default_iris_report_renders_without_errors(default_run, iris_page):
    """The default run's windows span the two workers, one task per worker a window: the page
    has no step-time split (it says why) and the rest of its figures."""
    assert iris_page["errors"] == []
    drawn = {f["name"] for f in iris_page["sizes"] if f["width"] > 100 and f["height"] > 100}
    assert drawn == {*EPOCH_FIGURES, "report-timeline", "report-spans-0"}
    assert "no step-time split" in (default_run / "report.html").read_text()
    assert (ARTIFACTS / "report-iris.png").stat().st_size > 10_000


@pytest.mark.slow
def test_legends_sit_outside_the_plot_frames(iris_page, short_page):
    models = {**_by_name(iris_page["models"]),
              "report-step-time": _by_name(short_page["models"])["report-step-time"]}
    for name in ("report-loss", "report-accuracy", "report-step-time", "report-timeline"):
        (fig,) = models[name]
        assert fig["center"] == 0 and fig["outside"] == 1, fig     # beside the frame, not on it
    assert models["report-rate"][0]["center"] == 0


def test_shared_figures_put_their_legends_below():
    """The helpers the live /dtrain page shares with the report."""
    source = ColumnDataSource({c: [1.0, 2.0] for c in (
        "epoch", "train_loss", "val_loss", "train_accuracy", "val_accuracy", "rate", "loss")})
    for add in (lambda f: figures.add_loss(f, source, "red", "a", steps=source),
                lambda f: figures.add_accuracy(f, source, "red", "a"),
                lambda f: figures.add_rate(f, source, "rate", "red", "a")):
        fig = figures.new_figure("t", "y")
        add(fig)
        assert not [m for m in fig.center if isinstance(m, Legend)]
        assert [m for m in fig.below if isinstance(m, Legend)]


@pytest.mark.slow
def test_throughput_is_the_size_of_its_neighbours(iris_page):
    sizes = {f["name"]: f for f in iris_page["sizes"]}
    loss = sizes["report-loss"]
    for name in ("report-accuracy", "report-rate"):
        assert sizes[name]["width"] == pytest.approx(loss["width"], abs=1), sizes
        assert sizes[name]["height"] == pytest.approx(loss["height"], abs=1), sizes
    assert loss["width"] > 500                          # two to a row in a 1400 px window


def test_work_split_table_shows_each_worker(default_run):
    parser = _Tables()
    parser.feed((default_run / "report.html").read_text())
    tables = [rows for heading, rows in parser.tables if heading == "work split"]
    assert len(tables) == 1, [h for h, _ in parser.tables]
    header, *rows = tables[0]
    assert header[:4] == ["worker", "device", "shards", "samples"]
    split = json.loads((default_run / "summary.json").read_text())["work_split"]
    assert len(split) == 2
    assert {r[0]: r[1:4] for r in rows} == {
        name: [w["device"], str(w["leaves"]), str(w["samples"])] for name, w in split.items()}
    assert sum(int(r[3]) for r in rows) == 105          # every training sample, once
    assert "-" not in {c for r in rows for c in r}


def test_default_iris_report_is_under_500_kb(default_run):
    size = (default_run / "report.html").stat().st_size
    assert size < 500_000, f"report.html is {size:,} bytes"
    rows = len(json.loads((default_run / "timeline.json").read_text())["rows"])
    shown = htmlpage.unpack((default_run / "report.html").read_text(), "dtrain-figures")
    assert (f"the last 1,000 of {rows:,} task intervals shown" in shown) == (rows > 1000)


def test_a_short_run_keeps_every_point(short_run, short_page):
    page = (short_run / "report.html").read_text()
    page += htmlpage.unpack(page, "dtrain-figures")
    assert "shown" not in page                          # no "every k-th", no "the last N"
    models = _by_name(short_page["models"])
    summary = json.loads((short_run / "summary.json").read_text())
    timeline = json.loads((short_run / "timeline.json").read_text())
    assert models["report-step-time"][0]["rows"][:2] == [summary["steps"]] * 2
    assert sum(models["report-timeline"][0]["rows"]) == len(timeline["rows"])
    assert models["report-loss"][0]["rows"][0] == 3


def _long_timeline(steps: int, spike: int) -> tuple[dict, list[float]]:
    """Task records of ``steps`` steps of about 10 ms on two workers, step ``spike`` 600 ms;
    and each step's time (ms)."""
    rng, rows, t, took = random.Random(0), [], 0.0, []
    for step in range(steps):
        wall = 0.6 if step == spike else 0.008 + 0.004 * rng.random()
        for shard in (0, 1):
            rows.append([f"forward-backward-{step}-{shard}-abc", f"tcp://w{shard}", 1,
                         "compute", t, t + 0.002])
        rows.append([f"update-{step}-abc", "tcp://w0", 1, "compute", t + wall - 0.001,
                     t + wall])
        t += wall
        took.append(wall * 1e3)
    return {"run": "abc", "tasks_seen": len(rows), "limit": 20000, "rows": rows,
            "workers": {"tcp://w0": "0", "tcp://w1": "1"},
            "columns": ["key", "worker", "thread", "action", "start", "stop"]}, took


@pytest.fixture(scope="module")
def long_run(short_run, tmp_path_factory):
    """A run directory with 1,200 epochs and 2,400 recorded steps, step 1,001 (not a 4th)
    of 600 ms, its report rebuilt by ``python -m dtrain report``; what Chromium draws of it,
    and the steps' times."""
    run = tmp_path_factory.mktemp("long") / "long"
    run.mkdir()
    for name in ("config.toml", "summary.json"):
        shutil.copy(short_run / name, run / name)
    row = json.loads((short_run / "metrics.jsonl").read_text().splitlines()[-1])
    (run / "metrics.jsonl").write_text("".join(json.dumps({**row, "epoch": e}) + "\n"
                                               for e in range(1, 1201)))
    timeline, took = _long_timeline(2400, spike=1001)
    (run / "timeline.json").write_text(json.dumps(timeline))
    proc = run_cli("report", str(run))
    assert proc.returncode == 0, proc.stderr
    return run, _look(run / "report.html", shot="report-long.png"), took


@pytest.mark.slow
def test_a_slow_step_does_not_flatten_the_step_time_chart(long_run):
    """The y axis ends above the usual steps and below the 600 ms one, which is marked at
    the top (though every 4th step's bar is drawn, and it is step 1,001), and says so."""
    _, seen, took = long_run
    assert seen["errors"] == []
    (step,) = _by_name(seen["models"])["report-step-time"]
    assert sorted(took)[int(0.99 * len(took))] < step["y_end"] < 600, step
    assert step["y_start"] == 0
    assert re.search(r"y axis cut at [\d.]+ ms .*95th percentile.*1 slower step marked",
                     step["texts"]), step["texts"]
    assert step["rows"][2:] == [1]                      # the spike's mark


@pytest.mark.slow
def test_long_series_are_thinned_and_say_so(long_run):
    """Every 3rd epoch's point (and the last), every 4th step's bar, the last 1,000 task
    intervals, and the page saying so."""
    run, seen, _ = long_run
    models = _by_name(seen["models"])
    assert models["report-loss"][0]["rows"] == [401, 401]        # train, validation
    assert "every 3rd epoch of 1,200 shown (and the last)" in (run / "report.html").read_text()
    (step,) = models["report-step-time"]
    assert step["rows"][:2] == [600, 600]               # compute, overhead
    assert "every 4th step of 2,400 shown" in step["texts"], step["texts"]
    (tasks,) = models["report-timeline"]
    assert sum(tasks["rows"]) == 1000
    assert "the last 1,000 of 7,200 task intervals shown" in tasks["texts"], tasks["texts"]
    assert (run / "report.html").stat().st_size < 500_000


# Bytes whose base85 is "<!--0<script>00": unbroken in a script element, "<!--" then
# "<script>" would make the HTML parser read on past its "</script>".
ESCAPING = base64.b85decode("<!--0<script>00")


@pytest.mark.parametrize("data", [b"", b"a", b"abcd", b"abcde", bytes(range(256)) * 3,
                                  ESCAPING, b"x" + ESCAPING])
def test_packing_round_trips_in_python(data):
    text = htmlpage.encode(data)
    assert "<!--" not in text and "/" not in text               # nothing that ends the script
    assert base64.b85decode(text.replace("\n", "")) == data
    words = data.decode("latin-1") + "é中😀"
    page = htmlpage.packed_script(words, "p")
    assert htmlpage.unpack(page, "p") == words


def _in_chromium(tmp_path, body: str, script: str):
    """Run async ``script`` (its last argument is the callback) on a page of ``body`` and
    :data:`~dtrain.observe.htmlpage.UNPACK_JS`; what it gives back and the page's errors."""
    page = tmp_path / "packed.html"
    page.write_text(f'<!DOCTYPE html><meta charset="utf-8"><body>{body}'
                    f"<script>{htmlpage.UNPACK_JS}</script></body>")
    with open_browser() as browser:
        browser.get(page.as_uri())
        back = browser.execute_async_script(script)
        return back, errors(browser)


def test_base85_decodes_in_chromium(tmp_path):
    """The page's base85 decoder gives back every tail length and all 85 characters, and
    the text that would fool the HTML parser, broken by :func:`htmlpage.encode`, leaves
    the script after it running."""
    cases = [bytes(range(n)) for n in range(10)] + [ESCAPING, random.Random(3).randbytes(5000)]
    body = "".join(f'<script type="text/plain" id="b{i}">{htmlpage.encode(c)}</script>'
                   for i, c in enumerate(cases))
    back, errs = _in_chromium(tmp_path, body, f"""
        const done = arguments[arguments.length - 1], out = [];
        for (let i = 0; i < {len(cases)}; i++)
          out.push(Array.from(dtrainBytes(document.getElementById("b" + i).textContent)));
        done(out);""")
    assert errs == []
    assert [bytes(b) for b in back] == cases


def test_packed_text_unpacks_in_chromium(tmp_path):
    """The browser inflates what was packed: long repetitive text and non-ASCII text; a
    payload with one character changed is refused (the zlib stream's check), not run."""
    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 12)))
             for _ in range(400)]
    text = "".join(rng.choice(words) + rng.choice(" \n") for _ in range(40_000))
    text += "é中😀<\\'\"</script>" * 500 + "".join(chr(rng.randint(32, 0x2FF))
                                                   for _ in range(20_000))
    good = htmlpage.packed_script(text, "good")
    data = re.search(r'id="good">([^/]*)</script>', good).group(1)
    i = len(data) // 2
    changed = data[:i] + ("0" if data[i] != "0" else "1") + data[i + 1:]
    bad = f'<script type="text/plain" id="bad">{changed}</script>'
    back, errs = _in_chromium(tmp_path, good + bad, """
        const done = arguments[arguments.length - 1], el = (id) => document.getElementById(id);
        dtrainText(el("good")).then(good => dtrainText(el("bad"))
          .then(bad => done([good, "inflated: " + bad.length]), err => done([good, String(err)])));
        """)
    assert errs == []
    assert back[0] == text
    assert back[1].startswith("TypeError"), back[1][:200]
