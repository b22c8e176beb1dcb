"""``python -m dtrain report DIR...`` and ``python -m dtrain graph --out FILE``."""
from __future__ import annotations

from pathlib import Path

from dtrain.cli.common import Parser, config_options
from dtrain.core.config import load_config
from dtrain.observe import drawing, htmlreport
from dtrain.training import pictures


def report(argv: list[str]) -> int:
    """``python -m dtrain report DIR [DIR...] [--out FILE]``."""
    parser = Parser(
        prog="python -m dtrain report",
        description="Rebuild report.html from run directories; several runs are overlaid.")
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directories")
    parser.add_argument("--out", metavar="FILE", help="where to write the report (default: "
                        "DIR/report.html for one run, ./report.html for several)")
    args = parser.parse_args(argv)
    runs = [htmlreport.RunData.read(d) for d in args.dirs]
    default = Path(args.dirs[0]) / "report.html" if len(runs) == 1 else Path("report.html")
    print(f"report: {htmlreport.write(runs, Path(args.out) if args.out else default)}")
    return 0


def draw(argv: list[str]) -> int:
    """``python -m dtrain graph [--config FILE] [--set KEY=VALUE] --out FILE``."""
    parser = Parser(
        prog="python -m dtrain graph",
        description="Draw one training step's task graph, coloured by task type, in a box per "
                    "worker (cluster.workers fake workers; 2 if it is 0).")
    config_options(parser)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", metavar="FILE", help=".svg, .png or .pdf (rendered by Graphviz's "
                       "dot), or .dot for the DOT source")
    where.add_argument("--gallery", metavar="DIR", help="write every strategy's picture (.dot "
                       "and .svg) to DIR, as kept in graphs/")
    args = parser.parse_args(argv)
    if args.gallery:
        for path in pictures.write_gallery(args.gallery):
            print(f"graph: {path}")
        return 0
    dot = pictures.step_graph(load_config(args.config, args.overrides))
    print(f"graph: {drawing.render(dot, args.out)}")
    return 0
