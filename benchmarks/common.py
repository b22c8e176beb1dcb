"""What every contender shares: its run directory, its shards, its memory report."""
from __future__ import annotations

import argparse
import json
import os
import resource
from pathlib import Path
from typing import Any

import dtrain
from dtrain.core.config import Config
from dtrain.data.prepare import clear_cache
from dtrain.data.shards import Shard, load_shard
from dtrain.training.plan import Plan, plan

RSS_FILE = "rss.json"


class OneLineParser(argparse.ArgumentParser):
    """A benchmark command's mistakes are one line naming the command, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive(text: str) -> int:
    """A whole number >= 1, for an argument parser (its message otherwise)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (VmHWM: reset by exec, unlike ru_maxrss)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_rss(run_dir: Path, driver: float | None, workers: list[float]) -> None:
    """``rss.json``: peak MiB of the process that coordinates (None if none) and of each worker."""
    (Path(run_dir) / RSS_FILE).write_text(json.dumps({"driver": driver, "workers": workers}))


def load_run(run_dir: str | Path) -> tuple[Config, Plan]:
    """The run directory's ``config.toml`` and dtrain's plan for it (sizes, model, schedule)."""
    cfg = dtrain.load_config(Path(run_dir) / "config.toml")
    return cfg, plan(cfg)


def own_shards(the_plan: Plan, ranks: int, rank: int) -> list[Shard]:
    """The shards rank ``rank`` of ``ranks`` holds, in shard order, built from the files here.

    Shards go to ranks in contiguous blocks exactly as dtrain's plan places them on
    workers (:func:`dtrain.taskgraph.placement.place`; with ``parameter-server`` rank 0 is
    the server and holds none).  The process's cached copy of the dataset is dropped
    once they are built, as dtrain's workers do.
    """
    owners = the_plan.builder.place([str(r) for r in range(ranks)]).leaves
    shards = [load_shard(src) for i, src in enumerate(the_plan.sources)
              if owners[i] == str(rank)]
    clear_cache()
    return shards


def epoch_row(the_plan: Plan, epoch: int, seconds: float, loss: float | None,
              samples: int) -> dict[str, Any]:
    """One ``metrics.jsonl`` line, with dtrain's keys, for a contender that is not dtrain
    (``loss`` None: it trains nothing)."""
    return {"epoch": epoch, "train_loss": None if loss is None else loss / max(samples, 1),
            "seconds": seconds,
            "samples_per_second": the_plan.train_samples / seconds if seconds else None,
            "lr": the_plan.schedule.rates[epoch - 1], "steps": the_plan.schedule.steps_per_epoch}


def rank_from_env() -> int:
    """This process's MPI rank as the launcher tells it (MPICH/Hydra, Open MPI, PMIx), or 0."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0
