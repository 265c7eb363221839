"""Qlib's backtest of forecast signals on a demo market (its benchmark series included).

An oracle signal (the realised return of the days a position is held) must beat the benchmark
and its negation lose; every metric is finite; the PNG is written; a provider without the
benchmark's series gives one skip line; bad keys and bad signals are one line each.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from data_helpers import isolated_home, qlib_features  # noqa: F401
from recording import Recorder

from kronos_mlflow.config.core import load_config
from kronos_mlflow.data import provider as pv
from kronos_mlflow.data import write_demo_market
from kronos_mlflow.data.demo import BENCHMARK
from kronos_mlflow.config.digest import config_digest
from kronos_mlflow.errors import ConfigError, DataError
from kronos_mlflow.evaluation.backtest import PNG, backtest_signals, benchmark_of, breadth_reason, metric_prefix, portfolio

NAMES = ("excess_return_with_cost", "excess_return_without_cost", "information_ratio", "max_drawdown")


@pytest.fixture(scope="module")
def market(tmp_path_factory):
    return write_demo_market(tmp_path_factory.mktemp("bt") / "market", 20, 3, start="2020-01-01", end="2021-12-31")


def _config(market, **overrides):
    return load_config({"qlib_data_path": str(market), "test_time_range": "2021-01-01:2021-12-31",
                        "backtest_n_symbol_hold": 3, "backtest_n_symbol_drop": 1, **overrides})


def _oracle(market) -> pd.DataFrame:
    """Score at date t: the open-to-open return from t+1 (the buy) to t+6 (past hold_thresh)."""
    cal = pd.DatetimeIndex((market / "calendars/day.txt").read_text().split())
    cols = {}
    for symbol in pv.read_instrument_file(market, "csi300"):
        start, opens = pv.read_series(market, symbol, "open")
        s = pd.Series(opens.astype(np.float64), index=cal[start : start + len(opens)])
        cols[symbol] = s.shift(-6) / s.shift(-1) - 1.0
    frame = pd.DataFrame(cols).stack().rename("score").to_frame()
    frame.index.names = ["datetime", "instrument"]
    return frame


@pytest.fixture(scope="module")
def oracle_run(market, tmp_path_factory):
    oracle = _oracle(market)
    negated = oracle.assign(score=-oracle["score"])
    out = tmp_path_factory.mktemp("bt-out")
    return backtest_signals(_config(market), {"oracle": oracle, "anti-oracle": negated}, out), out


def test_oracle_beats_the_benchmark_and_its_negation_loses(oracle_run):
    result, out = oracle_run
    assert result.skipped is None and result.benchmark == BENCHMARK
    names = [f"backtest_{s}_{n}" for s in ("oracle", "anti_oracle") for n in NAMES] + ["backtest_benchmark_return"]
    assert sorted(result.metrics) == sorted(names)
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.metrics["backtest_oracle_excess_return_with_cost"] > 0.1
    assert result.metrics["backtest_anti_oracle_excess_return_with_cost"] < -0.1
    assert result.metrics["backtest_oracle_information_ratio"] > 1.0 > -1.0 > \
        result.metrics["backtest_anti_oracle_information_ratio"]
    assert result.metrics["backtest_oracle_max_drawdown"] <= 0.0
    # costs only lower the excess return
    assert result.metrics["backtest_oracle_excess_return_with_cost"] < \
        result.metrics["backtest_oracle_excess_return_without_cost"]
    # the test range, from the first signal date, ends before the calendar's last day
    assert result.time_range == ("2021-01-01", "2021-12-30")
    assert result.plot == out / PNG and (out / PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_controls_say_an_oracle_is_better_and_a_random_signal_is_not(market, tmp_path):
    """``backtest_n_random`` random signals and the negated one on the same days and symbols: an
    oracle's excess return lies above the random signals' 95% point (``better``), a random
    signal's does not; the negated oracle loses."""
    oracle = _oracle(market)
    # four months and 8 random signals: each control is one backtest
    spring = {"backtest_time_range": "2021-01-04:2021-04-30", "backtest_n_random": 8}
    result = backtest_signals(_config(market, **spring), {"oracle": oracle}, tmp_path, control="oracle")
    m = result.metrics
    assert result.tags == {"backtest_verdict": "better"}
    assert m["backtest_random_excess_return_with_cost_p05"] <= m["backtest_random_excess_return_with_cost"] \
        <= m["backtest_random_excess_return_with_cost_p95"] < m["backtest_oracle_excess_return_with_cost"]
    assert m["backtest_negated_excess_return_with_cost"] < m["backtest_random_excess_return_with_cost_p05"]
    noise = oracle.assign(score=np.random.default_rng(7).standard_normal(len(oracle)))
    said: list[str] = []
    plain = backtest_signals(_config(market, **spring), {"noise": noise}, tmp_path,
                             control="noise", say=said.append)
    assert plain.tags["backtest_verdict"] != "better"
    # a line as each of the 10 backtests (the signal, its negation, 8 random signals) starts and ends
    labels = ["noise", "noise negated (control)", *(f"random signal {i}/8 (control)" for i in range(1, 9))]
    assert said[0::2] == [f"backtest {i}/10: {label} ..." for i, label in enumerate(labels, 1)]
    assert all(re.fullmatch(rf"backtest {i}/10: {re.escape(label)} done \(\d+\.\ds\)", line)
               for i, (label, line) in enumerate(zip(labels, said[1::2], strict=True), 1)), said
    assert all(math.isfinite(v) for v in plain.metrics.values())
    none = backtest_signals(_config(market, **{**spring, "backtest_n_random": 0}), {"oracle": oracle}, tmp_path,
                            control="oracle")
    assert none.tags == {} and "backtest_random_excess_return_with_cost" not in none.metrics
    assert none.metrics["backtest_negated_excess_return_with_cost"] == m["backtest_negated_excess_return_with_cost"]
    with pytest.raises(DataError, match="backtest control 'other' is not one of the signals"):
        backtest_signals(_config(market), {"noise": noise}, tmp_path, control="other")
    with pytest.raises(DataError, match="backtest signal name 'Random' gives the metric names"):
        backtest_signals(_config(market), {"Random": noise}, tmp_path)


def test_a_top_k_of_half_the_universe_is_skipped_in_one_line(market, tmp_path):
    """15 symbols with a signal: a top-k of 8 holds half of them and trades alike on any signal (7
    does not); the default (0) holds a fifth of them, upstream's 50 on a universe of 250 or more."""
    result = backtest_signals(_config(market, backtest_n_symbol_hold=8), {"oracle": _oracle(market)}, tmp_path)
    line = result.skipped
    assert result.metrics == {} and not (tmp_path / PNG).exists()
    assert "\n" not in line and "backtest_n_symbol_hold 8" in line and "15 symbols" in line and "below 8" in line
    assert breadth_reason(load_config({"qlib_data_path": str(market), "backtest_n_symbol_hold": 7}), 15) is None
    config = load_config({"qlib_data_path": str(market)})
    assert config["backtest_n_symbol_hold"] == 0
    assert portfolio(config, 20) == (4, 4) and portfolio(config, 51) == (10, 5)
    assert portfolio(config, 300) == (50, 5) and portfolio(config, 3) == (1, 1)
    assert breadth_reason(config, 20) is None and breadth_reason(config, 2) is not None
    auto = backtest_signals(_config(market, backtest_n_symbol_hold=0), {"oracle": _oracle(market)}, tmp_path)
    assert auto.skipped is None and auto.metrics["backtest_oracle_excess_return_with_cost"] > 0.1


def test_repeated_calls_in_one_process_read_their_own_provider(oracle_run, market, tmp_path):
    """Qlib's init is process-global: after Qlib reads another directory, a backtest gives the
    same numbers again."""
    other = write_demo_market(tmp_path / "other", 6, 9, start="2019-01-01", end="2020-06-30")
    assert len(qlib_features(other, "all", ["$close"])) > 0
    oracle = _oracle(market)
    again = backtest_signals(_config(market), {"oracle": oracle}, tmp_path / "out")
    for name in NAMES:
        key = f"backtest_oracle_{name}"
        assert again.metrics[key] == pytest.approx(oracle_run[0].metrics[key], rel=1e-9)


def test_backtest_time_range_is_used(market, tmp_path):
    result = backtest_signals(_config(market, backtest_time_range="2021-03-01:2021-06-30"),
                              {"oracle": _oracle(market)}, tmp_path)
    assert result.time_range == ("2021-03-01", "2021-06-30")
    with pytest.raises(DataError, match="backtest_time_range 2019-01-01:2019-06-30 holds no trading day") as err:
        backtest_signals(_config(market, backtest_time_range="2019-01-01:2019-06-30"), {"o": _oracle(market)}, tmp_path)
    assert "\n" not in str(err.value)


def test_a_provider_without_the_benchmark_series_is_skipped_with_one_line(market, tmp_path):
    result = backtest_signals(_config(market, backtest_benchmark="SH000905"), {"oracle": _oracle(market)}, tmp_path)
    assert result.metrics == {} and result.plot is None and not (tmp_path / PNG).exists()
    line = result.skipped
    assert "\n" not in line and "SH000905" in line and str(market) in line and "backtest_benchmark" in line


def test_the_benchmark_is_upstreams_for_the_instrument():
    assert benchmark_of({"instrument": "csi300", "backtest_benchmark": ""}) == "SH000300"
    assert benchmark_of({"instrument": "csi800", "backtest_benchmark": ""}) == "SH000906"
    assert benchmark_of({"instrument": "all", "backtest_benchmark": ""}) == "SH000300"
    assert benchmark_of({"instrument": "csi300", "backtest_benchmark": "MYINDEX"}) == "MYINDEX"
    assert metric_prefix("Fine-tuned") == "backtest_fine_tuned_" and metric_prefix("zero shot") == "backtest_zero_shot_"


def test_backtest_keys_have_upstreams_defaults_and_leave_the_digest_alone():
    c = load_config()
    # hold 0: upstream's 50 on a universe of 250 symbols or more (a fifth of a smaller one)
    assert (c["backtest_n_symbol_hold"], c["backtest_n_symbol_drop"], c["backtest_hold_thresh"]) == (0, 5, 5)
    assert portfolio(c, 300) == (50, 5)
    assert c["backtest_time_range"] == [] and c["backtest_benchmark"] == ""
    assert (c["backtest_signal_stride"], c["backtest_n_random"]) == (1, 20)
    changed = load_config({"backtest_time_range": "2024-07-01:2025-06-05", "backtest_n_symbol_hold": 10,
                           "backtest_n_symbol_drop": 2, "backtest_hold_thresh": 1, "backtest_benchmark": "SH000905",
                           "backtest_signal_stride": 5, "backtest_n_random": 3})
    assert changed["backtest_time_range"] == ["2024-07-01", "2025-06-05"]
    assert config_digest(changed) == config_digest(c)


@pytest.mark.parametrize("overrides, needle", [
    ({"backtest_n_symbol_hold": -1}, "backtest_n_symbol_hold: -1 must be 0 or greater"),
    ({"backtest_signal_stride": -2}, "backtest_signal_stride: -2 must be 0 or greater"),
    ({"backtest_n_random": 10**6}, "backtest_n_random: 1000000 is"),
    ({"backtest_n_symbol_drop": -1}, "backtest_n_symbol_drop: -1 must be 0 or greater"),
    ({"backtest_n_symbol_hold": 3, "backtest_n_symbol_drop": 4}, "backtest_n_symbol_drop: 4 is more than"),
    ({"backtest_hold_thresh": "two"}, "backtest_hold_thresh: 'two' is not an integer"),
    ({"backtest_time_range": "2025-01-01:2024-01-01"}, "backtest_time_range: start 2025-01-01 is after end"),
    ({"backtest_benchmark": "../index"}, "backtest_benchmark: '../index' is not an instrument code"),
])
def test_bad_backtest_keys_are_one_line(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("signal, needle", [
    (pd.DataFrame({"value": [1.0]}), "not a DataFrame with a 'score' column"),
    (pd.DataFrame({"score": [1.0]}), "expected (datetime, instrument)"),
    (pd.DataFrame({"score": [float("nan")]}, index=pd.MultiIndex.from_tuples(
        [(pd.Timestamp("2021-01-04"), "DEMO000")], names=["datetime", "instrument"])), "holds no finite score"),
])
def test_bad_signals_are_one_line(market, tmp_path, signal, needle):
    with pytest.raises(DataError) as err:
        backtest_signals(_config(market), {"bad": signal}, tmp_path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_scorecard_backtests_its_signals_or_says_in_one_line_why_not(market, tmp_path, capsys):
    """The scorecard's end: the fine-tuned and zero-shot signals backtested (metrics joined,
    the PNG logged), or one console line and a tag when the benchmark has no series."""
    from kronos_mlflow.evaluation.scorecard import Scorecard, add_backtest

    oracle = _oracle(market)
    card = Scorecard(signals={"finetuned": oracle, "zeroshot": oracle.assign(score=-oracle["score"])})
    from kronos_mlflow.runtime.console import Console

    logger, console = Recorder(), Console(True)
    add_backtest(card, _config(market, backtest_n_random=4), tmp_path, logger, console)
    assert card.metrics["backtest_fine_tuned_excess_return_with_cost"] > card.metrics[
        "backtest_zero_shot_excess_return_with_cost"]
    # the fine-tuned signal is the one controlled: here an oracle, so better than random
    assert card.tags == {"backtest_verdict": "better"}
    assert card.metrics["backtest_negated_excess_return_with_cost"] < 0
    assert logger.calls == [("log_artifact", str(tmp_path / PNG), "evaluation")]
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "fine-tuned" in line and "4 random signals" in line and line.count("%") >= 6 and "better" in line
    skipped = Scorecard(signals={"finetuned": oracle})
    add_backtest(skipped, _config(market, backtest_benchmark="SH000905"), tmp_path / "x", logger, console)
    assert skipped.tags["backtest"] == "skipped" and skipped.metrics == {}
    assert logger.calls == [("log_artifact", str(tmp_path / PNG), "evaluation")]  # nothing more logged
    assert "SH000905" in capsys.readouterr().out.strip().splitlines()[-1]
