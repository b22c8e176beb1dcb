"""``python -m benchmarks``: every contender on every selected workload, in one invocation.

For each repeat, workload, worker count and contender (in that nesting, so a
noisy minute spreads over all contenders), the harness writes the cell's
dtrain config into a run directory, runs the contender in fresh processes,
and reads back what it left: per-epoch seconds (``metrics.jsonl``), final
parameters (``params.npz``, compared with the serial reference of the same
cell), peak memory (``rss.json``) and, from dtrain, the bytes its workers
exchanged per step (``summary.json``).  Then it prints the tables and writes
``results.json``, ``results.md`` and ``results.html`` under ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from dtrain.core import layerspec
from dtrain.core.errors import UserError
from dtrain.training.plan import plan

from benchmarks import report
from benchmarks.contenders import BY_NAME, CONTENDERS, REPO, Contender, Tools
from benchmarks.workloads import Workload, load_workloads

DEFAULT_DATA = REPO.parent / "shared" / "data"
QUICK_WORKLOADS = ["P3"]


class UsageError(Exception):
    """Bad command-line input: one line on stderr, exit code 2."""


@dataclass
class Run:
    """One contender on one workload at one worker count: what it took and what it left."""

    workload: str
    workers: int
    contender: str
    repeat: int
    processes: int
    status: str = "ok"                          # ok, failed, skipped
    note: str = ""
    busy: int = 0                               # processes + compute threads (0: = processes)
    synchronous: bool = True                    # the synchronous step: must match serial
    epoch_seconds: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    steps_per_epoch: int = 0
    train_samples: int = 0
    train_mb: float = 0.0                       # the training set's features in float32
    network: str = ""                           # layer sizes, e.g. "784-1024-10"
    batch_size: int = 0
    driver_mb: float | None = None
    worker_mb: list[float] = field(default_factory=list)
    params_delta: float | None = None           # max |params - serial| / max |serial|
    comm_bytes: float | None = None             # bytes between workers per step (see comm_source)
    comm_source: str = ""                       # "measured" (dtrain: Dask's transfer records),
                                                # "formula" (pencil and paper), "" (none)
    comm_bytes_predicted: float | None = None   # dtrain: counted from its graphs
    overhead_ms: float | None = None            # dtrain: ms per step beyond its critical compute
    tasks_per_step: float | None = None         # dtrain and dask-chain: from their graphs
    sched_tasks_per_step: float | None = None   # dtrain: as its scheduler counted them
    head_cpu_ms: float | None = None            # dtrain: its head process's CPU per step
    transfers_per_step: float | None = None     # dtrain: values crossing workers, from its graphs
    wall_seconds: float = 0.0

    @property
    def timed(self) -> list[float]:
        """Epoch seconds after the first (warm-up) epoch."""
        return self.epoch_seconds[1:] or self.epoch_seconds


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes are usage errors too: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see python -m benchmarks --help)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="python -m benchmarks",
        description="Run dtrain and its contenders on the same workloads and data; print the "
                    "table, write results.json/.md/.html.")
    parser.add_argument("--workloads", help=f"comma-separated names (default: all; with --quick: "
                        f"{','.join(QUICK_WORKLOADS)}); see benchmarks/workloads.toml")
    parser.add_argument("--workers", default=None,
                        help="comma-separated training-worker counts, = shards (default 1,2,4; "
                             "--quick: 1,2; the layout study: 1,2,4,8,16)")
    parser.add_argument("--contenders", help="comma-separated names (default: all), each "
                        "optionally at some worker counts only (torch-ddp@16, serial@1/16): "
                        + ", ".join(c.name for c in CONTENDERS))
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell, interleaved (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and few epochs: checks that everything runs and agrees")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                        help=f"folder holding mnist/ (default {DEFAULT_DATA})")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results",
                        help="where results.json/.md/.html and runs/ go")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    parser.add_argument("--keep-params", action="store_true",
                        help="keep every run's params.npz (deleted once compared, by default)")
    return parser.parse_args(argv)


def _names(text: str | None, known: list[str], what: str, default: list[str]) -> list[str]:
    if not text:
        return default
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"unknown {what} {', '.join(unknown) or repr(text)}; choose from "
                         f"{', '.join(known)}")
    return names


def _only(text: str | None) -> dict[str, list[int] | None]:
    """``--contenders`` as ``{name: worker counts it runs at (None: every one)}``, in order
    (``torch-ddp@16`` runs at 16 workers only, ``serial@1/16`` at 1 and 16)."""
    out: dict[str, list[int] | None] = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        name, _, at = item.partition("@")
        try:
            out[name] = _workers(at.replace("/", ",")) if at else None
        except UsageError:
            raise UsageError(f"--contenders {item!r}: after @ come worker counts, e.g. "
                             f"torch-ddp@16 or serial@1/16") from None
    return out


def _workers(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UsageError(f"--workers {text!r}: expected positive integers, e.g. --workers 1,2,4")
    return sorted(set(counts))


def run_one(wl: Workload, workers: int, contender: Contender, repeat: int, args, tools: Tools) -> Run:
    """Run one cell in fresh processes and read back what it left."""
    run = Run(wl.name, workers, contender.name, repeat, contender.processes(workers),
              busy=contender.busy(workers), synchronous=contender.synchronous)
    try:
        cfg = contender.config_for(wl, workers, args.data_dir)
    except UserError as exc:                        # a config dtrain cannot run, e.g. no
        run.status, run.note = "skipped", str(exc)  # hidden layer to split into slices
        return run
    reason = wl.cannot_run(workers, args.data_dir) or contender.unavailable(tools, cfg)
    if reason:
        run.status, run.note = "skipped", reason
        return run
    try:
        the_plan = plan(cfg)
    except UserError as exc:                        # e.g. unreadable data files
        run.status, run.note = "failed", str(exc)
        return run
    run.steps_per_epoch, run.train_samples = the_plan.schedule.steps_per_epoch, the_plan.train_samples
    run.train_mb = the_plan.train_samples * the_plan.info.features * 4 / 2**20
    run.network = layerspec.describe(cfg.model.layers, cfg.model.input_shape)
    run.batch_size = min(cfg.train.batch_size, the_plan.train_samples)
    run_dir = run_path(args.out, run)
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(cfg.to_toml())
    start = time.perf_counter()
    with open(run_dir / "log.txt", "wb") as log:
        proc = subprocess.Popen(contender.command(tools, run_dir, workers), cwd=REPO,
                                env=tools.environment(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = f"timeout after {args.timeout:g} s"
        finally:                                    # the run's own process group, nothing else:
            with contextlib.suppress(ProcessLookupError):    # strays, or all of it on a timeout
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run.wall_seconds = time.perf_counter() - start
    if code != 0 or (contender.trains and not (run_dir / "params.npz").is_file()):
        tail = (run_dir / "log.txt").read_text(errors="replace").strip().splitlines()[-3:]
        run.status, run.note = "failed", f"exit {code}: " + " | ".join(tail)
        return run
    read_run(run, run_dir)
    if run.comm_bytes is None:
        formula = contender.formula_bytes(the_plan.net.size, np.dtype(cfg.model.dtype).itemsize,
                                          workers, the_plan.net.buffer_size)
        if formula is not None:
            run.comm_bytes, run.comm_source = float(formula), "formula"
    return run


def read_run(run: Run, run_dir: Path) -> None:
    """Fill ``run`` from the files the contender left in ``run_dir``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    run.epoch_seconds = [r["seconds"] for r in rows]
    run.train_loss = [r["train_loss"] for r in rows]
    rss = run_dir / "rss.json"
    if rss.is_file():
        peaks = json.loads(rss.read_text())
        run.driver_mb, run.worker_mb = peaks["driver"], peaks["workers"]
    else:                                           # dtrain under mpiexec: one file per rank
        ranks = sorted(run_dir.glob("rss-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        peaks = [json.loads(p.read_text()) for p in ranks]
        run.driver_mb, run.worker_mb = (peaks[0], peaks[1:]) if peaks else (None, [])
    summary = run_dir / "summary.json"
    if summary.is_file():                           # dtrain's; the others' have no comm keys
        facts = json.loads(summary.read_text())
        run.comm_bytes_predicted = facts.get("comm_bytes_per_step")
        overhead = facts.get("overhead_per_step")
        run.overhead_ms = None if overhead is None else overhead * 1000
        run.tasks_per_step = facts.get("tasks_per_step")
        run.sched_tasks_per_step = facts.get("scheduler_tasks_per_step")
        run.head_cpu_ms = facts.get("head_cpu_ms_per_step")
        run.transfers_per_step = facts.get("transfers_per_step")
        measured = facts.get("comm_bytes_measured_per_step")
        if measured is not None:
            run.comm_bytes, run.comm_source = float(measured), "measured"


def params_delta(params: Path, reference: Path) -> float:
    """Largest difference from the reference's parameters, relative to their largest magnitude."""
    with np.load(params) as a, np.load(reference) as b:
        if sorted(a.files) != sorted(b.files):
            return float("inf")
        scale = max(float(np.abs(b[k]).max()) for k in b.files) or 1.0
        return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in b.files) / scale


def run_path(out: Path, run: Run) -> Path:
    """The run directory of one cell and repeat."""
    return out / "runs" / run.workload / f"{run.workers}w" / run.contender / f"r{run.repeat}"


def compare_with_serial(runs: list[Run], out: Path, keep: bool) -> None:
    """Set each finished run's ``params_delta`` against the serial run of its cell and repeat."""
    def path(r: Run) -> Path:
        return run_path(out, r) / "params.npz"

    serial = {(r.workload, r.workers, r.repeat): path(r) for r in runs
              if r.contender == "serial" and r.status == "ok"}
    for r in runs:
        ref = serial.get((r.workload, r.workers, r.repeat))
        if r.status == "ok" and ref is not None and path(r).is_file():   # the floor has none
            r.params_delta = params_delta(path(r), ref)
    if not keep:
        for r in runs:
            if r.status == "ok":
                path(r).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        workloads = load_workloads(args.quick)
        names = _names(args.workloads, list(workloads), "workload",
                       QUICK_WORKLOADS if args.quick else list(workloads))
        only = _only(args.contenders)
        contenders = [BY_NAME[n] for n in _names(",".join(only) if only else None,
                                                 list(BY_NAME), "contender", list(BY_NAME))]
        counts = _workers(args.workers or ("1,2" if args.quick else "1,2,4"))
        if args.repeat < 1:
            raise UsageError(f"--repeat {args.repeat}: needs at least 1")
    except UsageError as exc:
        print(f"benchmarks: error: {exc}", file=sys.stderr)
        return 2
    tools = Tools.discover()
    shutil.rmtree(args.out / "runs", ignore_errors=True)
    meta = report.machine(args, tools)
    cells = [(r, workloads[w], n, c) for r in range(args.repeat) for w in names
             for n in counts for c in contenders if only.get(c.name) is None or n in only[c.name]]
    runs = []
    before = signal.signal(signal.SIGTERM, _stopped)    # `timeout`: as Ctrl-C
    try:
        for i, (repeat, wl, n, c) in enumerate(cells, start=1):
            run = run_one(wl, n, c, repeat, args, tools)
            runs.append(run)
            took = f"{statistics.median(run.timed):.4f} s/epoch" if run.epoch_seconds else run.note
            print(f"[{i}/{len(cells)}] {wl.name} {n}w {c.name}: {run.status} {took} "
                  f"({run.wall_seconds:.1f} s)", file=sys.stderr, flush=True)
    except KeyboardInterrupt:                       # the running cell's processes are gone already
        meta["partial"] = f"stopped after {len(runs)} of {len(cells)} runs"
        print(f"benchmarks: {meta['partial']}" + ("; writing the tables of those, marked "
                                                  "partial" if runs else ""), file=sys.stderr)
        if not runs:
            return 130
    finally:
        signal.signal(signal.SIGTERM, before)
    compare_with_serial(runs, args.out, args.keep_params)
    meta["load_after"] = os.getloadavg()
    results = report.build(meta, [workloads[w] for w in names], counts, contenders,
                           [asdict(r) | {"timed": r.timed} for r in runs])
    report.write(results, args.out)
    print(report.markdown(results))
    print(f"\nwrote {args.out / 'results.json'}, results.md, results.html, results-speedup.png")
    if meta.get("partial"):
        return 130
    return 1 if any(r.status == "failed" for r in runs) else 0


def _stopped(signum: int, frame: object) -> None:
    """SIGTERM (``timeout``, a batch system's limit): stop as on Ctrl-C, keeping the runs
    done (a lent machine's budget may end before the last cell)."""
    raise KeyboardInterrupt
