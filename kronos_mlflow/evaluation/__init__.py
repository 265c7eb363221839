"""Held-out evaluation: did a fine-tune help? A model against its base on the same windows.

    from kronos_mlflow.evaluation import heldout_windows, compare_on
    windows = heldout_windows(config, "test")              # from the data and config only
    result = compare_on(windows, "outputs/.../best_model", "./Kronos-Tokenizer-base", "cpu",
                        config=config, label="./Kronos-Tokenizer-base",
                        stage=kronos_mlflow.stages.get("tokenizer").heldout())
    print(result.line(), result.verdict)                   # better / worse / inconclusive / unavailable

Modules: ``windows`` (which windows: every test window, or an evenly spaced subset),
``verdict`` (paired bootstrap over windows, the verdict rule, the record; stage-neutral),
``heldout`` (the end of a training run; what differs per model, a window's loss and the
metrics, is the stage's held-out piece in :mod:`kronos_mlflow.stages`), ``sources`` (a model
named by path, run, registry or hub id). What the verdict means:
docs/verdict.md.

The forecast scorecard (docs/forecast-evaluation.md): ``origins`` (forecast origins on the test
split), ``forecasters`` (Kronos pairs, persistence, seasonal naive), ``scores`` (the close
metrics), ``scorecard`` (skills, verdicts, artifacts; ``Scorecard.signals`` holds the Kronos
pairs' per-(datetime, instrument) forecast returns), ``figures`` and ``forecast_run`` (the end of a
predictor run); ``kronos-mlflow evaluate`` is :mod:`kronos_mlflow.evaluate`.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kronos_mlflow.evaluation' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
