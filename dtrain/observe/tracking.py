"""Experiment tracking: a run's epochs, config and final model, logged to TensorBoard and MLflow.

Both are optional and off by default (``[track] tensorboard``, ``[track] mlflow``); their
packages are extras (``pip install 'dtrain[tensorboard]'``, ``'dtrain[mlflow]'``) imported
only when a run turns them on, and :func:`check` says which extra is missing before
anything starts.

* **TensorBoard**: event files in ``<run dir>/tensorboard/``: the config (as text and as
  hparams) at step 0, one scalar per epoch metric at step = epoch, the test metrics at the
  last epoch.  Written with TensorBoard's own event-file writer and protos (no TensorFlow).
* **MLflow**: one MLflow run per dtrain run, in the experiment ``track.experiment`` of the
  store ``track.mlflow_uri`` (a local file store, ``mlruns/``, by default): the config as
  params ``section.key``, the epoch metrics at step = epoch, and at the end the test
  metrics and the run directory's model files as artifacts.  Its id is kept in
  ``<run dir>/mlflow_run_id``.

A resumed run continues the same MLflow run and appends to the same TensorBoard directory;
an epoch that a tracker already has (logged before the run was killed, then trained again
from the checkpoint, to the same numbers) is not logged twice.  Only the driver tracks.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtrain.core import files
from dtrain.core.config import Config, TrackConfig
from dtrain.core.errors import Stopped, UserError

# the epoch metrics every tracker gets (the keys of metrics.jsonl's rows)
METRICS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "samples_per_second",
           "lr")
TEST_METRICS = ("test_loss", "test_accuracy")
# what the run directory's model is made of: logged as MLflow artifacts when present
MODEL_FILES = (files.PARAMS, files.MODEL, files.CONFIG, files.SUMMARY)

# track.<key> -> the module the tracker needs (its extra has the key's name)
MODULES = {"tensorboard": "tensorboard.summary.writer.event_file_writer",
           "mlflow": "mlflow.tracking"}


def check(track: TrackConfig) -> None:
    """Raise :class:`UserError` naming the extra to install when an enabled tracker's package
    cannot be imported."""
    for key in _enabled(track):
        _load(key)


def _enabled(track: TrackConfig) -> list[str]:
    """The ``[track]`` keys turned on."""
    return [key for key in MODULES if getattr(track, key)]


def _load(key: str) -> Any:
    """The module tracker ``key`` needs, or a UserError naming its extra."""
    try:
        return importlib.import_module(MODULES[key])
    except ImportError as exc:
        raise UserError(f"track.{key} = true but {key} cannot be imported ({exc}); install it "
                        f"with pip install 'dtrain[{key}]', or set track.{key} = false") from None


def flat_config(config: Config) -> dict[str, Any]:
    """``{"section.key": value}``, lists written as TOML writes them."""
    return {f"{section}.{key}": str(value) if isinstance(value, list) else value
            for section, keys in config.to_dict().items() for key, value in keys.items()}


class Tracker:
    """The run's trackers (none, TensorBoard, MLflow, or both), told what the recorder is told.

    Parameters
    ----------
    config
        The run's config; ``config.track`` says which trackers.
    run_dir
        The run directory; trackers need one (their files live there or name it).
    resumed
        The run continues an interrupted one in ``run_dir``.
    warn
        Called with one line when a tracker fails mid-run (it is then turned off; the
        training goes on).
    """

    def __init__(self, config: Config, run_dir: Path | None, resumed: bool = False,
                 warn: Callable[[str], None] = print):
        self.config, self.run_dir, self.resumed, self.warn = config, run_dir, resumed, warn
        self.keys = _enabled(config.track)
        if self.keys and run_dir is None:
            raise UserError(f"track.{self.keys[0]} = true logs the run directory's files; "
                            f"pass out=DIR to dtrain.train")
        check(config.track)
        if run_dir is not None and not resumed:       # a new run in an old run's directory
            _forget(run_dir)
        self.sinks: list[TensorBoardSink | MLflowSink] = []

    def start(self, rows: list[dict[str, Any]]) -> None:
        """Open the trackers, log the config, then ``rows`` (epochs already recorded in the
        run directory) that a tracker does not have yet."""
        kinds = {"tensorboard": TensorBoardSink, "mlflow": MLflowSink}
        for key in self.keys:
            self.sinks.append(kinds[key](self.config, self.run_dir, self.resumed))
        for row in rows:
            self.epoch(row)

    def epoch(self, row: dict[str, Any]) -> None:
        values = {k: float(row[k]) for k in METRICS if row.get(k) is not None}
        self._each("epoch", row["epoch"], values)

    def finish(self, summary: dict[str, Any]) -> None:
        """After the run directory's final files: the test metrics and the model."""
        self._each("finish", {k: float(summary[k]) for k in TEST_METRICS
                              if summary.get(k) is not None})
        self.close(None)

    def close(self, exc: object) -> None:
        """Close every tracker; a run that ends with the exception ``exc`` (None: none) is
        marked failed, or killed if a signal stopped it."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close(exc)
            except Exception as failed:     # never hides how the run ended
                self.warn(f"{sink.name}: closing failed: {type(failed).__name__}: "
                          f"{_first_line(failed)}")

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:      # a full disk, a tracking server gone: train on
                self.warn(f"{sink.name} logging off: {type(exc).__name__}: "
                          f"{_first_line(exc)}")
                self.sinks.remove(sink)
                with contextlib.suppress(Exception):
                    sink.close(exc)


def _forget(run_dir: Path) -> None:
    """Drop what trackers left in ``run_dir`` for an earlier run: its MLflow run is not this
    run's, its event files not this run's history."""
    (run_dir / files.MLFLOW_RUN).unlink(missing_ok=True)
    for stale in (run_dir / files.TENSORBOARD).glob("events.out.tfevents.*"):
        stale.unlink()


def _first_line(exc: BaseException) -> str:
    """An exception's message, cut to one line for the console."""
    return (str(exc).strip().splitlines() or [""])[0]


class TensorBoardSink:
    """Event files in ``<run dir>/tensorboard/``, one more per (re)start of the run."""

    name = "tensorboard"

    def __init__(self, config: Config, run_dir: Path, resumed: bool):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.event_pb2, self.summary_pb2 = event_pb2, summary_pb2
        self.dir = run_dir / files.TENSORBOARD
        self.last = _last_step(self.dir) if resumed else None
        self.writer = EventFileWriter(str(self.dir))
        if self.last is None:
            self._config(config, run_dir)
        self.last = self.last or 0

    def _config(self, config: Config, run_dir: Path) -> None:
        """config.toml as text, and the flat config as the hparams of this run."""
        from tensorboard.plugins.hparams import summary_v2 as hparams
        from tensorboard.plugins.text import metadata as text_metadata
        from tensorboard.util import tensor_util
        text = "".join(f"    {line}\n" for line in config.to_toml().splitlines())  # code block
        summary = self.summary_pb2.Summary()
        summary.value.add(tag="config", tensor=tensor_util.make_tensor_proto(text.encode()),
                          metadata=text_metadata.create_summary_metadata(
                              display_name="config.toml", description=""))
        self._write(0, summary)
        self._write(0, hparams.hparams_pb(flat_config(config), trial_id=run_dir.name))
        self.writer.flush()

    def epoch(self, epoch: int, values: dict[str, float]) -> None:
        if epoch <= self.last:
            return
        self._scalars(epoch, values)
        self.last = epoch

    def finish(self, values: dict[str, float]) -> None:
        self._scalars(self.last, values)

    def close(self, exc: object) -> None:
        self.writer.close()

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        summary = self.summary_pb2.Summary(value=[
            self.summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._write(step, summary)
        self.writer.flush()

    def _write(self, step: int, summary: Any) -> None:
        self.writer.add_event(self.event_pb2.Event(wall_time=time.time(), step=step,
                                                   summary=summary))


def _last_step(logdir: Path) -> int | None:
    """The last epoch with metrics in ``logdir``'s event files (0: config only; None: no
    event files)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    paths = sorted(logdir.glob("events.out.tfevents.*"))
    if not paths:
        return None
    return max((event.step for path in paths for event in EventFileLoader(str(path)).Load()
                if any(v.tag in METRICS for v in event.summary.value)), default=0)


class MLflowSink:
    """One MLflow run, created by a new dtrain run and continued by a resumed one."""

    name = "mlflow"

    def __init__(self, config: Config, run_dir: Path, resumed: bool):
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        self.Metric, self.Param = Metric, Param
        self.run_dir, track = run_dir, config.track
        if urllib.parse.urlparse(track.mlflow_uri).scheme == "file":
            # MLflow 3 keeps the file store only for those who ask (it prefers a database)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            self.client = MlflowClient(tracking_uri=track.mlflow_uri)
            self.run_id = self._continued() if resumed else None
            if self.run_id is None:
                self.run_id = self._created(track.experiment)
                self.last = 0
            else:
                self.client.update_run(self.run_id, status="RUNNING")
                self.last = max((m.step for key in METRICS
                                 for m in self.client.get_metric_history(self.run_id, key)),
                                default=0)
            self._params(config)
        except MlflowException as exc:
            raise UserError(f"MLflow at track.mlflow_uri = {track.mlflow_uri!r}: "
                            f"{_first_line(exc)}") from None

    def _continued(self) -> str | None:
        """The interrupted run's MLflow run id, if this store has that run."""
        from mlflow.exceptions import MlflowException
        path = self.run_dir / files.MLFLOW_RUN
        if not path.is_file():
            return None
        run_id = path.read_text(encoding="utf-8").strip()
        try:
            self.client.get_run(run_id)
        except MlflowException:               # e.g. resumed with another track.mlflow_uri
            return None
        return run_id

    def _created(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None \
            else self.client.create_experiment(name)
        run = self.client.create_run(experiment_id, run_name=self.run_dir.name,
                                     tags={"dtrain.run_dir": str(self.run_dir.resolve())})
        files.atomic_write(self.run_dir / files.MLFLOW_RUN, f"{run.info.run_id}\n".encode())
        return run.info.run_id

    def _params(self, config: Config) -> None:
        """The config as ``section.key`` params; a resumed run adds only keys the run lacks
        (MLflow keeps a param's first value)."""
        have = self.client.get_run(self.run_id).data.params
        params = [self.Param(k, str(v)) for k, v in flat_config(config).items() if k not in have]
        for i in range(0, len(params), 100):      # MLflow's limit per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def epoch(self, epoch: int, values: dict[str, float]) -> None:
        if epoch <= self.last:
            return
        self._metrics(epoch, values)
        self.last = epoch

    def finish(self, values: dict[str, float]) -> None:
        self._metrics(self.last, values)
        for name in MODEL_FILES:
            if (self.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))
        self.client.set_terminated(self.run_id, "FINISHED")
        self.run_id = None

    def close(self, exc: object) -> None:
        if self.run_id is not None:           # not finished: failed, or stopped to resume
            status = "KILLED" if isinstance(exc, (Stopped, KeyboardInterrupt)) else "FAILED"
            self.client.set_terminated(self.run_id, status)

    def _metrics(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.Metric(k, v, stamp, step)
                                                    for k, v in values.items()])
