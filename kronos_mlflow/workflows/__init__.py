"""What launches many runs: the pipeline, the Optuna sweep, the walk-forward.
May import everything but ``cli`` (docs/code-map.md)."""
