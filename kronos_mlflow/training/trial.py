"""What a training process needs from a sweep, and nothing else: the pruners by name, the
environment the sweep sets for a trial, and the reporter that rank 0 of the trial calls after each validation."""

from __future__ import annotations

import math
import os
from typing import Any

from ..errors import ConfigError

# Successive halving on epochs: a trial must be in the best third of the trials that reached
# epoch 2 to go on to epoch 4, then again to epoch 10, 28, ... (docs/sweeps.md, Pruning). The
# sweep and its trials' processes must agree on it.
DEFAULT_PRUNER = "successive_halving"


def make_pruner(spec: str):
    """``successive_halving`` (default: min_resource=1, reduction_factor=3, so rungs after epochs
    2, 4, 10, 28), ``median`` (MedianPruner(n_startup_trials=2, n_warmup_steps=1)), ``none``,
    ``percentile:25``, ``hyperband`` (min_resource=1, reduction_factor=3); options as
    ``median:n_startup_trials=3``."""
    import optuna

    import math

    name, _, opts = (spec or DEFAULT_PRUNER).partition(":")
    name = name.strip().lower()
    kwargs: dict[str, Any] = {}
    if name == "percentile" and opts and "=" not in opts:
        opts = f"percentile={opts}"
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, _, value = item.partition("=")
        key = key.strip()
        try:
            number = float(value) if value.strip().isascii() else math.nan  # "٣": float() reads 3.0
        except ValueError:
            raise ConfigError(f"pruner '{spec}': option '{item}' is not key=number") from None
        if not math.isfinite(number):
            raise ConfigError(f"pruner '{spec}': {key} {value.strip()} is not a finite number (digits 0-9)")
        if key in _PRUNER_INTS:
            low = _PRUNER_INTS[key]
            if number != int(number) or not low <= number <= PRUNER_INT_MAX:
                raise ConfigError(f"pruner '{spec}': {key} {value.strip()} is out of range; expected an integer "
                                  f"from {low} to {PRUNER_INT_MAX:,}")
            number = int(number)
        elif key == "percentile" and not 0.0 <= number <= 100.0:
            raise ConfigError(f"pruner '{spec}': percentile {value.strip()} is out of range; expected 0 to 100")
        kwargs[key] = number
    try:
        if name == "median":
            kwargs.setdefault("n_startup_trials", 2)
            kwargs.setdefault("n_warmup_steps", 1)
            return optuna.pruners.MedianPruner(**kwargs)
        if name == "none":
            return optuna.pruners.NopPruner()
        if name == "percentile":
            kwargs.setdefault("percentile", 25.0)
            kwargs.setdefault("n_startup_trials", 2)
            kwargs.setdefault("n_warmup_steps", 1)
            return optuna.pruners.PercentilePruner(**kwargs)
        if name == "hyperband":
            kwargs.setdefault("min_resource", 1)
            kwargs.setdefault("reduction_factor", 3)
            return optuna.pruners.HyperbandPruner(**kwargs)
        if name == "successive_halving":
            kwargs.setdefault("min_resource", 1)
            kwargs.setdefault("reduction_factor", 3)
            return optuna.pruners.SuccessiveHalvingPruner(**kwargs)
    except (TypeError, ValueError) as exc:  # an unknown option, or a value Optuna refuses
        raise ConfigError(f"pruner '{spec}': {' '.join(str(exc).split())}") from None
    raise ConfigError(f"pruner '{spec}' is not one of successive_halving, hyperband, median, percentile, none")


# Integer options of Optuna's pruners, with their smallest accepted value; each at most
# PRUNER_INT_MAX (trials, epochs or a factor between rungs: a billion is beyond any sweep).
PRUNER_INT_MAX = 10**9
_PRUNER_INTS = {"n_startup_trials": 0, "n_warmup_steps": 0, "interval_steps": 1, "n_min_trials": 1,
                "min_resource": 1, "max_resource": 1, "reduction_factor": 2, "min_early_stopping_rate": 0,
                "bootstrap_count": 0}


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
