"""What a training process needs from a sweep, and nothing else: the environment the sweep
sets for a trial, and the reporter that rank 0 of the trial calls after each validation."""

from __future__ import annotations

import math
import os

from .study import DEFAULT_PRUNER, make_pruner

EXIT_PRUNED = 42  # a pruned trial's exit code when it runs without torchrun

# Environment handed to a trial's training process so that rank 0 can report to the study.
ENV_STORAGE = "KRONOS_OPTUNA_STORAGE"
ENV_STUDY = "KRONOS_OPTUNA_STUDY"
ENV_TRIAL_ID = "KRONOS_OPTUNA_TRIAL_ID"
ENV_PRUNER = "KRONOS_OPTUNA_PRUNER"


class TrialReporter:
    """Reports each epoch's objective value (validation loss, or with ``objective: val_skill``
    the validation forecast skill) to the trial and asks the pruner.

    Built inside the training process from the environment the sweep set; ``None`` otherwise.
    """

    def __init__(self, storage_url: str, study_name: str, trial_id: int, pruner_spec: str):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=study_name, storage=storage_url, pruner=make_pruner(pruner_spec))
        self.trial = optuna.trial.Trial(study, trial_id)

    @classmethod
    def from_env(cls) -> TrialReporter | None:
        if not os.environ.get(ENV_STUDY):
            return None
        return cls(os.environ[ENV_STORAGE], os.environ[ENV_STUDY], int(os.environ[ENV_TRIAL_ID]),
                   os.environ.get(ENV_PRUNER, DEFAULT_PRUNER))

    def __call__(self, epoch: int, value: float | None) -> bool:
        """Returns True when the trial should stop (pruned)."""
        if value is None or not math.isfinite(value):
            return False
        self.trial.report(value, epoch)
        return self.trial.should_prune()
