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
