"""``kronos-mlflow``: the command line. Each subcommand's module exposes ``add_arguments(parser)``
and ``run(args) -> int``; this file wires them and turns a user's error into one line on stderr,
exit code 2. The commands: README.md, "Everyday commands"."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..config.argparsing import OneLineParser
from ..runtime.console import install_warning_format, terminal_only_bars
from ..errors import EXIT_USAGE
from .commands import COMMANDS

#: Subcommands that read no KRONOS_MLFLOW_* setting (every other one checks them all first).
NO_SETTINGS = {"import-csv", "compare"}

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo-data": ("kronos_mlflow.data.demo", "write the built-in synthetic demo market as a Qlib directory"),
    "import-csv": ("kronos_mlflow.data.csv_import", "turn K-line CSV files into a Qlib directory"),
    "prepare": ("kronos_mlflow.data.prepare", "read Qlib once and cache the train/val/test splits"),
    "train": ("kronos_mlflow.training.run", "fine-tune the tokenizer (one process; use torchrun for several)"),
    "train-predictor": ("kronos_mlflow.cli.train_predictor",
                        "fine-tune the predictor on a frozen tokenizer (one process; use torchrun for several)"),
    "compare": ("kronos_mlflow.cli.compare", "table of MLflow runs sorted by best_val_loss"),
    "evaluate-tokenizer": ("kronos_mlflow.stages.tokenizer.command",
                           "score a tokenizer against another on held-out windows: metrics, change, verdict"),
    "evaluate": ("kronos_mlflow.cli.evaluate",
                 "score a forecaster against its zero-shot pair and naive forecasts: the scorecard"),
    "pipeline": ("kronos_mlflow.workflows.pipeline",
                 "tokenizer, predictor on it, scorecard: one parent MLflow run, a child run per step, reused when done"),
    "walk-forward": ("kronos_mlflow.workflows.walkforward.command",
                     "fine-tune and score fold after fold (a pipeline per test period): one verdict over all folds"),
    "upload-spool": ("kronos_mlflow.tracking.spool_command", "upload what a run kept locally while its MLflow server was down"),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kronos-mlflow",
        description="Fine-tune Kronos (its tokenizer, then its predictor), judge the result against the model it "
                    "started from, and track every run in MLflow and Comet.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Import a module only for the subcommand being run: each pulls heavy libraries.
        if name == wanted:
            from ..stages import build_registry  # lazy: the stages and their plugins, ~250 ms on --help

            build_registry()  # before the command's module and its config: the stages its `stage` key accepts
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run, commands=COMMANDS)  # the command lines a workflow starts
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    install_warning_format()
    terminal_only_bars()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else EXIT_USAGE
    from ..tracking.project_run import exit_in_one_line  # lazy: tracking package, http/urllib/ssl: ~60 ms on --help

    def work() -> int:
        if args.command not in NO_SETTINGS:
            from ..config.settings import check_environment  # lazy: ~10 ms on --help

            check_environment()
        return int(args._run(args) or 0)

    return exit_in_one_line(f"kronos-mlflow {args.command}", work)

