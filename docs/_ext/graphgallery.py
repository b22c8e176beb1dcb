"""``.. dtrain-graphs::``: every picture of ``graphs/`` as a figure, captioned as
``graphs/README.md``'s table captions it, in the table's order (the table is checked against
the strategies' own list of pictures by ``tests/test_drawing.py``)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"
ROW = re.compile(r"^\| \[(?P<file>[\w.-]+\.svg)\]\((?P=file)\) \| (?P<caption>.+) \|$")


def pictures() -> list[tuple[str, str]]:
    """``(file name, caption)`` for each row of graphs/README.md's table."""
    rows = [ROW.match(line) for line in (GRAPHS / "README.md").read_text().splitlines()]
    return [(m["file"], m["caption"]) for m in rows if m]


class Gallery(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(GRAPHS / "README.md"))
        lines: list[str] = []
        for name, caption in pictures():
            caption = re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", caption)
            lines += [f".. figure:: /../graphs/{name}", f"   :alt: {name}", "   :width: 100%",
                      "", f"   ``{name}``: {caption}", ""]
        container = nodes.section()
        container.document = self.state.document
        self.state.nested_parse(StringList(lines, source=str(GRAPHS / "README.md")),
                                self.content_offset, container)
        return container.children


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("dtrain-graphs", Gallery)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
