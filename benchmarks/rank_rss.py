"""Run a module as ``python -m MODULE ARGS`` would, then record this process's peak memory.

``mpiexec -n N python -m benchmarks.rank_rss RUN_DIR MODULE ARGS...`` is how the
harness runs dtrain under MPI: each rank leaves ``RUN_DIR/rss-<rank>.json``
(its peak RSS in MiB) when it exits normally, without dtrain knowing.
"""
from __future__ import annotations

import atexit
import json
import runpy
import sys
from pathlib import Path

from benchmarks.common import peak_rss_mb, rank_from_env


def main(run_dir: Path, module: str, args: list[str]) -> None:
    rank = rank_from_env()
    atexit.register(lambda: (run_dir / f"rss-{rank}.json").write_text(json.dumps(peak_rss_mb())))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
