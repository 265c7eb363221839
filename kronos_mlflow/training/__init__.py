"""One training run on N ranks: the loop, the optimiser, the resumable state, the trial's reports.
May import ``stages`` and everything below it (docs/code-map.md)."""
