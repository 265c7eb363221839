"""The scorecard (:func:`score_forecasters`): does the fine-tuned pair forecast better than its
zero-shot pair and than persistence (and, intraday, seasonal naive), on the same test-split
origins? Its metrics, verdicts and artifacts: docs/forecast-evaluation.md.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..config.core import horizons
from ..config.sections import as_section
from ..runtime.fsutil import write_atomic
from . import aci, calibration as cb, ensemble as en, forecasters as fc, probabilistic as pr, scores as sc
from . import head_scores as hs, weather as wx
from .calibration import CALIBRATED
from .ic_stats import rank_ic_metrics
from .backtest import backtest_signals, breadth_reason, skip_reason
from .figures import forecasts_figure, horizons_figure, pit_figure, reliability_figure, scorecard_figure
from .origins import CLOSE, Origins, calendar_of_test_range, forecast_origins, no_origins_reason, signal_origins
from .verdict import decide

#: forecaster -> metric prefix; the order of the scorecard
PREFIXES = {"finetuned": "test_", "zeroshot": "zeroshot_test_", "persistence": "persistence_test_",
            "seasonal_naive": "seasonal_naive_test_", "histvol": "histvol_test_",
            CALIBRATED: "calibrated_test_", en.ENSEMBLE: "ensemble_test_", aci.ACI: "aci_test_"}
BASELINES = ("zeroshot", "persistence", "histvol", "seasonal_naive")
VERDICT_TAGS = {"zeroshot": "verdict_vs_zeroshot", "persistence": "verdict_vs_persistence",
                "histvol": "verdict_vs_histvol"}
WQL_VERDICT_TAGS = {"zeroshot": "verdict_wql_vs_zeroshot", "persistence": "verdict_wql_vs_persistence",
                    "histvol": "verdict_wql_vs_histvol"}
CALIBRATION_TAG = "verdict_calibrated_vs_raw"
#: forecasters whose forecast return is a signal (direction, IC): not the naive ones
SIGNALS = ("finetuned", "zeroshot", CALIBRATED)
QUANTILE_COLUMNS = [f"q{level:.1f}" for level in sc.LEVELS]  # the nine deciles (WQL's)
ALL_QUANTILE_COLUMNS = pr.QUANTILE_COLUMNS  # q0.05 .. q0.95: what forecasts.parquet holds


@dataclass
class Scorecard:
    """One evaluation: the metrics and tags a run records, the per-origin table, the paths of
    a few origins for the picture, and the Kronos pairs' signals."""

    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    origins: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: per Kronos pair: forecast return at the horizon per (datetime, instrument), column ``score``
    signals: dict[str, pd.DataFrame] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per forecaster
    description: str = ""
    digest: str = ""
    reason: str = ""  # why nothing was scored
    sample: dict[str, Any] = field(default_factory=dict)  # what forecasts.png draws
    forecasts: pd.DataFrame = field(default_factory=pd.DataFrame)  # evaluation/forecasts.parquet
    horizon_mase: dict[str, list[float]] = field(default_factory=dict)  # per forecaster: MASE at steps 1..H
    #: the backtest signal's origins (backtest_signal_stride) and each pair's wall time on those
    #: the scorecard did not forecast; empty when the signal is the scorecard's origins' forecasts
    signal_description: str = ""
    signal_seconds: dict[str, float] = field(default_factory=dict)
    #: per forecaster: the PIT of every (origin, step) and (p_up, rose) per origin (pit.png, reliability.png)
    pit: dict[str, np.ndarray] = field(default_factory=dict)
    p_up: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    calibrator: Any = None  # the fitted :class:`~kronos_mlflow.evaluation.calibration.Calibrator`
    ensemble: Any = None  # the fitted :class:`~kronos_mlflow.serving.forecasting.ensemble.Ensemble`
    ensemble_losses: dict[str, float] = field(default_factory=dict)  # its members' validation WQL
    weather: Any = None  # coverage over test time (:class:`~kronos_mlflow.evaluation.weather.Weather`)

    def calibration_line(self) -> str:
        """Coverage, PIT KS and Brier before and after calibration ('' without it)."""
        m = self.metrics
        if f"{PREFIXES[CALIBRATED]}coverage_80" not in m:
            return ""

        def shown(prefix):
            return (f"coverage 50/80/90 {m.get(prefix + 'coverage_50', math.nan):.2f}/"
                    f"{m.get(prefix + 'coverage_80', math.nan):.2f}/{m.get(prefix + 'coverage_90', math.nan):.2f}, "
                    f"PIT KS {m.get(prefix + 'pit_ks', math.nan):.3f}, Brier {m.get(prefix + 'brier_up', math.nan):.3f}")
        name = "wql_skill_calibrated_vs_raw"
        return (f"calibration on {int(m.get('calibration_origins', 0)):,} validation origins: raw {shown('test_')}; "
                f"calibrated {shown(PREFIXES[CALIBRATED])}; {name} {m.get(name, math.nan):+.3f} (95% CI "
                f"{m.get(name + '_ci_low', math.nan):+.3f} .. {m.get(name + '_ci_high', math.nan):+.3f}): "
                f"{self.tags.get(CALIBRATION_TAG, 'unavailable')}")

    def line(self) -> str:
        if self.reason:
            return f"scorecard unavailable: {self.reason}"
        parts = [self.description]
        for base in BASELINES:
            name = f"skill_vs_{base}"
            if name in self.metrics:
                parts.append(f"{name} {self.metrics[name]:+.3f} (95% CI {self.metrics.get(name + '_ci_low', math.nan):+.3f}"
                             f" .. {self.metrics.get(name + '_ci_high', math.nan):+.3f})"
                             + (f": {self.tags[VERDICT_TAGS[base]]}" if base in VERDICT_TAGS and VERDICT_TAGS[base]
                                in self.tags else ""))
        return "scorecard: " + "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "tags": self.tags, "origins": self.description, "origins_digest": self.digest,
                "seconds": self.seconds, "reason": self.reason, "signal_origins": self.signal_description,
                "signal_seconds": self.signal_seconds}


def _paths_of(predictors: Mapping[str, Any], origins: Origins, config, *, rank, world_size, console, period):
    paths, seconds = {}, {}
    progress = console.progress if console is not None else None
    for name, predictor in predictors.items():
        if predictor is None:
            continue
        if console is not None:
            console.print(f"scorecard: {name}: forecasting {len(origins):,} origins")
        started = time.time()
        paths[name] = fc.kronos_paths(predictor, origins, config, rank=rank, world_size=world_size,
                                      progress=progress, desc=f"scorecard: {name}")
        seconds[name] = round(time.time() - started, 3)
    paths["persistence"] = fc.persistence_paths(origins)
    seasonal = fc.seasonal_naive_paths(origins, period)
    if seasonal is not None:
        paths["seasonal_naive"] = seasonal
    return paths, seconds


def _backtest_signals(config, predictors, origins: Origins, per, *, rank, world_size, console, head=None,
                      head_signal=None):
    """The Kronos pairs' backtest signals (forecast return at the horizon, by (datetime,
    instrument)), the signal origins' description, each pair's seconds on the origins forecast
    for the signal alone and their number. The signal
    covers :func:`~.origins.signal_origins` (every ``backtest_signal_stride``-th day, as upstream
    trades): a scorecard origin's forecast serves as is, the others are forecast for it (the
    return ``head``'s signal, ``head_signal`` on the scorecard's origins, is read on every one). The
    scorecard's own signals serve alone when the stride is 0 or no backtest will run (daily bars
    only, the benchmark's series, a top-k of under half of the symbols)."""
    own = {name: pd.DataFrame({"score": per[name]["forecast_return"]}, index=origins.index())
           for name in ("finetuned", "zeroshot") if name in per}
    if head_signal is not None:
        own[hs.HEAD] = pd.DataFrame({"score": head_signal}, index=origins.index())
    if not own or not int(as_section(config, "backtest").backtest_signal_stride) or skip_reason(config):
        return own, "", {}, 0
    daily = signal_origins(config)
    if not len(daily) or breadth_reason(config, len(np.unique(daily.series))):
        return own, "", {}, 0
    where = pd.Index(origins.rows).get_indexer(daily.rows)  # the scorecard's origin, or -1
    fresh = where < 0
    part = replace(daily, rows=daily.rows[fresh], series=daily.series[fresh], positions=daily.positions[fresh],
                   dates=daily.dates[fresh], candidates=int(fresh.sum()))
    last = part.history(np.arange(len(part)))[:, -1, CLOSE]
    progress = console.progress if console is not None else None
    signals, seconds = {}, {}
    for name in own:
        if name == hs.HEAD:  # one forward per origin: read on all of them
            signals[name] = pd.DataFrame({"score": hs.signals(predictors["finetuned"], head[0], daily, config, rank=rank,
                                                              world_size=world_size)}, index=daily.index())
            continue
        score = np.empty(len(daily), dtype=np.float64)
        score[~fresh] = per[name]["forecast_return"][where[~fresh]]
        if len(part):
            started = time.time()
            paths = fc.kronos_paths(predictors[name], part, config, rank=rank, world_size=world_size,
                                    progress=progress, desc=f"backtest signal: {name}")
            seconds[name] = round(time.time() - started, 3)
            with np.errstate(divide="ignore", invalid="ignore"):
                score[fresh] = paths.mean(axis=1)[:, -1] / last - 1.0
        signals[name] = pd.DataFrame({"score": score}, index=daily.index())
    return signals, f"{daily.describe()}, {len(part):,} forecast for it", seconds, len(part)


def _skills(per: Mapping[str, Mapping[str, np.ndarray]], min_change: float, groups=None) -> tuple[dict, dict]:
    metrics, tags = {}, {}
    for base in BASELINES:
        if base not in per or "finetuned" not in per:
            continue
        model, other = per["finetuned"], per[base]
        kinds = [("skill", sc.skill(model["mase"], other["mase"], groups), VERDICT_TAGS)]
        if base in VERDICT_TAGS:  # the probabilistic and fev's summaries, against the two that matter
            kinds += [("wql_skill", sc.skill(model["quantile_loss"], other["quantile_loss"], groups), WQL_VERDICT_TAGS),
                      ("gm_skill", sc.gm_skill(model["mase"], other["mase"], groups), {})]
            metrics[f"win_rate_vs_{base}"] = sc.win_rate(model["mase"], other["mase"])
        for kind, (value, low, high), verdicts in kinds:
            name = f"{kind}_vs_{base}"
            metrics.update({name: value, f"{name}_ci_low": low, f"{name}_ci_high": high})
            if base in verdicts:
                # decide() reads a change of the loss (negative = better): the skill's interval, negated
                tags[verdicts[base]] = decide(-high, -low, min_change)
    return metrics, tags


def forecasts_frame(origins: Origins, per: Mapping[str, Mapping[str, np.ndarray]], actual: np.ndarray) -> pd.DataFrame:
    """One row per (origin, forecaster, step): what ``evaluation/forecasts.parquet`` holds: the
    actual close, the mean, the median, the quantiles ``q0.05 .. q0.95``, the PIT of the actual
    close and the origin's ``p_up``."""
    n, horizon = actual.shape
    frames = []
    for name, scores in per.items():
        q = np.asarray(scores["levels"])  # (n, 13, H)
        frame = pd.DataFrame({
            "datetime": np.repeat(pd.DatetimeIndex(origins.dates), horizon), "instrument": np.repeat(origins.instruments, horizon),
            "forecaster": name, "step": np.tile(np.arange(1, horizon + 1), n), "actual": actual.reshape(-1),
            "mean": np.asarray(scores["mean"]).reshape(-1), "median": q[:, pr.MEDIAN].reshape(-1)})
        for i, column in enumerate(ALL_QUANTILE_COLUMNS):
            frame[column] = q[:, i].reshape(-1)
        frame["pit"] = np.asarray(scores["pit"]).reshape(-1)
        frame["p_up"] = np.repeat(np.asarray(scores["p_up"]), horizon)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _ic_intervals(per, dates) -> dict[str, float]:
    out = {}
    for name in ("finetuned", "zeroshot"):
        if name in per:
            daily = sc.daily_ic(dates, per[name]["forecast_return"], per[name]["actual_return"])
            low, high = sc.mean_interval(daily["ic"])
            out.update({f"{PREFIXES[name]}ic_ci_low": low, f"{PREFIXES[name]}ic_ci_high": high})
    return out


def score_forecasters(config: Mapping[str, Any], predictors: Mapping[str, Any], *, origins: Origins | None = None,
                      rank: int = 0, world_size: int = 1, console=None, calibrator=None,
                      reused: Mapping[str, Any] | None = None, ensemble=None, head=None, aci_state=None) -> Scorecard:
    """Score the Kronos pairs in ``predictors`` (``finetuned``, ``zeroshot``: a
    ``KronosPredictor`` or None) and the naive forecasters on the test origins of ``config``
    (a collective when ``world_size > 1``: every rank calls it); with ``calibration: on``, the
    calibrated forecaster too, through ``calibrator`` (the scored model's own) when it was fit
    before the test's first forecast bar, else through one fit here (on ``reused``'s paths of the
    calibration origins when it holds them: ``{origins digest: paths}``); ``head``: see :func:`.head_scores.score`."""
    origins = origins if origins is not None else forecast_origins(config)
    if not len(origins):
        return Scorecard(reason=no_origins_reason(origins, config))
    period = fc.bars_per_session(calendar_of_test_range(config)) if as_section(config, "data").freq != "day" else 1
    paths, seconds = _paths_of(predictors, origins, config, rank=rank, world_size=world_size, console=console,
                               period=period)
    every = np.arange(len(origins))
    history, actual = origins.history(every)[..., CLOSE], origins.future(every)[..., CLOSE]
    u = pr.uniforms(int(as_section(config, "job").seed), actual.shape)
    per = {name: sc.origin_scores(p, history, actual, u) for name, p in paths.items()}
    vol = pr.histvol(history, actual, u)
    if vol is not None:
        per["histvol"] = sc.distribution_scores(vol, history, actual)
    calibration, cal_seconds = _calibrate(config, predictors, origins, per, history, actual, u, rank=rank,
                                          world_size=world_size, console=console, calibrator=calibrator,
                                          reused=reused, ensemble=ensemble, aci_state=aci_state)
    if cal_seconds is not None:
        seconds["calibration"] = cal_seconds
    groups = origins.dates if as_section(config, "evaluation").bootstrap_unit == "date" else None
    steps = tuple(horizons(config))
    metrics: dict[str, float] = {}
    table = pd.DataFrame({"datetime": pd.DatetimeIndex(origins.dates), "instrument": origins.instruments,
                          "position": origins.positions, "last_close": history[:, -1],
                          "actual_return": per["persistence"]["actual_return"]})
    for name, scores in per.items():
        signal = name in SIGNALS or name == "seasonal_naive"
        kept = sc.summary(scores, origins.dates, direction=signal, horizons=steps)
        metrics.update({f"{PREFIXES[name]}{k}": v for k, v in kept.items()})
        for column in ("mase", "crps") + (("direction", "forecast_return") if signal else ()):
            table[f"{name}_{column}"] = scores[column]
    min_change = float(as_section(config, "verdict").verdict_min_change)
    skills, tags = _skills(per, min_change, groups)
    more, more_tags, weather = wx.measure(per, origins.dates, history, actual, PREFIXES)  # coverage in every weather
    metrics.update(more)
    tags.update(more_tags)
    metrics.update(skills)
    metrics.update(_brier_skills(per, calibration["base_rate"]))
    if calibration["calibrator"] is not None:
        value, low, high = sc.skill(per[CALIBRATED]["quantile_loss"], per["finetuned"]["quantile_loss"], groups)
        name = "wql_skill_calibrated_vs_raw"
        metrics.update({name: value, f"{name}_ci_low": low, f"{name}_ci_high": high,
                        "calibration_origins": float(calibration["calibrator"].origins)})
        tags[CALIBRATION_TAG] = decide(-high, -low, min_change)
    if calibration.get("ensemble") is not None:
        more, more_tags = en.record_metrics(calibration["ensemble"], per, groups, min_change, PREFIXES)
        metrics.update(more)
        metrics.update(calibration.get("ensemble_losses", {}))
        tags.update(more_tags)
    tags["calibration"] = calibration["status"]
    metrics.update(_ic_intervals(per, origins.dates))
    metrics.update(rank_ic_metrics(per, origins.dates, history[:, -1], actual, steps, PREFIXES, SIGNALS))
    metrics["direction_baseline"] = sc.direction_baseline(per["persistence"]["actual_return"])
    for name in ("finetuned", "zeroshot"):
        if name in per:
            low, high = sc.mean_interval(per[name]["direction"], groups)
            metrics.update({f"{PREFIXES[name]}direction_accuracy_ci_low": low,
                            f"{PREFIXES[name]}direction_accuracy_ci_high": high})
    metrics["eval_origins"] = float(len(origins))
    head_signal = hs.score(predictors.get("finetuned"), head, origins, config, metrics, table, seconds, rank=rank,
                           world_size=world_size)
    signals, signal_description, signal_seconds, n_forecast = _backtest_signals(
        config, predictors, origins, per, rank=rank, world_size=world_size, console=console, head=head,
        head_signal=head_signal)
    if signal_description:
        metrics["backtest_signal_origins"] = float(len(next(iter(signals.values()))))
        metrics["backtest_signal_forecasts"] = float(n_forecast)
    shown = every[np.linspace(0, len(origins) - 1, min(4, len(origins))).astype(int)]
    sample = {"history": history[shown], "actual": actual[shown], "labels": [
        f"{origins.instruments[i]} {str(origins.dates[i])[:16]}" for i in shown],
        "paths": {name: p[shown] for name, p in paths.items()}}
    step_means = {name: [float(v) for v in np.nanmean(scores["step_mase"], axis=0)] if np.isfinite(
        scores["step_mase"]).any() else [] for name, scores in per.items()}
    return Scorecard(metrics={k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}, tags=tags,
                     origins=table, signals=signals, seconds=seconds, description=origins.describe(),
                     digest=origins.digest, sample=sample, forecasts=forecasts_frame(origins, per, actual),
                     horizon_mase=step_means, signal_description=signal_description, signal_seconds=signal_seconds,
                     pit={name: scores["pit"] for name, scores in per.items()},
                     p_up={name: (scores["p_up"], scores["up"]) for name, scores in per.items()
                           if name not in ("persistence", "seasonal_naive")},
                     calibrator=calibration["calibrator"], ensemble=calibration.get("ensemble"),
                     ensemble_losses=calibration.get("ensemble_losses", {}), weather=weather)


def _calibrate(config, predictors, origins: Origins, per, history, actual, u, *, rank, world_size, console,
               calibrator=None, reused=None, ensemble=None, aci_state=None):
    """The calibration origins' base rate of a rise and, with ``calibration: on`` and a fine-tuned
    pair, the calibrator (``calibrator``, the served model's own, when given and fit on bars
    before the first test forecast bar; else fit here on the pair's forecasts of them) and the
    calibrated forecaster's scores in ``per`` (:mod:`~kronos_mlflow.evaluation.calibration`);
    the seconds the fit took (None when off or given). ``aci_state``: a dict whose ``from`` (an
    :class:`~kronos_mlflow.evaluation.aci.Start`) aci's levels start at, filled with where they
    started and ended (:func:`~kronos_mlflow.evaluation.aci.run`'s ``state``)."""
    out = {"base_rate": float("nan"), "calibrator": None, "status": "off"}
    cal_origins = cb.origins_for(config, origins)
    base = cb.base_rate(cal_origins)
    out["base_rate"] = base if base is not None else float("nan")
    if not cb.is_on(config) or predictors.get("finetuned") is None:
        return out, None
    seconds, keep = None, {}
    if calibrator is not None and cb.before(calibrator, origins):
        out["status"] = "model"
    else:
        line = cb.skipped(len(cal_origins), config)  # calibration auto with too few origins: go on without
        if line:
            if console is not None:
                console.print(line)
            out["status"] = "skipped"
            return out, None
        started = time.time()
        calibrator = fit_calibrator(predictors["finetuned"], cal_origins, config, rank=rank, world_size=world_size,
                                 console=console, keep=keep)
        ensemble, out["ensemble_losses"] = en.build_for(config, keep)
        seconds = round(time.time() - started, 3)
        out["status"] = "on"
    if ensemble is not None:
        per[en.ENSEMBLE] = sc.distribution_scores(en.forecast(ensemble, per["finetuned"], history, actual, u),
                                                  history, actual)
        out["ensemble"] = ensemble
    test_raw = {"levels": per["finetuned"]["levels"], "mean": per["finetuned"]["mean"], "p_up": per["finetuned"]["p_up"]}
    dist = cb.calibrated(calibrator, test_raw, history[:, -1], pr.histvol_sigma(history), actual, u)
    per[CALIBRATED] = sc.distribution_scores(dist, history, actual)
    adaptive = aci.scored_from(keep, ensemble, per["finetuned"], per[en.ENSEMBLE] if ensemble is not None
                               else per[CALIBRATED], history, actual, origins, float(as_section(config, "evaluation").aci_step),
                               u, start=(aci_state or {}).get("from"), state=aci_state)
    if adaptive is not None:
        per[aci.ACI] = sc.distribution_scores(adaptive, history, actual)
    out["calibrator"] = calibrator
    return out, seconds


def fit_calibrator(predictor, origins, config: Mapping[str, Any], *, rank: int = 0, world_size: int = 1,
                   console=None, paths: np.ndarray | None = None, keep: dict | None = None) -> cb.Calibrator:
    """A calibrator fit on a Kronos pair's forecasts of the calibration ``origins`` (sampled as
    the scorecard samples; a collective when ``world_size > 1``), or on ``paths`` already drawn
    for them."""
    cb.check_enough(len(origins), config)
    every = np.arange(len(origins))
    history, actual = origins.history(every)[..., pr.CLOSE], origins.future(every)[..., pr.CLOSE]
    if paths is None:
        progress = console.progress if console is not None else None
        paths = fc.kronos_paths(predictor, origins, config, rank=rank, world_size=world_size, progress=progress,
                                desc="calibration: finetuned")
    elif console is not None:
        console.print(f"calibration: the {len(origins):,} validation origins' paths objective val_skill drew with "
                      "the kept weights, reused")
    raw = pr.from_paths(paths, history[:, -1], actual, pr.uniforms(int(as_section(config, "job").seed), actual.shape))
    if keep is not None:  # what the ensemble is fit on (evaluation/ensemble.py)
        keep.update(raw={**raw, "mean": np.asarray(paths).mean(axis=1)}, history=history, actual=actual,
                    time_range=cb.time_range(origins))
    return cb.fit(raw["levels"], history[:, -1], pr.histvol_sigma(history), actual, raw["p_up"], cb.time_range(origins))



def _brier_skills(per, base_rate: float) -> dict[str, float]:
    """The constant base rate's Brier score on the test origins (``base_rate_up``,
    ``base_rate_test_brier_up``) and each forecaster's ``<prefix>brier_skill_up`` against it."""
    if not math.isfinite(base_rate):
        return {}
    up = per["persistence"]["up"]
    reference = pr.brier(np.full(len(up), base_rate), up)
    out = {"base_rate_up": base_rate, "base_rate_test_brier_up": reference}
    for name, scores in per.items():
        if name in ("persistence", "seasonal_naive") or not reference > 0:
            continue
        out[f"{PREFIXES[name]}brier_skill_up"] = 1.0 - pr.brier(scores["p_up"], scores["up"]) / reference
    return out


CALIBRATOR_NAME = "calibrator.json"


def write_artifacts(card: Scorecard, directory: Path) -> list[Path]:
    """``scorecard.json``, ``calibrator.json`` (when calibrated), ``scorecard.png``,
    ``forecasts.png``, ``horizons.png``, ``pit.png``, ``reliability.png``, ``origins.parquet``
    and ``forecasts.parquet`` in ``directory`` (each written whole, then renamed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = [directory / "scorecard.json"]
    write_atomic(out[0], json.dumps(card.as_json(), indent=2, sort_keys=True))
    if card.reason:
        return out
    if card.calibrator is not None:
        write_atomic(directory / CALIBRATOR_NAME, card.calibrator.dumps())
        out.append(directory / CALIBRATOR_NAME)
    if card.ensemble is not None:
        out += en.write_artifacts(card.ensemble, card.ensemble_losses, directory, card.description)
    if card.weather is not None:
        wx.coverage_figure(card.weather, card.description).savefig(directory / ".coverage.png.tmp", format="png",
                                                                   dpi=110)
        (directory / ".coverage.png.tmp").replace(directory / "coverage.png")
        out.append(directory / "coverage.png")
    for name, draw in (("scorecard.png", scorecard_figure), ("forecasts.png", forecasts_figure),
                       ("horizons.png", horizons_figure), ("pit.png", pit_figure),
                       ("reliability.png", reliability_figure)):
        tmp = directory / f".{name}.tmp"
        draw(card).savefig(tmp, format="png", dpi=110)
        tmp.replace(directory / name)
        out.append(directory / name)
    for name, frame in (("origins.parquet", card.origins), ("forecasts.parquet", card.forecasts)):
        tmp = directory / f".{name}.tmp"
        frame.to_parquet(tmp, index=False)
        tmp.replace(directory / name)
        out.append(directory / name)
    return out


def record(card: Scorecard, directory: Path, logger, step: int = 0, console=None, *, write: bool = True,
           config: Mapping[str, Any] | None = None) -> None:
    """Write the artifacts (``write``: rank 0 only) and log them with the metrics and tags
    (rank 0's logger; the others' is a no-op). With ``config``, rank 0 also backtests the Kronos
    pairs' signals with Qlib (:func:`add_backtest`)."""
    if write:
        if config is not None:
            add_backtest(card, config, directory, logger, console)
        for path in write_artifacts(card, directory):
            logger.log_artifact(str(path), "evaluation")
    logger.log_metrics(card.metrics, step=step)
    if card.tags:
        logger.set_tags(card.tags)
    if console is not None:
        console.print(card.line())
        if hs.line(card.metrics):
            console.print(hs.line(card.metrics))
        if card.calibration_line():
            console.print(card.calibration_line())
        for name, seconds in card.seconds.items():
            count = card.metrics.get("calibration_origins" if name == "calibration" else "eval_origins", 0)
            console.print(f"  {name}: {fc.describe_cost(seconds, int(count))}")
        if card.signal_description:
            n = int(card.metrics.get("backtest_signal_forecasts", 0))
            console.print(f"  backtest signal: {card.signal_description}" + "".join(
                f"; {name} {fc.describe_cost(seconds, n)}" for name, seconds in card.signal_seconds.items()))


#: The scorecard's signal names -> the backtest's (its metric names: backtest_fine_tuned_...).
BACKTEST_NAMES = {"finetuned": "fine-tuned", "zeroshot": "zero-shot", hs.HEAD: hs.BACKTEST_NAME}


def add_backtest(card: Scorecard, config: Mapping[str, Any], directory: Path, logger, console=None) -> None:
    """Qlib's TopkDropoutStrategy on the fine-tuned and zero-shot signals (docs/backtest.md):
    its metrics join the card's with the fine-tuned signal's controls and ``backtest_verdict``,
    ``backtest.png`` is logged under ``evaluation/``; a skipped backtest (intraday bars, no
    benchmark series, a top-k of half the universe) is one line and the tag ``backtest: skipped``."""
    signals = {BACKTEST_NAMES[name]: frame for name, frame in card.signals.items()
               if name in BACKTEST_NAMES and frame is not None and len(frame)}
    if card.reason or not signals:
        return
    started = time.time()
    result = backtest_signals(config, signals, directory, control="fine-tuned" if "fine-tuned" in signals else None,
                              say=console.print if console is not None else None)
    if result.skipped:
        card.tags["backtest"] = "skipped"
        if console is not None:
            console.print(result.skipped)
        return
    card.metrics.update({k: float(v) for k, v in result.metrics.items() if math.isfinite(float(v))})
    card.tags.update(result.tags)
    if result.plot is not None:
        logger.log_artifact(str(result.plot), "evaluation")
    if console is not None:
        m = result.metrics
        shown = ", ".join(f"{name} {m.get(f'backtest_{n}_excess_return_with_cost', float('nan')):+.1%}"
                          for name, n in (("fine-tuned", "fine_tuned"), ("zero-shot", "zero_shot"),
                                          (hs.BACKTEST_NAME, "fine_tuned_head")) if name in signals)
        if "backtest_negated_excess_return_with_cost" in m:
            shown += f", negated {m['backtest_negated_excess_return_with_cost']:+.1%}"
        if "backtest_random_excess_return_with_cost" in m:
            shown += (f", {int(as_section(config, 'backtest').backtest_n_random)} random signals "
                      f"{m['backtest_random_excess_return_with_cost']:+.1%} (5%..95% "
                      f"{m['backtest_random_excess_return_with_cost_p05']:+.1%} .. "
                      f"{m['backtest_random_excess_return_with_cost_p95']:+.1%}): {result.tags.get('backtest_verdict')}")
        console.print(f"backtest {result.time_range[0]}:{result.time_range[1]} against {result.benchmark}, annualised "
                      f"excess return with cost: {shown} ({time.time() - started:.1f}s)")
