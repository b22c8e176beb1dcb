"""The documentation site (docs/): it builds with warnings as errors, so a broken link or
cross-reference fails; its configuration reference is the config schema, a row per key that
load_config accepts; README.md is a first visit whose commands are all on the site; and every
example the site shows is one tests/test_examples.py runs."""
from __future__ import annotations

import dataclasses
import functools
import html
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import dtrain
from conftest import REPO
from dtrain.core import config
from dtrain.core.errors import ConfigError
from dtrain.core.fields import at_least

DOCS = REPO / "docs"
EXAMPLES = REPO / "examples"


@functools.cache
def _extension(name: str) -> ModuleType:
    """A module of docs/_ext, imported from its file (docs/ is not a package)."""
    pytest.importorskip("sphinx", reason="pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location(f"dtrain_docs_{name}",
                                                  DOCS / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _undocumented() -> list[str]:
    return [f"{section}.{f.name}" for section, cls in config.SECTIONS.items()
            for f in dataclasses.fields(cls) if not f.metadata.get("doc", "").strip()]


def _accepted_keys() -> set[str]:
    """Every key of a resolved config, which is every key load_config takes."""
    return {f"{section}.{key}" for section, values in dtrain.load_config(None).to_dict().items()
            for key in values}


# --- the configuration reference -----------------------------------------------------------

def test_every_config_key_has_its_documentation():
    assert _undocumented() == [], ("config keys without a doc string: give each its doc= in "
                                   "dtrain/core/config/schema.py (docs/configuration.rst shows it)")


def test_the_configuration_reference_has_a_row_and_an_entry_per_accepted_key():
    accepted = _accepted_keys()
    dtrain.load_config(dtrain.load_config(None).to_dict())     # all of them at once: accepted
    text = _extension("configref").reference_rst()
    rows = re.findall(r"^   \* - :confval:`(\S+)`$", text, re.M)
    entries = re.findall(r"^\.\. confval:: (\S+)$", text, re.M)
    assert sorted(rows) == sorted(entries) == sorted(accepted)
    assert len(accepted) > 60


def test_the_reference_shows_the_default_type_and_rule_load_config_uses():
    text = _extension("configref").reference_rst()
    entry = text.split(".. confval:: optim.lr\n", 1)[1].split(".. confval::", 1)[0]
    assert ":type: number" in entry and ":default: ``0.1``" in entry
    with pytest.raises(ConfigError) as caught:
        dtrain.load_config(None, ["optim.lr=-1"])
    rule = str(caught.value).rsplit("must be ", 1)[1]                  # "> 0"
    assert f"Accepted: {rule}" in entry.replace("\\", "")
    split = text.split(".. confval:: data.split\n", 1)[1]
    assert split.startswith("   :type: list of numbers\n   :default: ``[0.8, 0.1, 0.1]``")


def test_a_key_added_without_documentation_is_caught(monkeypatch):
    """What happens to a change that adds a key to the schema and forgets its doc string."""
    @dataclass(frozen=True)
    class Train(config.TrainConfig):
        new_key: int = at_least(1, 0)

    monkeypatch.setitem(config.SECTIONS, "train", Train)
    assert _undocumented() == ["train.new_key"]
    assert ".. confval:: train.new_key" in _extension("configref").reference_rst()


# --- README, a first visit whose commands the site holds ----------------------------------

def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_readme_is_a_short_first_visit_that_links_into_the_site():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert any(t.startswith("docs/") for t in targets) and any(t.endswith(".svg") for t in targets)
    for target in targets:
        assert (REPO / target).exists(), target


def test_every_readme_command_is_on_a_page_of_the_site():
    pages = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    readme = (REPO / "README.md").read_text()
    for block in _blocks(readme, "bash") + _blocks(readme, "python"):
        for line in block.splitlines():
            if line.strip() and not line.startswith("#"):
                assert line in pages, line


def test_every_example_is_shown_on_the_site_and_run_by_a_test():
    page = (DOCS / "examples.md").read_text()
    tests = (REPO / "tests" / "test_examples.py").read_text()
    examples = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))
    assert len(examples) >= 6
    for name in examples:
        assert f"```{{literalinclude}} ../examples/{name}" in page, name
        assert f'"{name}"' in tests, f"no test in tests/test_examples.py runs {name}"


# --- the build -------------------------------------------------------------------------------

def _sphinx(source: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                           "html", str(source), str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx", reason="pip install -e '.[docs]'")
    out = tmp_path / "html"
    proc = _sphinx(DOCS, out)
    assert proc.returncode == 0, proc.stderr[-5000:]
    reference = (out / "configuration.html").read_text()
    for key in _accepted_keys():
        assert f'id="confval-{key}"' in reference, key
    api = (out / "api.html").read_text()
    for name in set(dtrain.__all__) - {"__version__"}:
        assert f'id="dtrain.{name}"' in api, name
    assert "--scheduler-rank" in (out / "cli.html").read_text()     # the parser's own --help
    shown = html.unescape(re.sub(r"<[^>]+>", "", (out / "examples.html").read_text()))
    for path in EXAMPLES.iterdir():             # each example's text, whole, as it is now
        for line in path.read_text().splitlines():
            assert line in shown, (path.name, line)
    assert (out / "_images" / "allreduce-fan-in-2.svg").exists()


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path):
    pytest.importorskip("sphinx", reason="pip install -e '.[docs]'")
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text(f"import runpy\nglobals().update(runpy.run_path("
                                    f"{str(DOCS / 'conf.py')!r}))\n")
    (source / "index.md").write_text("# A page\n\nSee {doc}`no-such-page` and "
                                     "{func}`dtrain.trian`.\n")
    proc = _sphinx(source, tmp_path / "html")
    assert proc.returncode != 0
    assert "no-such-page" in proc.stderr and "dtrain.trian" in proc.stderr
