"""``.. dtrain-help:: [COMMAND]``: what ``python -m dtrain [COMMAND] --help`` prints, taken
from the parsers while the site builds (in this process, 90 columns wide), so the
command-line reference is the command line's own."""
from __future__ import annotations

import contextlib
import importlib
import io
import os
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

WIDTH = "90"


def help_text(*words: str) -> str:
    """The ``--help`` text of ``python -m dtrain WORDS``."""
    main = importlib.import_module("dtrain.cli.main")

    out = io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        with contextlib.redirect_stdout(out):
            try:
                code = main.main([*words, "--help"])
            except SystemExit as exc:        # argparse's --help exits 0
                code = exc.code
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    if code not in (0, None):
        raise RuntimeError(f"python -m dtrain {' '.join(words)} --help exited {code}")
    return out.getvalue().rstrip()


class DtrainHelp(SphinxDirective):
    optional_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        text = help_text(*self.arguments)
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("dtrain-help", DtrainHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
