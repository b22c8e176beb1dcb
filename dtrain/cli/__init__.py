"""The command line: ``python -m dtrain``, a thin layer over the public API.

``python -m dtrain [options]`` trains (``--resume DIR`` continues a run;
with ``--scheduler-rank`` the process is one rank of an MPI job), in
:mod:`~dtrain.cli.train`; ``python -m dtrain report DIR...`` and
``python -m dtrain graph --out FILE`` are :mod:`~dtrain.cli.tools`.
:mod:`~dtrain.cli.main` dispatches and turns errors into exit codes: user
errors print one line on stderr and exit 2 (a diverged run: 3); anything
else is a bug and keeps its traceback.

May import: every other part of dtrain.
"""
from __future__ import annotations

from dtrain.cli.main import main

__all__ = ["main"]
