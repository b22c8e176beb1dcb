"""``python -m dtrain`` with a fault injected, for the MPI tests: ``mpi_fault.py FAULT ARGS...``.

The driver (on the head) acts when epoch 2 is reported:
``driver-raises`` raises a RuntimeError (a bug), ``driver-user-error`` a UserError,
``pause`` waits (up to 60 s) until the file named by $DTRAIN_RESUME_FILE exists.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from dtrain import cli
from dtrain.core.errors import UserError
from dtrain.observe.recorder import Recorder


def _pause() -> None:
    resume = Path(os.environ["DTRAIN_RESUME_FILE"])
    deadline = time.monotonic() + 60
    while not resume.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _raise(error: Exception):
    def act() -> None:
        raise error
    return act


ACTIONS = {"driver-raises": _raise(RuntimeError("injected driver failure at epoch 2")),
           "driver-user-error": _raise(UserError("injected user error at epoch 2")),
           "pause": _pause}


def _inject(fault: str) -> None:
    action = ACTIONS[fault]
    original = Recorder.epoch

    def epoch(self, row):
        if row["epoch"] == 2:
            action()
        original(self, row)

    Recorder.epoch = epoch


if __name__ == "__main__":
    _inject(sys.argv.pop(1))
    sys.exit(cli.main())
