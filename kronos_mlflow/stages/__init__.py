"""What differs per training stage: one folder per stage, one spec each, found by name in the registry.
May import ``evaluation`` and everything below it (docs/code-map.md); the loop, sweep and pipeline ask the spec.

A stage's folder holds its training piece (a :class:`~kronos_mlflow.stages.base.TrainingStage`),
its held-out piece (a :class:`~kronos_mlflow.stages.base.HeldOutPiece`) and its spec
(:class:`~kronos_mlflow.stages.registry.StageSpec`). A new stage is one folder plus one line below
(the registry keeps this order: the pipeline's); docs/code-map.md lists what a spec provides.
"""

from __future__ import annotations

from .base import HeldOutPiece, StepOutput, TrainingStage, Validation
from .registry import StageSpec, get, names, spec_of

from . import tokenizer, predictor  # noqa: E402,F401 - each registers its spec, in pipeline order

__all__ = ["HeldOutPiece", "StageSpec", "StepOutput", "TrainingStage", "Validation", "get", "names", "spec_of"]
