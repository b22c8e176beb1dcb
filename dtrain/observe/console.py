"""The console: one line per epoch, a progress bar on a terminal, progress lines elsewhere.

On a terminal a progress bar runs under the epoch lines (epoch, step, loss,
accuracy, samples/s); elsewhere (CI, mpirun logs) plain lines: the epoch lines
and, while an epoch runs long, a progress line (step, epoch, loss, accuracy,
samples/s) at most every ``PLAIN_EVERY`` seconds.  It is fed ``step`` events
(:mod:`dtrain.core.events`) and epoch rows; it never asks the cluster
itself, except through the ``latest`` callable a :class:`PlainProgress` polls.
"""
from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dtrain.observe.runlog import StepRate

Echo = Callable[[str], None]

PLAIN_EVERY = 30.0      # off a terminal: seconds of console silence before a progress line


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
    """A plain progress line from a ``step`` event (see :mod:`dtrain.core.events`); ``loss`` and
    ``train_acc`` are the running means over the epoch's minibatches so far."""
    return (f"step {msg['step']:>{len(str(steps))}}/{steps}"
            f"  epoch {msg['epoch']:>{len(str(epochs))}}/{epochs}"
            f"  loss {msg['epoch_loss']:.4f}"
            f"  train_acc {_fmt(msg.get('epoch_accuracy'), '.4f')}"
            f"  {_fmt(rate, ',.0f')} samples/s")


def _timing_line(summary: dict[str, Any]) -> str:
    """Efficiency over the workers' threads, step time and overhead; a run in this process
    (the serial strategy) has no workers, so no efficiency."""
    step = f"step {_ms(summary.get('step_seconds'))}  overhead " \
        f"{_ms(summary.get('overhead_per_step'))} per step"
    if not summary.get("workers"):
        return f"{step} (in this process: no workers)"
    return (f"efficiency {_fmt(summary.get('efficiency'), '.1%')} (time in forward-backward / "
            f"wall time, over worker threads)  {step}")


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The final console summary."""
    steps = "" if summary.get("solver") else \
        f", {summary.get('steps_run', summary['steps'])} steps"       # lbfgs: in _epochs
    return [
        f"done: {summary['strategy']} on {summary['workers']} worker(s)"
        f"{_threads(summary)}, "
        f"{summary['shards']} shards, {_epochs(summary)}{steps} "
        f"in {summary['seconds']:.2f} s ({_fmt(summary['samples_per_second'], ',.0f')} samples/s)",
        (f"test_r2 {_fmt(summary['test_r2'], '.4f')}  "
         f"test_rmse {_fmt(summary.get('test_rmse'), '.4g')}  " if "test_r2" in summary
         else f"test_accuracy {_fmt(summary['test_accuracy'], '.4f')}  ")
        + f"test_loss {_fmt(summary['test_loss'], '.4f')}  "
        f"on {summary['test_samples']} test samples",
        _timing_line(summary),
    ] + ([f"bytes between workers per step {summary['comm_bytes_per_step']:,.0f} (from the "
          f"graph), {_fmt(summary.get('comm_bytes_measured_per_step'), ',.0f')} (measured)"]
         if summary.get("comm_bytes_per_step") is not None else []) + split_lines(summary)


def _epochs(summary: dict[str, Any]) -> str:
    """``40 epochs``, or ``79 of 200 epochs (stopped early; best val_loss at epoch 74,
    kept)``; lbfgs: ``63 of 200 L-BFGS iterations, 71 evaluations (scipy: CONVERGENCE:
    ...)``."""
    solver = summary.get("solver")
    if solver:
        return (f"{solver['iterations']} of {summary['epochs']} L-BFGS iterations, "
                f"{solver['evaluations']} evaluations (scipy: {solver['message']})")
    stopped = summary.get("stopped_early")
    if not stopped:
        return f"{summary['epochs']} epoch{'s' if summary['epochs'] != 1 else ''}"
    kept = ", its parameters kept" if summary.get("params_from_epoch") else ""
    return (f"{stopped} of {summary['epochs']} epochs (stopped early; best "
            f"{summary['monitor']} at epoch {summary['best_epoch']}{kept})")


def _threads(summary: dict[str, Any]) -> str:
    """`` (2 threads)``: the Dask threads of the workers in all, where there are workers."""
    threads = summary.get("threads")
    return f" ({threads} thread{'s' if threads != 1 else ''})" if threads else ""


def split_lines(summary: dict[str, Any]) -> list[str]:
    """How a run with CPU and GPU workers split its shards (nothing for one kind)."""
    split = summary.get("work_split") or {}
    if len({v.get("device") for v in split.values()}) < 2:
        return []
    choice = summary.get("device_choice") or {}
    return ["work split: " + ", ".join(
        f"worker {name} ({v['device']}) {v['leaves']} shards"
        + (f", {v['samples_per_second']:,.0f} samples/s measured"
           if v.get("samples_per_second") else "") for name, v in split.items())
        + (f"; {choice['why']}" if choice.get("why") else "")]


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
        self.rate = StepRate(train_samples)
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
        """A ``step`` event (see :mod:`dtrain.core.events`)."""
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
        self.rate = StepRate(train_samples)
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


class Console:
    """Where a run's lines go: ``echo`` (None: nowhere), under a :class:`Progress` bar when
    ``progress``, else with :class:`PlainProgress` lines every ``plain_every`` seconds of
    silence (0 or less: never)."""

    def __init__(self, echo: Echo | None, progress: bool, plain_every: float):
        self.echo, self.progress, self.plain_every = echo, progress, plain_every
        self.shape: tuple[int, int, int] | None = None    # epochs, steps per epoch, samples
        self.bar: Progress | None = None
        self.plain: PlainProgress | None = None

    def start(self, epochs: int, steps_per_epoch: int, train_samples: int) -> None:
        """The run's shape, before any step."""
        self.shape = (epochs, steps_per_epoch, train_samples)

    def training(self) -> None:
        """The training has begun: the progress bar starts now, not with the cluster."""
        if self.progress and self.bar is None and self.shape:
            self.bar = Progress(*self.shape)

    def follow(self, latest: Callable[[], dict[str, Any] | None]) -> None:
        """Off a terminal, poll ``latest`` for the newest ``step`` event (see
        :class:`PlainProgress`)."""
        if self.bar is None and self.echo is not None and self.plain_every > 0 and self.shape:
            self.plain = PlainProgress(self.say, *self.shape, self.plain_every, latest)

    def say(self, line: str) -> None:
        bar = self.bar
        if bar is not None:
            bar.write(line)
        elif self.echo is not None:
            self.echo(line)
        plain = self.plain
        if plain is not None:
            plain.quiet()

    def step(self, msg: dict[str, Any]) -> None:
        """A ``step`` event."""
        bar = self.bar                          # the driver may drop it meanwhile
        if bar is not None:
            bar.step(msg)

    def epoch(self, row: dict[str, Any]) -> None:
        self.training()
        if self.bar is not None:
            self.bar.epoch(row)
        self.say(epoch_line(row, self.shape[0] if self.shape else row["epoch"]))

    def stop_following(self) -> None:
        plain, self.plain = self.plain, None
        if plain is not None:
            plain.close()

    def close(self) -> None:
        """Close the bar (the lines after it go plainly to ``echo``)."""
        self.stop_following()
        bar, self.bar = self.bar, None
        if bar is not None:
            bar.close()
