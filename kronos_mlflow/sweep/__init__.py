"""Optuna sweeps over learning rate and weight decay: ``driver`` (the sweep process, parent and
child MLflow runs) and ``trial`` (what a trial's training process needs from the sweep)."""
