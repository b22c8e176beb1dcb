"""The workloads of ``workloads.toml``, and the dtrain config of each benchmark cell."""
from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dtrain
from dtrain.core.config import Config

WORKLOADS_FILE = Path(__file__).with_name("workloads.toml")
FILE_DATASETS = {"mnist": "mnist"}          # dataset -> folder under --data-dir


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it, nested tables merged key by key (new dict)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Workload:
    """One benchmark problem: a dtrain config plus how to run and judge it."""

    name: str
    title: str
    epochs: int
    config: dict[str, Any]
    scaling: str = "strong"
    study: str = ""
    targets: dict[str, float] = field(default_factory=dict)
    max_workers: int | None = None

    @property
    def dataset(self) -> str:
        return self.config.get("data", {}).get("dataset", "iris")

    def cannot_run(self, workers: int, data_dir: Path) -> str | None:
        """Why this workload does not run at ``workers`` with the data in ``data_dir``, or None."""
        folder = FILE_DATASETS.get(self.dataset)
        if folder and not (data_dir / folder).is_dir():
            return f"no {self.dataset} data in {data_dir / folder} (pass --data-dir)"
        if self.max_workers and workers > self.max_workers:
            return f"{self.name} runs on at most {self.max_workers} workers (memory; see workloads.toml)"
        return None

    def config_for(self, workers: int, strategy: str, dask_workers: int, data_dir: Path,
                   extra: dict[str, Any] | None = None) -> Config:
        """The dtrain config of this workload at ``workers`` training workers.

        One shard per training worker; ``weak`` scaling repeats the data once per
        worker; ``dask_workers`` is what a LocalCluster would start; ``extra``
        (a contender's own keys, e.g. ``graph.sync_every``) is laid over the rest.
        """
        cfg = merge(self.config, {"train": {"epochs": self.epochs},
                                  "graph": {"strategy": strategy},
                                  "cluster": {"workers": dask_workers}})
        cfg = merge(cfg, extra or {})
        cfg["data"]["shards"] = workers
        if self.scaling == "weak":
            cfg["data"]["replicate"] = cfg["data"].get("replicate", 1) * workers
        if self.dataset in FILE_DATASETS:
            cfg["data"]["path"] = str(data_dir / FILE_DATASETS[self.dataset])
        return dtrain.load_config(cfg)


def load_workloads(quick: bool = False, path: Path = WORKLOADS_FILE) -> dict[str, Workload]:
    """Every workload in ``path``, in file order; ``quick`` applies their ``quick`` overrides."""
    with open(path, "rb") as f:
        table = tomllib.load(f)
    defaults = table.pop("defaults", {}).get("config", {})
    out = {}
    for name, spec in table.items():
        spec = merge(spec, spec.get("quick", {})) if quick else spec
        out[name] = Workload(name, spec["title"], spec["epochs"],
                             merge(defaults, spec.get("config", {})), spec.get("scaling", "strong"),
                             spec.get("study", ""), spec.get("targets", {}),
                             spec.get("max_workers"))
    return out
