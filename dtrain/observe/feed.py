"""The driver's side of the live events: it announces the run to the scheduler's plugin, sends
the epochs, follows the step events for the console, and fetches the task records at the end."""
from __future__ import annotations

import logging
from typing import Any

from dtrain.core import events, internals
from dtrain.observe import live
from dtrain.observe.console import Console

logger = logging.getLogger(__name__)


class LiveFeed:
    """One run's events on one client, for as long as the cluster is up.

    Parameters
    ----------
    client
        The run's Dask client.
    start
        The run's ``start`` event (see :mod:`dtrain.core.events`), without ``workers``.
    console
        Told of step events: every one to move a progress bar, or the newest now and
        then for plain progress lines.
    """

    def __init__(self, client: Any, start: dict[str, Any], console: Console):
        self.client, self.console = client, console
        self.run, self.topic = start["run"], events.topic(start["run"])
        self.subscribed = False
        live.install(client)
        # asked fresh: the client's cached worker list can be empty
        client.log_event(self.topic, {**start,
                                      "workers": len(internals.scheduler_workers(client))})
        console.training()
        if console.bar is not None:                 # every step event, to move the bar
            client.subscribe_topic(self.topic, self._on_event)
            self.subscribed = True
        else:
            console.follow(lambda: live.fetch_last_step(client, self.run))

    def _on_event(self, event: tuple[float, Any]) -> None:
        msg = event[1]
        if isinstance(msg, dict) and msg.get("kind") == "step":
            self.console.step(msg)

    def epoch(self, row: dict[str, Any]) -> None:
        internals.log_event_soon(self.client, self.topic, {"kind": "epoch", **row})

    def spans(self, groups: tuple) -> None:
        """A window's spans and timings, to the scheduler's plugin (never waited for)."""
        live.send_spans(self.client, self.run, groups)

    def close(self, timeline: bool) -> dict[str, Any] | None:
        """Say the run has ended; return its task records if ``timeline``."""
        self.console.stop_following()
        try:
            if self.subscribed:
                self.client.unsubscribe_topic(self.topic)
            self.client.log_event(self.topic, {"kind": "end"})
            return live.fetch_timeline(self.client, self.run) if timeline else None
        except Exception:  # never hide the run's own outcome behind a reporting failure
            logger.warning("dtrain: could not close the run's live events", exc_info=True)
            return None
