"""Run output: the run directory's files, the console, the live events.

A run directory holds ``config.toml`` (written first), ``metrics.jsonl``
(one line per epoch, appended as epochs finish), and, only when the run
succeeds, ``params.npz``, ``timeline.json`` (the task records of a Dask
run), ``report.html`` and then ``summary.json``: a directory without
``summary.json`` is not a finished run.  Files that must not be seen half
written go through a temporary file and a rename.

On a terminal the console shows a progress bar (epoch, step, loss,
accuracy, samples/s) under the epoch lines; elsewhere (CI, mpirun logs)
plain lines: the epoch lines and, while an epoch runs long, a progress line
(step, epoch, loss, accuracy, samples/s) at most every ``PLAIN_EVERY``
seconds.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dtrain import checkpoint, cluster, live
from dtrain.config import Config

logger = logging.getLogger(__name__)

Echo = Callable[[str], None]

PLAIN_EVERY = 30.0      # off a terminal: seconds of console silence before a progress line


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def new_run_dir(base: Path, label: str) -> Path:
    """A fresh ``base/<time>-<label>`` directory (suffixed if that exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = base / (f"{stamp}-{label}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a new run directory under {base}")


class RunDir:
    """The files of one run, written in an order that never looks finished early.

    A new run starts the directory afresh; a resumed one (``keep_epochs`` set)
    keeps its files and cuts ``metrics.jsonl`` back to the epochs its
    checkpoint covers.
    """

    def __init__(self, path: Path, config: Config, keep_epochs: int | None = None):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        if keep_epochs is None:
            for stale in ("summary.json", "report.html", "timeline.json", "params.npz",
                          "metrics.jsonl", checkpoint.FILE):
                (self.path / stale).unlink(missing_ok=True)
            atomic_write(self.path / "config.toml", config.to_toml().encode())
        else:
            rows = self.epochs()[:keep_epochs]
            atomic_write(self.path / "metrics.jsonl",
                         "".join(json.dumps(r) + "\n" for r in rows).encode())

    def epochs(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` written so far."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    def add_epoch(self, row: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def finish(self, params: dict[str, np.ndarray], summary: dict[str, Any],
               timeline: dict[str, Any] | None = None) -> None:
        """Write ``params.npz``, ``timeline.json``, ``report.html`` and then ``summary.json``,
        the mark of a finished run; then drop the checkpoint, which it no longer needs."""
        from dtrain import htmlreport

        tmp = self.path / ".params.npz.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **params)
        os.replace(tmp, self.path / "params.npz")
        if timeline is not None:
            atomic_write(self.path / "timeline.json", json.dumps(timeline).encode())
        run = htmlreport.RunData.read(self.path, summary=summary, timeline=timeline)
        htmlreport.write([run], self.path / "report.html")
        atomic_write(self.path / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        (self.path / checkpoint.FILE).unlink(missing_ok=True)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """One console line per epoch."""
    return (f"epoch {row['epoch']:>{len(str(epochs))}}/{epochs}"
            f"  train_loss {_fmt(row.get('train_loss'), '.4f')}"
            f"  train_acc {_fmt(row.get('train_accuracy'), '.4f')}"
            f"  val_loss {_fmt(row.get('val_loss'), '.4f')}"
            f"  val_acc {_fmt(row.get('val_accuracy'), '.4f')}"
            f"  {_fmt(row.get('samples_per_second'), ',.0f')} samples/s"
            f"  {row['seconds']:.3f} s")


def progress_line(msg: dict[str, Any], steps: int, epochs: int, rate: float | None) -> str:
    """A plain progress line from a ``step`` event (see :mod:`dtrain.live`); ``loss`` and
    ``train_acc`` are the running means over the epoch's minibatches so far."""
    return (f"step {msg['step']:>{len(str(steps))}}/{steps}"
            f"  epoch {msg['epoch']:>{len(str(epochs))}}/{epochs}"
            f"  loss {msg['epoch_loss']:.4f}"
            f"  train_acc {_fmt(msg.get('epoch_accuracy'), '.4f')}"
            f"  {_fmt(rate, ',.0f')} samples/s")


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The final console summary."""
    return [
        f"done: {summary['strategy']} on {summary['workers']} worker(s), "
        f"{summary['shards']} shards, {summary['epochs']} epochs, {summary['steps']} steps "
        f"in {summary['seconds']:.2f} s ({_fmt(summary['samples_per_second'], ',.0f')} samples/s)",
        f"test_accuracy {_fmt(summary['test_accuracy'], '.4f')}  "
        f"test_loss {_fmt(summary['test_loss'], '.4f')}  "
        f"on {summary['test_samples']} test samples",
        f"efficiency {_fmt(summary.get('efficiency'), '.1%')} (time in forward-backward / wall "
        f"time, over workers)  step {_ms(summary.get('step_seconds'))}  overhead "
        f"{_ms(summary.get('overhead_per_step'))} per step",
    ] + ([f"bytes between workers per step {summary['comm_bytes_per_step']:,.0f} (from the "
          f"graph), {_fmt(summary.get('comm_bytes_measured_per_step'), ',.0f')} (measured)"]
         if summary.get("comm_bytes_per_step") is not None else []) + split_lines(summary)


def split_lines(summary: dict[str, Any]) -> list[str]:
    """How a run with CPU and GPU workers split its shards (nothing for one kind)."""
    split = summary.get("work_split") or {}
    if len({v.get("device") for v in split.values()}) < 2:
        return []
    return ["work split: " + ", ".join(
        f"worker {name} ({v['device']}) {v['leaves']} shards"
        + (f", {v['samples_per_second']:,.0f} samples/s measured"
           if v.get("samples_per_second") else "") for name, v in split.items())]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


class Progress:
    """A tqdm bar over the run's steps, with epoch, step, loss, accuracy and samples/s."""

    def __init__(self, epochs: int, steps_per_epoch: int, train_samples: int):
        from tqdm import tqdm

        self.epochs, self.per_epoch = epochs, steps_per_epoch
        size = shutil.get_terminal_size((100, 20))   # tqdm hides its bar on a 0-row terminal
        self.bar = tqdm(total=epochs * steps_per_epoch, unit="step", file=sys.stdout,
                        ncols=size.columns, nrows=size.lines, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} steps "
                        "[{elapsed}<{remaining}{postfix}]")
        self.rate = live.StepRate(train_samples)
        self.stepped = False                # step events seen: they are ahead of epoch rows
        self.info: dict[str, str] = {}
        self.lock = threading.Lock()       # step events arrive on the client's event loop

    def _show(self, done: int) -> None:
        with self.lock:
            if done > self.bar.n:
                self.bar.update(done - self.bar.n)
            self.bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in self.info.items()),
                                     refresh=False)

    def step(self, msg: dict[str, Any]) -> None:
        """A ``step`` event (see :mod:`dtrain.live`)."""
        rate = self.rate.add(msg)
        self.stepped = True
        self.info.update(epoch=f"{msg['epoch']}/{self.epochs}", loss=f"{msg['epoch_loss']:.4f}")
        if msg.get("epoch_accuracy") is not None:
            self.info["train_acc"] = f"{msg['epoch_accuracy']:.4f}"
        if rate is not None:
            self.info["samples/s"] = f"{rate:,.0f}"
        self._show(msg["step"])

    def epoch(self, row: dict[str, Any]) -> None:
        """An epoch row; its validation accuracy (labelled with its epoch: the bar's epoch
        may be ahead), and the rest where no step events come."""
        if not self.stepped:
            self.info["epoch"] = f"{row['epoch']}/{self.epochs}"
            if row.get("train_loss") is not None:
                self.info["loss"] = f"{row['train_loss']:.4f}"
            if row.get("train_accuracy") is not None:
                self.info["train_acc"] = f"{row['train_accuracy']:.4f}"
            if row.get("samples_per_second") is not None:
                self.info["samples/s"] = f"{row['samples_per_second']:,.0f}"
        if row.get("val_accuracy") is not None:
            self.info["val_acc"] = f"{row['val_accuracy']:.4f} (ep {row['epoch']})"
        self._show(row["epoch"] * self.per_epoch)

    def write(self, line: str) -> None:
        with self.lock:
            self.bar.write(line, file=sys.stdout)

    def close(self) -> None:
        with self.lock:
            self.bar.close()


class PlainProgress:
    """Off a terminal: a :func:`progress_line` once ``every`` seconds have passed without a
    console line (a long epoch is not silent; a short one adds nothing to its epoch line).

    With ``latest`` (a callable that returns the run's newest ``step`` event, or None) a
    daemon thread asks for it every ``every`` seconds: one message per interval, none per
    training step.
    """

    MIN_POLL = 0.05          # seconds between asks, however small ``every`` is

    def __init__(self, say: Echo, epochs: int, steps_per_epoch: int, train_samples: int,
                 every: float, latest: Callable[[], dict[str, Any] | None] | None = None):
        self.say, self.every = say, every
        self.epochs, self.steps = epochs, epochs * steps_per_epoch
        self.rate = live.StepRate(train_samples)
        self.last = time.monotonic()
        self.stopped = threading.Event()
        self.thread = None
        if latest is not None:
            self.thread = threading.Thread(target=self._poll, args=(latest,), daemon=True,
                                           name="dtrain-plain-progress")
            self.thread.start()

    def _poll(self, latest: Callable[[], dict[str, Any] | None]) -> None:
        while not self.stopped.wait(max(self.every, self.MIN_POLL)):
            try:
                msg = latest()
            except Exception:      # the cluster is going away: so is the run
                return
            if msg is not None:
                self.step(msg)

    def close(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def quiet(self) -> None:
        """A console line was just written: the silence starts again."""
        self.last = time.monotonic()

    def step(self, msg: dict[str, Any]) -> None:
        """A ``step`` event: printed if the console has been silent for ``every`` seconds."""
        rate = self.rate.add(msg)
        if time.monotonic() - self.last >= self.every:
            self.say(progress_line(msg, self.steps, self.epochs, rate))
            self.quiet()


class Recorder:
    """Everything a run reports, in one place: console, run directory, live events.

    The trainer calls :meth:`start` with the run's shape, :meth:`attach` once
    a cluster is up and :meth:`detach` before it goes (both through
    :meth:`attached`), :meth:`epoch` as each epoch's evaluation arrives,
    :meth:`checkpoint` at window edges, and :meth:`finish` after training.
    Use it as a context manager so the progress bar is closed whatever happens.

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
        (default ``PLAIN_EVERY``; 0 or less: never), from the step events.
    resume_epochs
        Reopen an interrupted run's directory, keeping this many epoch rows.
    """

    def __init__(self, config: Config, out: str | Path | None, echo: Echo | None = print,
                 progress: bool | None = None, resume_epochs: int | None = None,
                 plain_every: float | None = None):
        self.config = config
        self.echo = echo
        self.run_dir = RunDir(Path(out), config, resume_epochs) if out is not None else None
        self.metrics: list[dict[str, Any]] = self.run_dir.epochs() if self.run_dir else []
        self.saved: checkpoint.Checkpoint | None = None
        self.progress = (echo is print and sys.stdout.isatty()) if progress is None else progress
        self.bar: Progress | None = None
        self.plain_every = PLAIN_EVERY if plain_every is None else plain_every
        self.plain: PlainProgress | None = None
        self.client: Any = None
        self.meta: dict[str, Any] = {}
        self.timeline: dict[str, Any] | None = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    @property
    def path(self) -> Path | None:
        return self.run_dir.path if self.run_dir else None

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        elif self.echo is not None:
            self.echo(line)
        plain = self.plain
        if plain is not None:
            plain.quiet()

    def start(self, run: str, steps_per_epoch: int, train_samples: int) -> None:
        """The run's id (the end of its task keys) and shape, before any step."""
        cfg = self.config
        self.meta = {"kind": "start", "run": run, "dataset": cfg.data.dataset,
                     "strategy": cfg.graph.strategy, "epochs": cfg.train.epochs,
                     "steps_per_epoch": steps_per_epoch, "train_samples": train_samples}

    def _start_bar(self) -> None:
        """The progress bar starts with the training, not with the cluster."""
        if self.progress and self.bar is None and self.meta:
            self.bar = Progress(self.meta["epochs"], self.meta["steps_per_epoch"],
                                self.meta["train_samples"])

    def attach(self, client: Any) -> None:
        """Called with the Dask client before training starts (not for ``serial``)."""
        info, cfg = client.scheduler_info(), self.config.cluster
        link = None
        if (cfg.dashboard_address or cfg.scheduler_address) and \
                info.get("services", {}).get("dashboard"):
            link = client.dashboard_link
        if link:
            self.say(f"dashboard: {link}")
        if not self.meta:
            return
        try:
            live.install(client)
        except Exception as exc:      # e.g. a scheduler that cannot import dtrain
            self.say(f"live metrics off: the scheduler refused dtrain's plugin "
                     f"({type(exc).__name__}: {exc})")
            return
        if link and link.endswith("/status"):
            self.say(f"live page: {link[:-len('status')]}dtrain")
        self.client = client
        topic = live.topic(self.meta["run"])
        # asked fresh: the client's cached worker list can be empty
        client.log_event(topic, {**self.meta, "workers": len(cluster.workers(client))})
        self._start_bar()
        if self.bar is not None:                 # every step event, to move the bar
            client.subscribe_topic(topic, self._on_event)
        elif self.echo is not None and self.plain_every > 0:
            run = self.meta["run"]
            self.plain = PlainProgress(self.say, self.meta["epochs"], self.meta["steps_per_epoch"],
                                       self.meta["train_samples"], self.plain_every,
                                       lambda: live.fetch_last_step(client, run))

    @contextlib.contextmanager
    def attached(self, client: Any) -> Iterator[None]:
        """:meth:`attach` on entry, :meth:`detach` on exit (before the cluster closes)."""
        self.attach(client)
        try:
            yield
        finally:
            self.detach()

    def _on_event(self, event: tuple[float, Any]) -> None:
        msg = event[1]
        if not isinstance(msg, dict) or msg.get("kind") != "step":
            return
        bar = self.bar                          # the driver may drop it meanwhile
        if bar is not None:
            bar.step(msg)

    def detach(self) -> None:
        """Say the run has ended and fetch its task records, while the client is still up."""
        client, self.client = self.client, None
        if client is None:
            return
        topic = live.topic(self.meta["run"])
        plain, self.plain = self.plain, None
        if plain is not None:
            plain.close()
        try:
            if self.bar is not None:
                client.unsubscribe_topic(topic)
            client.log_event(topic, {"kind": "end"})
            if self.run_dir is not None:                 # for timeline.json
                self.timeline = live.fetch_timeline(client, self.meta["run"])
        except Exception:  # never hide the run's own outcome behind a reporting failure
            logger.warning("dtrain: could not close the run's live events", exc_info=True)

    def epoch(self, row: dict[str, Any]) -> None:
        if self.run_dir is not None:
            self.run_dir.add_epoch(row)
        if self.client is not None:
            self.client.log_event(live.topic(self.meta["run"]), {"kind": "epoch", **row})
        self._start_bar()
        if self.bar is not None:
            self.bar.epoch(row)
        self.say(epoch_line(row, self.config.train.epochs))

    def checkpoint(self, ckpt: checkpoint.Checkpoint) -> None:
        if self.run_dir is not None:
            checkpoint.save(self.run_dir.path, ckpt, self.config)
            self.saved = ckpt

    def checkpoint_note(self) -> str:
        """Where the last good checkpoint is, for error messages."""
        if self.saved is None:
            return ""
        return (f"; the last good checkpoint (step {self.saved.step}) is kept in "
                f"{self.run_dir.path / checkpoint.FILE}")

    def finish(self, params: dict[str, np.ndarray], summary: dict[str, Any]) -> None:
        self.__exit__()
        if self.run_dir is not None:
            self.run_dir.finish(params, summary, self.timeline)
        for line in summary_lines(summary):
            self.say(line)
