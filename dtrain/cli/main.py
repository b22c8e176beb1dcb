"""Dispatch ``python -m dtrain ...`` to its subcommand and turn errors into exit codes."""
from __future__ import annotations

import contextlib
import difflib
import os
import sys
import warnings
from collections.abc import Iterator

from dtrain.cli import tools, train, use
from dtrain.core.errors import (EXIT_INTERRUPTED, Diverged, Stopped, UnprotectedCluster,
                                UserError, exit_code)
from dtrain.deploy.signals import AT_ONCE, StopSignals

EXIT_BROKEN_PIPE = 141     # 128 + SIGPIPE, what a shell reports for a writer whose reader left

SUBCOMMANDS = {"report": tools.report, "graph": tools.draw, "predict": use.predict,
               "evaluate": use.evaluate, "export": use.export_model}


def _unknown(word: str) -> str:
    """What to say about a first argument that is neither a subcommand nor an option."""
    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1)
    hint = f"did you mean `python -m dtrain {close[0]}`? " if close else ""
    return (f"unknown command '{word}'; {hint}the commands are "
            f"{', '.join(SUBCOMMANDS)}, or none to train (see python -m dtrain --help)")


def main(argv: list[str] | None = None, *, last: bool = False) -> int:
    """Entry point; returns the process exit code.

    While the command runs (in the main thread), Ctrl-C, SIGTERM and SIGUSR1 stop it with
    one line and their exit code: at once before a run has made anything, at a window edge
    after saving a checkpoint once it has (:mod:`dtrain.deploy.signals`); once the outcome
    is known, a signal changes nothing of it.

    Parameters
    ----------
    argv
        The arguments (default: ``sys.argv[1:]``).
    last
        The process ends with this command (``python -m dtrain``): once its exit code is
        known, the stop signals are ignored, rather than the handlers before put back, so
        that none can cut the exit short or change its code.
    """
    argv = sys.argv[1:] if argv is None else argv
    signals = StopSignals(AT_ONCE, ignore_after=last)
    try:
        with signals, _said_as_lines():
            try:
                return _command(argv)
            finally:
                signals.settle()        # the outcome is known: a signal changes nothing now
    except Stopped as exc:
        for line in exc.lines(train.resume_command(argv)):
            print(f"dtrain: {line}", file=sys.stderr)
        return exc.code
    except (UserError, Diverged) as exc:
        print(f"dtrain: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print("dtrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:             # `python -m dtrain predict ... | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


@contextlib.contextmanager
def _said_as_lines() -> Iterator[None]:
    """dtrain's own warnings (:class:`~dtrain.core.errors.UnprotectedCluster`) as one
    ``dtrain: warning:`` line, as the command line's other warnings; others as Python
    shows them."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if issubclass(category, UnprotectedCluster):
            print(f"dtrain: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _command(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    if argv and not argv[0].startswith("-"):
        raise UserError(_unknown(argv[0]))
    return train.run(argv)
