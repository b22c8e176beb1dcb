"""Dispatch ``python -m dtrain ...`` to its subcommand and turn errors into exit codes."""
from __future__ import annotations

import difflib
import os
import sys

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


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
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
