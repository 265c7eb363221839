"""Property-based tests (Hypothesis) of every parser of a number, a length, a horizon or a count a
user types: any text (other scripts' digits such as ``"٣"`` or ``"²"``, which ``str.isdigit`` and
``int`` accept; thousands of digits; ``1e400``; signs, spaces, units) parses to a value inside the
parser's documented bounds, or is refused with one :class:`~kronos_mlflow.errors.UserError` line.
Never another exception (OverflowError, pandas' OutOfBoundsDatetime, MemoryError, a ValueError of
``int`` on 4,300 digits), never a value outside the bounds, never the long value echoed whole.

- walk-forward: ``parse_length`` (``fold_length``, ``val_length``, ``train_length``), the
  settings (``folds``, ``embargo``) and the fold table those make on a calendar;
- config keys: every number key through ``validate`` (its range in ``MAX_VALUES``), and
  ``eval_horizons`` (steps in 1..predict_window);
- ``kronos_mlflow.config.checks``'s ``integer`` and ``number`` (every flag, setting and sweep option
  that is a number goes through them), the pruner's options, ``compare --top``, fold numbers;
- dates and time ranges (``parse_date``, ``parse_time_range``).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kronos_mlflow.config import core as cfg, names, checks
from kronos_mlflow.errors import UserError
from kronos_mlflow.workflows.walkforward import folds as fl

QUICK = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONG = 200  # no more than this much of a long value is echoed

#: Digits of other scripts, superscripts, full-width and mathematical digits, odd spaces.
OTHER_DIGITS = ["٣", "١", "۳", "²", "³", "¹", "߃", "३", "৩", "３", "𝟗", "𝟘", "Ⅻ", "½", "\u2003", "\u00a0", "\t"]
NUMBER_CHARS = list("0123456789+-_.eE ") + OTHER_DIGITS
EXAMPLES = ["0", "1", "-1", "+3", " 7 ", "1_000", "1e5", "1e400", "-1e400", "1.5", "nan", "inf", "-inf", "0x10",
            "٣", "²", "9" * 30, "9" * 400, "9" * 5000, "", " ", "1" + "0" * 309, "3M", "99999999999Y", "0Y"]

whole = st.integers(min_value=-10**40, max_value=10**40).map(str)
long_digits = st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n)
number_like = st.text(alphabet=st.sampled_from(NUMBER_CHARS), max_size=40)
TEXTS = st.one_of(st.sampled_from(EXAMPLES), whole, long_digits, number_like, st.text(max_size=40))
UNITS = ["", "D", "W", "M", "Y", "d", "w", "m", "y", "Q", " M", "M ", "MM", "Ｍ"]
LENGTHS = st.one_of(st.tuples(TEXTS, st.sampled_from(UNITS)).map("".join), st.text(max_size=20))


def _one_line(exc: BaseException, value: str) -> None:
    message = str(exc)
    assert message and len(message.splitlines()) == 1, repr(message)
    assert len(message) < 1200, f"a {len(message)}-character message"
    if len(value) > LONG:
        assert value[:LONG] not in message, "a long value echoed in the message"


# ------------------------------------------------------------------------------- walk-forward


@QUICK
@given(LENGTHS)
@example("99999999999Y")
@example("9" * 5000 + "D")
@example("٣M")
@example("²")
@example("201Y")
@example("200Y")
@example("73000D")
def test_a_length_is_within_200_years_or_ten_million_bars_or_one_line(text):
    try:
        length = fl.parse_length("fold_length", text)
    except UserError as exc:
        _one_line(exc, text)
        return
    assert text.strip().isascii()
    if length.bars:
        assert 1 <= length.bars <= fl.MAX_BARS and not length.count
    else:
        assert 1 <= length.count <= fl.MAX_SPAN[length.unit]
        import pandas as pd

        # the longest span fits between any two times pandas holds (1677..2262)
        assert pd.Timestamp("2262-04-01") - length.offset() > pd.Timestamp("1677-09-22")


@QUICK
@given(TEXTS, TEXTS)
@example("100", "-1")
@example("101", "")
@example("٣", "")
@example("4", "٣")
@example("4", "9" * 5000)
def test_folds_and_embargo_are_within_their_ranges_or_one_line(folds, embargo):
    try:
        s = fl.Settings.checked(folds=folds, fold_length="3M", mode="expanding", train_length="", embargo=embargo,
                                val_length="", end="", retrain="predictor")
    except UserError as exc:
        _one_line(exc, folds if len(folds) > len(embargo) else embargo)
        return
    assert 1 <= s.folds <= fl.MAX_FOLDS
    assert s.embargo is None or 0 <= s.embargo <= 10**6


CALENDAR = np.array([str(d) for d in np.arange(np.datetime64("2020-01-01"), np.datetime64("2022-01-01"))
                     if np.is_busday(d)], dtype="datetime64[s]")
PLAN_CONFIG = {"lookback_window": 20, "predict_window": 5, "train_time_range": ["2020-01-01", "2021-06-30"],
               "test_time_range": ["2021-09-01", "2021-12-31"]}


@QUICK
@given(st.integers(1, 100).map(str) | TEXTS, LENGTHS, st.sampled_from(["expanding", "rolling"]), LENGTHS, LENGTHS,
       st.sampled_from(["", "0", "5", "400", "1000000"]))
@example("2", "99999999999Y", "expanding", "", "", "")
@example("2", "200Y", "rolling", "200Y", "200Y", "")
@example("100", "10000000", "expanding", "", "1", "1000000")
def test_the_fold_table_is_made_or_refused_in_one_line(folds, fold_length, mode, train_length, val_length, embargo):
    """Any fold settings on a two-year calendar: a fold table whose periods lie on the calendar,
    or one line; never an overflow of the calendar's arithmetic."""
    try:
        s = fl.Settings.checked(folds=folds, fold_length=fold_length, mode=mode, train_length=train_length,
                                embargo=embargo, val_length=val_length, end="", retrain="predictor")
        table = fl.plan(PLAN_CONFIG, s, CALENDAR)
    except UserError as exc:
        _one_line(exc, max((folds, fold_length, train_length, val_length), key=len))
        return
    assert len(table) == s.folds
    first, last = str(CALENDAR[0])[:10], str(CALENDAR[-1])[:10]
    for fold in table:
        for a, b in fold.ranges.values():
            assert first <= a <= b <= last


# ------------------------------------------------------------------------------- config keys

NUMBER_KEYS = sorted(k for k, v in cfg.DEFAULTS.items() if isinstance(v, (int, float)) and not isinstance(v, bool))


def test_every_number_key_has_an_upper_bound():
    """Every int and float key has a largest value: its entry in MAX_VALUES, or a check of its own
    (a fraction, a probability)."""
    own = {"verdict_min_change", "inference_top_p", "adam_beta1", "adam_beta2", "lora_dropout"}
    assert set(NUMBER_KEYS) - set(cfg.MAX_VALUES) == own


@QUICK
@given(st.sampled_from(NUMBER_KEYS), TEXTS)
@example("epochs", "٣")
@example("clip", "٣.٥")
@example("epochs", "9" * 5000)
@example("clip", "1e400")
@example("seed", "4294967296")
@example("n_train_iter", "1e18")
def test_a_number_key_is_within_its_range_or_one_line(key, text):
    try:
        value = cfg.validate({key: text})[key]
    except UserError as exc:
        _one_line(exc, text)
        return
    assert text.strip().isascii(), "a digit of another script was read as a number"
    assert isinstance(value, type(cfg.DEFAULTS[key])) and math.isfinite(value)
    assert value <= cfg.MAX_VALUES.get(key, 1.0) and value >= 0


@QUICK
@given(st.integers(1, 100_000), st.one_of(TEXTS, st.lists(TEXTS, max_size=4).map(",".join)))
@example(5, "٣")
@example(5, "1,²")
@example(5, "9" * 5000)
@example(10, "1,5,10")
def test_eval_horizons_are_steps_of_the_forecast_or_one_line(horizon, text):
    try:
        steps = cfg.horizons({"predict_window": horizon, "eval_horizons": text})
    except UserError as exc:
        _one_line(exc, text)
        return
    assert steps == sorted(set(steps)) and all(1 <= k <= horizon for k in steps)
    assert all(part.strip().isascii() for part in text.split(","))


# ------------------------------------------------------------------------------- the validators


@QUICK
@given(TEXTS, st.sampled_from([(0, 1), (1, 256), (0, 2**32 - 1), (1, 10**12), (-5, 5)]))
@example("٣", (0, 10))
@example("9" * 5000, (0, 10))
@example("1e400", (0, 10))
def test_integer_is_within_its_range_or_one_line(text, bounds):
    low, high = bounds
    try:
        value = checks.integer("key", text, low, high)
    except UserError as exc:
        _one_line(exc, text)
        return
    assert isinstance(value, int) and low <= value <= high
    assert text.strip().isascii()


@QUICK
@given(TEXTS, st.sampled_from([(0.0, 1.0), (0.0, 3600.0), (None, None), (1e-4, 1e6)]))
@example("٣.٥", (0.0, 10.0))
@example("1e400", (0.0, 10.0))
@example("1" + "0" * 400, (None, None))
def test_number_is_finite_within_its_range_or_one_line(text, bounds):
    low, high = bounds
    try:
        value = checks.number("key", text, low, high)
    except UserError as exc:
        _one_line(exc, text)
        return
    assert math.isfinite(value) and text.strip().isascii()
    assert (low is None or value >= low) and (high is None or value <= high)


def test_a_huge_int_is_shown_without_its_digits():
    """An int of more digits than Python turns into text (4,300) is refused by name, not by a
    ValueError of the message that would show it."""
    with pytest.raises(UserError, match="about 5,001 digits"):
        checks.integer("key", 10**5000, 0, 10)
    with pytest.raises(UserError, match="out of range"):
        checks.number("key", 10**400, 0, 10)


@QUICK
@given(st.sampled_from(["median:n_startup_trials=", "hyperband:max_resource=", "percentile:", "median:n_warmup_steps="]),
       TEXTS)
@example("median:n_startup_trials=", "٣")
@example("hyperband:max_resource=", "1e300")
def test_a_pruner_option_is_within_its_range_or_one_line(prefix, text):
    from kronos_mlflow.training.trial import PRUNER_INT_MAX, make_pruner

    if "," in text or "=" in text or ":" in text:
        text = text.replace(",", "").replace("=", "").replace(":", "")
    try:
        make_pruner(prefix + text)
    except UserError as exc:
        assert len(str(exc).splitlines()) == 1
        return
    number = float(text) if text.strip() else None
    assert text.strip().isascii()
    assert number is None or number <= max(PRUNER_INT_MAX, 100)


@QUICK
@given(TEXTS)
@example("٣")
@example("9" * 5000)
@example("-+0")
def test_compare_top_is_a_count_of_runs_or_one_line(text):
    from kronos_mlflow.cli.compare import TOP_MAX, _positive_int

    try:
        value = _positive_int(text)
    except argparse.ArgumentTypeError as exc:
        _one_line(exc, text)
        return
    assert 1 <= value <= TOP_MAX and text.strip().isascii()


@QUICK
@given(st.one_of(TEXTS, st.integers(-10**6, 10**6)))
@example("٣")
@example("²")
def test_a_fold_number_is_one_to_the_most_folds_or_one_line(value):
    try:
        number = names.fold_number(value, "tag walkforward.fold")
    except UserError as exc:
        _one_line(exc, str(value))
        return
    assert 1 <= number <= names.MAX_FOLD


# ------------------------------------------------------------------------------- dates


DATE_CHARS = list("0123456789-:T /,") + OTHER_DIGITS


@QUICK
@given(st.one_of(st.text(alphabet=st.sampled_from(DATE_CHARS), max_size=40), st.text(max_size=30),
                 st.dates().map(str), st.tuples(st.dates(), st.dates()).map(lambda d: f"{d[0]}:{d[1]}")))
@example("٢٠٢٠-٠١-٠١:2021-01-01")
@example("2020-01-0٣:2021-01-01")
@example("0001-01-01:9999-12-31")
def test_a_time_range_is_two_ordered_dates_or_one_line(text):
    from kronos_mlflow.config.timeranges import parse_time_range, time_bounds

    try:
        start, end = parse_time_range("test_time_range", text)
    except UserError as exc:
        _one_line(exc, text)
        return
    assert start.isascii() and end.isascii()
    assert time_bounds(start, start)[0] <= time_bounds(end, end)[1]
