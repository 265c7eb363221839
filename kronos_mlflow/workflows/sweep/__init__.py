"""Optuna sweeps over learning rate and weight decay: ``driver`` (the sweep process: parent and
child MLflow runs, trials as training subprocesses, the champion), ``space`` (the search space
file), ``study`` (pruners, storage, the study, distinct trials), ``trial`` (what a trial's
training process needs from the sweep) and ``dashboard`` (the parent run's link to the study)."""
