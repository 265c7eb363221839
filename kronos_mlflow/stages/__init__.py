"""What differs per training stage: one folder per stage, one spec each, found by name in the registry.
May import ``evaluation`` and everything below it (docs/code-map.md); the loop, sweep and pipeline ask the spec.

A stage's folder holds its training piece (a :class:`~kronos_mlflow.stages.base.TrainingStage`),
its held-out piece (a :class:`~kronos_mlflow.stages.base.HeldOutPiece`) and its spec
(:class:`~kronos_mlflow.stages.registry.StageSpec`). Importing this package registers nothing: a
command builds the registry (:func:`build_registry`: the package's own stages, then the plugins of
the ``kronos_mlflow.stages`` entry-point group) before it loads a config (docs/stages.md).
"""

from __future__ import annotations

from .base import HeldOutPiece, StepOutput, TrainingStage, Validation
from ..config import stage_keys as _keys
from .registry import StageSpec, all_or_nothing, get, names, register, spec_of

from . import tokenizer, predictor  # noqa: E402 - the package's own stages, registered by build_registry

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


def build_registry() -> None:
    """Fill the one stage registry (:data:`kronos_mlflow.config.stage_keys.STAGES`): the package's
    stages (tokenizer, then predictor), then every plugin of the ``kronos_mlflow.stages``
    entry-point group. Each command calls it before it loads a config; once per process (a
    second call finds it built)."""
    if _keys.built():
        return
    for spec in (tokenizer.SPEC, predictor.SPEC):
        if spec.name not in _keys.STAGES:
            register(spec)
    _load_plugins()
    _keys.mark_built()


__all__ = ["ENTRY_POINTS", "HeldOutPiece", "StageSpec", "StepOutput", "TrainingStage", "Validation",
           "build_registry", "get", "names", "spec_of"]
