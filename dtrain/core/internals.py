"""Every use of distributed's private API, in one place, each with its reason and its fallback.

dtrain relies on a few of distributed's internals where no public API does
the job.  Each is reached only through a function here, which checks that
the attribute is there and has the expected kind before it touches it and
does nothing (returning False or None) where it has changed, so that a new
distributed degrades dtrain's speed or looks, never its results.
``tests/test_internals.py`` checks every one against the installed
distributed, so a change underneath fails a test rather than going unseen.

1. ``BatchedSend.interval`` on the control streams: distributed batches
   control messages on hard-coded 2-10 ms intervals, with no config key; a
   step is a chain of small dependent tasks and would pay one interval per
   hop (:func:`set_batch_interval`).
2. ``distributed.worker._worker_cvar`` and ``Worker.executors``: an executor
   that runs a task in the worker's event loop must set the context variable
   that ``get_worker()`` reads (:func:`worker_context`, :func:`add_executor`).
3. ``key_split`` and ``color_of`` as distributed's scheduler, task-stream and
   dashboard modules imported them: ``key_split`` drops any 8-letter word
   starting with a-f as if it were a hex token, so ``forward-backward-3-1``
   shows as ``forward`` (:func:`relabel_tasks`).
4. The scheduler's identity call (``client.scheduler.identity``): the
   client's cached ``scheduler_info()`` can list no workers while workers are
   connected (:func:`scheduler_workers`).
5. The dashboard's Bokeh server and page template, to serve ``/dtrain``
   beside distributed's own pages (:func:`add_dashboard_page`,
   :func:`style_dashboard_doc`).
6. A worker's RPC handlers, for the word an MPI head sends every worker rank
   before it closes them (:func:`add_worker_handler`).
7. A worker's thread count (``Worker.state.nthreads``) (:func:`worker_threads`).
8. A worker's ``Security`` (``Worker.security``), whose TLS contexts the
   worker-to-worker sockets use (:func:`worker_security`).
9. The scheduler's ``unrunnable`` tasks, their ``loose_restrictions``, its
   ``transitions`` and the event it logs when a worker's status changes: a task
   pinned to a worker with ``allow_other_workers`` that loses its worker while no
   other runs waits as ``no-worker``, and a worker that starts running later is
   offered only the tasks it is among the valid workers of, so the task waits for
   ever (a run's only worker SIGKILLed and started again by its nanny: the new one
   joins as ``init``, then runs) (:func:`schedule_stranded`,
   :func:`starts_running`).
10. ``Server.periodic_callbacks`` (tornado's ``PeriodicCallback.callback_time``, in
    ms): a worker's sampling profiler (``profile``, every 10 ms while a task runs) and
    event-loop tick (``tick``, every 20 ms) each wake its event loop, which takes the
    GIL from the window's task thread; the config keys that set them are read only
    when a worker starts, and dtrain tunes workers it did not start
    (:func:`slow_callback`).
11. The scheduler's ``request_remove_replicas`` (what its active memory manager uses) and
    its tasks' ``who_has``: a partition a run moved between workers is held on both once
    the run ends, and distributed's public ``replicate`` drops a random copy, where the
    one to drop is the one the run made (:func:`drop_copies`).
12. A scheduler's RPC handlers (``Server.handlers``), for a handler a plugin adds and
    the driver calls without waiting (:func:`call_scheduler_soon`: a window's spans,
    too many for the scheduler's event log); and the dashboard's ``progress_quads`` as
    its scheduler components imported it, for rows of the Progress panel that are not
    task prefixes (:func:`add_progress_rows`: the training steps).
13. The scheduler's ``tasks`` with each task's ``state`` and ``dependencies``: a window
    whose tasks wait on something no worker is doing (``no-worker``, ``queued`` or
    ``waiting`` with nothing of theirs ``processing``) is stuck for good, and the driver
    runs it again rather than wait for ever (:func:`stalled_tasks`).
14. The scheduler's ``heartbeat_worker`` handler and the ``heartbeat-interval`` of its
    reply, which sets each worker's next heartbeat: distributed asks for one a second
    from each of 11 to 49 workers, which at 32 workers on a LocalCluster is a third of an
    idle head's CPU; there is no config key (:func:`fewer_heartbeats`).
"""
from __future__ import annotations

import contextvars
import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

_MARK = "__dtrain_wraps__"

# (1) -------------------------------------------------------------------------------------


def set_batch_interval(stream: object, seconds: float) -> bool:
    """Set a ``BatchedSend``'s ``interval``; False (nothing changed) if it has none."""
    if stream is None or not isinstance(getattr(stream, "interval", None), (int, float)):
        return False
    stream.interval = seconds
    return True


def batch_interval(stream: object) -> float | None:
    """A ``BatchedSend``'s ``interval`` (None if it has none)."""
    value = getattr(stream, "interval", None)
    return value if isinstance(value, (int, float)) else None


def client_stream(client: Any) -> object:
    """The client's stream to the scheduler."""
    return getattr(client, "scheduler_comm", None)


def worker_stream(worker: Any) -> object:
    """A worker's stream to the scheduler."""
    return getattr(worker, "batched_stream", None)


def scheduler_streams(scheduler: Any, to: str) -> dict[str, object]:
    """The scheduler's streams ``to`` its ``"workers"`` or ``"clients"``, by address/id."""
    streams = getattr(scheduler, "stream_comms" if to == "workers" else "client_comms", None)
    return streams if isinstance(streams, dict) else {}

# (2) -------------------------------------------------------------------------------------


def worker_context() -> contextvars.ContextVar | None:
    """The context variable ``distributed.get_worker()`` reads, or None."""
    import distributed.worker
    current = getattr(distributed.worker, "_worker_cvar", None)
    return current if isinstance(current, contextvars.ContextVar) else None


def add_executor(worker: Any, name: str, executor: Any) -> bool:
    """Give ``worker`` an executor that tasks can ask for (``annotate(executor=name)``)."""
    executors = getattr(worker, "executors", None)
    if not isinstance(executors, dict):
        return False
    executors.setdefault(name, executor)
    return True


def has_executor(worker: Any, name: str) -> bool:
    return name in (getattr(worker, "executors", None) or {})

# (3) -------------------------------------------------------------------------------------

# modules holding their own reference to dask's key_split, and to distributed's color_of
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


def _wrap(module_name: str, attr: str, wrapper: Callable[[Callable], Callable]) -> str | None:
    try:
        module = importlib.import_module(module_name)
    except ImportError:          # e.g. the dashboard without bokeh
        return None
    current = getattr(module, attr, None)
    if not callable(current):
        return None
    setattr(module, attr, _once(current, wrapper))
    return f"{module_name}.{attr}"


def _once(current: Callable, wrapper: Callable[[Callable], Callable]) -> Callable:
    """``wrapper(current)``, marked as wrapping ``current`` (:func:`unwrapped`); ``current``
    itself where it is such a wrapper already: wrapping twice wraps once."""
    if hasattr(current, _MARK):
        return current
    wrapped = wrapper(current)
    setattr(wrapped, _MARK, current)
    return wrapped


def relabel_tasks(kind_of: Callable[[object], str | None],
                  colors: dict[str, str]) -> list[str]:
    """Make distributed label a key by ``kind_of(key)`` where that is not None, and colour
    those kinds by ``colors``; other keys are passed through unchanged.  Once per process;
    returns the ``module.attribute`` names wrapped."""
    def key_split(original: Callable[[object], str]) -> Callable[[object], str]:
        return lambda key: kind_of(key) or original(key)

    def color_of(original: Callable[..., str]) -> Callable[..., str]:
        return lambda name, *args, **kwargs: colors[name] if isinstance(name, str) and \
            name in colors else original(name, *args, **kwargs)

    done = [_wrap(m, "key_split", key_split) for m in KEY_SPLIT_USERS]
    done += [_wrap(m, a, color_of) for m, a in COLOR_OF_USERS]
    return [name for name in done if name]


def unwrapped(function: Callable) -> Callable:
    """The original of a function this module wrapped (:func:`relabel_tasks`,
    :func:`fewer_heartbeats`; itself if not wrapped)."""
    return getattr(function, _MARK, function)

# (4) -------------------------------------------------------------------------------------


def scheduler_workers(client: Any) -> dict[str, dict]:
    """``{address: info}`` of the connected workers, asked of the scheduler now.

    Not ``client.scheduler_info()["workers"]``: that returns the client's cached
    identity, which a periodic refresh (``distributed.client.scheduler-info-interval``)
    overwrites with one that lists no workers, so it can come back empty while
    workers are connected.
    """
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]

# (5) -------------------------------------------------------------------------------------


def add_dashboard_page(scheduler: Any, route: str, make_doc: Callable[..., None],
                       nav_name: str) -> bool:
    """Serve a Bokeh document at ``route`` from the scheduler's own web server, with a link
    in the dashboard's navigation bar, the way ``distributed.dashboard.scheduler.connect``
    adds distributed's pages.  ``make_doc(scheduler, extra, doc)`` builds it.  False where
    there is no dashboard, or it has changed (the training does not depend on the page)."""
    try:
        from bokeh.server.server import BokehTornado
        from tornado.ioloop import IOLoop

        from distributed.dashboard import scheduler as dashboard
        from distributed.dashboard.core import BokehApplication

        http = scheduler.http_application
        pages = [app for app in http.applications if isinstance(app, BokehTornado)]
        if not pages:                       # the dashboard is off
            return False
        variables = dashboard.template_variables(scheduler)   # shared by every page
        if isinstance(variables.get("pages"), list) and nav_name not in variables["pages"]:
            variables["pages"].append(nav_name)
        app = BokehApplication({route: make_doc}, scheduler, prefix=pages[0].prefix,
                               template_variables=variables)
        http.add_application(app)
        app.initialize(IOLoop.current())
        app.start()
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        logger.warning("dtrain: the %s page is not available here (%s: %s)", route,
                       type(exc).__name__, exc)
        return False
    return True


def style_dashboard_doc(doc: Any, page: Any, refresh_ms: int, title: str, template: str,
                        extra: dict[str, Any]) -> None:
    """Give a document distributed's page template and theme, and call ``page.update``
    every ``refresh_ms`` while it is open."""
    from distributed.dashboard.components import add_periodic_callback
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    add_periodic_callback(doc, page, refresh_ms)
    doc.title = title
    doc.template = env.from_string(template)
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME

# (6), (7), (8) ----------------------------------------------------------------------------


def add_worker_handler(worker: Any, op: str, handler: Callable[..., Any]) -> bool:
    """Answer RPC ``op`` on ``worker`` with ``handler``."""
    handlers = getattr(worker, "handlers", None)
    if not isinstance(handlers, dict):
        return False
    handlers[op] = handler
    return True


def worker_security(worker: Any) -> Any:
    """A worker's ``distributed.Security`` (its TLS certificate, key and CA), None if it has
    none: what the worker-to-worker sockets of a TLS cluster are wrapped in."""
    from distributed import Security

    security = getattr(worker, "security", None)
    return security if isinstance(security, Security) else None


def worker_threads(worker: Any) -> int:
    """The task threads of a worker (1 if unknown)."""
    return int(getattr(getattr(worker, "state", None), "nthreads", 1) or 1)


def log_event_soon(client: Any, topic: str, msg: Any) -> bool:
    """``client.log_event(topic, msg)`` without waiting for the scheduler's answer: queued on
    the client's event loop (``Client.log_event`` blocks on a round trip, and a fused
    window's epochs all arrive at once).  False, having sent it the blocking way, where the
    client has no scheduler rpc to queue it on."""
    scheduler, loop = getattr(client, "scheduler", None), getattr(client, "loop", None)
    if scheduler is None or loop is None or not hasattr(scheduler, "log_event"):
        client.log_event(topic, msg)
        return False
    loop.add_callback(scheduler.log_event, topic=topic, msg=msg)
    return True


# (9) -------------------------------------------------------------------------------------


def schedule_stranded(scheduler: Any) -> int:
    """On the scheduler (a plugin's hook): the ``no-worker`` tasks that may run on any
    worker (pinned with ``allow_other_workers``; no resource asked for) go to a running
    worker, as they would have had one been running when theirs left; how many (0 where the
    scheduler has changed)."""
    unrunnable = getattr(scheduler, "unrunnable", None)
    if not isinstance(unrunnable, dict) or not getattr(scheduler, "running", None) or \
            not callable(getattr(scheduler, "transitions", None)):
        return 0
    stranded = [ts.key for ts in unrunnable if getattr(ts, "loose_restrictions", False)
                and not getattr(ts, "resource_restrictions", None)]
    if stranded:
        scheduler.transitions(dict.fromkeys(stranded, "processing"),
                              stimulus_id=f"dtrain-stranded-{time.time()}")
    return len(stranded)


def starts_running(msg: Any) -> bool:
    """Whether a scheduler event (a plugin's ``log_event``) says a worker now runs."""
    return isinstance(msg, dict) and msg.get("action") == "worker-status-change" and \
        msg.get("status") == "running"


def schedule_stranded_soon(scheduler: Any) -> bool:
    """:func:`schedule_stranded` on the scheduler's event loop, once the handler that calls
    this (a worker joining, or its status changing) has updated the running workers;
    False where the scheduler has no loop."""
    loop = getattr(scheduler, "loop", None)
    if not callable(getattr(loop, "add_callback", None)):
        return False
    loop.add_callback(schedule_stranded, scheduler)
    return True


# (10) ------------------------------------------------------------------------------------


def callback_ms(server: Any, name: str) -> float | None:
    """The period in ms of ``server``'s periodic callback ``name`` (None: it has none)."""
    found = (getattr(server, "periodic_callbacks", None) or {}).get(name)
    period = getattr(found, "callback_time", None)
    return float(period) if isinstance(period, (int, float)) else None


def slow_callback(server: Any, name: str, ms: float) -> bool:
    """Run ``server``'s periodic callback ``name`` every ``ms`` milliseconds, unless it runs
    at most that often already (from its next run on); False, having changed nothing, where
    it has no such callback (e.g. the profiler switched off by config)."""
    period = callback_ms(server, name)
    if period is None:
        return False
    server.periodic_callbacks[name].callback_time = max(period, float(ms))
    return True


# (11) ------------------------------------------------------------------------------------


def drop_copies(copies: list[tuple[Any, str]], dask_scheduler: Any = None) -> int:
    """On the scheduler (``client.run_on_scheduler``): each ``(key, worker)`` of ``copies``,
    the worker's replica of the key dropped where another worker holds the key too (never
    the last copy); how many were asked (0 where the scheduler has changed).  Fire and
    forget, as the active memory manager's: a worker still using one keeps it."""
    request = getattr(dask_scheduler, "request_remove_replicas", None)
    tasks, workers = getattr(dask_scheduler, "tasks", None), getattr(dask_scheduler,
                                                                      "workers", None)
    if not callable(request) or not isinstance(tasks, dict) or workers is None:
        return 0
    by_worker: dict[str, list[Any]] = {}
    for key, address in copies:
        ts, ws = tasks.get(key), workers.get(address)
        held = getattr(ts, "who_has", None) or ()
        if ws is not None and ws in held and len(held) > 1:
            by_worker.setdefault(address, []).append(key)
    for address, keys in by_worker.items():
        request(address, keys, stimulus_id=f"dtrain-moved-{time.time()}")
    return sum(map(len, by_worker.values()))


# (12) ------------------------------------------------------------------------------------


def call_scheduler_soon(client: Any, op: str, **kwargs: Any) -> bool:
    """Call the scheduler's handler ``op`` (one a scheduler plugin added to
    ``Scheduler.handlers``) with ``kwargs``, queued on the client's event loop and never
    waited for: for data too big or too many for the scheduler's event log (which keeps
    every event, and sends each to the topic's subscribers).  False where the client has
    no scheduler rpc to queue it on (nothing is sent)."""
    scheduler, loop = getattr(client, "scheduler", None), getattr(client, "loop", None)
    if scheduler is None or loop is None:
        return False

    async def call() -> None:
        try:
            await getattr(scheduler, op)(**kwargs)
        except Exception:           # a scheduler without the handler: nothing to show
            pass
    loop.add_callback(call)
    return True


_progress_rows: list[Callable[[], dict[str, tuple[int, int]]]] = []


def add_progress_rows(rows: Callable[[], dict[str, tuple[int, int]]]) -> str | None:
    """Add rows to the dashboard's Progress panel: ``rows()`` gives ``{name: (done,
    total)}`` each time the panel is drawn (a failure or ``{}``: none), shown beside the
    task prefixes' bars (:func:`distributed.diagnostics.progress_stream.progress_quads`,
    as the dashboard's scheduler components imported it, wrapped once per process; each
    ``rows`` is asked once per drawing).  Returns the ``module.attribute`` wrapped, None
    where distributed has changed."""
    if rows not in _progress_rows:
        _progress_rows.append(rows)

    def quads(original: Callable[..., dict]) -> Callable[..., dict]:
        def wrapped(msg: Any, *args: Any, **kwargs: Any) -> dict:
            extra: dict[str, tuple[int, int]] = {}
            if isinstance(msg, dict) and isinstance(msg.get("all"), dict):
                for source in list(_progress_rows):
                    try:
                        extra.update(source() or {})
                    except Exception:
                        pass
            if extra:
                msg = {k: dict(v) if isinstance(v, dict) else v for k, v in msg.items()}
                for name, (done, total) in extra.items():
                    for v in msg.values():
                        if isinstance(v, dict):
                            v[name] = 0
                    msg["all"][name] = max(total, done, 1)
                    if isinstance(msg.get("memory"), dict):
                        msg["memory"][name] = done
            return original(msg, *args, **kwargs)
        return wrapped

    return _wrap("distributed.dashboard.components.scheduler", "progress_quads", quads)


# (13) ------------------------------------------------------------------------------------


def stalled_tasks(keys: list[Any], dask_scheduler: Any = None) -> dict[str, str] | None:
    """On the scheduler (``client.run_on_scheduler``): ``{key: state}`` of the tasks that
    ``keys`` wait on, themselves included (through their dependencies, down to what is in
    memory), where none of those is ``processing``: empty if one is, or if all are done;
    None where the scheduler has changed."""
    tasks = getattr(dask_scheduler, "tasks", None)
    if not isinstance(tasks, dict):
        return None
    seen: set[Any] = set()
    todo, states = list(keys), {}
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        ts = tasks.get(key)
        state = getattr(ts, "state", None)
        if state == "processing":
            return {}
        if ts is None or state in ("memory", "erred", "forgotten", None):
            continue
        states[str(key)] = str(state)
        todo.extend(getattr(d, "key", None) for d in getattr(ts, "dependencies", ()))
    return states


# (14) ------------------------------------------------------------------------------------


def fewer_heartbeats(scheduler: Any, per_second: float, most_s: float) -> bool:
    """Have ``scheduler``'s workers send it at most about ``per_second`` heartbeats a second
    in all: each heartbeat's reply asks for the next after ``workers / per_second`` seconds,
    at most ``most_s``, and never sooner than distributed's own interval.  Within the
    scheduler's ``worker_ttl`` too: a worker silent for ``max(worker_ttl, 10 x distributed's
    interval)`` is removed, and the interval stays under a fifth of that.  False, having
    changed nothing, where the scheduler has no such handler; wrapping twice wraps once."""
    handlers = getattr(scheduler, "handlers", None)
    original = handlers.get("heartbeat_worker") if isinstance(handlers, dict) else None
    if not callable(original):
        return False

    def wrapper(original: Callable) -> Callable:
        def heartbeat_worker(*args: Any, **kwargs: Any) -> Any:
            reply = original(*args, **kwargs)
            asked = reply.get("heartbeat-interval") if isinstance(reply, dict) else None
            if isinstance(asked, (int, float)):
                workers = len(getattr(scheduler, "workers", ()) or ())
                most, ttl = most_s, getattr(scheduler, "worker_ttl", None)
                if isinstance(ttl, (int, float)) and ttl > 0:   # silent this long: removed
                    most = min(most, max(ttl, 10 * asked) / 5)
                reply["heartbeat-interval"] = max(asked, min(workers / per_second, most))
            return reply
        return heartbeat_worker

    handlers["heartbeat_worker"] = _once(original, wrapper)
    return True
