"""The scorecard at the end of a predictor run (``evaluate: on``, the default), after the held-out
verdict: every rank calls :func:`evaluate_predictor_run` (the forecasts are split across ranks and
gathered), rank 0 writes ``evaluation/`` in the run's directory and logs it. Which pairs it
scores: docs/forecast-evaluation.md#forecasters.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..runtime.fsutil import write_atomic
from ..config.published import source
from ..config.sections import as_section
from .sources import resolve_tokenizer

ZEROSHOT_TAG = "zeroshot_pair"


def pair(tokenizer, predictor_dir, data: Any, device):
    """A ``KronosPredictor`` of a loaded tokenizer and a predictor checkpoint directory, at the
    ``data`` section's ``max_context`` and ``clip`` (or the whole config's)."""
    from ..model import Kronos, KronosPredictor  # lazy: torch, pandas, numpy

    model = Kronos.from_pretrained(str(predictor_dir), map_location=device).eval()
    data = as_section(data, "data")
    return KronosPredictor(model, tokenizer, device=str(device), max_context=int(data.max_context),
                           clip=float(data.clip))


def zeroshot_label(config: Mapping[str, Any]) -> str:
    """``<tokenizer> + <predictor>`` as given (``fresh`` for an empty one)."""
    tuned = as_section(config, "predictor").finetuned_tokenizer_path
    tok = source(config, "pretrained_tokenizer_path") or str(tuned or "") or "fresh"
    pred = source(config, "pretrained_predictor_path") or "fresh"
    return f"{tok} + {pred}"


def fit_run_calibrator(config: Mapping[str, Any], layout, device, *, rank: int, world_size: int, logger, console,
                       reused: Mapping[str, Any] | None = None):
    """With ``evaluate: off`` and ``calibration: on`` (a pipeline's predictor step): the
    calibrator alone, fit on the run's fine-tuned pair's forecasts of the calibration origins,
    written to ``evaluation/calibrator.json`` (rank 0) and logged, so that the logged model
    carries it; a collective. Without a test origin (nothing to keep the calibration before)
    or with too few calibration origins, no calibrator and one line saying why."""
    from ..model import KronosTokenizer  # lazy: torch
    from . import calibration as cb  # lazy: scipy, scikit-learn
    from .origins import forecast_origins  # lazy: the data package
    from .scorecard import CALIBRATOR_NAME, fit_calibrator  # lazy: torch, mlflow, pandas

    test = forecast_origins(config)
    origins = cb.origins_for(config, test)
    reason = cb.too_few(len(origins), config) or ("" if len(test) else "no test origin to calibrate before")
    if reason:
        console.print(cb.skipped(len(origins), config) or f"no calibrator logged with the model: {reason}")
        return None
    from . import ensemble as en  # lazy: scipy, scikit-learn

    frozen = KronosTokenizer.from_pretrained(str(layout.tokenizer), map_location=device).eval()
    keep: dict[str, Any] = {}
    calibrator = fit_calibrator(pair(frozen, layout.best_model, config, device), origins, config, rank=rank,
                                world_size=world_size, console=console, paths=(reused or {}).get(origins.digest),
                                keep=keep)
    ensemble, losses = en.build_for(config, keep)
    if rank == 0:
        directory = Path(layout.root) / "evaluation"
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / CALIBRATOR_NAME, calibrator.dumps())
        logger.log_artifact(str(directory / CALIBRATOR_NAME), "evaluation")
        logger.log_metrics({"calibration_origins": float(calibrator.origins)}, step=0)
        console.print(f"calibrator: fit on {calibrator.origins:,} validation origins "
                      f"({calibrator.time_range[0][:10]}..{calibrator.time_range[1][:10]}), logged with the model")
        if ensemble is not None:
            for path in en.write_artifacts(ensemble, losses, directory):
                logger.log_artifact(str(path), "evaluation")
            logger.log_metrics({**{f"ensemble_weight_{k}": v for k, v in ensemble.weights.items()}, **losses},
                               step=0)
            console.print("ensemble: " + ", ".join(f"{k} {v:.2f}" for k, v in ensemble.weights.items())
                          + f" (validation WQL {losses['validation_wql_ensemble']:.4f}), logged with the model")
    return calibrator


def evaluate_predictor_run(config: Mapping[str, Any], layout, device, *, rank: int, world_size: int, logger, console,
                           step: int, reused: Mapping[str, Any] | None = None):
    """The run's scorecard (:class:`~kronos_mlflow.evaluation.scorecard.Scorecard`), recorded, with
    the return head as ``finetuned_head`` where the best checkpoint holds one;
    ``reused``: validation paths ``objective: val_skill`` drew with the kept weights (calibration
    reads them instead of forecasting its origins again)."""
    from ..model import KronosTokenizer  # lazy: torch
    from .scorecard import record, score_forecasters  # lazy: torch, mlflow, pandas

    frozen = KronosTokenizer.from_pretrained(str(layout.tokenizer), map_location=device).eval()
    # the published tokenizer a fine-tuned tokenizer came from; without a fine-tuned one the
    # frozen tokenizer is pretrained_tokenizer_path's already
    spec = source(config, "pretrained_tokenizer_path") if as_section(config, "predictor").finetuned_tokenizer_path else ""
    base_tokenizer = resolve_tokenizer(spec, device, what="pretrained_tokenizer_path") if spec else frozen
    start = Path(layout.start_model)
    predictors = {"finetuned": pair(frozen, layout.best_model, config, device),
                  "zeroshot": pair(base_tokenizer, start, config, device)
                  if (start / "model.safetensors").is_file() else None}
    from ..serving.forecasting.head import load as load_head  # lazy: torch

    card = score_forecasters(config, predictors, rank=rank, world_size=world_size, console=console, reused=reused,
                             head=load_head(layout.best_model, device))
    card.tags[ZEROSHOT_TAG] = zeroshot_label(config) if predictors["zeroshot"] is not None else "unavailable"
    record(card, Path(layout.root) / "evaluation", logger, step=step, console=console, write=rank == 0,
           config=config)
    return card
