"""Sphinx configuration of dtrain's documentation site.

Build it, warnings as errors, from the repository root (``tests/test_docs.py`` runs the same)::

    python -m sphinx -W -b html docs docs/_build/html

Nothing is fetched while building: no intersphinx inventories, no gallery runs (the examples
are shown with ``literalinclude`` and run by the tests instead).
"""
from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))          # configref, clihelp, graphgallery: generated pages
sys.path.insert(0, str(DOCS.parent))            # dtrain itself, from this checkout

import dtrain  # noqa: E402

project = "dtrain"
author = "dtrain's authors"
copyright = "dtrain's authors, BSD-3-Clause"
release = dtrain.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_parser",
    "configref",
    "clihelp",
    "graphgallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
# Every Python cross-reference must resolve (a misspelt :func:`dtrain.trian` fails the build),
# except names of other projects (no intersphinx offline) and internal types that signatures
# and docstrings name but the API reference does not document.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(pathlib|numpy|collections\.abc|typing|distributed|dask|pandas|sklearn)\..*"),
    (r"py:class", r"dtrain\.core\.config\.schema\.\w+Config"),    # the sections: configuration.rst
    (r"py:class", r"dtrain\.(core\.modelfile\.ModelSpec|maths\.optim\.TrainState)"),
    (r"py:class", r"dtrain\.maths\.scores\.TargetSums"),
    (r"py:class", r"dtrain\.estimators\.mlp\._MLP"),
    (r"py:mod", r"dtrain\.estimators\.(mlp|cluster)"),
    (r"py:func", r"apply_overrides"),
]
# benchmarks/latest-results.md goes from # to ### headings: fine on GitHub, and here
suppress_warnings = ["myst.header"]

# Markdown pages (MyST): anchors for headings down to ### so that README-style links
# (page.md#a-heading) resolve, and are checked, across pages.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# API reference: numpydoc docstrings, autodoc for the objects, no member tables of their own
# (api.rst lists what is public), type hints in the signatures.
autosummary_generate = False
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = f"dtrain {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {"index": []}
html_show_sourcelink = False
smartquotes = False       # rules such as "'' (detect)" are code-like: keep their quotes straight
