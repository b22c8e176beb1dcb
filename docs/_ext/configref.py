"""The configuration reference, generated from the config schema while the site builds.

``.. dtrain-config::`` writes, for every section of :data:`dtrain.core.config.SECTIONS`, a
table of its keys and one ``confval`` entry per key (its type, default, the rule
:func:`dtrain.load_config` checks, and the field's doc string), so the reference is the schema
and cannot drift from it.  ``:confval:`train.epochs``` links to a key from any page; a link to
a key that does not exist fails the build (``sphinx-build -W``).

``.. dtrain-strategies::`` writes the table of ``graph.strategy``'s values from the strategy
objects themselves (:mod:`dtrain.taskgraph.strategies`, listed under the config's names).

:func:`keys` and :func:`reference_rst` are what the tests read (``tests/test_docs.py``).
"""
from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import tomli_w
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

from dtrain.core.config import schema
from dtrain.core.layerspec import LayerItem
from dtrain.taskgraph import strategies

# what a section is for: a line above its table
SECTION_DOCS = {
    "data": "What to train on: the dataset, how it is split, normalized and cut into shards.",
    "model": "The network: its layers, activation, loss, dtype and initialization.",
    "optim": "The optimizer and its learning-rate schedule.",
    "train": "How long to train, minibatches, early stopping and divergence.",
    "graph": "How each step's task graph is built: the strategy, the reduce tree, windows, "
             "live events.",
    "cluster": "Where it runs: the embedded LocalCluster, a running scheduler, batch jobs, "
               "TLS, devices.",
    "track": "Logging to TensorBoard and MLflow.",
}

TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean",
              LayerItem: "layer"}          # model.layers: sizes and layer tables


@dataclass(frozen=True)
class Key:
    """One key of the schema, as the reference shows it."""

    section: str
    name: str
    type: str       # "integer", "list of number", ...
    default: str    # as written in TOML
    rule: str       # what load_config accepts ("" for any value of the type)
    doc: str        # the field's doc string

    @property
    def full(self) -> str:
        return f"{self.section}.{self.name}"


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        return f"list of {TYPE_NAMES[item]}s"
    return TYPE_NAMES[hint]


def _toml(value: Any) -> str:
    """A value as it is written in TOML (``"x"``, ``[0.8, 0.1, 0.1]``, ``true``)."""
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return tomli_w.dumps({"v": value})[4:].strip()


def _text(text: str) -> str:
    """Plain text in reStructuredText: no character of it is markup."""
    return re.sub(r"([\\*`_|\[\]<>])", r"\\\1", text)


def keys() -> Iterator[Key]:
    """Every key :func:`dtrain.load_config` accepts, section by section, in schema order."""
    for section, cls in schema.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            meta = field.metadata
            rule = meta["rule"]() if callable(meta["rule"]) else meta["rule"]
            yield Key(section, field.name, _type_name(hints[field.name]),
                      _toml(field.default), rule, meta.get("doc", ""))


def _literal(text: str) -> str:
    return "``" + text + "``" if text else '``""``'


def reference_rst() -> str:
    """The reference as reStructuredText: a section per config section, each with a table of
    its keys and a ``confval`` per key."""
    out: list[str] = []
    by_section: dict[str, list[Key]] = {}
    for key in keys():
        by_section.setdefault(key.section, []).append(key)
    for section, items in by_section.items():
        title = f"``[{section}]``"
        out += [f".. _config-{section}:", "", title, "~" * len(title), "",
                SECTION_DOCS.get(section, ""), "",
                ".. list-table::", "   :header-rows: 1", "   :widths: 25 20 20 35", "",
                "   * - key", "     - type", "     - default", "     - accepted"]
        for key in items:
            out += [f"   * - :confval:`{key.full}`", f"     - {key.type}",
                    f"     - {_literal(key.default)}",
                    f"     - {_text(key.rule) or 'any ' + key.type}"]
        out.append("")
        for key in items:
            out += [f".. confval:: {key.full}", f"   :type: {key.type}",
                    f"   :default: {_literal(key.default)}", "",
                    f"   {_text(key.doc)}", ""]
            if key.rule:
                out += [f"   Accepted: {_text(key.rule)}", ""]
    return "\n".join(out)


def strategies_rst() -> str:
    """``graph.strategy``'s values, from the strategy objects: name, what it does, workers."""
    out = [".. list-table::", "   :header-rows: 1", "   :widths: 18 52 10 20", "",
           "   * - ``graph.strategy``", "     - what each step's graph does",
           "     - Dask workers", "     - MPI ranks (``mpirun -n``)"]
    for name in schema.STRATEGIES:
        strategy = strategies.get(name)
        ranks = "1 (no Dask)" if strategy.in_process else \
            f"{strategy.ranks}: {strategy.workers_word}"
        out += [f"   * - ``{name}``", f"     - {_text(strategy.about)}",
                f"     - {strategy.min_workers}", f"     - {ranks}"]
    return "\n".join(out) + "\n"


class _Generated(SphinxDirective):
    """Parse generated reStructuredText in place of the directive."""

    def text(self) -> str:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(schema.__file__)
        self.env.note_dependency(strategies.__file__)
        container = nodes.section()
        container.document = self.state.document
        lines = StringList(self.text().splitlines(), source="<dtrain config schema>")
        nested_parse_with_titles(self.state, lines, container)
        return container.children


class ConfigReference(_Generated):
    def text(self) -> str:
        return reference_rst()


class StrategyTable(_Generated):
    def text(self) -> str:
        return strategies_rst()


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("dtrain-config", ConfigReference)
    app.add_directive("dtrain-strategies", StrategyTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
