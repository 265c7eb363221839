"""Optuna sweep over learning rate and weight decay, one child MLflow run per trial.

    python sweeps/sweep.py --n-trials 8 --epochs 3
    mlflow run . -e sweep --env-manager local -P n_trials=8 -P epochs=3

The search space is ``sweeps/search_space.yaml``; see ``kronos_mlflow/workflows/sweep/driver.py`` for the design
(parent run, child runs, pruning from inside torchrun, heartbeats, champion alias).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kronos_mlflow.cli.sweep import main  # noqa: E402 - the stage registry, then the driver with the command lines

if __name__ == "__main__":
    sys.exit(main())
