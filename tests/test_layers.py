"""The package's layers: each part imports only what its ``__init__`` says it may, and no
module imports its way back to itself.

The rules are read from the subpackages' own docstrings (their "May import:" line), so the
documented layers and the enforced ones are the same text.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "dtrain"
PARTS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    return name.removesuffix(".__init__")


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """The dtrain modules ``name`` imports, anywhere in it (functions included): for
    ``from dtrain.x import y`` the module ``dtrain.x.y`` if there is one, else ``dtrain.x``."""
    path, out = MODULES[name], set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dtrain")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and \
                (node.module or "").startswith("dtrain"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{name}: a relative import; dtrain imports absolutely")
    return out - {name}


def _part(module: str) -> str | None:
    """``core`` of ``dtrain.core.keys``; None for the package's own ``__init__``/``__main__``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[1] in PARTS else None


def _allowed(part: str) -> set[str]:
    """The parts ``part`` may import, from the "May import:" line of its ``__init__``."""
    doc = ast.get_docstring(ast.parse((PACKAGE / part / "__init__.py").read_text())) or ""
    found = re.search(r"May import:(.*)", doc, re.S)
    assert found, f"dtrain/{part}/__init__.py does not say what it may import"
    text = found.group(1)
    if "every other part of dtrain" in text:
        return set(PARTS)
    return set(re.findall(r"dtrain\.(\w+)", text))


def test_the_package_is_its_parts():
    """Nothing sits loose beside the parts but the public API and the entry point."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"]
    assert set(PARTS) == {"core", "maths", "data", "taskgraph", "deploy", "observe", "training",
                          "inference", "estimators", "cli"}
    for part in PARTS:
        assert _allowed(part) <= set(PARTS), part
    import tomllib
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert {f"dtrain.{p}" for p in PARTS} <= set(listed), "a wheel would leave a part out"


@pytest.mark.parametrize("part", PARTS)
def test_a_part_imports_only_what_its_init_allows(part):
    allowed = _allowed(part) | {part}
    wrong = {(m, i) for m in MODULES if _part(m) == part for i in _imports(m)
             if _part(i) not in allowed}
    assert not wrong, f"dtrain/{part} may import only {sorted(allowed)}: {sorted(wrong)}"


def test_no_import_circles():
    edges = {m: _imports(m) & MODULES.keys() for m in MODULES}
    state: dict[str, int] = {}          # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)


def test_the_rules_can_fail():
    """The checks above see what they must: a circle and a forbidden import made up here."""
    assert _part("dtrain.core.keys") == "core" and _part("dtrain") is None
    assert "dtrain.core" in {f"dtrain.{p}" for p in _allowed("maths")}
    assert "observe" not in _allowed("taskgraph") and "training" not in _allowed("observe")
    assert "dtrain.core.keys" in _imports("dtrain.observe.metrics")
    assert "dtrain.taskgraph.strategies" in _imports("dtrain.training.plan")
