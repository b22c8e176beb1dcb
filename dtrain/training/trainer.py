"""The training driver: plan a run, run it on an engine, record it.

:func:`train` and :func:`resume` are the public entry points (the CLI is a
thin layer over them).  They validate everything they can before any cluster
starts (:func:`~dtrain.training.plan.plan`), then run the plan on an engine
(:mod:`dtrain.training.serial` in this process for the serial reference,
:mod:`dtrain.training.engines` as Dask task graphs for every other strategy) and write
the run directory (what its summary says: :mod:`dtrain.training.summary`).
"""
from __future__ import annotations

import contextlib
import glob
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from distributed import Client

from dtrain.core import broadcast
from dtrain.core.config import Config, DataConfig
from dtrain.core.errors import Diverged, Stopped, UserError
from dtrain.core.modelfile import ModelSpec
from dtrain.deploy import mainguard, plugins
from dtrain.deploy.connect import connect, running_scheduler
from dtrain.deploy.logs import lost_gathers_quiet
from dtrain.deploy.options import make_ahead, warn_if_theirs
from dtrain.deploy.signals import AT_EDGE, AT_ONCE, StopSignals
from dtrain.maths.optim import TrainState
from dtrain.observe.console import Echo
from dtrain.observe.recorder import Recorder
from dtrain.observe.rundir import new_run_dir
from dtrain.taskgraph import strategies
from dtrain.training import checkpoint, collections
from dtrain.training.checkpoint import Checkpoints
from dtrain.training.collections import Collection
from dtrain.training.course import Start, stop_before
from dtrain.training.engines import DaskEngine
from dtrain.training.fullbatch import FullBatchEngine
from dtrain.training.plan import Plan, part_spec, partitioned, plan, plan_on
from dtrain.training.serial import SerialEngine
from dtrain.training.stopping import Watch
from dtrain.training.summary import head_cpu, model_spec, run_summary


@dataclass
class RunResult:
    """What a run produced.

    Attributes
    ----------
    metrics
        One dict per epoch (the lines of ``metrics.jsonl``).
    summary
        The contents of ``summary.json``.
    params
        ``{"W1": ..., "b1": ..., ...}``, as saved in ``params.npz``.
    out
        The run directory, or None if the run wrote no files.
    model
        What ``model.json`` says (layers, normalization, class labels): with
        ``params``, a :class:`dtrain.Model` (``dtrain.Model(result.model,
        result.params)``).
    state
        The last step's training state (parameters and optimizer slots), to go
        on from.
    """

    metrics: list[dict[str, Any]]
    summary: dict[str, Any]
    params: dict[str, np.ndarray]
    out: Path | None = None
    model: ModelSpec | None = None
    state: TrainState | None = None


def train(config: Config, *, client: Client | None = None, out: str | Path | None = None,
          echo: Echo | None = print) -> RunResult:
    """Train a network as ``config`` says and return what it produced.

    Parameters
    ----------
    config
        From :func:`dtrain.load_config`.
    client
        Run on this Dask client's cluster.  Without one, a LocalCluster is
        started (or ``cluster.scheduler_address`` is used) and closed after.
        Ignored by the ``serial`` strategy.
    out
        Run directory for ``config.toml``, ``metrics.jsonl``, ``checkpoint.npz``,
        ``params.npz`` and ``summary.json``; None writes no files.
    echo
        Called with each console line; None for silence.

    Raises
    ------
    UserError
        For anything wrong with the config or the data, before training
        starts where it can be known then.
    Diverged
        When the training loss becomes NaN or infinite, or a step's mean loss per sample
        exceeds ``train.max_loss``.
    Stopped
        When Ctrl-C, SIGTERM or SIGUSR1 stopped the run (in the main thread): at its next
        window edge, after saving a checkpoint, or, before the run made anything (while
        it plans), at once, as a Ctrl-C there raises ``KeyboardInterrupt``.  One that comes
        after the last step is said in one line and the run finishes.
    """
    mainguard.stop_if_bootstrapping()
    if partitioned(config.data):
        return train_on(config, lambda c: collections.from_files(c, config.data), client=client,
                        out=out, echo=echo)
    _credentials_ahead(config, client)
    with StopSignals(AT_ONCE) as signals:
        the_plan = plan(config)
        signals.at_edges()                  # the run makes its directory, its cluster
        recorder = Recorder(config, out, echo)
        with _discarded_if_unused(recorder):
            return _run(the_plan, recorder, Start(the_plan.initial_state(), fresh=True),
                        client, Watch.of(config), signals)


def train_on(config: Config, data: Callable[[Client], Collection], *,
             client: Client | None = None, out: str | Path | None = None,
             echo: Echo | None = print, initial: TrainState | None = None,
             on_epoch: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Train on data that stays where it is on the cluster: ``data(client)`` makes it a
    :class:`~dtrain.training.collections.Collection` (a Dask collection's partitions, or
    files the workers read); each partition becomes a shard on the worker holding it.

    Parameters are as for :func:`train`; the config's ``[data]`` says how to split and
    normalize.  Nothing is gathered to the driver.  ``initial``: start from this state
    (parameters and optimizer slots, as :attr:`RunResult.state` gives) instead of the
    seeded initialization; ``on_epoch``: called with each epoch row as it is recorded.
    """
    mainguard.stop_if_bootstrapping()
    with StopSignals(AT_EDGE) as signals, _planned(config, client, signals, data) as \
            (the_plan, c):
        start = Start(initial, fresh=False) if initial is not None \
            else Start(the_plan.initial_state(), fresh=True)
        recorder = Recorder(config, out, echo, on_epoch=on_epoch)
        with _discarded_if_unused(recorder):
            return _run(the_plan, recorder, start, c, Watch.of(config, initial), signals)


@contextlib.contextmanager
def _planned(config: Config, client: Client | None, signals: StopSignals,
             data: Callable[[Client], Collection] | None = None
             ) -> Iterator[tuple[Plan, Client | None]]:
    """The plan of a run, and the client it runs on: data read on the workers needs the
    cluster before it can be planned (its sizes and statistics come from there).  From the
    moment the run makes anything on, a stop signal is acted on at a window edge."""
    if data is None and not partitioned(config.data):
        the_plan = plan(config)
        signals.at_edges()
        yield the_plan, client
        return
    data = data or (lambda c: collections.from_files(c, config.data))
    signals.at_edges()
    with _cluster(config, client) as c:
        coll = data(c)
        if coll.stats is None:          # (an estimator describes its data before its config)
            collections.describe(c, coll, part_spec(config, coll), config.graph.fan_in)
        yield plan_on(config, coll), c

def resume(run_dir: str | Path, *, config: Config | None = None, client: Client | None = None,
           echo: Echo | None = print) -> RunResult:
    """Continue a run that was killed, from its last checkpoint.

    Parameters
    ----------
    run_dir
        The run directory of the interrupted run.
    config
        Defaults to the run's ``config.toml``; if given, it may differ only in
        ``[cluster]`` (where to run) and ``[track]`` (where to log), not in what to
        compute.
    client, echo
        As for :func:`train`.

    Returns
    -------
    RunResult
        Whose ``params`` are byte-for-byte those of an uninterrupted run.
    """
    mainguard.stop_if_bootstrapping()
    return resume_checked(check_resume(run_dir, config), client=client, echo=echo)


@dataclass(frozen=True)
class Resumption:
    """A run directory checked for resuming, with its config and last checkpoint (None: the
    run was killed before its first one)."""

    run_dir: Path
    config: Config
    checkpoint: checkpoint.Checkpoint | None


def check_resume(run_dir: str | Path, config: Config | None = None) -> Resumption:
    """Everything :func:`resume` checks before it starts a cluster (a run dtrain started and
    did not finish, the same config but for ``[cluster]`` and ``[track]``, a readable
    checkpoint), reading the checkpoint once."""
    run_dir = Path(run_dir)
    config = checkpoint.resumable(run_dir, config)
    saved = checkpoint.load(run_dir)
    return Resumption(run_dir, config, saved[0] if saved is not None else None)


def resume_checked(point: Resumption, *, client: Client | None = None,
                   echo: Echo | None = print) -> RunResult:
    """:func:`resume` from a :func:`check_resume` result."""
    with StopSignals(AT_ONCE) as signals, _planned(point.config, client, signals) as \
            (the_plan, c):
        return _resume(point, the_plan, c, echo, signals)


def _resume(point: Resumption, the_plan: Plan, client: Client | None,
            echo: Echo | None, signals: StopSignals) -> RunResult:
    ckpt = point.checkpoint
    start = Start(ckpt.state, ckpt.step, ckpt.epochs_done) if ckpt is not None \
        else Start(the_plan.initial_state(), fresh=True)
    extending = checkpoint.finished(point.run_dir)
    recorder = Recorder(point.config, point.run_dir, echo, resume_epochs=start.epochs_done)
    if extending:
        recorder.say(f"going on with {point.run_dir}: epochs {start.epochs_done + 1} to "
                     f"{point.config.train.epochs}, from its last step ({start.step})")
        if point.config.optim.schedule == "cosine":
            recorder.say(f"note: optim.schedule = 'cosine' depends on train.epochs: the first "
                         f"{start.epochs_done} epochs followed the curve for "
                         f"{start.epochs_done}, the rest follow the one for "
                         f"{point.config.train.epochs}, so the result differs from a "
                         f"straight {point.config.train.epochs}-epoch run")
    elif start.step:
        recorder.say(f"resuming {point.run_dir} at step {start.step} of "
                     f"{len(the_plan.schedule)} (epoch {start.epochs_done + 1})")
    watch = Watch.of(point.config)
    watch.replay(recorder.metrics, ckpt.best if ckpt is not None else None)
    return _run(the_plan, recorder, start, client, watch, signals)


def _run(the_plan: Plan, recorder: Recorder, start: Start, client: Client | None,
         watch: Watch, signals: StopSignals) -> RunResult:
    """Run the plan from ``start`` and write what it made.  A stop signal that came while
    the run started stops it before its cluster does; one that comes once the engine is
    done (its last step trained) changes nothing: the run finishes its files and says so in
    one line."""
    with recorder:
        recorder.start(the_plan.run, the_plan.schedule.steps_per_epoch, the_plan.train_samples)
        if the_plan.info.dropped:
            recorder.say(f"data: {the_plan.info.dropped} row(s) with a missing or non-finite "
                         f"value left out (data.missing = 'drop')")
        keep = Checkpoints(recorder.path, the_plan.config, recorder.checkpointed)
        try:
            stop_before(signals, the_plan, start, keep)
            with _engine(the_plan, client, recorder) as engine:
                outcome = engine.run(start, recorder, keep, signals, watch)
                signals.settle()            # trained: what comes now finishes its files
        except Diverged as exc:
            exc.note = recorder.checkpoint_note()
            raise
        except KeyboardInterrupt:           # a second Ctrl-C: at once, from wherever it was
            saved = recorder.saved[0] if recorder.saved else None
            raise Stopped("SIGINT", None, len(the_plan.schedule), saved, recorder.path) \
                from None
        params = the_plan.net.named(the_plan.opt.params(outcome.state))
        summary = run_summary(the_plan, outcome, watch, recorder.phases)
        summary["head_cpu_ms_per_step"] = head_cpu(the_plan, recorder.cpu)
        spec = model_spec(the_plan, outcome, watch)
        recorder.finish(params, summary, spec, keep_checkpoint=watch.stopped is None)
        if signals.requested:
            recorder.say(f"{signals.requested} came too late to stop the run: it finished")
    return RunResult(outcome.metrics, summary, params, recorder.path, spec, outcome.last)


@contextlib.contextmanager
def _discarded_if_unused(recorder: Recorder) -> Iterator[None]:
    """A new run that bad input (or a loss that explodes at once) stops before its first
    epoch or checkpoint leaves no run directory behind; one that recorded anything keeps
    it.  A run stopped by a signal keeps it (resumable), and so does a bug (to look at); one
    stopped before it recorded anything leaves none either, and is a stop before training
    (run it again)."""
    try:
        yield
    except (UserError, Diverged):
        if recorder.run_dir is not None:
            recorder.run_dir.discard_unused()
        raise
    except Stopped as exc:
        unused = not recorder.metrics and recorder.saved is None
        if unused and recorder.run_dir is not None:
            unused = recorder.run_dir.discard_unused()
        if unused:
            raise Stopped.before_training(exc.signal) from None
        raise


@contextlib.contextmanager
def _engine(plan: Plan, client: Client | None,
            recorder: Recorder) -> Iterator[SerialEngine | DaskEngine | FullBatchEngine]:
    """The engine the plan runs on.  On a scheduler that is not the run's own (``client``
    given, or a running scheduler named by the config), dtrain's plugins are removed when
    the run ends (:func:`dtrain.deploy.plugins.removed_after`)."""
    cfg, strategy = plan.config, plan.strategy
    engine = FullBatchEngine if cfg.optim.name == "lbfgs" else DaskEngine
    if strategy.in_process:
        yield SerialEngine(plan)
    elif client is not None:
        warn_if_theirs(client)              # the user's cluster: its security is theirs
        with contextlib.nullcontext() if broadcast.kept(client) else \
                plugins.removed_after(client), recorder.attached(client):
            yield engine(plan, client)
    else:
        began = time.perf_counter()
        theirs = bool(running_scheduler(cfg.cluster))     # a running scheduler, not ours
        with _cluster(cfg, None, plan.leaves) as own, \
                plugins.removed_after(own) if theirs else contextlib.nullcontext(), \
                recorder.attached(own):
            recorder.phases["cluster_seconds"] = round(time.perf_counter() - began, 3)
            yield engine(plan, own)


def _credentials_ahead(config: Config, client: Client | None) -> None:
    """Where the run will start its own cluster: its TLS credentials made while it plans
    (:func:`dtrain.deploy.options.make_ahead`)."""
    if client is None and not running_scheduler(config.cluster) and \
            not strategies.get(config.graph.strategy).in_process:
        make_ahead(config.cluster)


@contextlib.contextmanager
def _cluster(cfg: Config, client: Client | None, leaves: int = 0) -> Iterator[Client]:
    """``client``, or a cluster of our own (closed after), shaped by ``cluster.layout`` for
    the workers the strategy needs and the ``leaves`` it computes (0: not known yet)."""
    if client is not None:
        with lost_gathers_quiet():      # a worker lost before the run's windows: as in them
            yield client
        return
    strategy = strategies.get(cfg.graph.strategy)
    needed, c = strategy.min_workers, cfg.cluster
    one_each = c.kind == "local" or c.layout == "hybrid"   # a worker per count (not per job)
    if not running_scheduler(c) and one_each and 0 < c.workers < needed:
        raise UserError(f"graph.strategy = '{strategy.name}' needs {needed} workers "
                        f"({strategy.workers_word.removeprefix('the head + ')}), found "
                        f"{c.workers}; use --workers {needed}")
    # quiet from the cluster's start: dtrain calls every worker as it starts them, and one
    # may be lost meanwhile
    with lost_gathers_quiet(), connect(c, needed, leaves) as own:
        yield own


def default_out_dir(named: str | Path | DataConfig | None) -> Path:
    """A new directory under ``runs/`` named after the time and ``named``: a config file's
    stem, or the data's name (:func:`data_name`; None: the default config's data)."""
    if isinstance(named, DataConfig):
        return new_run_dir(Path("runs"), data_name(named))
    return new_run_dir(Path("runs"), Path(named).stem if named else data_name(DataConfig()))


def data_name(cfg: DataConfig) -> str:
    """A short name of the data a run reads, for its directory: the dataset (``iris``,
    ``mnist``...), or a file's or folder's name (``flowers`` for ``/data/flowers.csv``; the
    folder of a glob such as ``/data/sales/part-*.parquet``)."""
    if not cfg.path or cfg.dataset in ("iris", "digits", "synthetic"):
        return cfg.dataset
    path = Path(cfg.path)
    while path.name and glob.has_magic(path.name):
        path = path.parent
    name = path.name
    for suffix in (".gz", ".csv", ".tsv", ".txt", ".parquet", ".pq"):
        name = name.removesuffix(suffix)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return name or cfg.dataset
