"""Warnings about a run's layout that cost speed but not correctness: one line each."""
from __future__ import annotations

import os


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                  # not on Linux
        return os.cpu_count() or 1


def layout_warnings(workers: int, threads: int, leaves: int, cores: int, leaf: str = "shard",
                    spare: int = 0) -> list[str]:
    """What an embedded cluster of ``workers`` processes of ``threads`` threads each costs on
    ``cores`` cores with ``leaves`` shards (or model slices: ``leaf``) to hold, when it costs
    something; ``spare`` workers hold no leaf by design (a parameter server)."""
    lines = []
    if workers * threads > cores:
        who = f"{workers} worker{'s' * (workers > 1)}" + \
            (f" of {threads} threads" if threads > 1 else "")
        lines.append(f"{who} on {cores} core{'s' * (cores > 1)}: they take turns; expect "
                     f"slower steps")
    idle = workers - spare - leaves
    if idle > 0:
        lines.append(f"{workers} workers for {leaves} {leaf}{'s' * (leaves > 1)}: {idle} "
                     f"worker{'s hold' if idle > 1 else ' holds'} no {leaf} and only add"
                     f"{'s' * (idle == 1)} messages")
    return lines
