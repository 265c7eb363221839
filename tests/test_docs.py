"""The documentation as a reader meets it: the README stays a front page, every link lands,
every docs page opens with the commands a user types, and every command shown names real
subcommands, MLproject entry points and parameters, and flags.

Commands are read from the ```bash blocks and from inline code spans of README.md and
docs/*.md, and checked against the parsers the commands themselves use: ``kronos-mlflow`` and
``python -m kronos_mlflow.train`` (argparse, flags never abbreviated), ``sweeps/sweep.py``, the
benchmark scripts, ``mlflow`` (its click commands, and MLproject for ``mlflow run``) and
``torchrun``. Nothing is run: a typo in a flag or a parameter name fails here in seconds.
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GENERATED = {"hostile-input.md"}  # written by tests/test_hostile_input.py; its bad inputs are meant to fail
README_MAX_LINES = 200
# Shown on purpose as input that is refused, with the message it gets.
SHOWN_AS_REFUSED = {"mlflow run . -P epoch=3", "--epoch 3"}
# Placeholders in prose ("any other `--key value`"), not flags.
PLACEHOLDER_FLAGS = {"--key"}


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ----------------------------------------------------------------------------- reading markdown

_FENCE = re.compile(r"^(```+|~~~+)\s*([\w-]*)")


def _blocks(text: str) -> tuple[list[tuple[int, str, str]], str]:
    """The fenced blocks (first line number, language, body) and the text with them blanked out."""
    blocks, prose, open_fence, lang, body, start = [], [], None, "", [], 0
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line.strip())
        if open_fence is None and m:
            open_fence, lang, body, start = m.group(1), m.group(2), [], number
            prose.append("")
        elif open_fence is not None and line.strip().startswith(open_fence):
            blocks.append((start, lang, "\n".join(body)))
            open_fence = None
            prose.append("")
        elif open_fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def _headings(text: str) -> list[tuple[int, str]]:
    """(line number, heading text) of the ATX headings outside fenced blocks."""
    _, prose = _blocks(text)
    return [(n, m.group(1).strip()) for n, line in enumerate(prose.splitlines(), 1)
            if (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line))]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, heading in _headings(path.read_text()):
        slug = github_slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(path: Path) -> list[str]:
    """Targets of the markdown links and images in ``path``'s prose (not code)."""
    _, prose = _blocks(path.read_text())
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return re.findall(r"\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)", prose)


def _code_spans(text: str) -> list[str]:
    _, prose = _blocks(text)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


# ----------------------------------------------------------------------------- the pages


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move a topic to docs/"


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for page in _pages():
        for target in _links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{_rel(page)}: {target} (no file {file_part})")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{_rel(page)}: {target} (no heading #{anchor} in {_rel(dest)}; "
                              f"it has {sorted(_anchors(dest))})")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _links(README)}
    missing = [_rel(p) for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not missing, f"not in README.md's documentation map: {missing}"


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md") if p.name not in GENERATED))
def test_each_docs_page_starts_with_the_commands_a_user_types(page):
    text = (DOCS / page).read_text()
    headings = _headings(text)
    assert headings and headings[0][0] == 1 and text.startswith("# "), f"{page} must open with a # title"
    blocks, _ = _blocks(text)
    first_bash = next((start for start, lang, _ in blocks if lang in ("bash", "sh", "shell")), None)
    assert first_bash is not None, f"{page} shows no ```bash block"
    if len(headings) > 1:
        assert first_bash < headings[1][0], (
            f"{page}: the first ```bash block (line {first_bash}) must come before the second heading "
            f"(line {headings[1][0]}: {headings[1][1]!r})")


def test_the_readme_links_the_generated_hostile_input_page():
    assert "docs/hostile-input.md" in _links(README)


# ----------------------------------------------------------------------------- the commands shown


def _shell_commands(body: str) -> list[str]:
    """The simple commands of a bash block: continuations joined, comments dropped, split at && | ;."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: show the line as written
            tokens = line.split()
        current: list[str] = []
        for token in tokens:
            if token in ("&&", "||", "|", ";"):
                commands.append(" ".join(shlex.quote(t) for t in current))
                current = []
            else:
                current.append(token)
        commands.append(" ".join(shlex.quote(t) for t in current))
    return [c for c in commands if c]


_PROGRAMS = ("kronos-mlflow", "mlflow", "torchrun", "python", "python3", "nice")


def shown_commands() -> list[tuple[str, str]]:
    """(where, command) for every command of ours, mlflow's or torchrun's shown in the docs."""
    found = []
    for page in _pages():
        if page.name in GENERATED:
            continue
        text = page.read_text()
        blocks, _ = _blocks(text)
        for start, lang, body in blocks:
            if lang in ("bash", "sh", "shell"):
                found += [(f"{_rel(page)}:{start}", c) for c in _shell_commands(body)]
        for span in _code_spans(text):
            words = span.split()
            if words[0] in _PROGRAMS and len(words) > 1 and not words[1].endswith(":"):  # not a console line
                found += [(f"{_rel(page)} `{span}`", c) for c in _shell_commands(span)]
    return [(where, c) for where, c in found if c.split(" ", 1)[0] in _PROGRAMS]


def _strip_prefix(argv: list[str]) -> list[str]:
    if argv[:1] == ["nice"]:
        argv = argv[3:] if argv[1:2] == ["-n"] else argv[1:]
    return argv


TRAIN_MODULES = ("kronos_mlflow.train", "kronos_mlflow.train_predictor")  # the same flags


@cache
def _train_flags() -> frozenset[str]:
    from kronos_mlflow.config.argparsing import OneLineParser
    from kronos_mlflow.training.run import add_arguments

    parser = OneLineParser(prog="python -m kronos_mlflow.train")
    add_arguments(parser)
    return _option_strings(parser)


def _option_strings(parser: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(o for action in parser._actions for o in action.option_strings)  # noqa: SLF001


@cache
def _subcommand_flags(name: str) -> frozenset[str]:
    from kronos_mlflow.cli.main import build_parser

    parser = build_parser([name])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return _option_strings(sub.choices[name])


@cache
def _sweep_flags() -> frozenset[str]:
    from kronos_mlflow.workflows.sweep.driver import build_parser

    refused = {"--learning-rate", "--learning_rate", "--weight-decay", "--weight_decay",
               "--tokenizer-learning-rate", "--tokenizer_learning_rate", "--adam-weight-decay", "--adam_weight_decay"}
    return _option_strings(build_parser()) | (_train_flags() - refused - {"--check"})


@cache
def _script_flags(path: str) -> frozenset[str]:
    """Flags a script declares with ``add_argument("--flag", ...)``, read from its source."""
    tree = ast.parse((ROOT / path).read_text())
    flags = {"-h", "--help"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return frozenset(flags)


@cache
def _torchrun_flags() -> frozenset[str]:
    from torch.distributed.run import get_args_parser

    from kronos_mlflow.cli.launch import CHECK_FIRST  # kronos_mlflow.launch: torchrun's flags and its own

    return _option_strings(get_args_parser()) | {CHECK_FIRST}


@cache
def _mlproject() -> dict:
    return yaml.safe_load((ROOT / "MLproject").read_text())


def _flag_tokens(args: list[str]) -> list[str]:
    """The option names among ``args`` (``--x=v`` gives ``--x``; negative numbers are values)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("-") and not re.match(r"^-\d", a) and a != "-"]


def _unknown(args: list[str], known: frozenset[str]) -> list[str]:
    return [f for f in _flag_tokens(args) if f not in known]


def _check_training(args: list[str]) -> list[str]:
    return [f"unknown training flag {f}" for f in _unknown(args, _train_flags())]


def _check_kronos_mlflow(args: list[str]) -> list[str]:
    from kronos_mlflow.cli.main import SUBCOMMANDS

    if not args or args[0] in ("-h", "--help"):
        return []
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        return [f"no subcommand {name!r} (kronos-mlflow has {sorted(SUBCOMMANDS)})"]
    return [f"kronos-mlflow {name}: unknown flag {f}" for f in _unknown(rest, _subcommand_flags(name))]


def _check_torchrun(args: list[str]) -> list[str]:
    if "-m" not in args:  # `torchrun --nnodes ...` in a sentence: its flags only
        unknown = [f"torchrun: unknown flag {f}" for f in _unknown(args, _torchrun_flags())]
        return unknown if "..." in args else [*unknown, "torchrun without -m MODULE"]
    i = args.index("-m")
    problems = [f"torchrun: unknown flag {f}" for f in _unknown(args[:i], _torchrun_flags())]
    if args[i + 1] not in TRAIN_MODULES:
        return problems + [f"torchrun runs {args[i + 1]!r}, not one of {', '.join(TRAIN_MODULES)}"]
    return problems + _check_training(args[i + 2:])


def _check_python(args: list[str]) -> list[str]:
    if args[:1] == ["-m"] and args[1:2] and args[1] in TRAIN_MODULES:
        return _check_training(args[2:])
    if args[:2] == ["-m", "kronos_mlflow"]:
        return _check_kronos_mlflow(args[2:])
    if args[:2] == ["-m", "kronos_mlflow.launch"] and args[2:]:  # torchrun's arguments, then the training's
        return [p.replace("torchrun", "python -m kronos_mlflow.launch", 1) for p in _check_torchrun(args[2:])]
    if args and args[0] == "sweeps/sweep.py":
        return [f"sweeps/sweep.py: unknown flag {f}" for f in _unknown(args[1:], _sweep_flags())]
    if args and args[0].startswith("benchmarks/"):
        if not (ROOT / args[0]).is_file():
            return [f"no script {args[0]}"]
        return [f"{args[0]}: unknown flag {f}" for f in _unknown(args[1:], _script_flags(args[0]))]
    return []  # python -m pytest, python -m mlflow ...: not ours


def _click_options(command) -> dict[str, object]:
    import click

    options: dict[str, object] = {"--help": None}
    for param in command.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                options[name] = param
    return options


def _env_managers() -> list[str]:
    from mlflow.utils import env_manager

    return [env_manager.LOCAL, env_manager.CONDA, env_manager.VIRTUALENV, env_manager.UV]


def _mlflow_command(path: list[str]):
    """The click command ``mlflow <path...>`` (aliases such as ``ui`` resolved), or None."""
    import click
    from mlflow.cli import cli

    command = cli
    for name in path:
        if not isinstance(command, click.Group):
            return None
        command = command.get_command(click.Context(command), name)
        if command is None:
            return None
    return command


def _check_mlflow(args: list[str]) -> list[str]:
    import click

    command, path = _mlflow_command([]), ["mlflow"]
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = _mlflow_command([*path[1:], args[0]])
        if sub is None:
            return [f"{' '.join(path)} has no command {args[0]!r}"]
        command, path, args = sub, [*path, args[0]], args[1:]
    options = _click_options(command)
    problems = [f"{' '.join(path)}: unknown option {f}" for f in _flag_tokens(args) if f not in options]
    for i, token in enumerate(args[:-1]):  # a choice's value, e.g. --env-manager local
        param = options.get(token)
        choices = (list(param.type.choices) if param is not None and isinstance(param.type, click.Choice)
                   else _env_managers() if token == "--env-manager" else None)
        if choices is not None and args[i + 1] not in choices:
            problems.append(f"{' '.join(path)}: {token} {args[i + 1]!r} is not one of {choices}")
    if path == ["mlflow", "run"]:
        problems += _check_mlflow_run(args)
    return problems


def _check_mlflow_run(args: list[str]) -> list[str]:
    entry_points = _mlproject()["entry_points"]
    entry = "main"
    for i, token in enumerate(args[:-1]):
        if token in ("-e", "--entry-point"):
            entry = args[i + 1]
    if entry not in entry_points:
        return [f"MLproject has no entry point {entry!r} (it has {sorted(entry_points)})"]
    problems = []
    for i, token in enumerate(args[:-1]):
        if token in ("-P", "--param-list"):
            name, eq, _ = args[i + 1].partition("=")
            if eq and name not in entry_points[entry]["parameters"]:
                problems.append(f"entry point {entry!r} has no parameter {name!r}")
    return problems


CHECKS = {"kronos-mlflow": _check_kronos_mlflow, "torchrun": _check_torchrun, "python": _check_python,
          "python3": _check_python, "mlflow": _check_mlflow}


def check_command(command: str) -> list[str]:
    """What is wrong with ``command`` as a user would type it (empty: nothing found)."""
    argv = _strip_prefix(shlex.split(command))
    return CHECKS[argv[0]](argv[1:]) if argv and argv[0] in CHECKS else []


def test_every_command_shown_names_real_subcommands_entry_points_parameters_and_flags():
    commands = shown_commands()
    assert len(commands) > 40, commands  # the parsing found the docs' commands
    problems = [f"{where}: {command}\n    {p}" for where, command in commands if command not in SHOWN_AS_REFUSED
                for p in check_command(command)]
    assert not problems, "\n".join(problems)


def test_every_mlflow_run_a_user_copies_runs_without_conda():
    """The MLproject names a conda environment: an `mlflow run` in a bash block without
    `--env-manager local` (or another manager) fails on a machine without conda and leaves its
    run RUNNING, so every one says which."""
    missing = [f"{where}: {command}" for where, command in shown_commands()
               if re.search(r":\d+$", where) and command.startswith("mlflow run ")
               and "--env-manager" not in shlex.split(command)]
    assert not missing, "mlflow run without --env-manager:\n" + "\n".join(missing)
    assert check_command("mlflow run . --env-manager local -e predictor -P backtest_signal_stride=0") == []


def test_the_refused_examples_are_shown_and_are_refused():
    commands = {c for _, c in shown_commands()}
    spans = {s for page in _pages() if page.name not in GENERATED for s in _code_spans(page.read_text())}
    for example in SHOWN_AS_REFUSED:
        assert example in commands | spans, f"{example!r} is no longer shown: drop it from SHOWN_AS_REFUSED"
    assert check_command("mlflow run . -P epoch=3") == ["entry point 'main' has no parameter 'epoch'"]
    assert _unknown(["--epoch", "3"], _train_flags()) == ["--epoch"]


def test_a_typo_in_a_shown_command_is_caught():
    assert check_command("kronos-mlflow train --learning-rat 1e-4")
    assert check_command("kronos-mlflow trian --epochs 1")
    assert check_command("python -m kronos_mlflow.train --epoch 3")
    assert check_command("torchrun --standalone --nproc_per_node 2 -m kronos_mlflow.train --confg my.yaml")
    assert check_command("torchrun --standlone -m kronos_mlflow.train")
    assert check_command("python -m kronos_mlflow.launch --standalone --nproc_per_node 2 -m kronos_mlflow.train --confg x")
    assert check_command("python -m kronos_mlflow.launch --standlone -m kronos_mlflow.train")
    assert not check_command("python -m kronos_mlflow.launch --standalone --nproc_per_node 4 -m kronos_mlflow.train "
                             "--config my.yaml")
    assert check_command("mlflow run . -e sweeps -P n_trials=8")
    assert check_command("mlflow run . -e sweep -P n_trial=8")
    assert check_command("mlflow run . --env-manager lokal -P epochs=2")
    assert check_command("mlflow models serve -m models:/x@champion --port-number 5001")
    assert check_command("python sweeps/sweep.py --n-trial 8")
    assert check_command("python sweeps/sweep.py --learning-rate 1e-4")  # the sweep chooses it
    assert check_command("python benchmarks/bench_train.py --basline")
    assert check_command("kronos-mlflow compare --tpo 3")
    assert not check_command("kronos-mlflow compare --top 3 --url")
    assert not check_command("mlflow run . -e sweep --env-manager local -P n_trials=8 -P epochs=3")


def _bare_flag_spans() -> list[tuple[str, str]]:
    found = []
    for page in _pages():
        if page.name in GENERATED:
            continue
        for span in _code_spans(page.read_text()):
            if re.match(r"^--[a-z]", span):
                found.append((_rel(page), span))
    return found


def test_every_flag_named_in_prose_is_a_flag_of_a_command_the_docs_show():
    """`--system-metrics off`, `--max-restarts 3`, `--env-manager local` in a sentence: each is a
    flag of one of the project's commands, of mlflow's or of torchrun."""
    from kronos_mlflow.cli.main import SUBCOMMANDS

    known = set(_train_flags()) | set(_sweep_flags()) | set(_torchrun_flags())
    for name in SUBCOMMANDS:
        known |= _subcommand_flags(name)
    for script in (ROOT / "benchmarks").glob("*.py"):
        known |= _script_flags(_rel(script))
    for path in (["run"], ["server"], ["models", "serve"], ["artifacts", "download"]):
        known |= set(_click_options(_mlflow_command(path)))
    problems = [f"{page}: `{span}`" for page, span in _bare_flag_spans()
                if span not in SHOWN_AS_REFUSED
                and span.split()[0].split("=", 1)[0] not in known | PLACEHOLDER_FLAGS]
    assert not problems, "flags no command takes:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- what a command costs

#: A command that trains or scores: an entry point of MLproject, a training or scoring
#: subcommand, torchrun or the launcher.
TRAINS_OR_SCORES = re.compile(r"^(nice (-n \d+ )?)?(mlflow run\b|kronos-mlflow (train|train-predictor|pipeline|sweep|"
                              r"evaluate|evaluate-tokenizer|walk-forward)\b|torchrun\b|python3? sweeps/sweep\.py\b|"
                              r"python3? -m kronos_mlflow\.(launch|train|train_predictor)\b)")
QUICK_SIZES = re.compile(r"(-P n_train_iter=|--n-train-iter[ =])\d")
COST = re.compile(r"\b\d[\d,.]*(-\d[\d,.]*)?\s*(s|min|minutes?|h|hours?|days?)\b")


def _costless(command: str) -> bool:
    """Commands whose sizes are not the defaults' to state: the user's own config file, a
    placeholder for the rest of a command, a check or help, and a scoring command of a logged
    model (it scores at that run's own sizes: docs/verdict.md, docs/forecast-evaluation.md)."""
    scoring_a_run = re.search(r"kronos-mlflow evaluate(-tokenizer)? (--model )?(runs|models):/", command) or re.search(
        r"-e evaluate\b.*-P model=(runs|models):/", command)
    return bool(re.search(r"--config \S+\.yaml|\.\.\.|--help|--check\b", command) or scoring_a_run)


def _sized_commands() -> list[tuple[str, str, str]]:
    """(where, command, the cost said for it) of every command that trains or scores in a bash
    block: the cost is its own comment, the comment lines just above it, the comment lines that
    open the block (said for all its commands), or the prose lines just before the block (a
    heading such as "(8-9 minutes here)")."""
    found = []
    for page in _pages():
        if page.name in GENERATED:
            continue
        lines = page.read_text().splitlines()
        blocks, _ = _blocks("\n".join(lines))
        for start, lang, body in blocks:
            if lang not in ("bash", "sh", "shell"):
                continue
            before = " ".join(line for line in lines[max(0, start - 4):start - 1] if line.strip())
            above, opening, first = [], [], True
            for line in body.replace("\\\n", " ").splitlines():
                text = line.strip()
                if text.startswith("#"):
                    above.append(text)
                    continue
                if first:
                    opening, first = list(above), False
                command, _, comment = text.partition(" # ")
                if TRAINS_OR_SCORES.match(command):
                    said = " ".join([comment, *above, *opening, before])
                    found.append((f"{_rel(page)}:{start}", command.strip(), said))
                above = []
    return found


def test_every_command_that_trains_or_scores_uses_the_quick_sizes_or_says_what_it_costs():
    """The MLproject's sizes (100,000 training and 20,000 validation samples an epoch) are about a
    hundred times the quick start's: a command shown without them says how long it takes here."""
    commands = _sized_commands()
    assert len(commands) > 30, commands
    problems = [f"{where}: {command}" for where, command, said in commands
                if not QUICK_SIZES.search(command) and not _costless(command) and not COST.search(said)]
    assert not problems, "commands that neither use the quick sizes nor say their cost:\n" + "\n".join(problems)
    assert COST.search("(8-9 minutes here)") and COST.search("about 40 s here") and not COST.search("3 epochs")
