"""``objective: val_ic``: each epoch's weights scored by the mean per-date rank IC of their
forecast return (the sampled paths' mean at the horizon over the origin's close, the
scorecard's signal) against the actual return, on the validation split's origins
(``val_rank_ic`` with its bootstrap interval and Newey-West t, ``best_val_ic``); the epochs and
sweep trials are ranked by it, highest first. It forecasts in a forked random state, as
``objective: val_skill`` does, so training draws exactly what it draws with ``val_loss``
(docs/objectives.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .ic_stats import rank_ic_summary
from .val_skill import ValSkill, epoch_hooks as skill_hooks

VAL_IC_METRIC = "val_rank_ic"
BEST_VAL_IC = "best_val_ic"
HISTORY_KEY = "val_ic_history"  # in a training state's extra


def epoch_hooks(config: Mapping[str, Any], stage, device, *, rank: int, world_size: int, console=None) -> list:
    """What :func:`kronos_mlflow.training.loop.fit` runs after each epoch for ``config``: the
    rank-IC scorer with ``objective: val_ic``, else :func:`~.val_skill.epoch_hooks`' (the skill
    scorer with ``val_skill``, nothing with ``val_loss``)."""
    if config.get("objective") == "val_ic":
        return [ValIC(config, stage, device, rank=rank, world_size=world_size, console=console)]
    return skill_hooks(config, stage, device, rank=rank, world_size=world_size, console=console)


class ValIC(ValSkill):
    """The per-epoch rank-IC scorer (an epoch hook of the loop, a collective like
    :class:`~kronos_mlflow.evaluation.val_skill.ValSkill`, whose origins and forecasts it shares);
    ``skills``: each scored epoch's ``val_rank_ic``."""

    metric, best, history_key, name = VAL_IC_METRIC, BEST_VAL_IC, HISTORY_KEY, "val_ic"

    def score(self, raw_model) -> dict[str, float]:
        """``val_rank_ic`` (with ``_ci_low`` / ``_ci_high``, ``_nw_t``) and ``val_ic_dates``."""
        return score_paths(self.forecast(raw_model), self.history, self.actual, self.origins.dates)

    @staticmethod
    def line(metrics: Mapping[str, float]) -> str:
        return line(metrics)


def score_paths(paths: np.ndarray, history_close: np.ndarray, actual_close: np.ndarray, dates) -> dict[str, float]:
    """The validation rank-IC metrics of sample ``paths`` (n, S, H): the paths' mean forecast
    return at the horizon against the actual one, per date (:func:`~.ic_stats.rank_ic_summary`)."""
    last = np.asarray(history_close, dtype=np.float64)[:, -1]
    mean = np.asarray(paths, dtype=np.float64).mean(axis=1)
    actual = np.asarray(actual_close, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        forecast_return, actual_return = mean[:, -1] / last - 1.0, actual[:, -1] / last - 1.0
    return score_signal(forecast_return, actual_return, dates, actual.shape[1])


def score_signal(signal, actual_return, dates, horizon: int) -> dict[str, float]:
    """``val_rank_ic`` (``_ci_low``, ``_ci_high``, ``_nw_t``) and ``val_ic_dates`` of any signal."""
    kept = rank_ic_summary(dates, signal, actual_return, horizon)
    names = {"rank_ic": VAL_IC_METRIC, "rank_ic_ci_low": f"{VAL_IC_METRIC}_ci_low",
             "rank_ic_ci_high": f"{VAL_IC_METRIC}_ci_high", "rank_ic_nw_t": f"{VAL_IC_METRIC}_nw_t",
             "ic_dates": "val_ic_dates"}
    return {names[k]: v for k, v in kept.items()}


def line(metrics: Mapping[str, float]) -> str:
    """``val_rank_ic +0.031 (95% CI +0.004 .. +0.057, NW t 2.10)`` ('' without a value)."""
    if VAL_IC_METRIC not in metrics:
        return ""
    nan = float("nan")
    return (f"{VAL_IC_METRIC} {metrics[VAL_IC_METRIC]:+.4f} (95% CI {metrics.get(VAL_IC_METRIC + '_ci_low', nan):+.4f}"
            f" .. {metrics.get(VAL_IC_METRIC + '_ci_high', nan):+.4f}, NW t "
            f"{metrics.get(VAL_IC_METRIC + '_nw_t', nan):.2f})")
