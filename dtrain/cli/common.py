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

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but ``--set KEY VALUE`` (a space for the ``=``) is named as such."""
        known, extra = self.parse_known_args(args, namespace)
        if extra:
            spaced = [s for s in getattr(known, "overrides", None) or [] if "=" not in s]
            if spaced and not extra[0].startswith("-"):
                self.error(f"--set {spaced[0]} {extra[0]}: write KEY=VALUE, without spaces: "
                           f"--set {spaced[0]}={extra[0]}")
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return known


def config_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--set``, shared by training and ``graph``."""
    default = DEFAULT_CONFIG.relative_to(Path.cwd()) if DEFAULT_CONFIG.is_relative_to(Path.cwd()) \
        else DEFAULT_CONFIG
    parser.add_argument("--config", metavar="FILE", help=f"TOML run config (default: {default})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.epochs=5 (repeatable)")
