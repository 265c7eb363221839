"""What differs per training stage: one folder per stage, one spec each, found by name in the registry.
May import ``evaluation`` and everything below it (docs/code-map.md); the loop, sweep and pipeline ask the spec.

A stage's folder holds its training piece (a :class:`~kronos_mlflow.stages.base.TrainingStage`),
its held-out piece (a :class:`~kronos_mlflow.stages.base.HeldOutPiece`) and its spec
(:class:`~kronos_mlflow.stages.registry.StageSpec`, which registers itself). The package's own
stages are imported below; another package adds one through the ``kronos_mlflow.stages``
entry-point group (docs/stages.md).
"""

from __future__ import annotations

from .base import HeldOutPiece, StepOutput, TrainingStage, Validation
from .registry import StageSpec, all_or_nothing, get, names, spec_of

from . import tokenizer, predictor  # noqa: E402,F401 - each registers its spec

ENTRY_POINTS = "kronos_mlflow.stages"


def _load_plugins() -> None:
    """Import every module the ``kronos_mlflow.stages`` entry-point group names: each registers its
    spec. One that fails anywhere while loading is named in a warning and left out whole: what it
    registered before failing is taken back (:func:`~kronos_mlflow.stages.registry.all_or_nothing`)."""
    import warnings
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINTS):
        try:
            with all_or_nothing():
                entry.load()
        except (Exception, SystemExit) as exc:  # a broken plugin must not take every command down with it
            warnings.warn(f"stage plugin {entry.name} ({entry.value}) does not load, left out: {exc}", stacklevel=2)


_load_plugins()

__all__ = ["ENTRY_POINTS", "HeldOutPiece", "StageSpec", "StepOutput", "TrainingStage", "Validation", "get", "names",
           "spec_of"]
