"""``objective: val_skill``: each epoch's weights scored as a forecaster on the validation split's
origins against persistence (``val_skill_vs_persistence``, ``best_val_skill``), in a forked random
state, so training draws exactly what it draws with ``objective: val_loss``
(docs/sweeps.md#sweeping-on-forecast-skill-objective).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..config.sections import as_section
from ..errors import UserError
from ..model.finetune import merged
from ..model import KronosPredictor
from . import forecasters as fc, scores as sc
from .origins import CLOSE, forecast_origins, settings_of

VAL_SKILL_METRIC = "val_skill_vs_persistence"
BEST_VAL_SKILL = "best_val_skill"
HISTORY_KEY = "val_skill_history"  # in a training state's extra


def val_origins(config: Any):
    """The validation origins; none is a one-line refusal. ``config``: the sections
    (``sections(config)``) or the whole config."""
    origins = forecast_origins(config, "val")
    if not len(origins):
        raise UserError(f"objective val_skill: no forecast origins in val_time_range "
                        f"{':'.join(settings_of(config).data.val_time_range)} after train_time_range's end (each needs "
                        "lookback_window + predict_window bars of a series, the forecast ones after training's); "
                        "widen val_time_range or use objective val_loss")
    return origins


def epoch_hooks(config: Mapping[str, Any], stage, device, *, rank: int, world_size: int, console=None) -> list:
    """What :func:`kronos_mlflow.training.loop.fit` runs after each epoch for ``config``: the scorer
    with ``objective: val_skill``, nothing with ``val_loss`` (the training section's ``objective``)."""
    if as_section(config, "training").objective != "val_skill":
        return []
    return [ValSkill(config, stage, device, rank=rank, world_size=world_size, console=console)]


class ValSkill:
    """The per-epoch scorer of one run, an epoch hook of the loop
    (:class:`kronos_mlflow.training.loop.EpochHook`): built by every rank; :meth:`score` is a collective.
    ``skills``: each scored epoch's ``val_skill_vs_persistence``, kept in the training state as
    ``val_skill_history``. A scorer of another number sets :attr:`metric`, :attr:`best`,
    :attr:`history_key` and :attr:`name`, and its own :meth:`score` and :meth:`line`."""

    metric, best, history_key, name = VAL_SKILL_METRIC, BEST_VAL_SKILL, HISTORY_KEY, "val_skill"

    def __init__(self, config: Mapping[str, Any], stage, device, *, rank: int, world_size: int, console=None):
        self.config, self.stage, self.device = config, stage, device  # the whole config: the stage's pair reads it
        self.data = as_section(config, "data")  # the validation range, max_context, clip
        self.rank, self.world_size, self.console = rank, world_size, console
        self.skills: dict[int, float] = {}
        self.paths: dict[int, np.ndarray] = {}  # each scored epoch's paths, this process's epochs only
        self.kept: np.ndarray | None = None  # the kept checkpoint's epoch's paths, once finished
        self.origins = val_origins(config)
        every = np.arange(len(self.origins))
        self.history = self.origins.history(every)[..., CLOSE]
        self.actual = self.origins.future(every)[..., CLOSE]
        self.base = sc.origin_scores(fc.persistence_paths(self.origins), self.history, self.actual)["mase"]

    def describe(self) -> str:
        return (f"{self.name} on {self.origins.describe()} of val_time_range {':'.join(self.data.val_time_range)}, "
                "forecasting bars after train_time_range")

    def predictor(self, raw_model):
        """A ``KronosPredictor`` of the epoch's weights (adapters merged, as they are logged) and
        their partner."""
        tokenizer, model = self.stage.forecast_pair(merged(raw_model), self.config, self.device)
        return KronosPredictor(model, tokenizer, device=str(self.device), max_context=int(self.data.max_context),
                               clip=float(self.data.clip))

    def forecast(self, raw_model) -> np.ndarray:
        """The validation origins' sample paths of ``raw_model``'s weights, drawn in a forked
        random state (training draws what it draws without this scorer); kept as :attr:`drawn`."""
        predictor = self.predictor(raw_model)
        device = torch.device(self.device)
        forked = [device] if device.type == "cuda" else []
        progress = self.console.progress if self.console is not None else None
        with torch.random.fork_rng(devices=forked):
            paths = fc.kronos_paths(predictor, self.origins, self.config, rank=self.rank, world_size=self.world_size,
                                    progress=progress, desc=self.name)
        self.drawn = paths
        return paths

    def score(self, raw_model) -> dict[str, float]:
        """``val_skill_vs_persistence`` (with ``_ci_low`` / ``_ci_high``), ``val_mase_close`` and
        ``persistence_val_mase_close`` for ``raw_model`` (finite values only)."""
        paths = self.forecast(raw_model)
        mase = sc.origin_scores(paths, self.history, self.actual)["mase"]
        value, low, high = sc.skill(mase, self.base)
        metrics = {VAL_SKILL_METRIC: value, f"{VAL_SKILL_METRIC}_ci_low": low, f"{VAL_SKILL_METRIC}_ci_high": high,
                   "val_mase_close": float(np.nanmean(mase)) if np.isfinite(mase).any() else math.nan,
                   "persistence_val_mase_close": float(np.nanmean(self.base)) if np.isfinite(self.base).any()
                   else math.nan}
        return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}

    # the loop's epoch hook
    def restore(self, extra: Mapping[str, Any]) -> None:
        self.skills = {int(k): float(v) for k, v in (extra.get(self.history_key) or {}).items()}

    def after_epoch(self, raw_model, epoch: int, logger, console) -> None:
        metrics = self.score(raw_model)
        self.paths[epoch] = self.drawn
        logger.log_metrics(metrics, step=epoch)
        if self.metric in metrics:
            self.skills[epoch] = metrics[self.metric]
            console.print(f"  {self.line(metrics)}")

    def objective(self, epoch: int, value: float | None) -> float | None:
        return self.skills.get(epoch)

    def state(self) -> dict[str, Any]:
        return {self.history_key: {str(k): v for k, v in self.skills.items()}} if self.skills else {}

    def forecasts(self) -> dict[str, Any]:
        """The kept epoch's validation paths by their origins' digest (what calibration forecasts:
        the same origins, seed and weights); none when that epoch ran before a resume."""
        return {self.origins.digest: self.kept} if self.kept is not None else {}

    def finish(self, best_epoch: int, logger) -> dict[str, Any]:
        self.kept = self.paths.get(best_epoch)
        self.paths = {}
        if best_epoch not in self.skills:
            return {}
        logger.log_metrics({self.best: self.skills[best_epoch]}, step=best_epoch)
        return {self.best: self.skills[best_epoch]}

    @staticmethod
    def line(metrics: Mapping[str, float]) -> str:
        return line(metrics)


def line(metrics: Mapping[str, float]) -> str:
    """``val_skill_vs_persistence +0.012 (95% CI -0.004 .. +0.027)`` ('' without a value)."""
    if VAL_SKILL_METRIC not in metrics:
        return ""
    return (f"{VAL_SKILL_METRIC} {metrics[VAL_SKILL_METRIC]:+.4f} (95% CI "
            f"{metrics.get(VAL_SKILL_METRIC + '_ci_low', math.nan):+.4f} .. "
            f"{metrics.get(VAL_SKILL_METRIC + '_ci_high', math.nan):+.4f})")
