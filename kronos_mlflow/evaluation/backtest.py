"""Qlib's own backtest of forecast signals, as upstream's ``finetune/qlib_test.py`` runs it
(:func:`backtest_signals`): ``TopkDropoutStrategy`` on each signal against the benchmark, with
random and negated controls (:func:`breadth_reason` skips a top-k too broad to depend on the
signal). What it computes and how to read it: docs/backtest.md.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.keys import BACKTEST
from ..config.sections import as_section, section
from ..errors import DataError

__all__ = ["BacktestResult", "backtest_signals", "benchmark_of", "breadth_reason", "check_signal_days", "metric_prefix",
           "portfolio", "skip_reason",
           "EXCHANGE", "ACCOUNT", "PNG"]

PNG = "backtest.png"
#: Upstream's exchange settings (finetune/qlib_test.py).
EXCHANGE = {"freq": "day", "limit_threshold": 0.095, "deal_price": "open", "open_cost": 0.001,
            "close_cost": 0.0015, "min_cost": 5}
ACCOUNT = 100_000_000
#: Upstream's benchmark per instrument universe (finetune/config.py); others use csi300's.
UPSTREAM_BENCHMARKS = {"csi300": "SH000300", "csi800": "SH000906", "csi1000": "SH000852"}
_NAME = re.compile(r"[^a-z0-9]+")
CONTROL_SEED = 20240601
VERDICT_TAG = "backtest_verdict"
UPSTREAM_TOPK = 50  # finetune/config.py's n_symbol_hold
#: signal names whose metric names the backtest's own metrics use
RESERVED = ("random", "negated", "benchmark")


@dataclass
class BacktestResult:
    """What :func:`backtest_signals` found. ``skipped`` is the one line to print when the
    backtest could not run (then ``metrics`` is empty and ``plot`` is None)."""

    metrics: dict[str, float] = field(default_factory=dict)
    plot: Path | None = None
    skipped: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # backtest_verdict, with a control
    benchmark: str = ""
    time_range: tuple[str, str] = ("", "")
    #: Per-day curves, by signal name: cumulative return with cost, cumulative excess return with
    #: cost; and ``benchmark``'s cumulative return (Qlib's sums of daily returns).
    curves: dict[str, Any] = field(default_factory=dict)


def metric_prefix(name: str) -> str:
    """``backtest_<name>_``: ``name`` lowercased, each run of other characters one ``_``."""
    slug = _NAME.sub("_", str(name).lower()).strip("_")
    if not slug:
        raise DataError(f"backtest signal name '{name}' has no letter or digit; expected a name such as fine-tuned")
    return f"backtest_{slug}_"


def benchmark_of(backtest: Any, data: Any = None) -> str:
    """``backtest_benchmark`` of the ``backtest`` section, or upstream's index for the ``data``
    section's instrument when it is empty (``backtest``: or the whole config, which gives both)."""
    if isinstance(backtest, Mapping) and data is None:
        data = backtest
    return str(as_section(backtest, BACKTEST).backtest_benchmark or "") or UPSTREAM_BENCHMARKS.get(
        str(as_section(data if data is not None else {}, "data").instrument).lower(), UPSTREAM_BENCHMARKS["csi300"])


def _signal_series(name: str, frame):
    """A signal as the Series Qlib's strategy reads: (datetime, instrument) -> score, finite only."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame) or "score" not in frame.columns:
        raise DataError(f"backtest signal '{name}' is not a DataFrame with a 'score' column; expected one indexed by "
                        "(datetime, instrument)")
    index = frame.index
    if not isinstance(index, pd.MultiIndex) or index.nlevels != 2:
        raise DataError(f"backtest signal '{name}' is indexed by {list(index.names)}; expected (datetime, instrument)")
    if "datetime" in index.names and "instrument" in index.names:
        frame = frame.reorder_levels(["datetime", "instrument"])
    score = pd.to_numeric(frame["score"], errors="coerce").astype("float64")
    try:
        dates = pd.DatetimeIndex(score.index.get_level_values(0))
    except (TypeError, ValueError):
        raise DataError(f"backtest signal '{name}': the first index level is not dates; expected (datetime, "
                        "instrument)") from None
    score.index = pd.MultiIndex.from_arrays([dates, score.index.get_level_values(1).astype(str)],
                                            names=["datetime", "instrument"])
    score = score[score.map(math.isfinite)]
    if score.empty:
        raise DataError(f"backtest signal '{name}' holds no finite score")
    return score[~score.index.duplicated(keep="last")].sort_index()


def _time_range(config: Mapping[str, Any], signals: Mapping[str, Any], calendar) -> tuple[str, str]:
    """``backtest_time_range``, or the test range from the first signal date; cut to the
    provider's calendar, whose last day is left out (Qlib's backtest steps one day beyond)."""
    first = min(s.index.get_level_values(0).min() for s in signals.values())
    last = max(s.index.get_level_values(0).max() for s in signals.values())
    return _days_with_signal(config, first, last, calendar)


def _days_with_signal(config: Mapping[str, Any], first, last, calendar) -> tuple[str, str]:
    """:func:`_time_range` of signals dated ``first`` .. ``last`` (``pandas.Timestamp``)."""
    import pandas as pd

    given = list(as_section(config, BACKTEST).backtest_time_range or [])
    if given:
        start, end = pd.Timestamp(given[0]), pd.Timestamp(given[1])
        key = "backtest_time_range"
    else:
        test = as_section(config, "data").test_time_range
        start, end = max(pd.Timestamp(test[0]), first), pd.Timestamp(test[1])
        key = "test_time_range"
    end = min(end, pd.Timestamp(calendar[-2]) if len(calendar) > 1 else start - pd.Timedelta(days=1))
    days = [d for d in calendar if start <= d <= end]
    if not days or days[0] > last or days[-1] < first:
        raise DataError(f"{key} {start.date()}:{end.date()} holds no trading day with a signal (signals cover "
                        f"{first.date()}:{last.date()}, the provider's calendar {calendar[0].date()}:"
                        f"{calendar[-1].date()}); choose a backtest_time_range inside both")
    return days[0].strftime("%Y-%m-%d"), days[-1].strftime("%Y-%m-%d")


def _init_qlib(path: Path) -> None:
    """``qlib.init`` on ``path``, quietly (errors only) and without disk caches; it clears Qlib's memory caches,
    so a second call in the same process (another provider, another test) reads afresh."""
    hook = sys.excepthook
    try:
        import qlib
        from qlib.constant import REG_CN

        qlib.init(provider_uri=str(path), region=REG_CN, logging_level=logging.ERROR, kernels=1,
                  expression_cache=None, dataset_cache=None)
    finally:
        sys.excepthook = hook  # qlib.init installs its own


@contextlib.contextmanager
def _quiet():
    """Qlib's backtest prints gym's notice on import, progress bars and numpy warnings on stderr."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def portfolio(backtest: Any, n_symbols: int) -> tuple[int, int]:
    """``(topk, n_drop)`` of the strategy on ``n_symbols`` symbols with a signal: the top-k is
    ``backtest_n_symbol_hold``, or (0) upstream's 50 capped at a fifth of the symbols;
    ``backtest_n_symbol_drop`` is capped at the top-k. ``backtest``: the config's ``backtest``
    section (:func:`kronos_mlflow.config.sections.section`), or the whole config."""
    settings = as_section(backtest, BACKTEST)
    hold = int(settings.backtest_n_symbol_hold or 0) or max(1, min(UPSTREAM_TOPK, int(n_symbols) // 5))
    return hold, min(int(settings.backtest_n_symbol_drop), hold)


def breadth_reason(backtest: Any, n_symbols: int) -> str | None:
    """The one line that skips a backtest whose top-k holds half of the ``n_symbols`` symbols
    with a signal or more, or None. ``backtest``: the config's ``backtest`` section, or the whole config."""
    settings = as_section(backtest, BACKTEST)
    hold, _ = portfolio(settings, n_symbols)
    if 2 * hold < int(n_symbols):
        return None
    given = "backtest_n_symbol_hold" if settings.backtest_n_symbol_hold else "the top-k"
    return (f"backtest skipped: {given} {hold} holds half or more of the {int(n_symbols)} symbols with a signal, so "
            f"it trades alike on any signal; expected backtest_n_symbol_hold below {(int(n_symbols) + 1) // 2} "
            "(0 = a fifth of them)")


def _run_one(signal, settings: Any, benchmark: str, start: str, end: str, codes: list[str]):
    """One Qlib backtest of one signal (``settings``: the config's ``backtest`` section): its
    daily report (account, return, cost, bench, ...)."""
    topk, n_drop = portfolio(settings, len(codes))
    with _quiet():
        from qlib.backtest import backtest, executor
        from qlib.contrib.strategy import TopkDropoutStrategy

        strategy = TopkDropoutStrategy(topk=topk, n_drop=n_drop,
                                       hold_thresh=int(settings.backtest_hold_thresh), signal=signal)
        trade_executor = executor.SimulatorExecutor(time_per_step="day", generate_portfolio_metrics=True)
        reports, _ = backtest(start_time=start, end_time=end, strategy=strategy, executor=trade_executor,
                                benchmark=benchmark, account=ACCOUNT, exchange_kwargs={**EXCHANGE, "codes": codes})
    report, _ = reports["1day"]
    return report


def _risk(returns) -> dict[str, float]:
    """Qlib's ``risk_analysis`` (daily, sums of returns as Qlib accumulates them)."""
    from qlib.contrib.evaluate import risk_analysis

    table = risk_analysis(returns, freq="day")["risk"]
    return {k: float(v) for k, v in table.items()}


def skip_reason(config: Mapping[str, Any]) -> str | None:
    """The one line that says why :func:`backtest_signals` skips the backtest of ``config``'s
    data (intraday bars, a provider without the benchmark's series), or None when it runs."""
    from ..data.prepare import resolve_qlib_path  # lazy: numpy

    benchmark = benchmark_of(config)
    freq = as_section(config, "data").freq
    if str(freq) != "day":
        return (f"backtest skipped: Qlib's backtest runs on daily bars, freq is {freq}; run it on a "
                "daily provider")
    path = resolve_qlib_path(config)
    if not (path / "features" / benchmark.lower() / "close.day.bin").is_file():
        return (f"backtest skipped: benchmark {benchmark} has no series in '{path}' "
                f"(features/{benchmark.lower()}/close.day.bin); set backtest_benchmark to an instrument code of "
                "that directory")
    return None


def check_signal_days(config: Mapping[str, Any], dates) -> None:
    """The backtest of signals on ``dates`` (the origins' dates) has a trading day with a signal
    in its range, as :func:`backtest_signals` requires (the same :class:`DataError` line), read
    from the provider's calendar file without starting Qlib. Nothing to check when it is skipped."""
    import numpy as np
    import pandas as pd

    from ..data.prepare import resolve_qlib_path  # lazy: numpy

    if skip_reason(config) or not len(dates):
        return
    path = resolve_qlib_path(config) / "calendars" / "day.txt"
    calendar = list(pd.DatetimeIndex([line.strip() for line in path.read_text().splitlines() if line.strip()]))
    dates = pd.DatetimeIndex(np.asarray(dates))
    _days_with_signal(config, dates.min(), dates.max(), calendar)


def _excess(report) -> tuple[Any, dict[str, float]]:
    """The daily excess return over the benchmark and Qlib's risk analysis of it with cost."""
    excess = report["return"] - report["bench"]
    return excess, _risk(excess - report["cost"])


def _controls(signal, run, n_random: int, value: float) -> tuple[dict[str, float], dict[str, str]]:
    """The random and negated controls of ``signal`` whose excess return with cost is ``value``
    (docs/backtest.md#does-it-depend-on-the-signal-controls): their metrics and the
    ``backtest_verdict`` tag (none without randoms). The random signals are independent standard
    normal scores drawn from ``CONTROL_SEED``."""
    import numpy as np
    import pandas as pd

    _, negated = _excess(run(-signal))
    metrics = {"backtest_negated_excess_return_with_cost": negated["annualized_return"],
               "backtest_negated_information_ratio": negated["information_ratio"]}
    if n_random <= 0:
        return metrics, {}
    rng = np.random.default_rng(CONTROL_SEED)
    randoms = [_excess(run(pd.Series(rng.standard_normal(len(signal)), index=signal.index)))[1]["annualized_return"]
               for _ in range(int(n_random))]
    p05, median, p95 = (float(v) for v in np.percentile(randoms, [5, 50, 95]))
    metrics.update({"backtest_random_excess_return_with_cost": median,
                    "backtest_random_excess_return_with_cost_p05": p05,
                    "backtest_random_excess_return_with_cost_p95": p95})
    return metrics, {VERDICT_TAG: "better" if value > p95 else "worse" if value < p05 else "inconclusive"}


class _Steps:
    """Lines as each of ``total`` backtests starts (``backtest 2/23: fine-tuned ...``) and ends
    (``backtest 2/23: fine-tuned done (41.2s)``), through ``say``; nothing without it."""

    def __init__(self, say: Callable[[str], None] | None, total: int):
        self.say, self.total, self.done = say, total, 0

    def run(self, label: str, work: Callable[[], Any]):
        self.done += 1
        head = f"backtest {self.done}/{self.total}: {label}"
        if self.say is not None:
            self.say(f"{head} ...")
        started = time.time()
        out = work()
        if self.say is not None:
            self.say(f"{head} done ({time.time() - started:.1f}s)")
        return out

    def control(self, run: Callable[[Any], Any], name: str, n_random: int) -> Callable[[Any], Any]:
        """``run`` of :func:`_controls`, counted: the negated signal first, then the random ones."""
        calls = [0]

        def counted(signal):
            calls[0] += 1
            label = (f"{name} negated (control)" if calls[0] == 1
                     else f"random signal {calls[0] - 1}/{n_random} (control)")
            return self.run(label, lambda: run(signal))
        return counted


def backtest_signals(config: Mapping[str, Any], signals: Mapping[str, Any], out_dir,
                     control: str | None = None, say: Callable[[str], None] | None = None) -> BacktestResult:
    """Backtest each signal (name -> DataFrame indexed (datetime, instrument), column ``score``)
    with Qlib on the config's provider (``qlib_data_path``, or the demo market when empty) and
    write ``out_dir/backtest.png``. Metrics per signal ``s`` (``backtest_<s>_...``, the name
    made metric-safe by :func:`metric_prefix`): ``excess_return_with_cost`` and
    ``excess_return_without_cost`` (annualised), ``information_ratio`` and ``max_drawdown`` of
    the excess return with cost; and ``backtest_benchmark_return`` (annualised).

    With ``control`` (one of the signals' names), its random and negated controls and the
    ``backtest_verdict`` tag (docs/backtest.md#does-it-depend-on-the-signal-controls).

    A provider without the benchmark's series, a config with intraday bars, or a top-k holding
    half of the symbols with a signal gives a result with ``skipped`` set (one line) instead.
    Bad signals raise :class:`DataError`. ``say`` (e.g. ``Console.print``) gets a line as each
    backtest starts and as it ends (:class:`_Steps`)."""
    from ..data.prepare import resolve_qlib_path  # lazy: numpy

    if not signals:
        raise DataError("backtest: no signal given; expected a mapping of name -> DataFrame with a 'score' column")
    prefixes = {name: metric_prefix(name) for name in signals}
    if len(set(prefixes.values())) < len(prefixes):
        raise DataError(f"backtest signal names {sorted(signals)} give the same metric names; expected distinct names")
    if control is not None and control not in signals:
        raise DataError(f"backtest control '{control}' is not one of the signals {sorted(signals)}")
    taken = [name for name, p in prefixes.items() if p in {f"backtest_{r}_" for r in RESERVED}]
    if taken:
        raise DataError(f"backtest signal name '{taken[0]}' gives the metric names of the backtest's own "
                        f"{taken[0].lower()} series; expected a name other than {', '.join(RESERVED)}")
    benchmark = benchmark_of(config)
    skipped = skip_reason(config)
    if skipped:
        return BacktestResult(skipped=skipped, benchmark=benchmark)
    path = resolve_qlib_path(config)
    series = {name: _signal_series(name, frame) for name, frame in signals.items()}
    _init_qlib(path)
    from qlib.data import D

    start, end = _time_range(config, series, list(D.calendar(freq="day")))
    codes = sorted(set().union(*(s.index.get_level_values(1).unique() for s in series.values())))
    settings = section(config, BACKTEST)  # what the strategy and its controls read
    narrow = breadth_reason(settings, len(codes))
    if narrow:
        return BacktestResult(skipped=narrow, benchmark=benchmark, time_range=(start, end))
    result = BacktestResult(benchmark=benchmark, time_range=(start, end))
    n_random = int(settings.backtest_n_random)
    steps = _Steps(say, len(series) + ((1 + max(n_random, 0)) if control is not None else 0))
    bench = None
    for name, signal in series.items():
        report = steps.run(name, lambda s=signal: _run_one(s, settings, benchmark, start, end, codes))
        excess, with_cost = _excess(report)
        p = prefixes[name]
        result.metrics[p + "excess_return_with_cost"] = with_cost["annualized_return"]
        result.metrics[p + "excess_return_without_cost"] = _risk(excess)["annualized_return"]
        result.metrics[p + "information_ratio"] = with_cost["information_ratio"]
        result.metrics[p + "max_drawdown"] = with_cost["max_drawdown"]
        result.curves[name] = {"return_with_cost": (report["return"] - report["cost"]).cumsum(),
                               "excess_return_with_cost": (excess - report["cost"]).cumsum()}
        bench = report["bench"]
    result.metrics["backtest_benchmark_return"] = _risk(bench)["annualized_return"]
    if control is not None:
        metrics, tags = _controls(series[control], steps.control(lambda s: _run_one(s, settings, benchmark, start, end,
                                                                                   codes), control, n_random),
                                  n_random,
                                  result.metrics[prefixes[control] + "excess_return_with_cost"])
        result.metrics.update(metrics)
        result.tags.update(tags)
    result.curves["benchmark"] = bench.cumsum()
    result.plot = plot_backtest(result, Path(out_dir) / PNG)
    return result


def plot_backtest(result: BacktestResult, out: Path) -> Path:
    """Two panels, as upstream draws them: each signal's cumulative return with cost beside the
    benchmark's, then each signal's cumulative excess return with cost. PNG, Agg canvas."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7), dpi=100, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for name, curve in result.curves.items():
        if name == "benchmark":
            continue
        top.plot(curve["return_with_cost"].index, curve["return_with_cost"].to_numpy(), label=name)
        bottom.plot(curve["excess_return_with_cost"].index, curve["excess_return_with_cost"].to_numpy(), label=name)
    bench = result.curves["benchmark"]
    top.plot(bench.index, bench.to_numpy(), label=f"{result.benchmark} (benchmark)", color="black", linestyle="--")
    bottom.axhline(0.0, color="black", linewidth=0.8, linestyle="--")
    top.set_title(f"Cumulative return with cost, {result.time_range[0]} to {result.time_range[1]}")
    top.set_ylabel("cumulative return")
    bottom.set_title(f"Cumulative excess return over {result.benchmark}, with cost")
    bottom.set_ylabel("cumulative excess return")
    bottom.set_xlabel("date")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
