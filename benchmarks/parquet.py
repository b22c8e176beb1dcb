"""Training on a Parquet dataset bigger than a driver should ever hold (issue 18).

Writes a seeded, learnable classification set of ``--gigabytes`` GB (float32 features,
int64 labels) as Parquet files of about 128 MB each, then trains on it with
``python -m dtrain --set data.dataset=parquet --set data.path=DIR/part-*.parquet``: each
worker reads its own files through dask.dataframe and pyarrow, so the driver holds no row.
Prints the data size, the time per epoch, and the peak memory of the driver and of each
worker (from ``summary.json``), and checks the driver's against ``--driver-limit`` MB.

    python -m benchmarks.parquet --gigabytes 2 --epochs 2
    python -m benchmarks.parquet --gigabytes 0.05 --epochs 1        # a quick check

Exit code 0 when the run finished with the driver under the limit, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FEATURES, CLASSES = 64, 4
FILE_BYTES = 128 << 20


def write_dataset(folder: Path, gigabytes: float, seed: int = 0) -> tuple[int, int]:
    """Parquet files of about ``FILE_BYTES`` each, ``gigabytes`` GB in all (in memory: one
    file's rows at a time).  Returns (rows, bytes on disk)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row_bytes = FEATURES * 4 + 8
    total_rows = int(gigabytes * 1e9 / row_bytes)
    per_file = max(1, FILE_BYTES // row_bytes)
    teacher = np.random.default_rng([seed, 1]).standard_normal((FEATURES, CLASSES))
    written, n = 0, 0
    while written < total_rows:
        rows = min(per_file, total_rows - written)
        rng = np.random.default_rng([seed, 2, n])
        x = rng.standard_normal((rows, FEATURES), dtype=np.float32)          # (rows, D)
        y = (x @ teacher + 0.5 * rng.standard_normal((rows, CLASSES))).argmax(axis=1)
        table = pa.table({**{f"f{j}": x[:, j] for j in range(FEATURES)}, "label": y})
        pq.write_table(table, folder / f"part-{n:04d}.parquet", row_group_size=1 << 20)
        written, n = written + rows, n + 1
    return written, sum(p.stat().st_size for p in folder.glob("part-*.parquet"))


def train(folder: Path, out: Path, epochs: int, workers: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "dtrain", "--set", "data.dataset=parquet",
           "--set", f"data.path={folder}/part-*.parquet", "--set", "data.label=label",
           "--set", f"model.layers=[{FEATURES}, 32, {CLASSES}]", "--set", "model.dtype=float32",
           "--set", f"train.epochs={epochs}", "--set", "train.batch_size=8192",
           "--set", "optim.name=adam", "--set", "optim.lr=0.01", "--set", "cluster.timeout=60",
           "--workers", str(workers), "--dashboard-address", "", "--out", str(out), *extra]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    summary["wall_seconds"] = time.perf_counter() - started
    summary["epoch_seconds"] = [json.loads(r)["seconds"]
                                for r in (out / "metrics.jsonl").read_text().splitlines()]
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.parquet",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=2.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--driver-limit", type=float, default=400.0, metavar="MB")
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temporary "
                        "folder, removed after)")
    parser.add_argument("extra", nargs="*", help="more arguments for python -m dtrain")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp) / "data"
        folder.mkdir()
        t0 = time.perf_counter()
        rows, size = write_dataset(folder, args.gigabytes)
        print(f"data: {rows:,} rows x {FEATURES} float32 features + int64 label, "
              f"{len(list(folder.glob('part-*.parquet')))} files, {size / 1e9:.2f} GB on disk "
              f"({rows * (FEATURES * 4 + 8) / 1e9:.2f} GB in memory), written in "
              f"{time.perf_counter() - t0:.0f} s")
        s = train(folder, Path(tmp) / "run", args.epochs, args.workers, args.extra)
    workers = s["worker_peak_rss_mb"]
    print(f"trained: {s['steps']} steps, {s['epochs_run']} epochs on {s['workers']} worker(s), "
          f"{s['shards']} shards; test accuracy {s['test_accuracy']:.4f}")
    print(f"time per epoch: {', '.join(f'{t:.1f} s' for t in s['epoch_seconds'])}; "
          f"setup (reading, statistics, shards) {s['setup_seconds']:.1f} s; "
          f"wall {s['wall_seconds']:.1f} s")
    print(f"peak memory: driver {s['driver_peak_rss_mb']:.0f} MB; workers "
          + ", ".join(f"{w} {m:.0f} MB" for w, m in sorted(workers.items())))
    moved = s.get("data_moved")
    print("partitions moved: " + (f"{moved['partitions']} ({moved['bytes'] / 1e6:,.0f} MB)"
                                  if moved else "none"))
    ok = s["driver_peak_rss_mb"] < args.driver_limit
    print(f"driver under {args.driver_limit:.0f} MB: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
