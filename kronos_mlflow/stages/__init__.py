"""What differs per training stage, for the one loop in :mod:`kronos_mlflow.trainer`.

A stage supplies its loss and the per-step metric names, its validation (loss and metrics, a
collective), the console line of an epoch, how its best checkpoint is drawn (plots) and
judged on the test windows, and how a run's model is built from the config:

- :class:`~kronos_mlflow.stages.tokenizer.TokenizerStage`: the VQ tokenizer (stage one);
- :class:`~kronos_mlflow.stages.predictor.PredictorStage`: the Kronos predictor on a frozen
  tokenizer's tokens (stage two).

Everything else (optimizer, schedule, DDP, resume, training state, tracking, stop signals,
the verdict's bootstrap) is the same code for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import StepOutput, TrainingStage
from .tokenizer import TokenizerStage

__all__ = ["StepOutput", "TrainingStage", "TokenizerStage", "stage_for"]


def stage_for(config: Mapping[str, Any], tokenizer=None) -> TrainingStage:
    """The stage ``config["stage"]`` names; a predictor stage trains on ``tokenizer`` (the
    frozen :class:`~kronos_mlflow.model.KronosTokenizer`, on the training device)."""
    if str(config.get("stage", "tokenizer")) == "predictor":
        from .predictor import PredictorStage

        if tokenizer is None:
            raise ValueError("the predictor stage needs its frozen tokenizer")
        return PredictorStage(tokenizer, config)
    return TokenizerStage()
