"""The rank IC as evidence (evaluation/ic_stats.py) and ``objective: val_ic``'s scoring
(evaluation/val_ic.py): the Newey-West t, the per-step rank IC, the validation metrics."""

import math

import numpy as np
import pytest

from kronos_mlflow.evaluation import ic_stats
from kronos_mlflow.evaluation.val_ic import VAL_IC_METRIC, line, score_paths


def test_newey_west_t_at_lag_0_is_the_plain_t_and_shrinks_on_autocorrelated_values():
    rng = np.random.default_rng(0)
    v = rng.normal(0.05, 0.2, 400)
    plain = v.mean() / (v.std() / math.sqrt(v.size))  # population std, as lag 0's variance
    assert ic_stats.newey_west_t(v, 0) == pytest.approx(plain)
    smooth = np.convolve(rng.normal(0.05, 0.2, 420), np.ones(20) / 20, mode="valid")[:400]  # overlapping sums
    assert abs(ic_stats.newey_west_t(smooth, 19)) < abs(ic_stats.newey_west_t(smooth, 0)) / 2
    assert math.isnan(ic_stats.newey_west_t([0.1], 3)) and math.isnan(ic_stats.newey_west_t([0.1, 0.1], 1))
    assert ic_stats.newey_west_t(v, 10_000) == ic_stats.newey_west_t(v, v.size - 1)  # the lag is clipped
    assert ic_stats.nw_lag(10) == 9 and ic_stats.nw_lag(1) == 0


def _market(n_dates=60, n_symbols=12, horizon=3, skill=1.0, seed=1):
    """Paths whose mean ranks the next returns with ``skill`` (1: perfectly, -1: backwards)."""
    rng = np.random.default_rng(seed)
    n = n_dates * n_symbols
    dates = np.repeat(np.arange("2020-01-01", n_dates, dtype="datetime64[D]"), n_symbols)
    history = 10.0 + rng.normal(0, 0.1, (n, 8))
    last = history[:, -1]
    moves = rng.normal(0, 0.02, (n, horizon)).cumsum(axis=1)
    actual = last[:, None] * (1 + moves)
    noisy = skill * moves + rng.normal(0, 0.015, (n, horizon))  # a rank IC of about 0.7 x skill
    paths = np.repeat((last[:, None] * (1 + noisy))[:, None, :], 4, axis=1) + rng.normal(0, 1e-4, (n, 4, horizon))
    return dates, history, actual, paths


def test_val_ic_scores_the_paths_mean_rank_ic_with_interval_and_t():
    dates, history, actual, paths = _market()
    good = score_paths(paths, history, actual, dates)
    assert good[VAL_IC_METRIC] > 0.6 and good["val_rank_ic_ci_low"] > 0.5 and good["val_rank_ic_nw_t"] > 10
    assert good["val_ic_dates"] == 60
    bad = score_paths(_market(skill=-1.0)[3], history, actual, dates)
    assert bad[VAL_IC_METRIC] < -0.6
    assert line(good).startswith(f"{VAL_IC_METRIC} +0.") and "NW t" in line(good) and line({}) == ""


def test_the_scorecards_per_step_rank_ic_and_nw_t():
    dates, history, actual, paths = _market(horizon=3)
    from kronos_mlflow.evaluation import scores as sc

    per = {"finetuned": sc.origin_scores(paths, history, actual)}
    out = ic_stats.rank_ic_metrics(per, dates, history[:, -1], actual, (1, 3), {"finetuned": "test_"},
                                   ("finetuned", "zeroshot"))
    assert set(out) == {"test_rank_ic_nw_t", "test_rank_ic_h1", "test_rank_ic_h3"}
    assert out["test_rank_ic_h3"] > 0.6 and out["test_rank_ic_h1"] > 0.5 and out["test_rank_ic_nw_t"] > 10


def test_a_run_on_val_ic_trains_the_same_and_records_each_epochs_rank_ic(tiny, tmp_path):
    """Same losses as ``val_loss``; ``val_rank_ic`` per epoch (interval, NW t) read by the pruner;
    ``best_val_ic`` the best epoch's, equal to the saved checkpoint's rank IC recomputed here."""
    import torch
    from recording import Recorder
    from test_val_skill import _predictor_checkpoint, _tokenizer

    from kronos_mlflow.config.layout import RunLayout
    from kronos_mlflow.evaluation.forecasters import kronos_paths
    from kronos_mlflow.evaluation.origins import CLOSE, forecast_origins
    from kronos_mlflow.evaluation.val_ic import epoch_hooks
    from kronos_mlflow.model import Kronos, KronosPredictor, KronosTokenizer
    from kronos_mlflow.runtime.console import Console
    from kronos_mlflow.stages.tokenizer.training import TokenizerStage
    from kronos_mlflow.training import loop as trainer

    predictor = _predictor_checkpoint(tmp_path / "predictor")
    base = tiny(compile="off", epochs=2, n_val_skill_windows=100, pretrained_predictor_path=str(predictor))
    runs = {}
    for objective in ("val_loss", "val_ic"):
        config = {**base, "objective": objective, "save_path": str(tmp_path / objective)}
        logger, seen, stage = Recorder(), [], TokenizerStage()
        hooks = epoch_hooks(config, stage, torch.device("cpu"), rank=0, world_size=1)
        assert len(hooks) == (objective == "val_ic")
        result = trainer.fit(_tokenizer(config), torch.device("cpu"), config, logger,
                             trainer.RunFiles(RunLayout.of(config)), Console(False),
                             should_stop=lambda epoch, value: seen.append((epoch, value)) and False, stage=stage,
                             hooks=hooks)
        runs[objective] = (config, logger, result, seen)
    (_, plain_log, plain, _), (config, log, result, seen) = runs["val_loss"], runs["val_ic"]
    assert result["val_loss_history"] == plain["val_loss_history"]  # training drew the same numbers
    assert log.history("train_tokenizer_loss_batch") == plain_log.history("train_tokenizer_loss_batch")
    ics = log.history(VAL_IC_METRIC)
    assert [s for s, _ in ics] == [0, 1] and seen == ics
    dates = dict(log.history("val_ic_dates"))
    assert sorted(dates) == [0, 1]
    for name in ("val_rank_ic_ci_low", "val_rank_ic_ci_high", "val_rank_ic_nw_t"):  # defined from 2 dates on
        assert [s for s, _ in log.history(name)] == [s for s, n in dates.items() if n >= 2], (name, dates)
    best = result["best_epoch"]
    assert result["best_val_ic"] == dict(ics)[best] and log.history("best_val_ic") == [(best, result["best_val_ic"])]
    origins = forecast_origins(config, "val")
    every = np.arange(len(origins))
    pair = KronosPredictor(Kronos.from_pretrained(str(predictor)),
                           KronosTokenizer.from_pretrained(RunLayout.of(config).best_model), device="cpu",
                           max_context=config["max_context"], clip=config["clip"])
    again = score_paths(kronos_paths(pair, origins, config), origins.history(every)[..., CLOSE],
                        origins.future(every)[..., CLOSE], origins.dates)
    assert result["best_val_ic"] == pytest.approx(again[VAL_IC_METRIC], abs=1e-9)
