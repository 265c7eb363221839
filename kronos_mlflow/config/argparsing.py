"""Argument parsing that speaks in one line: :class:`OneLineParser` and its messages.

Every command's parser (``kronos-mlflow ...``, ``python -m kronos_mlflow.train``, the launcher,
the sweep driver) is one of these, so a bad flag gets the same one-line refusal everywhere.
"""

from __future__ import annotations

import argparse

from ..errors import EXIT_USAGE, leave_the_line_to_rank_0


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
        from .secrets import is_secret_name, redact  # lazy: ~40 ms on --help (only bad flags need it)

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
            leave_the_line_to_rank_0()
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

    from .checks import shown  # lazy: ~8 ms on --help (only bad flags need it)

    for pattern in _ARGPARSE_ECHOES:
        match = re.match(pattern, text)
        if match:
            return f"{match.group(1)}'{shown(match.group(2))}'{match.group(3)}"
    return text


def unexpected_arguments_message(text: str) -> str:
    """``unrecognized arguments: a b c`` (values without a flag) -> one short line."""
    from .checks import shown  # lazy: ~8 ms on --help (only bad flags need it)

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
    from .checks import shown  # lazy: ~8 ms on --help (only bad flags need it)

    return f"unknown flag {shown(flag)}{hint}; flags are never abbreviated"
