"""From runs to results: the rows, scaling and targets, as JSON, Markdown and an HTML page.

``build`` turns the harness's runs into one JSON-ready dict; ``tables`` lays
it out as (title, header, rows) tables that ``markdown`` and ``html`` both
render, so the console, ``results.md`` and ``results.html`` say the same.
"""
from __future__ import annotations

import html as html_escape
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import across, layouts, peers

REFERENCE = "mpi-allreduce"                 # the "x MPI" column and the targets' yardstick
DTRAIN_TARGETED = ("dtrain-default", "dtrain-allreduce", "dtrain-threads",
                   "dtrain-mpi-allreduce")                               # side by side
FLOOR = "dask-floor"                        # the same goals, checked for Dask's floor under them
Table = tuple[str, list[str], list[list[str]], str]     # title, header, rows, footnote


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine(args: Any, tools: Any) -> dict[str, Any]:
    """Where and how this invocation ran: date, command, CPU, memory, versions, load."""
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").is_file() else platform.processor()
    versions = {}
    for dist in ("numpy", "dask", "distributed", "mpi4py", "mpich", "torch", "bokeh"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    commit = os.environ.get("DTRAIN_COMMIT") or subprocess.run(     # device.sh: a copy
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=Path(__file__).parent).stdout.strip() or None
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": " ".join(["python -m benchmarks", *sys.argv[1:]]),
        "quick": args.quick, "repeat": args.repeat,
        "cpu": cpu, "cores": cores(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(), "platform": platform.platform(),
        "versions": versions, "dtrain_commit": commit,
        "mpiexec": tools.mpiexec, "load_before": os.getloadavg(), "gpu": tools.gpu or None,
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def aggregate(runs: list[dict[str, Any]], n_cores: int) -> list[dict[str, Any]]:
    """One row per (workload, workers, contender): medians over every timed epoch of every repeat."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["workload"], r["workers"], r["contender"])].append(r)
    rows = []
    for (wl, n, name), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        epoch = _median([s for r in ok for s in r["timed"]])
        first = (ok or rs)[0]
        deltas = [r["params_delta"] for r in ok if r["params_delta"] is not None]
        comm = [r["comm_bytes"] for r in ok if r.get("comm_bytes") is not None]
        predicted = [r["comm_bytes_predicted"] for r in ok
                     if r.get("comm_bytes_predicted") is not None]
        busy = first.get("busy") or first["processes"]
        rows.append({
            "workload": wl, "workers": n, "contender": name, "processes": first["processes"],
            "busy": busy, "oversubscribed": busy > n_cores,
            "synchronous": first.get("synchronous", True),
            "status": "ok" if ok else rs[0]["status"],
            "note": "; ".join(dict.fromkeys(r["note"] for r in rs if r["note"])),
            "epoch_s": epoch, "steps": first["steps_per_epoch"],
            **{k: first[k] for k in ("train_samples", "train_mb", "network", "batch_size")},
            "samples_per_s": _ratio(first["train_samples"], epoch),
            "ms_per_step": _ratio(epoch * 1000, first["steps_per_epoch"]) if epoch else None,
            "driver_mb": max((r["driver_mb"] for r in ok if r["driver_mb"] is not None), default=None),
            "worker_mb": max((m for r in ok for m in r["worker_mb"]), default=None),
            "params_delta": max(deltas) if deltas else None,
            "bytes_per_step": _median(comm),
            "bytes_source": next((r["comm_source"] for r in ok if r.get("comm_bytes") is not None),
                                 ""),
            "bytes_predicted_per_step": _median(predicted),
            "final_train_loss": ok[-1]["train_loss"][-1] if ok and ok[-1]["train_loss"] else None,
            **{key: _median([r[key] for r in ok if r.get(key) is not None])
               for key in ("overhead_ms", "tasks_per_step", "transfers_per_step",
                           "sched_tasks_per_step", "head_cpu_ms")},
        })
    index = {(r["workload"], r["workers"], r["contender"]): r for r in rows}
    for r in rows:
        serial = index.get((r["workload"], r["workers"], "serial"), {}).get("epoch_s")
        mpi = index.get((r["workload"], r["workers"], REFERENCE), {}).get("epoch_s")
        r["vs_serial"], r["vs_mpi"] = _ratio(r["epoch_s"], serial), _ratio(r["epoch_s"], mpi)
        r["extra_ms_per_step_vs_mpi"] = (r["epoch_s"] - mpi) * 1000 / r["steps"] \
            if r["epoch_s"] is not None and mpi is not None and r["steps"] else None
    return rows


def scaling(rows: list[dict[str, Any]], workloads: list[Any]) -> list[dict[str, Any]]:
    """Speedup and efficiency against each contender's own smallest worker count.

    Strong scaling: speedup ``T(n0)/T(n)``, efficiency ``speedup * n0 / n``.
    Weak scaling (data grows with the workers): efficiency ``T(n0)/T(n)``,
    scaled speedup ``efficiency * n / n0``.
    """
    out = []
    for wl in workloads:
        by_contender: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            if r["workload"] == wl.name and r["epoch_s"] and r["contender"] != "serial":
                by_contender[r["contender"]].append(r)
        for name, rs in by_contender.items():
            rs.sort(key=lambda r: r["workers"])
            if len(rs) < 2:
                continue
            n0, t0 = rs[0]["workers"], rs[0]["epoch_s"]
            points = []
            for r in rs:
                n, ratio = r["workers"], t0 / r["epoch_s"]
                if wl.scaling == "strong":
                    speedup, eff = ratio, ratio * n0 / n
                else:
                    speedup, eff = ratio * n / n0, ratio
                points.append({"workers": n, "epoch_s": r["epoch_s"], "speedup": speedup,
                               "efficiency": eff, "oversubscribed": r["oversubscribed"]})
            out.append({"workload": wl.name, "scaling": wl.scaling, "contender": name,
                        "points": points})
    return out


def targets(rows: list[dict[str, Any]], workloads: list[Any]) -> list[dict[str, Any]]:
    """Issue 4's goals, checked for dtrain's allreduce at 2 workers, where both sides ran, and
    for the Dask floor under ``dtrain-allreduce``: a goal the floor misses is out of reach of
    any graph of that shape on that cluster."""
    index = {(r["workload"], r["workers"], r["contender"]): r for r in rows}
    out = []
    for wl in workloads:
        for name in (*DTRAIN_TARGETED, FLOOR):
            row = index.get((wl.name, 2, name))
            if row is None or row["epoch_s"] is None:
                continue
            torch = index.get((wl.name, 2, "torch-ddp"), {}).get("epoch_s")
            values = {"mpi_ratio": row["vs_mpi"], "torch_ratio": _ratio(row["epoch_s"], torch),
                      "step_ms": row["ms_per_step"]}
            for what, goal in wl.targets.items():
                value = values[what]
                out.append({"workload": wl.name, "contender": name, "what": what, "goal": goal,
                            "value": value, "met": None if value is None else value <= goal})
    return out


def build(meta: dict, workloads: list[Any], counts: list[int], contenders: list[Any],
          runs: list[dict[str, Any]]) -> dict[str, Any]:
    rows = aggregate(runs, meta["cores"])
    return {
        "meta": meta | {"workers": counts},
        "workloads": {w.name: {"title": w.title, "epochs": w.epochs, "scaling": w.scaling,
                               "study": w.study, "targets": w.targets} for w in workloads},
        "contenders": {c.name: c.title for c in contenders},
        "rows": rows, "scaling": scaling(rows, workloads), "targets": targets(rows, workloads),
        "layout_goal": layouts.goal_checks(rows), "across_goal": across.goal_checks(rows),
        "runs": runs,
    }


# --- layout ---------------------------------------------------------------------------------

def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _bytes(value: float | None, source: str = "measured") -> str:
    """Bytes in binary units, 3 significant digits; ``~`` marks a pencil-and-paper figure."""
    if value is None:
        return "-"
    mark = "~" if source == "formula" else ""
    if value < 1024:
        return f"{mark}{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{mark}{value:.3g} {unit}"
    raise AssertionError("unreachable")


def _delta(row: dict[str, Any]) -> str:
    """``params vs serial``; ``(n/c)``: not comparable, another algorithm than serial's step."""
    text = _f(row["params_delta"], ".1e")
    return text if row.get("synchronous", True) or text == "-" else f"{text} (n/c)"


WHAT = {"mpi_ratio": "dtrain / mpi4py Allreduce", "torch_ratio": "dtrain / PyTorch DDP",
        "step_ms": "ms per step"}


def tables(results: dict[str, Any]) -> list[Table]:
    """Every table of the report: one per workload, then targets, strong and weak scaling."""
    meta, out = results["meta"], list(peers.tables(results))
    star = (f"procs marked * : more busy processes (a threaded worker's compute threads "
            f"counted one by one) than the {meta['cores']} cores (oversubscribed).")
    header = ["workers", "contender", "procs", "epoch s", "samples/s", "ms/step", "x serial",
              "x MPI", "+ms/step vs MPI", "bytes/step", "driver MiB", "worker MiB",
              "params vs serial", "note"]
    moved = ("bytes/step: bytes between worker processes per step, dtrain's as Dask recorded "
             "them (summary.json comm_bytes_measured_per_step); ~ marks a pencil-and-paper "
             "figure for the others (a ring allreduce moves 2 (W - 1) gradient buffers in all).")
    for name, wl in results["workloads"].items():
        rows = [r for r in results["rows"] if r["workload"] == name]
        body = [[str(r["workers"]), r["contender"],
                 f"{r['processes']}{'*' if r['oversubscribed'] else ''}",
                 _f(r["epoch_s"], ".4f"), _f(r["samples_per_s"], ",.0f"), _f(r["ms_per_step"], ".2f"),
                 _f(r["vs_serial"], ".2f"), _f(r["vs_mpi"], ".2f"),
                 _f(r["extra_ms_per_step_vs_mpi"], "+.2f"),
                 _bytes(r.get("bytes_per_step"), r.get("bytes_source", "")),
                 _f(r["driver_mb"], ".0f"), _f(r["worker_mb"], ".0f"), _delta(r),
                 r["note"] if r["status"] != "ok" else ""] for r in rows]
        unsync = ("params vs serial marked (n/c): not comparable, local SGD averages the "
                  "workers' parameters every graph.sync_every steps, another algorithm than the "
                  "synchronous step, so it is shown but not checked. "
                  if any(not r.get("synchronous", True) for r in rows) else "")
        first = min(rows, key=lambda r: r["workers"])
        data = (f"{first['train_samples']:,} training samples ({first['train_mb']:.0f} MiB of "
                f"float32 features)") if wl["scaling"] == "strong" else \
            (f"{first['train_samples'] // first['workers']:,} training samples per worker "
             f"({first['train_mb'] / first['workers']:.0f} MiB)")
        data = f"network {first['network']}, batch {first['batch_size']:,}, {data}"
        foot = (f"{wl['epochs']} epochs per run, median epoch time of epochs 2-{wl['epochs']} "
                f"over {meta['repeat']} repeat(s); {data}. " + star
                + f" {moved} {unsync}" + (f"Study: {wl['study']}." if wl["study"] else ""))
        out.append((f"{name}: {wl['title']}", header, body, foot.rstrip()))
    if results["targets"]:
        out.append(targets_table(results["targets"]))
    out.extend(layouts.tables(results))
    out.extend(across.tables(results))
    for kind, title, foot in (
            ("strong", "Strong scaling (same data): epoch s, speedup T(n0)/T(n), efficiency",
             "n0 = the contender's smallest worker count; efficiency = speedup * n0 / n."),
            ("weak", "Weak scaling (data grows with the workers): epoch s, scaled speedup, "
                     "efficiency T(n0)/T(n)", "Ideal: the epoch time stays put, efficiency 1.")):
        entries = [s for s in results["scaling"] if s["scaling"] == kind]
        if not entries:
            continue
        counts = results["meta"]["workers"]
        body = []
        for s in entries:
            at = {p["workers"]: p for p in s["points"]}
            body.append([s["workload"], s["contender"]] + [
                f"{at[n]['epoch_s']:.3g} s, {at[n]['speedup']:.2f}x, {at[n]['efficiency']:.0%}"
                f"{'*' if at[n]['oversubscribed'] else ''}" if n in at else "-" for n in counts])
        header = ["workload", "contender"] + [f"{n} worker{'s' if n > 1 else ''}" for n in counts]
        out.append((title, header, body, f"{foot} {star}"))
    return out


def targets_table(checks: list[dict[str, Any]]) -> Table:
    """Issue 4's targets, one row per goal, dtrain's targeted contenders side by side."""
    goals = list(dict.fromkeys((t["workload"], t["what"], t["goal"]) for t in checks))
    at = {(t["workload"], t["what"], t["contender"]): t for t in checks}
    body = []
    for wl, what, goal in goals:
        cells = []
        for name in (*DTRAIN_TARGETED, FLOOR):
            t = at.get((wl, what, name))
            cells.append("-" if t is None or t["value"] is None else
                         f"{t['value']:.2f} {'yes' if t['met'] else 'NO'}")
        body.append([wl, WHAT[what], f"<= {goal:g}", *cells])
    return ("Targets (issue 4), 2 workers",
            ["workload", "measure", "goal", *DTRAIN_TARGETED, FLOOR],
            body, "Ratios of median epoch times in this run; ms per step = epoch time / steps. "
            "dtrain-default: the LocalCluster python -m dtrain starts here (cluster.layout = "
            "hybrid: one worker process, a thread per core, at most one per shard); "
            "dtrain-allreduce: 2 worker processes on a LocalCluster (flat); dtrain-threads: one "
            "worker process, 2 threads; dtrain-mpi-allreduce: 2 worker ranks under mpiexec; "
            "dask-floor: dtrain-allreduce's step graph with no maths on the same cluster, a "
            "goal it misses is below what Dask itself costs here; each cell says whether the "
            "goal is met.")


def headline(meta: dict[str, Any]) -> str:
    """When, where and how: the first lines of every rendering."""
    after = meta.get("load_after", [float("nan")])[0]
    gpu = f", {meta['gpu']}" if meta.get("gpu") else ""
    partial = f"PARTIAL ({meta['partial']}): the cells not run are missing. " \
        if meta.get("partial") else ""
    return (f"{partial}Benchmark of {meta['date']} on {meta['cpu']} ({meta['cores']} cores, "
            f"{meta['memory_gib']} GiB{gpu}), load average {meta['load_before'][0]:.2f} before, "
            f"{after:.2f} after; dtrain {meta['dtrain_commit'] or '(no git checkout)'}.\n"
            f"`{meta['command']}`")


def markdown(results: dict[str, Any]) -> str:
    lines = [headline(results["meta"]), ""]
    for title, header, body, foot in tables(results):
        lines += [f"### {title}", "", "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        lines += ["", foot, ""]
    return "\n".join(lines)


def _html_table(title: str, header: list[str], body: list[list[str]], foot: str) -> str:
    e = html_escape.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>" for cells in body)
    return (f"<h3>{e(title)}</h3><table border='1' cellpadding='3' style='border-collapse:"
            f"collapse;font-size:12px'><tr>{head}</tr>{rows}</table><p>{e(foot)}</p>")


def html(results: dict[str, Any]) -> str:
    """A standalone page (Bokeh inlined): speedup and efficiency plots, then every table."""
    from bokeh.embed import file_html
    from bokeh.layouts import column, gridplot
    from bokeh.models import Div
    from bokeh.palettes import Category20
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    meta = results["meta"]
    palette = Category20[20][::2] + Category20[20][1::2]       # the 10 dark colors first
    colors = dict(zip(results["contenders"], itertools.cycle(palette)))
    counts = meta["workers"]
    figures = []
    for name in results["workloads"]:
        entries = [s for s in results["scaling"] if s["workload"] == name]
        if not entries:
            continue
        pair = []
        for measure, ideal in (("speedup", counts), ("efficiency", [1.0] * len(counts))):
            kind = entries[0]["scaling"]
            legend = measure == "efficiency"        # one legend per pair, outside the plot
            f = figure(width=620 if legend else 420, height=300,
                       title=f"{name} ({kind} scaling): {measure}",
                       x_axis_label="workers", y_axis_label=measure)
            base = min(p["workers"] for s in entries for p in s["points"])
            f.line(counts, [v / base for v in ideal] if measure == "speedup" else ideal,
                   legend_label="ideal", color="gray", line_dash="dashed")
            for s in entries:
                xs = [p["workers"] for p in s["points"]]
                ys = [p[measure] for p in s["points"]]
                f.line(xs, ys, legend_label=s["contender"], color=colors[s["contender"]], line_width=2)
                f.scatter(xs, ys, legend_label=s["contender"], color=colors[s["contender"]], size=7)
            f.xaxis.ticker = counts
            if legend:
                f.legend.click_policy = "hide"
                f.legend.label_text_font_size = "9pt"
                f.add_layout(f.legend[0], "right")
            else:
                f.legend.visible = False
            pair.append(f)
        figures.append(pair)
    intro = Div(text=f"<h2>dtrain benchmark</h2><pre>{html_escape.escape(headline(meta))}</pre>",
                width=940)
    parts = [intro]
    if figures:
        parts.append(gridplot(figures))
    parts.append(Div(text="".join(_html_table(*t) for t in tables(results)), width=1400))
    return file_html(column(*parts), INLINE, "dtrain benchmark")


def write(results: dict[str, Any], out: Path) -> None:
    """``results.json``, ``results.md`` and ``results.html`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    (out / "results.md").write_text(markdown(results) + "\n")
    (out / "results.html").write_text(html(results))
    peers.picture(results, out / "results-speedup.png")
