"""The walk-forward aggregation on constructed folds: three test periods of random closes and
sample paths scored by ``scores.origin_scores`` and tabulated as the scorecard writes
``origins.parquet`` and ``forecasts.parquet``; the pooled skills against the formulas over every
origin, the fold counts against the fold tags, the verdict rule, disjoint folds, the summary
and its picture; the pooled coverage, PIT KS and calibrated-vs-raw skill against the same
numbers over every fold's scores; folds of older runs (deciles only) aggregating as before."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kronos_mlflow.evaluation import probabilistic as pr
from kronos_mlflow.evaluation import scores as sc
from kronos_mlflow.evaluation.scorecard import forecasts_frame
from kronos_mlflow.evaluation.verdict import decide
from kronos_mlflow.workflows.walkforward.aggregate import (
    FoldResult, fold_counts, fold_metrics, origin_wql, pooled, pooled_calibration, skill_figure, summarize,
    walkforward_verdict, write_summary,
)

LOOKBACK, HORIZON, SAMPLES, SYMBOLS, DATES = 16, 5, 8, 6, 12
MIN_CHANGE = 0.005
STARTS = ("2024-01-01", "2024-02-01", "2024-03-01")
CALIBRATED = "finetuned_calibrated"
#: what a fold of an older run lacks: the outer quantiles, the PIT, p_up, and these forecasters
NEW_COLUMNS = ["q0.05", "q0.25", "q0.75", "q0.95", "pit", "p_up"]
NEW_FORECASTERS = ("histvol", CALIBRATED)


def _fold(k: int, start: str, noise: dict[str, float], seed: int) -> tuple[FoldResult, dict]:
    """Fold ``k``: ``DATES`` business days from ``start`` x ``SYMBOLS`` symbols, the Kronos
    pairs' (and a ``finetuned_calibrated`` in ``noise``: its) paths the actual closes times noise
    of the given size, persistence the last close, the historical-volatility baseline; the run's
    skills and verdicts as the scorecard computes them (dates resampled)."""
    rng = np.random.default_rng(seed)
    days = pd.bdate_range(start, periods=DATES)
    dates = np.repeat(days.to_numpy(), SYMBOLS)
    symbols = np.tile([f"S{i}" for i in range(SYMBOLS)], DATES)
    n = len(dates)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, (n, LOOKBACK + HORIZON)), axis=1))
    history, actual = close[:, :LOOKBACK], close[:, LOOKBACK:]
    paths = {name: actual[:, None, :] * (1.0 + rng.normal(0.0, size, (n, SAMPLES, HORIZON)))
             for name, size in noise.items()}
    paths["persistence"] = np.repeat(history[:, -1:], HORIZON, axis=1)[:, None, :]
    per = {name: sc.origin_scores(p, history, actual) for name, p in paths.items()}
    per["histvol"] = sc.distribution_scores(pr.histvol(history, actual, pr.uniforms(seed, actual.shape)), history,
                                            actual)
    origins = pd.DataFrame({"datetime": pd.DatetimeIndex(dates), "instrument": symbols, "position": np.arange(n),
                            "last_close": history[:, -1], "actual_return": per["persistence"]["actual_return"]})
    for name, scores in per.items():
        for column in ("mase", "crps") + (("direction", "forecast_return") if name not in ("persistence", "histvol")
                                          else ()):
            origins[f"{name}_{column}"] = scores[column]
    forecasts = forecasts_frame(SimpleNamespace(dates=dates, instruments=symbols), per, actual)
    metrics, tags = {}, {}
    for base in [b for b in ("zeroshot", "persistence", "histvol") if b in per]:
        for kind, column, tag in (("skill", "mase", f"verdict_vs_{base}"),
                                  ("wql_skill", "quantile_loss", f"verdict_wql_vs_{base}")):
            value, low, high = sc.skill(per["finetuned"][column], per[base][column], dates)
            metrics.update({f"{kind}_vs_{base}": value, f"{kind}_vs_{base}_ci_low": low,
                            f"{kind}_vs_{base}_ci_high": high})
            tags[tag] = decide(-high, -low, MIN_CHANGE)
    if CALIBRATED in per:
        value, low, high = sc.skill(per[CALIBRATED]["quantile_loss"], per["finetuned"]["quantile_loss"], dates)
        metrics.update({"wql_skill_calibrated_vs_raw": value, "wql_skill_calibrated_vs_raw_ci_low": low,
                        "wql_skill_calibrated_vs_raw_ci_high": high})
        tags["verdict_calibrated_vs_raw"] = decide(-high, -low, MIN_CHANGE)
    period = (str(days[0].date()), str(days[-1].date()))
    return FoldResult(k, f"run{k}", period, metrics, tags, origins, forecasts), per


def _folds(noises) -> tuple[list[FoldResult], list[dict]]:
    built = [_fold(k, start, noise, seed=100 + k) for k, (start, noise) in enumerate(zip(STARTS, noises), start=1)]
    return [b[0] for b in built], [b[1] for b in built]


@pytest.fixture(scope="module")
def folds():
    """The fine-tuned pair clearly better than the zero-shot pair in folds 1 and 3, about even in
    2; the calibrated forecaster's paths half the fine-tuned pair's error."""
    return _folds([{"finetuned": 0.002, "zeroshot": 0.02, CALIBRATED: 0.001},
                   {"finetuned": 0.010, "zeroshot": 0.011, CALIBRATED: 0.005},
                   {"finetuned": 0.004, "zeroshot": 0.02, CALIBRATED: 0.002}])


def _old(r: FoldResult) -> FoldResult:
    """Fold ``r`` as an older run wrote it: the deciles only, no PIT, no calibrated or histvol
    forecaster, none of their metrics or tags."""
    def new(name: str) -> bool:
        return "histvol" in name or "calibrated" in name
    forecasts = r.forecasts[~r.forecasts["forecaster"].isin(NEW_FORECASTERS)].drop(columns=NEW_COLUMNS)
    origins = r.origins[[c for c in r.origins.columns if not new(c)]]
    return replace(r, origins=origins, forecasts=forecasts, metrics={k: v for k, v in r.metrics.items() if not new(k)},
                   tags={k: v for k, v in r.tags.items() if not new(k)})


def _all(per_folds: list[dict], name: str, column: str) -> np.ndarray:
    return np.concatenate([per[name][column] for per in per_folds])


def test_origin_wql_is_the_scorecards_quantile_loss(folds):
    results, per_folds = folds
    table = origin_wql(results[0].forecasts)
    for name, scores in per_folds[0].items():
        rows = table[table["forecaster"] == name].sort_values(["datetime", "instrument"])
        assert len(rows) == DATES * SYMBOLS
        np.testing.assert_allclose(rows["quantile_loss"].to_numpy(), scores["quantile_loss"], rtol=1e-12)
        np.testing.assert_allclose(rows["abs_actual"].to_numpy(), scores["abs_actual"], rtol=1e-12)


def test_origin_wql_marks_an_origin_with_a_missing_step():
    frame = pd.DataFrame({"datetime": pd.to_datetime(["2024-01-02"] * 2), "instrument": "S0", "forecaster": "finetuned",
                          "step": [1, 2], "actual": [1.0, np.nan], "mean": 1.0, "median": 1.0,
                          **{f"q{0.1 * i:.1f}": 1.0 for i in range(1, 10)}})
    assert math.isnan(origin_wql(frame)["quantile_loss"].iloc[0])


def test_pooled_skills_are_the_ratios_over_every_origin(folds):
    results, per_folds = folds
    metrics, tags = pooled(results, MIN_CHANGE)
    assert metrics["pooled_origins"] == 3 * DATES * SYMBOLS and metrics["folds"] == 3
    model_mase, model_loss = _all(per_folds, "finetuned", "mase"), _all(per_folds, "finetuned", "quantile_loss")
    for base in ("zeroshot", "persistence"):
        mase = 1.0 - model_mase.mean() / _all(per_folds, base, "mase").mean()
        wql = 1.0 - model_loss.sum() / _all(per_folds, base, "quantile_loss").sum()
        for name, expected, tag in ((f"pooled_skill_vs_{base}", mase, f"pooled_verdict_vs_{base}"),
                                    (f"pooled_wql_skill_vs_{base}", wql, f"pooled_verdict_wql_vs_{base}")):
            assert metrics[name] == pytest.approx(expected, rel=1e-9)
            assert metrics[f"{name}_ci_low"] <= metrics[name] <= metrics[f"{name}_ci_high"]
            assert tags[tag] == decide(-metrics[f"{name}_ci_high"], -metrics[f"{name}_ci_low"], MIN_CHANGE)
    assert tags["pooled_verdict_vs_zeroshot"] == "better"


def test_pooled_resamples_dates_or_origins(folds):
    results, _ = folds
    by_date, _ = pooled(results, MIN_CHANGE, bootstrap_unit="date")
    by_origin, _ = pooled(results, MIN_CHANGE, bootstrap_unit="origin")
    assert by_date["pooled_skill_vs_zeroshot"] == pytest.approx(by_origin["pooled_skill_vs_zeroshot"])
    assert by_date["pooled_skill_vs_zeroshot_ci_low"] != by_origin["pooled_skill_vs_zeroshot_ci_low"]
    with pytest.raises(ValueError, match="bootstrap_unit"):
        pooled(results, MIN_CHANGE, bootstrap_unit="week")


def test_fold_counts_read_the_fold_tags_and_skills(folds):
    results, _ = folds
    counts = fold_counts(results)
    for base in ("zeroshot", "persistence"):
        verdicts = [r.tags[f"verdict_vs_{base}"] for r in results]
        assert counts[f"folds_better_vs_{base}"] == verdicts.count("better")
        assert counts[f"folds_worse_vs_{base}"] == verdicts.count("worse")
    constructed = [replace(results[0], metrics={"skill_vs_zeroshot": 0.2}, tags={"verdict_vs_zeroshot": "better"}),
                   replace(results[1], metrics={"skill_vs_zeroshot": -0.1}, tags={"verdict_vs_zeroshot": "worse"}),
                   replace(results[2], metrics={}, tags={})]
    counts = fold_counts(constructed)
    assert counts["folds_better_vs_zeroshot"] == 1 and counts["folds_worse_vs_zeroshot"] == 1
    assert counts["win_rate_vs_zeroshot"] == 0.5  # the fold without the metric is not counted
    assert math.isnan(counts["win_rate_vs_persistence"])


def test_fold_metrics_name_each_fold_and_step_over_folds(folds):
    results, _ = folds
    steps = fold_metrics(results)
    named = {name: (value, step) for name, value, step in steps if step is None}
    for r in results:
        for name in ("skill_vs_zeroshot", "skill_vs_persistence", "wql_skill_vs_zeroshot", "wql_skill_vs_persistence"):
            for suffix in ("", "_ci_low", "_ci_high"):
                assert named[f"fold{r.fold}_{name}{suffix}"] == (r.metrics[name + suffix], None)
    series = [(value, step) for name, value, step in steps if name == "fold_skill_vs_zeroshot"]
    assert series == [(r.metrics["skill_vs_zeroshot"], r.fold) for r in results]


@pytest.mark.parametrize("pooled_verdict, fold_verdicts, expected", [
    ("better", ["better", "inconclusive", "better"], "better"),
    ("better", ["better", "worse", "better"], "inconclusive"),
    ("worse", ["better", "worse", "worse"], "worse"),
    ("inconclusive", ["better", "better", "better"], "inconclusive"),
])
def test_walkforward_verdict_rule(pooled_verdict, fold_verdicts, expected):
    assert walkforward_verdict(pooled_verdict, fold_verdicts) == expected


def test_one_worse_fold_blocks_better(folds):
    results, _ = folds
    summary = summarize(results, MIN_CHANGE)
    assert summary["tags"]["pooled_verdict_vs_zeroshot"] == "better"
    blocked = [replace(r, tags={**r.tags, "verdict_vs_zeroshot": "worse"}) if r.fold == 2 else r for r in results]
    tags = summarize(blocked, MIN_CHANGE)["tags"]
    assert tags["pooled_verdict_vs_zeroshot"] == "better"
    assert tags["walkforward_verdict_vs_zeroshot"] == "inconclusive"
    assert "better" in tags["walkforward_verdict_why"] and "fold 2 says worse" in tags["walkforward_verdict_why"]
    assert tags["fold2_verdict_vs_zeroshot"] == "worse" and tags["fold1_verdict_vs_zeroshot"] == results[0].tags[
        "verdict_vs_zeroshot"]


def test_pooled_worse_or_inconclusive_carries_over():
    results, _ = _folds([{"finetuned": 0.03, "zeroshot": 0.003}] * 3)
    tags = summarize(results, MIN_CHANGE)["tags"]
    assert tags["pooled_verdict_vs_zeroshot"] == "worse" and tags["walkforward_verdict_vs_zeroshot"] == "worse"
    assert tags["walkforward_verdict_wql_vs_zeroshot"] == "worse"
    even, _ = _folds([{"finetuned": 0.01, "zeroshot": 0.01}] * 3)
    wide = summarize(even, 0.5)["tags"]  # two pairs of the same error: no interval clears a 50% change
    assert wide["pooled_verdict_vs_zeroshot"] == "inconclusive"
    assert wide["walkforward_verdict_vs_zeroshot"] == "inconclusive"
    assert wide["walkforward_verdict_why"].startswith("vs zeroshot: pooled interval inconclusive")


def test_folds_without_the_zeroshot_pair(folds):
    results, _ = folds
    alone = [replace(r, origins=r.origins.drop(columns=[c for c in r.origins.columns if c.startswith("zeroshot_")]),
                     forecasts=r.forecasts[r.forecasts["forecaster"] != "zeroshot"],
                     metrics={k: v for k, v in r.metrics.items() if "zeroshot" not in k},
                     tags={k: v for k, v in r.tags.items() if "zeroshot" not in k}) for r in results]
    summary = summarize(alone, MIN_CHANGE)
    assert not [k for k in list(summary["metrics"]) + list(summary["tags"]) if "zeroshot" in k and "pooled" in k]
    assert "walkforward_verdict_vs_persistence" in summary["tags"]
    assert summary["tags"]["walkforward_verdict_why"].startswith("vs persistence")


def test_overlapping_or_missing_folds_are_refused(folds):
    results, _ = folds
    shifted = results[1].origins.assign(datetime=results[1].origins["datetime"] - pd.Timedelta(days=20))
    with pytest.raises(ValueError, match="folds 1 and 2 overlap"):
        summarize([results[0], replace(results[1], origins=shifted), results[2]], MIN_CHANGE)
    with pytest.raises(ValueError, match="overlap"):
        pooled([results[0], replace(results[0], fold=2, run_id="again")], MIN_CHANGE)
    with pytest.raises(ValueError, match="repeat"):
        pooled([results[0], replace(results[1], fold=1)], MIN_CHANGE)
    with pytest.raises(ValueError, match="no folds"):
        summarize([], MIN_CHANGE)


def test_summary_json_and_figure(folds, tmp_path):
    results, _ = folds
    summary = summarize(results, MIN_CHANGE)
    path = write_summary(summary, tmp_path / "walkforward")
    written = json.loads(path.read_text(encoding="utf-8"))
    assert [f["fold"] for f in written["folds"]] == [1, 2, 3]
    assert written["folds"][0]["run_id"] == "run1" and written["folds"][0]["test_period"] == list(results[0].test_period)
    assert written["folds"][1]["verdict_vs_zeroshot"] == results[1].tags["verdict_vs_zeroshot"]
    assert written["metrics"]["pooled_skill_vs_zeroshot"] == pytest.approx(summary["metrics"]["pooled_skill_vs_zeroshot"])
    assert {"walkforward_verdict_vs_zeroshot", "walkforward_verdict_vs_persistence", "walkforward_verdict_wql_vs_zeroshot",
            "walkforward_verdict_wql_vs_persistence", "walkforward_verdict_why"} <= set(written["tags"])
    assert len(written["steps"]) == len(summary["steps"])
    summary["metrics"]["win_rate_vs_zeroshot"] = float("nan")
    assert json.loads(write_summary(summary, tmp_path).read_text())["metrics"]["win_rate_vs_zeroshot"] is None
    png = skill_figure(summary, tmp_path / "skill_by_fold.png")
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a panel each for zeroshot, persistence, histvol and the calibrated skill: twice the two-panel height
    two = skill_figure(summarize([_old(r) for r in results], MIN_CHANGE), tmp_path / "two.png")
    assert _png_height(png) > 1.8 * _png_height(two)


def _png_height(path) -> int:
    return int.from_bytes(path.read_bytes()[20:24], "big")  # the IHDR chunk's height


def _table(forecaster: str, actual: list[float], pit: list[float]) -> pd.DataFrame:
    """Rows of one forecaster whose every quantile is ``100 + 10 (level - 0.5)``: the 50% interval
    97.5..102.5, the 80% one 96..104, the 90% one 95.5..104.5."""
    n = len(actual)
    frame = pd.DataFrame({"datetime": pd.bdate_range("2024-01-01", periods=n), "instrument": "S0",
                          "forecaster": forecaster, "step": 1, "actual": actual})
    for level, column in zip(pr.QLEVELS, pr.QUANTILE_COLUMNS):
        frame[column] = 100.0 + 10.0 * (level - 0.5)
    frame["pit"], frame["p_up"] = pit, np.nan
    return frame


def test_pooled_coverage_and_pit_ks_of_constructed_tables():
    first = pd.concat([_table("finetuned", [100.0, 97.0, 95.0, 110.0], [0.1, 0.5, 0.9, 0.3]),
                       _table("persistence", [100.0], [np.nan])], ignore_index=True)
    second = _table("finetuned", [103.0, 104.5, np.nan], [0.7, 0.2, np.nan])
    results = [FoldResult(1, "a", ("", ""), forecasts=first), FoldResult(2, "b", ("", ""), forecasts=second)]
    # inside 50%: 100 | none; 80%: 100, 97 | 103; 90%: 100, 97 | 103, 104.5; of 4 + 2 rows (NaN left out)
    # PIT sorted 0.1 0.2 0.3 0.5 0.7 0.9: KS = max(i/6 - u_i, u_i - (i-1)/6) = 3/6 - 0.3
    assert pooled_calibration(results) == pytest.approx({"pooled_test_coverage_50": 1 / 6,
                                                         "pooled_test_coverage_80": 3 / 6,
                                                         "pooled_test_coverage_90": 4 / 6,
                                                         "pooled_test_pit_ks": 0.2})
    # a fold of an older run (deciles, no PIT): only the 80% interval's coverage is pooled
    older = replace(results[0], forecasts=first.drop(columns=NEW_COLUMNS))
    assert pooled_calibration([older, results[1]]) == pytest.approx({"pooled_test_coverage_80": 3 / 6})


def test_pooled_coverage_and_pit_ks_over_every_folds_forecasts(folds):
    results, per_folds = folds
    metrics, _ = pooled(results, MIN_CHANGE)
    for name, prefix in (("finetuned", "test_"), (CALIBRATED, "calibrated_test_"), ("histvol", "histvol_test_"),
                         ("zeroshot", "zeroshot_test_")):
        for nominal in (50, 80, 90):
            inside = np.concatenate([per[name][f"coverage_steps_{nominal}"].reshape(-1) for per in per_folds])
            assert metrics[f"pooled_{prefix}coverage_{nominal}"] == pytest.approx(inside.mean(), rel=1e-12)
        pit = np.sort(np.concatenate([per[name]["pit"].reshape(-1) for per in per_folds]))
        i = np.arange(1, len(pit) + 1)
        ks = max((i / len(pit) - pit).max(), (pit - (i - 1) / len(pit)).max())
        assert metrics[f"pooled_{prefix}pit_ks"] == pytest.approx(ks, rel=1e-12)
    assert not [k for k in metrics if "persistence_test_" in k]


def test_pooled_calibrated_skill_and_verdict(folds):
    results, per_folds = folds
    summary = summarize(results, MIN_CHANGE)
    metrics, tags = summary["metrics"], summary["tags"]
    name = "pooled_wql_skill_calibrated_vs_raw"
    dates = np.concatenate([r.origins["datetime"].to_numpy() for r in results])
    calibrated, raw = _all(per_folds, CALIBRATED, "quantile_loss"), _all(per_folds, "finetuned", "quantile_loss")
    expected = sc.skill(calibrated, raw, dates)  # whole dates resampled, as the scorecard does
    assert (metrics[name], metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"]) == pytest.approx(expected, rel=1e-9)
    assert metrics[name] == pytest.approx(1.0 - calibrated.sum() / raw.sum(), rel=1e-9)
    assert tags["pooled_verdict_calibrated_vs_raw"] == decide(-expected[2], -expected[1], MIN_CHANGE) == "better"
    steps = [(value, step) for key, value, step in summary["steps"] if key == "fold_wql_skill_calibrated_vs_raw"]
    assert steps == [(r.metrics["wql_skill_calibrated_vs_raw"], r.fold) for r in results]
    for r, entry in zip(results, summary["folds"]):
        assert tags[f"fold{r.fold}_verdict_calibrated_vs_raw"] == r.tags["verdict_calibrated_vs_raw"]
        assert entry["verdict_calibrated_vs_raw"] == r.tags["verdict_calibrated_vs_raw"]
        for suffix in ("", "_ci_low", "_ci_high"):
            assert entry[f"wql_skill_calibrated_vs_raw{suffix}"] == r.metrics[f"wql_skill_calibrated_vs_raw{suffix}"]
    worse, _ = _folds([{"finetuned": 0.002, "zeroshot": 0.02, CALIBRATED: 0.02}] * 3)
    assert pooled(worse, MIN_CHANGE)[1]["pooled_verdict_calibrated_vs_raw"] == "worse"


def test_histvol_is_a_pooled_base_beside_the_verdicts(folds):
    results, per_folds = folds
    summary = summarize(results, MIN_CHANGE)
    metrics, tags = summary["metrics"], summary["tags"]
    assert metrics["pooled_skill_vs_histvol"] == pytest.approx(
        1.0 - _all(per_folds, "finetuned", "mase").mean() / _all(per_folds, "histvol", "mase").mean(), rel=1e-9)
    assert metrics["pooled_wql_skill_vs_histvol"] == pytest.approx(
        1.0 - _all(per_folds, "finetuned", "quantile_loss").sum() / _all(per_folds, "histvol", "quantile_loss").sum(),
        rel=1e-9)
    for kind in ("", "wql_"):
        low, high = metrics[f"pooled_{kind}skill_vs_histvol_ci_low"], metrics[f"pooled_{kind}skill_vs_histvol_ci_high"]
        assert tags[f"pooled_verdict_{kind}vs_histvol"] == decide(-high, -low, MIN_CHANGE)
        assert f"walkforward_verdict_{kind}vs_histvol" in tags
    verdicts = [r.tags["verdict_vs_histvol"] for r in results]
    assert metrics["folds_better_vs_histvol"] == verdicts.count("better")
    assert tags["fold1_verdict_vs_histvol"] == verdicts[0]
    assert tags["walkforward_verdict_why"].startswith("vs zeroshot")


def test_folds_of_older_runs_aggregate_as_before(folds, tmp_path):
    results, per_folds = folds
    new, old = summarize(results, MIN_CHANGE), summarize([_old(r) for r in results], MIN_CHANGE)
    names = list(old["metrics"]) + list(old["tags"]) + [name for name, _, _ in old["steps"]]
    assert not [k for k in names if any(w in k for w in ("histvol", "calibrated", "pit_ks", "coverage_50",
                                                         "coverage_90"))]
    # the one number an older table's deciles give: the 80% interval's coverage (persistence's too, from the
    # forecasters' table)
    assert {k for k in old["metrics"] if "coverage" in k} == {"pooled_test_coverage_80",
                                                              "pooled_zeroshot_test_coverage_80",
                                                              "pooled_persistence_test_coverage_80"}
    assert old["metrics"] == pytest.approx({k: new["metrics"][k] for k in old["metrics"]}, nan_ok=True)
    assert old["tags"] == {k: new["tags"][k] for k in old["tags"]}
    skills = [f"{kind}_vs_{base}{suffix}" for kind in ("skill", "wql_skill") for base in ("zeroshot", "persistence")
              for suffix in ("", "_ci_low", "_ci_high")]
    verdicts = [f"verdict_{kind}vs_{base}" for kind in ("", "wql_") for base in ("zeroshot", "persistence")]
    assert all(set(entry) == {"fold", "run_id", "test_period", "origins", *skills, *verdicts} for entry in old["folds"])
    # one older fold among newer ones: what it lacks is pooled over none, the calibrated skill over the others
    mixed_metrics, _ = pooled([_old(results[0])] + results[1:], MIN_CHANGE)
    assert "pooled_test_coverage_50" not in mixed_metrics and "pooled_test_pit_ks" not in mixed_metrics
    assert "pooled_calibrated_test_coverage_50" in mixed_metrics
    dates = np.concatenate([r.origins["datetime"].to_numpy() for r in results[1:]])
    expected = sc.skill(np.concatenate([per[CALIBRATED]["quantile_loss"] for per in per_folds[1:]]),
                        np.concatenate([per["finetuned"]["quantile_loss"] for per in per_folds[1:]]), dates)
    assert mixed_metrics["pooled_wql_skill_calibrated_vs_raw"] == pytest.approx(expected[0], rel=1e-9)
    png = skill_figure(old, tmp_path / "old.png")
    assert png.stat().st_size > 1000


def test_the_forecasters_table_pools_every_fold(folds, tmp_path):
    """``walkforward/forecasters.*``: per forecaster, its WQL, coverage, PIT KS and 80% coverage by
    volatility tercile (histvol's sigma, terciles over every fold's origins) recomputed from every
    fold's scores; logged as ``pooled_<prefix>wql_close`` and ``pooled_<prefix>coverage_80_vol<k>``."""
    from kronos_mlflow.workflows.walkforward import table as ft

    results, per_folds = folds
    summary = summarize(results, MIN_CHANGE)
    rows = {r["forecaster"]: r for r in summary["forecasters"]}
    assert list(rows) == ["finetuned (raw)", CALIBRATED, "histvol", "persistence", "zeroshot"]
    # the tercile: histvol's q0.9 over its median at step 1 grows with its sigma
    spread = np.concatenate([per["histvol"]["levels"][:, 11, 0] / per["histvol"]["levels"][:, 6, 0]
                             for per in per_folds])
    low, high = np.quantile(spread, [1 / 3, 2 / 3])
    tercile = 1 + (spread > low).astype(int) + (spread > high).astype(int)
    for name, label, prefix in (("finetuned", "finetuned (raw)", "test_"), (CALIBRATED, CALIBRATED, "calibrated_test_"),
                                ("histvol", "histvol", "histvol_test_"), ("persistence", "persistence",
                                                                          "persistence_test_")):
        row = rows[label]
        assert row["folds"] == 3 and row["origins"] == 3 * DATES * SYMBOLS
        wql = _all(per_folds, name, "quantile_loss").sum() / _all(per_folds, name, "abs_actual").sum()
        assert row["wql"] == pytest.approx(wql, rel=1e-9)
        assert summary["metrics"][f"pooled_{prefix}wql_close"] == pytest.approx(wql, rel=1e-9)
        for nominal in (50, 80, 90):
            inside = _all(per_folds, name, f"coverage_steps_{nominal}")
            assert row[f"coverage_{nominal}"] == pytest.approx(inside.mean(), rel=1e-12)
        inside = _all(per_folds, name, "coverage_steps_80")
        for k in (1, 2, 3):
            assert row[f"coverage_80_vol{k}"] == pytest.approx(inside[tercile == k].mean(), rel=1e-12)
            assert summary["metrics"][f"pooled_{prefix}coverage_80_vol{k}"] == row[f"coverage_80_vol{k}"]
    assert rows[CALIBRATED]["pit_ks"] == pytest.approx(summary["metrics"]["pooled_calibrated_test_pit_ks"])
    csv, js, md = ft.write(summary["forecasters"], tmp_path)
    assert pd.read_csv(csv)["wql"].tolist() == pytest.approx([r["wql"] for r in summary["forecasters"]])
    assert json.loads(js.read_text()) == summary["forecasters"]
    lines = md.read_text().splitlines()
    assert lines[0].startswith("| forecaster | folds | origins | WQL | coverage 50/80/90 | PIT KS") and len(lines) == 7
    assert json.loads(write_summary(summary, tmp_path / "s").read_text())["forecasters"] == summary["forecasters"]
    # folds of older runs (deciles, no PIT): the table says n/a where a column is missing
    older = summarize([_old(r) for r in results], MIN_CHANGE)["forecasters"]
    assert {r["forecaster"] for r in older} == {"finetuned (raw)", "persistence", "zeroshot"}
    assert all(r["pit_ks"] is None and r["coverage_50"] is None and r["coverage_80_vol1"] is None for r in older)
