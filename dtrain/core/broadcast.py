"""A function run on every worker that does not fail when a worker leaves during the call."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distributed import Client


def on_workers(client: Client, function: Callable, *args: Any,
               workers: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    """``client.run(function, ...)``, less the workers that left during the call.

    A worker that is lost or retires (a batch job's ``--lifetime``) while the call is out
    answers with a comm error, an ``OSError``; a lost worker is the trainer's to handle
    when it places the next window, so its answer is left out, not raised.  An error of
    ``function`` itself is raised.
    """
    answers = client.run(function, *args, workers=workers, on_error="return", **kwargs)
    for answer in answers.values():
        if isinstance(answer, BaseException) and not isinstance(answer, OSError):
            raise answer
    return {a: answer for a, answer in answers.items() if not isinstance(answer, OSError)}
