"""What a run's summary says crossed between workers, against what its graphs predict."""
from __future__ import annotations


def assert_moved_as_predicted(summary: dict) -> None:
    """Dask moved the bytes the graphs predict: exactly, as a rule.  On a loaded machine Dask
    may drop a replica and fetch a value twice, so a re-fetch or two is tolerated (the
    figures differ then by whole values, a few hundred bytes); a missing transfer is not."""
    predicted, measured = summary["comm_bytes_per_step"], summary["comm_bytes_measured_per_step"]
    assert predicted > 0
    assert predicted <= measured <= predicted * 1.02, (predicted, measured)
