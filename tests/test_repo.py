"""The repository's promises to a new user: the Quickstart and CI run the same commands, and
the README's Quickstart is the documentation's."""
from __future__ import annotations

import re

from conftest import REPO


def _quickstart(page: str = "README.md") -> list[str]:
    text = (REPO / page).read_text()
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_quickstart_has_two_commands_and_ci_runs_the_test_one():
    assert _quickstart("docs/getting-started.md") == _quickstart()
    install_and_train, install_and_test = _quickstart()
    assert install_and_train.endswith("python -m dtrain")
    assert install_and_test.endswith("python -m pytest")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert install_and_test in ci


def test_the_wheel_ships_py_typed_so_type_checkers_read_the_annotations():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["dtrain"]
    assert (REPO / "dtrain" / "py.typed").is_file()


def _test_names() -> dict[str, list[str]]:
    import ast
    import collections
    names = collections.defaultdict(list)
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.name.startswith("test_"):
                names[node.name].append(path.name)
    return names


def test_no_test_name_is_defined_twice():
    """A test is found by its name: one name, one test, in one file."""
    twice = {name: files for name, files in _test_names().items() if len(files) > 1}
    assert not twice, twice
    assert len(_test_names()) > 500           # (the check reads the suite it guards)


def _module_table() -> list[tuple[str, list[str]]]:
    """docs/development.md's table "Where a module's tests are": a row's first cell (a module
    of dtrain/, or a folder or file of the repository) and the test files it names."""
    text = (REPO / "docs" / "development.md").read_text()
    section = text.split("(tests-by-module)=\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 2 or not cells[0].startswith("`"):
            continue                                  # prose, the header, the rule under it
        rows.append((cells[0].strip("`"), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _modules() -> set[str]:
    """Every module of dtrain/ by its dotted name (a package by its own)."""
    return {".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for path in (REPO / "dtrain").rglob("*.py")}


def test_every_module_has_a_row_of_its_test_files():
    """A module's tests are found by its name: docs/development.md has a row per module."""
    rows = [name for name, _ in _module_table() if name.split(".")[0] == "dtrain"]
    assert len(rows) > 100                    # (the check reads the table it guards)
    page = "docs/development.md, \"Where a module's tests are\""
    missing = sorted(_modules() - set(rows))
    assert not missing, f"{page}: no row for {', '.join(missing)}: add one naming its test files"
    gone = sorted(set(rows) - _modules())
    assert not gone, f"{page}: a row for {', '.join(gone)}, which is no module of dtrain/"
    twice = sorted({name for name in rows if rows.count(name) > 1})
    assert not twice, f"{page}: more than one row for {', '.join(twice)}"


def test_the_test_files_the_module_table_names_are_the_suites():
    """Every test file a row names exists, and every test file is named by some row."""
    rows = _module_table()
    page = "docs/development.md, \"Where a module's tests are\""
    empty = [name for name, files in rows if not files]
    assert not empty, f"{page}: the row for {', '.join(empty)} names no test file"
    absent = [f"{name}: {f}" for name, files in rows for f in files
              if not f.startswith("test_") or not (REPO / "tests" / f).is_file()]
    assert not absent, f"{page} names test files that tests/ does not hold: {'; '.join(absent)}"
    named = {f for _, files in rows for f in files}
    unnamed = sorted(path.name for path in (REPO / "tests").glob("test_*.py")
                     if path.name not in named)
    assert not unnamed, f"{page}: no row names {', '.join(unnamed)}: add it to the rows of " \
                        f"the modules it tests"
