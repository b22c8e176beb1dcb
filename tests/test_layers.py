"""The package's layers: each part imports only what its ``__init__`` says it may, no
module imports its way back to itself, and none takes another's private names.

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
    """The dtrain modules ``name`` imports (:func:`_imports_in` its source)."""
    return _imports_in(MODULES[name].read_text(), name)


def _imported_by_name(tree: ast.Module) -> set[str]:
    """The modules a call imports by name: ``importlib.import_module(X)`` (or
    ``import_module(X)``) and ``__import__(X)``, X a string or a name the module binds to
    one at its top level (``STRATEGIES_MODULE = "dtrain..."``).  A name computed at run
    time (the top package's lazy table) is not seen: it cannot be read from the source."""
    constants = {target.id: node.value.value for node in tree.body
                 if isinstance(node, (ast.Assign, ast.AnnAssign))
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(target, ast.Name)}
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        if called not in ("import_module", "__import__"):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in constants:
            out.add(constants[arg.id])
    return out


def _imports_in(source: str, name: str) -> set[str]:
    """The dtrain modules the module ``name`` of ``source`` imports, anywhere in it (functions
    included), by an import statement or by a call that names the module: for
    ``from dtrain.x import y`` the module ``dtrain.x.y`` if there is one, else ``dtrain.x``."""
    tree, out = ast.parse(source), set()
    out |= {m for m in _imported_by_name(tree) if m == "dtrain" or m.startswith("dtrain.")}
    for node in ast.walk(tree):
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
    packages = {_module(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert packages <= set(listed), f"a wheel would leave out {sorted(packages - set(listed))}"


def _forbidden(module: str, imports: set[str]) -> set[str]:
    """What of ``imports`` the part of ``module`` may not import (nothing for the top
    package, which may import every part)."""
    part = _part(module)
    if part is None:
        return set()
    return {i for i in imports if _part(i) not in _allowed(part) | {part}}


@pytest.mark.parametrize("part", PARTS)
def test_a_part_imports_only_what_its_init_allows(part):
    wrong = {(m, i) for m in MODULES if _part(m) == part for i in _forbidden(m, _imports(m))}
    assert not wrong, f"dtrain/{part} may import only {sorted(_allowed(part))}: {sorted(wrong)}"


def _circle(edges: dict[str, set[str]]) -> None:
    """Fail on the first import circle among ``edges`` (module -> modules it imports)."""
    state: dict[str, int] = {}          # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_no_import_circles():
    _circle({m: _imports(m) & MODULES.keys() for m in MODULES})


def test_the_rules_can_fail():
    """The checks above see what they must: a circle and a forbidden import made up here."""
    assert _part("dtrain.core.keys") == "core" and _part("dtrain") is None
    assert "dtrain.core" in {f"dtrain.{p}" for p in _allowed("maths")}
    assert "observe" not in _allowed("taskgraph") and "training" not in _allowed("observe")
    assert "dtrain.core.keys" in _imports("dtrain.observe.metrics")
    assert "dtrain.taskgraph.strategies" in _imports("dtrain.training.plan")
    assert _forbidden("dtrain.core.fake", {"dtrain.taskgraph.strategies"}) == \
        {"dtrain.taskgraph.strategies"}
    with pytest.raises(AssertionError, match="import circle: a -> b -> a"):
        _circle({"a": {"b"}, "b": {"a"}, "c": {"a"}})


# a core module that finds out what is valid by importing an upper layer at run time
UPWARD_BY_NAME = """
import importlib
from importlib import import_module

STRATEGIES_MODULE = "dtrain.taskgraph.strategies"


def load():
    importlib.import_module(STRATEGIES_MODULE)
    import_module("dtrain.training.plan")
    __import__("dtrain.observe.recorder")
    importlib.import_module("dtrain.core.keys")     # its own part
    importlib.import_module("cupy")                 # not dtrain's
    importlib.import_module(load.__module__)        # computed: not read from the source
"""


def test_an_upward_import_by_name_is_caught():
    found = _imports_in(UPWARD_BY_NAME, "dtrain.core.fake")
    assert found == {"dtrain.taskgraph.strategies", "dtrain.training.plan",
                     "dtrain.observe.recorder", "dtrain.core.keys"}
    assert _forbidden("dtrain.core.fake", found) == {
        "dtrain.taskgraph.strategies", "dtrain.training.plan", "dtrain.observe.recorder"}
    with pytest.raises(AssertionError, match="import circle: dtrain.core.fake -> "
                                             "dtrain.taskgraph.strategies -> dtrain.core.fake"):
        _circle({"dtrain.core.fake": found,
                 "dtrain.taskgraph.strategies": {"dtrain.core.fake"}})


def test_imports_by_name_that_keep_the_layers_pass():
    """The top package imports its public names from every part, by a table; the trackers and
    distributed's internals are imported by name from other projects: none breaks a rule."""
    assert _forbidden("dtrain", {"dtrain.training.trainer"}) == set()
    for module in ("dtrain", "dtrain.observe.tracking", "dtrain.core.internals"):
        assert not _forbidden(module, _imports(module)), module


def _private(name: str) -> bool:
    """A name its module keeps to itself: one leading underscore (``__version__`` is not)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_names(source: str) -> list[str]:
    """What ``source`` takes of another dtrain module's private names, as
    ``"<line>: <name>"``: ``from dtrain.x import _y``, ``import dtrain.x._y``, and ``m._y``
    on a dtrain module ``m`` it imported (the same name reached without an import)."""
    tree, found, bound = ast.parse(source), [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not a.name.startswith("dtrain"):
                    continue
                if any(map(_private, a.name.split("."))):
                    found.append(f"{node.lineno}: {a.name}")
                if a.asname:                    # import dtrain.x.y as z: z is dtrain.x.y
                    bound[a.asname] = a.name
                else:                           # import dtrain.x.y: the name is dtrain
                    bound["dtrain"] = "dtrain"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dtrain"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if any(map(_private, full.split("."))):
                    found.append(f"{node.lineno}: {full}")
                elif full in MODULES:
                    bound[a.asname or a.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            path, at = [], node.value
            while isinstance(at, ast.Attribute):
                path.insert(0, at.attr)
                at = at.value
            if isinstance(at, ast.Name) and at.id in bound and \
                    ".".join([bound[at.id], *path]) in MODULES:
                found.append(f"{node.lineno}: {'.'.join([bound[at.id], *path, node.attr])}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_no_module_takes_another_modules_private_names():
    """A name with a leading underscore is its module's own: what two modules share is
    public and documented (the full-batch graph builds its steps with dataparallel's
    ``step_leaves``, ``step_tree`` and ``leaf_tasks``).  No exception."""
    found = {m: got for m, path in MODULES.items() if (got := _private_names(path.read_text()))}
    assert not found, f"private names taken from another module: {found}"


def test_the_private_names_rule_can_fail():
    assert _private_names("from dtrain.taskgraph.dataparallel import _tree, fuse_choice\n") \
        == ["1: dtrain.taskgraph.dataparallel._tree"]
    assert _private_names("import os\n\ndef f():\n    from dtrain.taskgraph.tasks import (\n"
                          "        reduce, _group_sum as g)\n") \
        == ["4: dtrain.taskgraph.tasks._group_sum"]
    assert _private_names("from dtrain.taskgraph import fuse\nfuse._runs()\n") \
        == ["2: dtrain.taskgraph.fuse._runs"]
    assert _private_names("import dtrain.taskgraph.fuse as f\nimport dtrain\n"
                          "f._runs()\ndtrain.taskgraph.handoff._kept()\n") \
        == ["3: dtrain.taskgraph.fuse._runs", "4: dtrain.taskgraph.handoff._kept"]
    assert _private_names("import dtrain.taskgraph._hidden\n") == ["1: dtrain.taskgraph._hidden"]
    # what is not taking one: a dunder, a public name, a private name of one's own or of
    # something that is not a dtrain module
    assert _private_names("from dtrain.core.version import __version__\n"
                          "from dtrain.core import keys\nkeys.kind_of('x')\n_mine = 1\n"
                          "import numpy as np\nnp._NoValue\nself = None\nself._x\n") == []
