"""Property-based tests (Hypothesis) of the doors every config value comes through: any YAML
file, any flag and any ``KRONOS_MLFLOW_*`` setting gives a validated config or one refusal line,
never another exception, never a slow answer, never a long value echoed back.

- the config loader: ``load_config(path=...)`` of any document, generated as raw text or bytes
  and as structured YAML (nested mappings and lists, anchors and aliases, tags, odd keys, huge and
  odd numbers, unicode, known keys with random values);
- the search space loader of ``sweeps/sweep.py``, on the same documents;
- the flag parser of ``python -m kronos_mlflow.train`` / ``kronos-mlflow train``: the same
  ``OneLineParser`` + ``add_arguments`` + ``config_of`` the command runs, in process;
- the environment settings (``kronos_mlflow.config.settings.check_environment``).

Each failure the search found is pinned with ``@example`` and its seed is a case of the
hostile-input table (tests/test_hostile_input.py, docs/hostile-input.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kronos_mlflow.config import core as cfg
from kronos_mlflow.errors import UserError

SLOW_S = 2.0  # one answer, even a refusal, within this (ms in practice)
LONG = 200  # no more than this much of a long value is echoed (paths are shown up to 200 characters)
QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_DIR = tempfile.mkdtemp(prefix="kronos-props-")
_COUNT = iter(range(10**9))


def _file(data: bytes | str) -> Path:
    path = Path(_DIR) / f"c{next(_COUNT)}.yaml"
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return path


def _refusal_is_one_short_line(message: str, longs: list[str]) -> None:
    assert message and len(message.splitlines()) == 1, repr(message)
    assert len(message) < 1200, f"a {len(message)}-character message"
    for value in longs:
        assert value[:LONG] not in message, "a long value echoed in the message"


def _answers(load, data, longs: list[str]) -> None:
    """``load(path)`` of ``data`` returns, or raises one short UserError line; quickly."""
    path = _file(data)
    started = time.monotonic()
    try:
        load(path)
    except UserError as exc:
        _refusal_is_one_short_line(str(exc), longs)
    finally:
        path.unlink()
    assert time.monotonic() - started < SLOW_S


# ------------------------------------------------------------------------------- YAML documents

KNOWN_KEYS = sorted(set(cfg.DEFAULTS) | set(cfg.ALIASES))
PLAIN = [
    "1", "-1", "0", "+12", "0x1F", "0o17", "0b101", "1_000", "1:30", "190:20:30", "1e5", "1e400", "1.0e+400",
    "1.5e-3", "-0.0", ".nan", ".NaN", ".inf", "-.inf", "~", "null", "Null", "true", "False", "yes", "no", "on",
    "off", "y", "n", "2020-01-01", "2020-13-45", "2020-02-30", "2024-06-18 09:30:00+08:00", "2024-06-18T09:30",
    "2020-01-01:2021-01-01", "2021-06-30:2020-01-01", "=", "<<", "''", '""', "9" * 30, "9" * 400,
    "1" + "0" * 309, "0." + "1" * 150, "1:" * 60 + "1", "csi300", "../../x", "/etc/passwd", "a/b:c%", "auto",
    "cpu", "predictor", "tokenizer", "val_skill", "off", "offline", "online", "[]", "{}", "[1, 2]", "[a, b]",
    "open,high,low,close,vol,amt",
]
TAGS = ["!!str ", "!!int ", "!!float ", "!!binary ", "!!set ", "!!omap ", "!!python/object/apply:os.system ",
        "!!python/name:os.system ", "!foo ", "! ", "!<tag:x,2000:y> ", "!!timestamp ", "!!null "]


def _quoted(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


@st.composite
def scalars(draw, longs: list[str]):
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.sampled_from(PLAIN))
    if kind == 1:
        return str(draw(st.integers(-(10**40), 10**40)))
    if kind == 2:
        return repr(draw(st.floats(allow_nan=True, allow_infinity=True)))
    if kind == 3:
        return _quoted(draw(st.text(max_size=30)))
    if kind == 4:
        text = draw(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                            min_size=LONG + 10, max_size=400))
        longs.append(text)
        return _quoted(text)
    return draw(st.text(alphabet="abcxyz_-. 019", min_size=1, max_size=12)).strip() or "x"


@st.composite
def values(draw, longs: list[str], anchors: list[str], depth: int = 0):
    """A YAML value as flow-style text, possibly tagged, anchored or an alias."""
    roll = draw(st.integers(0, 9))
    if roll == 0 and anchors:
        return "*" + draw(st.sampled_from(anchors))
    if roll in (1, 2) and depth < 12:
        items = draw(st.lists(values(longs, anchors, depth + 1), max_size=4))
        text = "[" + ", ".join(items) + "]"
    elif roll == 3 and depth < 12:
        pairs = draw(st.lists(st.tuples(keys(longs), values(longs, anchors, depth + 1)), max_size=4))
        text = "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    else:
        text = draw(scalars(longs))
    if draw(st.integers(0, 11)) == 0:
        text = draw(st.sampled_from(TAGS)) + text
    if draw(st.integers(0, 9)) == 0:
        name = f"a{len(anchors)}"
        anchors.append(name)
        text = f"&{name} {text}"
    return text


@st.composite
def keys(draw, longs: list[str]):
    roll = draw(st.integers(0, 9))
    if roll <= 4:
        return draw(st.sampled_from(KNOWN_KEYS))
    if roll == 5:
        return draw(st.sampled_from(["1", "true", "~", "null", "1.5", "<<", "=", "2020-01-01", "''", '"1"']))
    if roll == 6:
        return draw(st.sampled_from(["[a, b]", "{a: 1}", "? [a, b]", "!!str x", "&k x", "!foo x"]))
    if roll == 7:
        text = draw(st.text(min_size=LONG + 10, max_size=300))
        longs.append(text)
        return _quoted(text)
    return _quoted(draw(st.text(max_size=20)))


@st.composite
def documents(draw):
    """``(text, long values in it)``: a mapping (or now and then another top-level value) as
    block-style YAML, with whatever values, keys, anchors, aliases and tags."""
    longs: list[str] = []
    anchors: list[str] = []
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        key = draw(keys(longs))
        value = draw(values(longs, anchors))
        explicit = draw(st.integers(0, 19)) == 0  # the "? key" form
        lines.append(f"? {key}\n: {value}" if explicit else f"{key}: {value}")
    text = "\n".join(lines) + "\n"
    extra = draw(st.integers(0, 14))
    if extra == 0:
        text = draw(values(longs, anchors)) + "\n"  # not a mapping
    elif extra == 1:
        text += "---\nepochs: 2\n"  # a second document
    elif extra == 2:
        text = "%YAML 1.1\n---\n" + text
    elif extra == 3:
        text = "epochs:\n" + "".join(f"{'  ' * i}- \n" for i in range(1, draw(st.integers(2, 30))))
    return text, longs


YAML_CHARS = st.sampled_from(list(":-[]{}&*!?|>'\"#%@`,.~=<\n\t ") + list("abc019eE_+") + ["\u00e9", "\u2028", "\x85",
                                                                                          "\ufeff", "\x00", "\x7f"])
RAW_TEXT = st.text(alphabet=YAML_CHARS, max_size=200)
RAW_BYTES = st.binary(max_size=200)

BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def _load_config(path: Path) -> None:
    cfg.load_config(path=path)


@QUICK
@given(documents())
@example(("? [a, b]\n: 1\n", []))  # a list as a key: was a 38-line TypeError traceback
@example(("{a: 1}: x\n", []))  # a mapping as a key: the same
@example((BOMB, []))  # aliases: 38 s and 3 GB before the refusal
@example(("epochs: " + "9" * 5000 + "\n", []))  # past Python's int digit limit: a ValueError traceback
@example(("dataset_begin_time: 2020-13-45\n", []))  # a YAML timestamp that is no date: a ValueError traceback
@example(("epochs: 1" + "0" * 400 + "\n", []))  # an int no float can hold: an OverflowError traceback
@example(("run_name: !!python/object/apply:os.system [echo]\n", []))
# Found by this search (fixed, each a case of tests/test_hostile_input.py): a long value echoed whole
@example(("%YAML 1.1\n---\n? adamw_impl\n: &a0 \"" + "0" * 220 + "\"\n", ["0" * 220]))
@example(("accumulation_steps: \"" + "0" * 220 + "\"\n", ["0" * 220]))
# ... and a path component longer than the file system takes: an OSError traceback
@example(("save_path: /tmp/" + "s" * 300 + "\n", []))
def test_any_structured_yaml_gives_a_config_or_one_line(doc):
    text, longs = doc
    _answers(_load_config, text, longs)


@QUICK
@given(st.one_of(RAW_TEXT, RAW_BYTES))
@example("epochs: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n")
@example("\ufeffepochs: 2\n")
def test_any_raw_text_gives_a_config_or_one_line(data):
    _answers(_load_config, data, [])


@settings(max_examples=100, deadline=None)
@given(st.one_of(documents(), st.tuples(RAW_TEXT, st.just([]))))
@example(("learning_rate: {low: 1" + "0" * 400 + ", high: 1}\nweight_decay: {low: 0.1, high: 0.2}\n", []))
@example(("learning_rate: {low: 1.0e-5, high: 1.0e-3}\n" + "x" * 300 + ": 1\n", ["x" * 300]))
def test_any_search_space_gives_a_space_or_one_line(doc):
    from kronos_mlflow.workflows.sweep.space import load_search_space

    text, longs = doc
    _answers(load_search_space, text, longs)


def _outcome(text: str, libyaml: bool):
    import yaml

    from kronos_mlflow.config import yamlfile

    try:
        return "value", yamlfile._load(text, libyaml)  # noqa: SLF001 - both parsers, side by side
    except (yamlfile._Refused, yamlfile._DuplicateKey) as exc:  # noqa: SLF001
        return "refused", type(exc).__name__, exc.line
    except yaml.YAMLError:
        return "not YAML"


@settings(max_examples=100, deadline=None)
@given(documents())
@example((BOMB, []))
def test_libyaml_and_pure_python_parsers_agree(doc):
    """PyYAML without libyaml (the pure-Python parser) refuses and reads what libyaml does."""
    text, _ = doc
    fast, pure = _outcome(text, True), _outcome(text, False)
    if "not YAML" not in (fast, pure):  # the two parsers differ on a few syntax corner cases
        assert repr(fast) == repr(pure)  # repr: nan is not equal to itself


# ------------------------------------------------------------------------------- flags

FLAGS = sorted({f"--{k.replace('_', '-')}" for k in KNOWN_KEYS} | {f"--{k}" for k in KNOWN_KEYS}
               | {"--config", "--check", "--max-restarts", "--max_restarts"})
ARG_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00", exclude_categories=("Cs",))
                   | st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),  # undecodable bytes of argv
                   max_size=40)


@st.composite
def argvs(draw):
    """``(argv, long values)``: flags of the training command, known or not, with values."""
    longs: list[str] = []
    argv: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        roll = draw(st.integers(0, 9))
        if roll <= 5:
            flag = draw(st.sampled_from(FLAGS))
        elif roll == 6:
            flag = "--" + draw(ARG_TEXT)
        else:
            flag = draw(ARG_TEXT)
        kind = draw(st.integers(0, 4))
        if kind == 0:
            value = draw(st.sampled_from(PLAIN))
        elif kind == 1:
            value = draw(st.text(min_size=LONG + 10, max_size=300, alphabet=st.characters(
                codec="utf-8", exclude_characters="\x00", exclude_categories=("Cs",))))
            longs.append(value)
        else:
            value = draw(ARG_TEXT)
        if flag == "--config":
            value = draw(st.one_of(st.builds(lambda doc: str(_file(doc[0])), documents()),
                                   st.sampled_from(["", "/", "/dev/null", "/dev/zero", _DIR, "/nonexistent/c.yaml",
                                                    "/" + "c" * 300 + ".yaml"])))
        argv += [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]
    return argv, longs


def _parse_and_validate(argv: list[str]) -> None:
    from kronos_mlflow.config.argparsing import OneLineParser
    from kronos_mlflow.training.run import add_arguments, config_of

    parser = OneLineParser(prog="python -m kronos_mlflow.train")
    add_arguments(parser)
    config_of(parser.parse_args(argv))


@QUICK
@given(argvs())
@example((["--epochs", "1" + "0" * 400], []))  # an int no float can hold
@example((["--seed", "9" * 5000], []))  # past Python's int digit limit
@example((["--run-name", "\udcff" * 3], []))  # undecodable bytes on the command line
@example((["--instrument", "x" * 300], ["x" * 300]))
# Found by this search: argparse's "unrecognized arguments" echoed every stray value whole
@example((["--accumulation-steps", "0" * 220, "", "1" + "0" * 320], ["0" * 220]))
@example((["--check=" + "v" * 300], ["v" * 300]))  # argparse quotes the value it ignores
def test_any_flags_give_a_config_or_one_usage_line(case):
    argv, longs = case
    err = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            _parse_and_validate(argv)
        except SystemExit as exc:
            if exc.code == 0:  # --help
                assert any(a.split("=", 1)[0] in ("-h", "--help") for a in argv), argv
            else:
                assert exc.code == 2, exc.code
                _refusal_is_one_short_line(err.getvalue().strip(), longs)
        except UserError as exc:
            _refusal_is_one_short_line(str(exc), longs)
    assert time.monotonic() - started < SLOW_S


# ------------------------------------------------------------------------------- the environment

ENV_VALUES = st.one_of(st.sampled_from(["", " ", "10", "0", "-1", "nan", "inf", "1e400", "abc", "/etc/passwd",
                                        "/etc/passwd/x", "~/x", "9" * 5000, "1" + "0" * 400]),
                       st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00",
                                                      exclude_categories=("Cs",)), max_size=40))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["KRONOS_MLFLOW_HOME", "KRONOS_MLFLOW_SPOOL_DIR",
                                        "KRONOS_MLFLOW_HTTP_TIMEOUT_S", "KRONOS_MLFLOW_FINALIZE_WAIT_S",
                                        "KRONOS_PROGRESS_SECONDS"]),
                       ENV_VALUES))
@example({"KRONOS_MLFLOW_HOME": "9" * 5000})  # found by this search: an OSError traceback (name too long)
def test_any_setting_is_accepted_or_refused_in_one_line(env):
    from kronos_mlflow.config import settings as st_

    saved = {name: os.environ.get(name) for name in st_.NAMES}
    try:
        for name in st_.NAMES:
            os.environ.pop(name, None)
        os.environ.update({k: v.replace("~", _DIR) for k, v in env.items()})
        try:
            st_.check_environment()
        except UserError as exc:
            message = str(exc)
            _refusal_is_one_short_line(message, [v for v in env.values() if len(v) > LONG])
            assert any(name in message for name in env), message
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_every_kronos_variable_the_package_reads_is_declared_once():
    """Each ``KRONOS_*`` name in the package's code is a setting of ``config/settings.py``'s table
    (parsed there, refused when malformed) or one the package's processes hand each other."""
    import re
    from pathlib import Path

    from kronos_mlflow.config import settings as st_

    root = Path(st_.__file__).resolve().parents[2]
    found = {name for path in [*(root / "kronos_mlflow").rglob("*.py"), *(root / "sweeps").glob("*.py")]
             for name in re.findall(r"\bKRONOS_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])", path.read_text())}
    assert "KRONOS_PROGRESS_SECONDS" in found and found <= {*st_.NAMES, *st_.HANDED_OVER}, found - {*st_.NAMES,
                                                                                                 *st_.HANDED_OVER}
    assert not set(st_.NAMES) & set(st_.HANDED_OVER)
    read = re.compile(rf"(?:environ(?:\.get)?|getenv)\W*[\"']({'|'.join(st_.NAMES)})[\"']")
    bypass = [str(path.relative_to(root)) for path in (root / "kronos_mlflow").rglob("*.py")
              if path.name != "settings.py" and read.search(path.read_text())]
    assert not bypass, f"read through config/settings.py, not os.environ: {bypass}"


@pytest.fixture(autouse=True, scope="module")
def _cleanup():
    yield
    import shutil

    shutil.rmtree(_DIR, ignore_errors=True)
