"""Judging a model: the held-out verdict against its base, the forecast scorecard, calibration, backtests, the tokenizer's plots.
May import ``serving``, ``tracking``, ``data``, ``model``, ``config``, ``runtime`` and ``errors`` (docs/code-map.md).
What the numbers mean: docs/verdict.md and docs/forecast-evaluation.md.
"""

from __future__ import annotations

from ..runtime.lazy import lazy_exports

_EXPORTS = {
    "heldout_windows": "windows",
    "HeldOutWindows": "windows",
    "evenly_spaced": "windows",
    "paired_bootstrap": "verdict",
    "decide": "verdict",
    "judge": "verdict",
    "HeldOut": "verdict",
    "compare_on": "heldout",
    "evaluate_run": "heldout",
    "forecast_origins": "origins",
    "Origins": "origins",
    "score_forecasters": "scorecard",
    "Scorecard": "scorecard",
    "evaluate_predictor_run": "forecast_run",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
