"""Readable task names and colours in Dask's dashboard, for dtrain's keys.

Dask labels and colours tasks by ``dask.utils.key_split(key)``, which drops
any 8-letter word that starts with a-f (it takes it for a hex token), so
``forward-backward-3-1-<run>`` shows as ``forward``.  The keys stay as they
are; :func:`install` wraps the ``key_split`` that distributed's scheduler,
task stream, progress and dashboard modules imported, so dtrain's keys get
their whole type name (``forward-backward``, ``load-shard``, ...), and wraps
their ``color_of`` so each type gets the colour of
:data:`dtrain.tasktypes.TASK_COLORS` in the task stream, the progress bars
and the task-group graph.  Other keys are passed through unchanged.

These are distributed internals: every attribute is checked before it is
replaced and a missing one is skipped, so on a distributed that changed
this is a no-op rather than an error.  It runs in the scheduler's process
(from :class:`dtrain.live.DtrainPlugin`), which is where the task prefixes,
the task stream and the dashboard live.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

from dtrain.tasktypes import TASK_COLORS, task_type

# (module, attribute) pairs that hold distributed's own references to the functions.
KEY_SPLIT_USERS = (
    "distributed.scheduler",                       # TaskPrefix / TaskGroup names
    "distributed.diagnostics.task_stream",         # task-stream labels and colours
    "distributed.diagnostics.progress_stream",     # progress bars
    "distributed.diagnostics.progress",
    "distributed.diagnostics.websocket",
    "distributed.dashboard.components.scheduler",  # dashboard components
)
COLOR_OF_USERS = (
    ("distributed.diagnostics.task_stream", "color_of"),
    ("distributed.diagnostics.progress_stream", "color_of"),
    ("distributed.dashboard.components.scheduler", "color_of"),
    ("distributed.dashboard.components.scheduler", "ts_color_of"),
)
_MARK = "__dtrain_wraps__"


def readable_key_split(original: Callable[[object], str]) -> Callable[[object], str]:
    """``original`` (dask's ``key_split``), except that dtrain keys give their task type."""
    def key_split(key: object) -> str:
        return task_type(key) or original(key)

    setattr(key_split, _MARK, original)
    return key_split


def readable_color_of(original: Callable[..., str]) -> Callable[..., str]:
    """``original`` (distributed's ``color_of``), except for dtrain's task types."""
    def color_of(name: object, *args, **kwargs) -> str:
        if isinstance(name, str) and name in TASK_COLORS:
            return TASK_COLORS[name]
        return original(name, *args, **kwargs)

    setattr(color_of, _MARK, original)
    return color_of


def _wrap(module_name: str, attr: str, wrapper: Callable) -> str | None:
    try:
        module = importlib.import_module(module_name)
    except ImportError:          # e.g. the dashboard without bokeh
        return None
    current = getattr(module, attr, None)
    if not callable(current):
        return None
    if not hasattr(current, _MARK):
        setattr(module, attr, wrapper(current))
    return f"{module_name}.{attr}"


def install() -> list[str]:
    """Wrap what exists, once per process; returns the ``module.attribute`` names wrapped."""
    done = [_wrap(m, "key_split", readable_key_split) for m in KEY_SPLIT_USERS]
    done += [_wrap(m, a, readable_color_of) for m, a in COLOR_OF_USERS]
    return [name for name in done if name]
