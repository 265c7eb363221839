"""``objective: val_ic``: each epoch's weights scored by the mean per-date rank IC of their
forecast return (the sampled paths' mean at the horizon over the origin's close, the
scorecard's signal; the return head's signal where the predictor trains one, tag
``val_ic_signal``) against the actual return, on the validation split's origins
(``val_rank_ic`` with its bootstrap interval and Newey-West t, ``best_val_ic``); the epochs and
sweep trials are ranked by it, highest first. It forecasts in a forked random state, as
``objective: val_skill`` does, so training draws exactly what it draws with ``val_loss``
(docs/objectives.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..config.features import normalize_windows, time_features
from ..config.sections import as_section
from ..model.return_head import head_of
from ..runtime.distributed import unwrap
from .ic_stats import rank_ic_summary
from .val_skill import ValSkill, epoch_hooks as skill_hooks

VAL_IC_METRIC = "val_rank_ic"
BEST_VAL_IC = "best_val_ic"
HISTORY_KEY = "val_ic_history"  # in a training state's extra
SIGNAL_TAG = "val_ic_signal"  # which signal the validation IC is of: the return head's, else the paths' mean
SIGNAL_HEAD, SIGNAL_PATHS = "return_head", "paths_mean"


def epoch_hooks(config: Mapping[str, Any], stage, device, *, rank: int, world_size: int, console=None) -> list:
    """What :func:`kronos_mlflow.training.loop.fit` runs after each epoch for ``config``: the
    rank-IC scorer with ``objective: val_ic``, else :func:`~.val_skill.epoch_hooks`' (the skill
    scorer with ``val_skill``, nothing with ``val_loss``)."""
    if as_section(config, "training").objective == "val_ic":
        return [ValIC(config, stage, device, rank=rank, world_size=world_size, console=console)]
    return skill_hooks(config, stage, device, rank=rank, world_size=world_size, console=console)


class ValIC(ValSkill):
    """The per-epoch rank-IC scorer (an epoch hook of the loop, a collective like
    :class:`~kronos_mlflow.evaluation.val_skill.ValSkill`, whose origins and forecasts it shares);
    ``skills``: each scored epoch's ``val_rank_ic``."""

    metric, best, history_key, name = VAL_IC_METRIC, BEST_VAL_IC, HISTORY_KEY, "val_ic"
    announced = False

    def score(self, raw_model) -> dict[str, float]:
        """``val_rank_ic`` (with ``_ci_low`` / ``_ci_high``, ``_nw_t``) and ``val_ic_dates`` of the
        return head's signal where the model trains one (``predictor_objective: tokens+return``),
        else of the sampled paths' mean."""
        head = head_of(unwrap(raw_model))
        if head is None:
            return score_paths(self.forecast(raw_model), self.history, self.actual, self.origins.dates)
        self.drawn = None  # no paths drawn: nothing for the end of the run to reuse
        tokenizer, model = self.stage.forecast_pair(raw_model, self.config, self.device)
        signal = head_signal(tokenizer, model, head, self.origins, float(self.data.clip), self.device)
        last = np.asarray(self.history, dtype=np.float64)[:, -1]
        with np.errstate(divide="ignore", invalid="ignore"):
            actual_return = np.asarray(self.actual, dtype=np.float64)[:, -1] / last - 1.0
        return score_signal(signal, actual_return, self.origins.dates, self.actual.shape[1])

    def after_epoch(self, raw_model, epoch: int, logger, console) -> None:
        if not self.announced:  # which signal the IC is of, once: a tag and a line
            used = SIGNAL_HEAD if head_of(unwrap(raw_model)) is not None else SIGNAL_PATHS
            logger.set_tags({SIGNAL_TAG: used})
            console.print(f"  val_ic scores the {used} signal")
            self.announced = True
        super().after_epoch(raw_model, epoch, logger, console)

    @staticmethod
    def line(metrics: Mapping[str, float]) -> str:
        return line(metrics)


def head_signal(tokenizer, model, head, origins, clip: float, device, batch: int = 256) -> np.ndarray:
    """The return head's signal (n,) at each origin: the predictor's context at the lookback's last
    bar (the lookback z-scored with its own statistics, tokenized, its calendar stamps), read in
    eval mode without a draw of the random state; the model's mode is put back."""
    every = np.arange(len(origins))
    history = origins.history(every).astype(np.float32)
    past, _ = origins.times(every)
    stamps = time_features(np.asarray(past).reshape(-1)).reshape(*np.shape(past), -1)
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for start in range(0, len(every), batch):
                part = slice(start, start + batch)
                x = torch.from_numpy(normalize_windows(history[part], history.shape[1], clip)).to(device)
                s1, s2 = tokenizer.encode(x, half=True)
                context = model.context(s1, s2, torch.from_numpy(stamps[part]).to(device).long())
                out.append(head(context, context.shape[1] - 1).double().cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


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
