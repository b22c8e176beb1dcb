"""A function run on every worker, and a plugin handed to them, that do not fail, or hang, when
a worker leaves or stops answering during the call."""
from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from distributed import Client, SchedulerPlugin

from dtrain.core import internals

ANSWER_S = 10.0         # how long a worker may take to answer before it is left out


class _Silent:
    def __repr__(self) -> str:
        return "SILENT"


SILENT = _Silent()      # what :func:`answers` says of a worker that did not answer in time


def answers(client: Client, function: Callable, *args: Any,
            workers: Sequence[str] | None = None, timeout: float = ANSWER_S,
            **kwargs: Any) -> dict[str, Any]:
    """``client.run(function, ...)`` on each worker side by side, each given ``timeout``
    seconds: ``{worker: its answer, an exception, or SILENT where it said nothing that
    long}``.  One call to them all would wait for ever on a worker that is stopped (its
    process and sockets there, the scheduler still listing it)."""
    if workers is None:
        workers = list(internals.scheduler_workers(client))

    async def ask(worker: str) -> Any:
        try:
            got = await asyncio.wait_for(client.run(
                function, *args, workers=[worker], on_error="return", asynchronous=True,
                **kwargs), timeout)
        except asyncio.TimeoutError:
            return SILENT
        except OSError as exc:              # it left as it was asked
            return exc
        return got.get(worker, OSError(f"worker {worker} left"))

    async def ask_all() -> list[Any]:
        return await asyncio.gather(*map(ask, workers))

    return dict(zip(workers, client.sync(ask_all)))


def on_workers(client: Client, function: Callable, *args: Any,
               workers: Sequence[str] | None = None, timeout: float = ANSWER_S,
               **kwargs: Any) -> dict[str, Any]:
    """``client.run(function, ...)``, less the workers that left during the call or did
    not answer within ``timeout`` seconds.

    A worker that is lost or retires (a batch job's ``--lifetime``) while the call is out
    answers with a comm error, an ``OSError``; a lost worker is the trainer's to handle
    when it places the next window, so its answer is left out, not raised; so is a worker
    that says nothing (:func:`answers`).  An error of ``function`` itself is raised.
    """
    got = answers(client, function, *args, workers=workers, timeout=timeout, **kwargs)
    for answer in got.values():
        if isinstance(answer, BaseException) and not isinstance(answer, OSError):
            raise answer
    return {a: answer for a, answer in got.items()
            if answer is not SILENT and not isinstance(answer, OSError)}


def register(client: Client, plugin: Any, name: str | None = None) -> None:
    """``client.register_plugin(plugin)``, that does not fail when a worker leaves while a
    worker plugin is handed out: the scheduler keeps the plugin before it hands it to the
    workers there, and gives it to every worker that joins, the one that replaces the lost
    worker included.  A scheduler plugin's failure is raised."""
    try:
        client.register_plugin(plugin, name=name)
    except OSError:                     # a comm to a worker closed as it left
        if isinstance(plugin, SchedulerPlugin):
            raise


_kept: weakref.WeakSet[Any] = weakref.WeakSet()         # clients of clusters dtrain keeps
_done: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def keep(client: Any) -> None:
    """``client``'s cluster is dtrain's own and outlives runs: dtrain's plugins stay on it
    between runs, each installed once (:func:`once`)."""
    _kept.add(client)


def kept(client: Any) -> bool:
    """Whether ``client``'s cluster keeps dtrain's plugins between runs."""
    return client in _kept


def once(client: Any, what: str, install: Callable[[], Any]) -> Any:
    """``install()`` (a plugin's registration, named ``what``) and what it returned; on a
    :func:`kept` cluster, only the first time."""
    if not kept(client):
        return install()
    done = _done.setdefault(client, {})
    if what not in done:
        done[what] = install()
    return done[what]
