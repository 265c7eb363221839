"""What differs per training stage: one folder per stage, one spec each, found by name.

- :mod:`~kronos_mlflow.stages.tokenizer`: the VQ tokenizer (stage one);
- :mod:`~kronos_mlflow.stages.predictor`: the Kronos predictor on a frozen tokenizer's tokens
  (stage two).

A stage's folder holds its training piece (loss, step metrics, validation, plots: a
:class:`~kronos_mlflow.stages.base.TrainingStage` the loop asks), its held-out piece (a test
window's loss and the metrics: a :class:`~kronos_mlflow.stages.base.HeldOutPiece`) and its spec
(:class:`~kronos_mlflow.stages.registry.StageSpec`: metric names, config keys, model building,
the logged model, the champion rule, the default study). Everything else (optimizer,
schedule, DDP, resume, training state, tracking, stop signals, the verdict's bootstrap, the
sweep and the pipeline) is the same code for every stage and asks the spec.

A new stage is one folder plus one line below (the registry keeps this order: the pipeline's).
"""

from __future__ import annotations

from .base import HeldOutPiece, StepOutput, TrainingStage, Validation
from .registry import StageSpec, get, names, spec_of

from . import tokenizer, predictor  # noqa: E402,F401 - each registers its spec, in pipeline order

__all__ = ["HeldOutPiece", "StageSpec", "StepOutput", "TrainingStage", "Validation", "get", "names", "spec_of"]
