"""Dispatch ``python -m dtrain ...`` to its subcommand and turn errors into exit codes."""
from __future__ import annotations

import contextlib
import difflib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from dtrain.cli import tools, train, use
from dtrain.core.errors import EXIT_INTERRUPTED, Diverged, Stopped, UserError, exit_code

EXIT_BROKEN_PIPE = 141     # 128 + SIGPIPE, what a shell reports for a writer whose reader left

SUBCOMMANDS = {"report": tools.report, "graph": tools.draw, "predict": use.predict,
               "evaluate": use.evaluate, "export": use.export_model}


def _unknown(word: str) -> str:
    """What to say about a first argument that is neither a subcommand nor an option."""
    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1)
    hint = f"did you mean `python -m dtrain {close[0]}`? " if close else ""
    return (f"unknown command '{word}'; {hint}the commands are "
            f"{', '.join(SUBCOMMANDS)}, or none to train (see python -m dtrain --help)")


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or SIGUSR1 outside a training loop (which saves a checkpoint first): the
    command stops where it is, with the exit code of a stop by that signal."""
    raise Stopped.before_training(signal.Signals(signum).name)


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """While a command runs (in the main thread): Ctrl-C raises KeyboardInterrupt and
    SIGTERM or SIGUSR1 raise :class:`Stopped`, each reported as one line with its exit code
    (a training run's own handlers take over while it trains: :mod:`dtrain.deploy.signals`);
    the handlers before are put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _stop,
              signal.SIGUSR1: _stop}
    previous = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    with _signals():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else argv
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        if argv and not argv[0].startswith("-"):
            raise UserError(_unknown(argv[0]))
        return train.run(argv)
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
