"""The recorder: what a run reports, told to the console, the run directory and the live feed.

The trainer and the engines tell it what happened; it never drives the run.
Each of its parts does one thing: :class:`~dtrain.observe.rundir.RunDir`
writes the files, :class:`~dtrain.observe.console.Console` draws the lines
and the bar, :class:`~dtrain.observe.feed.LiveFeed` sends the events and
follows the step events while a cluster is up.
"""
from __future__ import annotations

import time

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dtrain.core import layerspec
from dtrain.core.config import Config
from dtrain.core.modelfile import ModelSpec
from dtrain.observe import console, spans
from dtrain.observe.console import Console, Echo, summary_lines
from dtrain.observe.feed import LiveFeed
from dtrain.observe.rundir import RunDir
from dtrain.observe.tracking import Tracker


class Recorder:
    """Everything a run reports, in one place.

    The trainer calls :meth:`start` with the run's shape, enters
    :meth:`attached` while a cluster is up, :meth:`epoch` as each epoch's
    evaluation arrives, :meth:`checkpointed` when the engine has written a
    checkpoint, and :meth:`finish` after training.  Use it as a context
    manager so the progress bar is closed whatever happens.

    Parameters
    ----------
    config
        The run's config.
    out
        Run directory, or None for no files.
    echo
        Called with each console line; None for silence.
    progress
        Show a progress bar; by default when ``echo`` is ``print`` and
        standard output is a terminal.  Without a bar, ``echo`` gets a plain
        progress line after every ``plain_every`` seconds of console silence
        (default :data:`~dtrain.observe.console.PLAIN_EVERY`; 0 or less: never), from the
        step events.
    resume_epochs
        Reopen an interrupted run's directory, keeping this many epoch rows.
    on_epoch
        Called with each epoch row as it is recorded (the estimators' ``verbose`` lines).
    """

    def __init__(self, config: Config, out: str | Path | None, echo: Echo | None = print,
                 progress: bool | None = None, resume_epochs: int | None = None,
                 plain_every: float | None = None,
                 on_epoch: Callable[[dict[str, Any]], None] | None = None):
        self.config = config
        self.on_epoch = on_epoch
        self.run_dir = RunDir(Path(out), config, resume_epochs) if out is not None else None
        self.metrics: list[dict[str, Any]] = self.run_dir.epochs() if self.run_dir else []
        self.console = Console(echo, (echo is print and sys.stdout.isatty())
                               if progress is None else progress,
                               console.PLAIN_EVERY if plain_every is None else plain_every)
        self.start_event: dict[str, Any] = {}
        self.feed: LiveFeed | None = None
        self.timeline: dict[str, Any] | None = None
        self.saved: tuple[int, Path] | None = None     # the last checkpoint: step, file
        self.phases: dict[str, float] = {}             # seconds of the run's fixed costs
        self.cpu: list[tuple[int, float]] = []  # (epoch, this process's CPU seconds) per row
        self.tracker = Tracker(config, self.path, resume_epochs is not None, self.say)
        self.span_totals = spans.Totals()      # each worker's time by kind, for the summary
        self.span_sample = spans.Sample()      # a sample of windows' spans, for the report

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.console.close()
        self.tracker.close(exc[1])

    @property
    def path(self) -> Path | None:
        return self.run_dir.path if self.run_dir else None

    def say(self, line: str) -> None:
        self.console.say(line)

    def start(self, run: str, steps_per_epoch: int, train_samples: int) -> None:
        """The run's id (the end of its task keys) and shape, before any step."""
        cfg = self.config
        self.start_event = {"kind": "start", "run": run, "dataset": cfg.data.dataset,
                            "strategy": cfg.graph.strategy, "epochs": cfg.train.epochs,
                            "layers": layerspec.describe(cfg.model.layers,
                                                         cfg.model.input_shape),
                            "steps_per_epoch": steps_per_epoch, "train_samples": train_samples}
        self.console.start(cfg.train.epochs, steps_per_epoch, train_samples)
        self.tracker.start(self.metrics)

    @contextlib.contextmanager
    def attached(self, client: Any) -> Iterator[None]:
        """While a Dask client is up: its dashboard link, the live page, the live feed."""
        self._attach(client)
        try:
            yield
        finally:
            feed, self.feed = self.feed, None
            if feed is not None:
                self.timeline = feed.close(timeline=self.run_dir is not None)

    def _attach(self, client: Any) -> None:
        info, cfg = client.scheduler_info(), self.config.cluster
        link = None
        if (cfg.dashboard_address or cfg.scheduler_address) and \
                info.get("services", {}).get("dashboard"):
            link = client.dashboard_link
        if link:
            self.say(f"dashboard: {link}")
        if not self.start_event:
            return
        try:
            self.feed = LiveFeed(client, self.start_event, self.console)
        except Exception as exc:      # e.g. a scheduler that cannot import dtrain
            self.say(f"live metrics off: the scheduler refused dtrain's plugin "
                     f"({type(exc).__name__}: {exc})")
            return
        if link and link.endswith("/status"):
            self.say(f"live page: {link[:-len('status')]}dtrain")

    def epoch(self, row: dict[str, Any]) -> None:
        self.cpu.append((row.get("epoch", 0), time.process_time()))
        if self.run_dir is not None:
            self.run_dir.add_epoch(row)
        self.tracker.epoch(row)
        if self.feed is not None:
            self.feed.epoch(row)
        self.console.epoch(row)
        if self.on_epoch is not None:
            self.on_epoch(row)

    def window(self, groups: tuple) -> None:
        """A window ran as a task per worker; ``groups``: its chains' spans and timings
        (:mod:`dtrain.observe.spans`), sent on to the live page and kept for the report and
        the summary."""
        if not groups:
            return
        if self.feed is not None:
            self.feed.spans(groups)
        self.span_totals.add(groups)
        self.span_sample.add(groups)

    def checkpointed(self, step: int, path: Path) -> None:
        """The engine saved a checkpoint of ``step`` steps at ``path``."""
        self.saved = (step, path)

    def checkpoint_note(self) -> str:
        """Where the last good checkpoint is, for error messages."""
        if self.saved is None:
            return ""
        step, path = self.saved
        return f"; the last good checkpoint (step {step}) is kept in {path}"

    def finish(self, params: dict[str, np.ndarray], summary: dict[str, Any],
               model: ModelSpec | None = None, keep_checkpoint: bool = True) -> None:
        """The run is done: its parameters, ``model.json`` and summary are written (the last
        checkpoint is kept, for going on, if ``keep_checkpoint``)."""
        self.console.close()
        names = (self.timeline or {}).get("workers") or {}
        shares = self.span_totals.summary(names)
        if shares:
            summary = {**summary, "worker_time_shares": shares}
        sample = self.span_sample.record()
        timeline = self.timeline
        if sample is not None:
            timeline = {**(timeline or {}), "spans": sample, "workers": names}
        if self.run_dir is not None:
            self.run_dir.finish(params, summary, timeline, model, keep_checkpoint)
        self.tracker.finish(summary)
        for line in summary_lines(summary):
            self.say(line)
