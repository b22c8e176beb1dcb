"""``python -m dtrain predict | evaluate | export RUN ...``: a finished run used as a model."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from dtrain.cli.common import Parser
from dtrain.core import files
from dtrain.core.config import ClusterConfig, Config, from_dict, read_toml
from dtrain.core.errors import UserError
from dtrain.data import partitions
from dtrain.data.prepare import prepared
from dtrain.deploy.connect import connect
from dtrain.deploy.logs import QuietUserErrors
from dtrain.inference import apply, export
from dtrain.inference.inputs import CHUNK_ROWS, open_input
from dtrain.inference.metrics import report
from dtrain.inference.model import Model
from dtrain.inference.saved import read_run
from dtrain.training import collections
from dtrain.training.plan import part_spec, partitioned


SPOOL_BYTES = 16 << 20      # predictions for standard output kept in memory up to this


def _parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = Parser(prog=f"python -m dtrain {name}", description=description)
    parser.add_argument("run", metavar="RUN", help="a finished run directory")
    return parser


def _input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delimiter", default="", metavar="C",
                        help="CSV field separator (default: detected)")
    parser.add_argument("--label", metavar="COLUMN",
                        help="CSV: the label column's name (default: the model's, or the last "
                             "of one column more than the model's features)")
    parser.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS, metavar="N",
                        help=f"rows per task (default {CHUNK_ROWS}); an input of more than one "
                             f"chunk is handled as Dask tasks on a cluster")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes of the embedded LocalCluster")
    parser.add_argument("--scheduler-address", metavar="ADDR",
                        help="use a running Dask scheduler (even for a small input)")
    parser.add_argument("--scheduler-file", metavar="FILE",
                        help="use the running Dask scheduler whose address FILE holds (as "
                             "written by dask scheduler --scheduler-file or dask-mpi)")


def _open(args: argparse.Namespace, model: Model):
    if args.chunk_rows < 1:
        raise UserError(f"--chunk-rows {args.chunk_rows}: must be at least 1")
    return open_input(args.data, model.spec, delimiter=args.delimiter, label=args.label,
                      chunk_rows=args.chunk_rows)


@contextlib.contextmanager
def _cluster(args: argparse.Namespace, parts: int) -> Iterator[Any]:
    """A client when the input is cut in several parts or a scheduler is named; else None."""
    if args.scheduler_address and args.scheduler_file:
        raise UserError("--scheduler-address and --scheduler-file: give one of them")
    if parts <= 1 and not args.scheduler_address and not args.scheduler_file:
        yield None
        return
    cfg = dataclasses.replace(ClusterConfig(), dashboard_address="",
                              scheduler_address=args.scheduler_address or "",
                              scheduler_file=str(Path(args.scheduler_file).resolve())
                              if args.scheduler_file else "",
                              **({"workers": args.workers} if args.workers else {}))
    with connect(cfg) as client:
        client.register_plugin(QuietUserErrors())
        yield client


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    """Standard output, or ``path``, written whole or not at all: ``path`` through a
    temporary file renamed at the end (removed on any error), standard output from a spooled
    copy once every row is predicted (a bad row in the last part prints nothing)."""
    if path is None:
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+", encoding="utf-8",
                                           newline="") as spool:
            yield spool       # type: ignore[misc]
            spool.seek(0)
            shutil.copyfileobj(spool, sys.stdout)
        return
    out = Path(path)
    if out.is_dir() or not out.parent.is_dir():
        why = "is a directory" if out.is_dir() else "its folder does not exist"
        raise UserError(f"--out {out}: {why}; name a file in an existing folder")
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            yield f
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def predict(argv: list[str]) -> int:
    """``python -m dtrain predict RUN --data PATH [--out FILE]``."""
    parser = _parser("predict", "Predict the class of every row of raw data with a trained run: "
                                "a CSV of the predicted label and one probability per class "
                                "(a regression: one column per target, its predicted value).")
    parser.add_argument("--data", required=True, metavar="PATH",
                        help="a CSV (header and label column optional), a .npy array, IDX "
                             "files or an image folder")
    parser.add_argument("--out", metavar="FILE", help="where to write the CSV (default: "
                        "standard output)")
    _input_options(parser)
    args = parser.parse_args(argv)
    model = Model.read(args.run)
    inp = _open(args, model)
    with _cluster(args, len(inp.parts)) as client, _output(args.out) as out:
        if model.regression:
            rows = apply.write_values(out, model.spec.targets,
                                      apply.each_part(apply.values_part, model, inp, client))
        else:
            rows = apply.write_predictions(out, model.classes_, apply.each_part(
                apply.predict_part, model, inp, client))
    if args.out:
        where = f"{len(inp.parts)} tasks on the cluster" if client else "in this process"
        print(f"predict: {rows} rows of {inp.path} ({where}) -> {args.out}")
    return 0


def evaluate(argv: list[str]) -> int:
    """``python -m dtrain evaluate RUN [--data PATH] [--out FILE]``."""
    parser = _parser("evaluate", "Accuracy, loss, per-class precision/recall/F1 and the "
                                 "confusion matrix of a trained run (a regression: loss, MSE, "
                                 "RMSE, MAE and R^2 per target and overall), printed and written "
                                 "as JSON.")
    parser.add_argument("--data", metavar="PATH", help="labelled data (CSV with a label column, "
                        "IDX with a labels file, image folder of class folders); default: the "
                        "run's own test split")
    parser.add_argument("--out", metavar="FILE",
                        help=f"the JSON file (default: RUN/{files.EVALUATION})")
    _input_options(parser)
    args = parser.parse_args(argv)
    model = Model.read(args.run)
    out = Path(args.out) if args.out else Path(args.run) / files.EVALUATION
    if args.data is None:
        result, source = _own_test_split(Path(args.run), model), "the run's test split"
    else:
        inp = _open(args, model)
        if not inp.labelled and model.regression:
            raise UserError(f"{inp.path} has no targets to evaluate against; give a CSV with "
                            f"the target column(s) ({', '.join(model.spec.targets)}), or name "
                            f"them with --label")
        if not inp.labelled:
            raise UserError(f"{inp.path} has no labels to evaluate against; give a CSV with a "
                            f"label column, IDX images with their labels file, or an image "
                            f"folder of class folders")
        with _cluster(args, len(inp.parts)) as client:
            total = functools.reduce(lambda a, b: a + b, apply.each_part(
                apply.tally_part, model, inp, client))
        result, source = apply.report_of(model, total), str(inp.path)
    for line in [f"evaluate: {args.run} on {source}", *result.lines()]:
        print(line)
    doc = {"run": str(args.run), "data": source, **result.to_dict()}
    files.atomic_write(out, (json.dumps(doc, indent=1) + "\n").encode())
    print(f"evaluation: {out}")
    return 0


def _own_test_split(run: Path, model: Model):
    """The report on the run's test split, read and normalized as training did, so that it
    equals summary.json's test figures to the last bit."""
    cfg = from_dict(read_toml(run / files.CONFIG), str(run / files.CONFIG))
    if partitioned(cfg.data):
        return _partitioned_test_split(cfg, model)
    x, y = prepared(cfg.data, model.spec.normalization)[0]["test"]
    if not len(y):
        raise UserError(f"{run} has no test split (data.split = {list(cfg.data.split)}); pass "
                        f"--data with labelled data to evaluate on")
    if model.regression:                # the targets in the model's dtype, as training has them
        y = model.values(y, len(y))
    return report(model, np.ascontiguousarray(x, dtype=model.spec.dtype), y)


def _partitioned_test_split(cfg: Config, model: Model):
    """The test rows of data the workers read in partitions: each partition's, tallied on
    its worker, added in partition order as training added them."""
    cluster = dataclasses.replace(cfg.cluster, dashboard_address="")
    with connect(cluster) as client:
        coll = collections.from_files(client, cfg.data)
        spec = dataclasses.replace(part_spec(cfg, coll), classes=tuple(model.classes_.tolist()),
                                   norm=model.spec.normalization)
        parts = [client.submit(_tally_test, model, spec, i, f)
                 for i, f in enumerate(coll.futures)]
        total = functools.reduce(lambda a, b: a + b, (f.result() for f in parts))
    if not total.rows:
        raise UserError(f"the run has no test split (data.split = {list(cfg.data.split)}); "
                        f"pass --data with labelled data to evaluate on")
    return apply.report_of(model, total)


def _tally_test(model: Model, spec: Any, index: int, part: Any) -> apply.Tally:
    shard = partitions.held_out(spec, "test", index, part)
    return apply.tally(model, shard.x, shard.y)


def export_model(argv: list[str]) -> int:
    """``python -m dtrain export RUN --format onnx --out FILE``."""
    parser = _parser("export", "Export a trained run, normalization included, for other "
                               "runtimes.")
    parser.add_argument("--format", required=True, choices=export.FORMATS,
                        help="the file format (onnx: opset %d)" % export.OPSET)
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write it")
    parser.add_argument("--dtype", default="float32", choices=export.DTYPES,
                        help="the graph's float type (default float32)")
    args = parser.parse_args(argv)
    spec, params = read_run(args.run)
    path = export.write_onnx(spec, params, args.out, dtype=args.dtype)
    n = len(spec.targets)
    outputs = f"{n} target{'s' * (n > 1)}" if spec.regression else f"{len(spec.classes)} classes"
    print(f"export: {args.run} -> {path} (ONNX opset {export.OPSET}, {args.dtype}, {outputs})")
    return 0
