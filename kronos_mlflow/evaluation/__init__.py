"""Judging a model: the held-out verdict against its base, the forecast scorecard, calibration, backtests, the tokenizer's plots.
May import ``serving``, ``tracking``, ``data``, ``model``, ``config``, ``runtime`` and ``errors`` (docs/code-map.md).

    from kronos_mlflow.evaluation import heldout_windows, compare_on
    windows = heldout_windows(config, "test")              # from the data and config only
    result = compare_on(windows, "outputs/.../best_model", "./Kronos-Tokenizer-base", "cpu",
                        config=config, label="./Kronos-Tokenizer-base",
                        stage=kronos_mlflow.stages.get("tokenizer").heldout())
    print(result.line(), result.verdict)                   # better / worse / inconclusive / unavailable

docs/verdict.md and docs/forecast-evaluation.md say what the numbers mean.
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
