"""``python -m dtrain`` and the ``dtrain`` command: a signal prologue, then the command line.

Importing the command line (Dask, distributed, Bokeh, ...) takes a second or
more.  A Ctrl-C, SIGTERM or SIGUSR1 in that time ends the process at once,
quietly and with the exit code a stop by that signal has everywhere else
(130 for Ctrl-C, 75 for SIGTERM and SIGUSR1): nothing has started and
nothing has been written.  :func:`dtrain.cli.main.main` takes the signals
over as soon as it runs, and once the command's exit code is known they are
ignored to the end of the process: a signal that comes while the process
exits changes nothing of its code (nor kills it: as Python finalizes, it
gives a signal that it handled its default action back).  This module
imports nothing of dtrain's before its handlers are in place.
"""
import os
import signal
import sys

EARLY = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (75, "stopped by SIGTERM"),
         signal.SIGUSR1: (75, "stopped by SIGUSR1")}


def _stop_at_once(signum, frame):
    code, what = EARLY[signum]
    os.write(2, f"dtrain: {what}\n".encode())
    os._exit(code)


def entry():
    """The ``dtrain`` command's entry point (``python -m dtrain`` runs the same)."""
    for sig in EARLY:
        signal.signal(sig, _stop_at_once)
    from dtrain.cli import main     # the heavy imports
    return main(last=True)


if __name__ == "__main__":
    sys.exit(entry())
