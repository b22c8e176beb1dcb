"""What every subcommand's parser shares."""
from __future__ import annotations

import argparse
from pathlib import Path

from dtrain.core.config import DEFAULT_CONFIG
from dtrain.core.errors import UserError


class Parser(argparse.ArgumentParser):
    """Command-line mistakes are user errors too: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see {self.prog} --help)")


def config_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--set``, shared by training and ``graph``."""
    default = DEFAULT_CONFIG.relative_to(Path.cwd()) if DEFAULT_CONFIG.is_relative_to(Path.cwd()) \
        else DEFAULT_CONFIG
    parser.add_argument("--config", metavar="FILE", help=f"TOML run config (default: {default})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.epochs=5 (repeatable)")
