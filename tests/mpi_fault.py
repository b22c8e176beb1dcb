"""``python -m dtrain`` with a fault injected, for the MPI tests: ``mpi_fault.py FAULT ARGS...``.

Faults (raised by the driver on the head when epoch 2 is reported):
``driver-raises`` a RuntimeError (a bug), ``driver-user-error`` a UserError.
"""
from __future__ import annotations

import sys

from dtrain import cli, report
from dtrain.errors import UserError

FAULTS = {"driver-raises": RuntimeError("injected driver failure at epoch 2"),
          "driver-user-error": UserError("injected user error at epoch 2")}


def _inject(fault: str) -> None:
    error = FAULTS[fault]
    original = report.Recorder.epoch

    def epoch(self, row):
        if row["epoch"] == 2:
            raise error
        original(self, row)

    report.Recorder.epoch = epoch


if __name__ == "__main__":
    _inject(sys.argv.pop(1))
    sys.exit(cli.main())
