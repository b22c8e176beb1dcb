"""``python -m benchmarks.figures``: every figure of docs/performance.md is drawn from the
results committed in benchmarks/, the committed SVGs are what the command writes now, and the
page shows each one with the command that makes it."""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from benchmarks import figures
from conftest import REPO

SVG = "{http://www.w3.org/2000/svg}"
PAGE = REPO / "docs" / "performance.md"


def test_every_figure_is_well_formed_svg_with_a_line_per_series(tmp_path):
    assert figures.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(figures.FIGURES)
    for name in figures.FIGURES:
        root = ET.parse(tmp_path / name).getroot()
        assert root.tag == f"{SVG}svg", name
        assert root.find(f"{SVG}title").text, name
        lines = root.findall(f"{SVG}polyline")
        assert len(lines) >= 2, name
        for line in lines:                         # every point inside the 640 x 400 canvas
            for point in line.get("points").split():
                x, y = map(float, point.split(","))
                assert 0 <= x <= 640 and 0 <= y <= 400, (name, point)


def test_the_committed_figures_are_what_the_command_draws(tmp_path):
    figures.main(["--out", str(tmp_path)])
    for name in figures.FIGURES:
        committed = REPO / "docs" / "figures" / name
        assert committed.exists(), f"run python -m benchmarks.figures ({name} is missing)"
        assert committed.read_text() == (tmp_path / name).read_text(), (
            f"docs/figures/{name} is not what python -m benchmarks.figures draws now: run it")


def test_the_page_shows_every_figure_and_the_command_that_draws_it():
    page = PAGE.read_text()
    assert "python -m benchmarks.figures" in page
    for name in figures.FIGURES:
        assert f"figures/{name}" in page, name


def test_the_strong_scaling_figure_reads_the_16_core_results():
    rows = figures.markdown_table(REPO / "benchmarks" / "results-16core.md", "Strong scaling",
                                  section="## Run 2:")
    assert [r["workload"] for r in rows] == ["P1", "P2", "P3"]
    p1 = rows[0]
    assert figures.number(p1["1 worker"]) / figures.number(p1["16 workers"]) == pytest.approx(
        7.35, abs=0.01)                            # the speedup the table itself prints
    assert figures.number("1,015 k") == 1015


def test_an_unknown_figure_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.figures", "no-such-figure",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "no figure no-such-figure.svg" in proc.stderr
    assert list(tmp_path.iterdir()) == []
