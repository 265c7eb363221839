"""``kronos-mlflow``: the command line.

Subcommands live in the modules that own their work; each such module exposes
``add_arguments(parser)`` and ``run(args) -> int``. This file only wires them and turns
user errors into one line on stderr with exit code 2.

    kronos-mlflow demo-data --out ./demo_market      # a synthetic Qlib directory
    kronos-mlflow import-csv prices/*.csv --out ./my_qlib
    kronos-mlflow prepare --qlib-data-path ./my_qlib  # cache the splits
    kronos-mlflow train --epochs 1 --qlib-data-path ''  # one process; torchrun for more
    kronos-mlflow evaluate-tokenizer runs:/<run id>/best_model --base ./Kronos-Tokenizer-base  # the verdict
    kronos-mlflow evaluate --model runs:/<run id>/best_model  # the forecast scorecard
    kronos-mlflow pipeline --epochs 2 --predictor-epochs 2  # tokenizer -> predictor -> scorecard
    kronos-mlflow upload-spool outputs/models/NAME/cfg-DIGEST/mlflow-spool  # after a tracking outage
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .errors import EXIT_USAGE, UserError
from .stopping import TrainingStopped, exit_code

#: Subcommands that read no KRONOS_MLFLOW_* setting (every other one checks them all first).
NO_SETTINGS = {"import-csv", "compare"}

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo-data": ("kronos_mlflow.data.demo", "write the built-in synthetic demo market as a Qlib directory"),
    "import-csv": ("kronos_mlflow.data.csv_import", "turn K-line CSV files into a Qlib directory"),
    "prepare": ("kronos_mlflow.data.prepare", "read Qlib once and cache the train/val/test splits"),
    "train": ("kronos_mlflow.train", "fine-tune the tokenizer (one process; use torchrun for several)"),
    "train-predictor": ("kronos_mlflow.train_predictor",
                        "fine-tune the predictor on a frozen tokenizer (one process; use torchrun for several)"),
    "compare": ("kronos_mlflow.compare", "table of MLflow runs sorted by best_val_loss"),
    "evaluate-tokenizer": ("kronos_mlflow.stages.tokenizer.command",
                           "score a tokenizer against another on held-out windows: metrics, change, verdict"),
    "evaluate": ("kronos_mlflow.evaluation.forecast_command",
                 "score a forecaster against its zero-shot pair and naive forecasts: the scorecard"),
    "pipeline": ("kronos_mlflow.pipeline",
                 "tokenizer, predictor on it, scorecard: one parent MLflow run, a child run per step, reused when done"),
    "upload-spool": ("kronos_mlflow.tracking.spool_command", "upload what a run kept locally while its MLflow server was down"),
}


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line on stderr and exit code 2.

    Flags are never abbreviated (``--epoch`` is not ``--epochs``): an unknown flag is refused
    with the closest real one. ``on_error`` (if set) is called with the line before exiting.
    """

    on_error = None  # callable(line) -> None, e.g. record the line on the MLflow run
    silent = False  # True: exit 2 without a word (a torchrun rank other than 0: rank 0 says it)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        from .secrets import is_secret_name, redact

        text = " ".join(message.split())
        if text.startswith("unrecognized arguments:"):
            unknown = unknown_flag_message(self, text)
            # argparse would echo the value too: a credential typed as a flag must not be printed.
            for token in text[len("unrecognized arguments:"):].split():
                name = token.split("=", 1)[0]
                if name.startswith("-") and is_secret_name(name.lstrip("-")):
                    text = (f"argument {name}: credentials are never taken from the command line (its value is "
                            "not shown); set COMET_API_KEY, MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_PASSWORD "
                            "in the environment instead")
                    break
            else:
                text = unknown or unexpected_arguments_message(text)
        line = f"{self.prog}: error: {redact(shorten_quoted(text))}"
        if self.silent:
            self.exit(EXIT_USAGE)
        if self.on_error is not None:
            self.on_error(line)
        self.exit(EXIT_USAGE, line + "\n")


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long flag of ``parser`` and of its subcommands' parsers."""
    names: list[str] = []
    for action in parser._actions:  # noqa: SLF001 - argparse keeps them here
        names += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                names += _option_strings(sub)
    return names


_ARGPARSE_ECHOES = (  # argparse's own messages that quote the value they refuse, however long
    r"^(argument [^:]+: invalid choice: )'(.*)'( \(choose from .*\))$",
    r"^(argument [^:]+: ignored explicit argument )'(.*)'()$",
    r"^(argument [^:]+: invalid \S+ value: )'(.*)'()$",
)


def shorten_quoted(text: str) -> str:
    """The value quoted in one of argparse's own messages, cut to a readable length."""
    import re

    from .validate import shown

    for pattern in _ARGPARSE_ECHOES:
        match = re.match(pattern, text)
        if match:
            return f"{match.group(1)}'{shown(match.group(2))}'{match.group(3)}"
    return text


def unexpected_arguments_message(text: str) -> str:
    """``unrecognized arguments: a b c`` (values without a flag) -> one short line."""
    from .validate import shown

    tokens = text[len("unrecognized arguments:"):].split()
    if not tokens:
        return text
    more = f" (and {len(tokens) - 1} more)" if len(tokens) > 1 else ""
    return f"unexpected argument '{shown(tokens[0])}'{more}; every value follows its flag (--key VALUE)"


def unknown_flag_message(parser: argparse.ArgumentParser, text: str) -> str | None:
    """``unrecognized arguments: --epoch 3`` -> ``unknown flag --epoch (did you mean --epochs?)``."""
    import difflib

    tokens = text[len("unrecognized arguments:"):].split()
    flag = next((t.split("=", 1)[0] for t in tokens if t.startswith("-")), None)
    if flag is None:
        return None
    known = sorted(set(_option_strings(parser)))
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    if not close:  # --epoch vs --epochs, --lr vs --learning-rate: a prefix is a good guess too
        close = [k for k in known if k.startswith(flag) or flag.startswith(k)][:1]
    if close and close[0].replace("_", "-") in known:  # the dashed spelling, as --help lists it
        close = [close[0].replace("_", "-")]
    hint = f" (did you mean {close[0]}?)" if close else " (see --help for the flags)"
    from .validate import shown

    return f"unknown flag {shown(flag)}{hint}; flags are never abbreviated"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kronos-mlflow",
        description="Fine-tune the Kronos K-line tokenizer and track the experiments in MLflow.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Import a module only for the subcommand being run: each pulls heavy libraries.
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .console import install_warning_format

    install_warning_format()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else EXIT_USAGE
    from .tracking.project_run import record_failure

    try:
        if args.command not in NO_SETTINGS:
            from .settings import check_environment

            check_environment()
        return int(args._run(args) or 0)
    except UserError as exc:
        line = f"kronos-mlflow {args.command}: error: {exc}"
        print(line, file=sys.stderr)
        record_failure(line)  # under `mlflow run` (or as a pipeline's step): the run ends FAILED saying why
        return EXIT_USAGE
    except TrainingStopped as exc:  # SIGTERM / Ctrl-C of a training run: it ended KILLED
        from .stopping import stop_reason

        print(f"kronos-mlflow {args.command}: {stop_reason(exc.signum, None)}", file=sys.stderr)
        return exit_code(exc.signum)
    except KeyboardInterrupt:
        print(f"kronos-mlflow {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a crash: the traceback follows; the run it leaves says why it failed
        record_failure(f"kronos-mlflow {args.command}: {type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.exit(main())
