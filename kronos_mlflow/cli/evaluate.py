"""``kronos-mlflow evaluate``: the scorecard of a logged forecaster, recorded as its own MLflow run.

What ``--model`` may be, the zero-shot pair, the settings a run's model is scored on
(:data:`INHERITED_KEYS`) and what the run records: docs/forecast-evaluation.md#forecasters.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from ..config import core as cfg, published
from ..config.core import run_params
from ..runtime.console import Console
from ..errors import UserError
from ..evaluation.forecast_run import ZEROSHOT_TAG, pair
from ..evaluation.sources import (
    MODEL_ACCEPTED, kept_settings, model_calibrator, recorded_settings, resolve_model, resolve_tokenizer,
)
from ..config.flags import add_config_arguments, config_overrides
from ..tracking.ownership import Claim, evidence, write_owner
from ..training.preflight import DataView, check_context, check_scorecard, check_tracking
from ..config.keys import PLACES_TO_WRITE

PREDICTOR_RUN_TAG = "predictor_run_id"
#: What ``--model``'s run decides unless a flag or the config file says otherwise; never a place
#: to write (``dataset_path``, ``save_path``: :data:`~kronos_mlflow.config.keys.PLACES_TO_WRITE`).
INHERITED_KEYS = tuple(k for k in (*cfg.DATA_WINDOW_KEYS, *cfg.EVALUATION_KEYS)
                       if k != "evaluate" and k not in PLACES_TO_WRITE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="URI", required=True, help=f"the forecaster to score: {MODEL_ACCEPTED}")
    parser.add_argument("--zeroshot-tokenizer", "--zeroshot_tokenizer", dest="zeroshot_tokenizer", metavar="URI",
                        default="", help="the zero-shot pair's tokenizer (a checkpoint directory or hub id)")
    parser.add_argument("--zeroshot-predictor", "--zeroshot_predictor", dest="zeroshot_predictor", metavar="URI",
                        default="", help="the zero-shot pair's predictor (a checkpoint directory or hub id)")
    parser.add_argument("--aci-start-run", "--aci_start_run", dest="aci_start_run", metavar="RUN_ID", default="",
                        help="start aci's levels where the evaluation run RUN_ID's ended (a walk-forward's previous "
                             "fold; docs/walk-forward.md#aci-across-folds); default: the nominal levels")
    parser.add_argument("--check", dest="_check", action="store_true",
                        help="check the model, the zero-shot pair, the origins and the backtest's range, then exit")
    add_config_arguments(parser)


def _run_record(run_id: str) -> tuple[dict, str]:
    """The predictor run's params and its directory (its ``run_directory`` tag, when that
    directory's ``owner.json`` says it is the run's: a tag naming a directory is only a claim;
    '' when unknown or unproven)."""
    if not run_id:
        return {}, ""
    from mlflow import MlflowClient

    client = MlflowClient()
    run = client.get_run(run_id)
    # an empty MLproject parameter is recorded as its shell quoting
    params = {k: ("" if v.strip() in ("''", '""') else v) for k, v in run.data.params.items()}
    for key in published.PUBLISHED:  # what auto chose there (its tag), not what this machine would choose
        if f"{key}_source" in run.data.tags:
            params[key] = published.from_tag(run.data.tags[f"{key}_source"])
        elif params.get(key, "").strip().lower() == published.FRESH:
            params[key] = ""
    return params, str(run.data.tags.get("run_directory", "")) if evidence(client, run) is None else ""


def zeroshot_sources(args, tok_dir: Path, run_id: str) -> tuple[str, str, str]:
    """``(tokenizer, predictor, label)`` of the zero-shot pair; ``predictor`` '' when none."""
    params, save_dir = _run_record(run_id)
    tokenizer = args.zeroshot_tokenizer or params.get("pretrained_tokenizer_path", "") or str(tok_dir)
    predictor = args.zeroshot_predictor or params.get("pretrained_predictor_path", "")
    named = predictor
    if not predictor and save_dir and (Path(save_dir) / "checkpoints" / "start" / "model.safetensors").is_file():
        predictor = str(Path(save_dir) / "checkpoints" / "start")
        named = f"runs:/{run_id} starting weights"
    # the label names what a colleague can find again: the model's URI, never the scratch copy
    label = f"{args.model} tokenizer" if tokenizer == str(tok_dir) else tokenizer
    return tokenizer, predictor, f"{label} + {named or 'none'}"


def _predictor(tokenizer, spec: str, config, device, what: str):
    from ..model import Kronos  # lazy: torch

    try:
        if not Path(spec).is_dir():
            Kronos.from_pretrained(spec)  # a hub id: its own line if it does not load
        return pair(tokenizer, spec, config, device)
    except UserError as exc:  # which argument it was: a checkpoint of the wrong kind, other bits
        raise UserError(f"{what}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from ..runtime.distributed import resolve_device  # lazy: torch, numpy
    from ..evaluation.scorecard import score_forecasters  # lazy: torch, mlflow, pandas

    recorded, recorded_by = recorded_settings(args.model, INHERITED_KEYS, "--model")
    config = cfg.load_config(config_overrides(args), path=getattr(args, "_config_file", None), beneath=recorded)
    from ..tracking.gate import check_handed  # lazy: numpy, urllib/http

    check_handed("evaluate", config["experiment_name"] or None)  # the run it would write, before any download
    device = resolve_device(config["device"])
    console = Console(True)
    kept = kept_settings(recorded, config, cfg.DEFAULTS)
    if kept:
        console.print(f"--model's run {recorded_by} recorded {kept}: scored at those (flags override them)")
    check_context(config)
    with tempfile.TemporaryDirectory(prefix="kronos-eval-") as scratch:
        tok_dir, pred_dir, run_id = resolve_model(args.model, Path(scratch))
        # the model's own calibrator (calibration on), checked field by field before any work and by --check
        from ..evaluation.calibration import is_on  # lazy: numpy

        calibrator = model_calibrator(pred_dir, f"--model '{args.model}'") if is_on(config) else None
        from ..evaluation.ensemble import model_ensemble  # lazy: numpy

        ensemble = model_ensemble(pred_dir, f"--model '{args.model}'") if calibrator is not None else None
        from ..serving.forecasting.head import load as load_head  # lazy: torch

        try:  # the return head beside the predictor (a tokens+return run's), scored as finetuned_head
            head = load_head(pred_dir, device)
        except UserError as exc:
            raise UserError(f"--model '{args.model}': {exc}") from None
        tokenizer = resolve_tokenizer(str(tok_dir), device, what="--model")
        models = {"finetuned": _predictor(tokenizer, str(pred_dir), config, device, "--model")}
        z_tok, z_pred, label = zeroshot_sources(args, tok_dir, run_id)
        if z_pred:
            base_tok = resolve_tokenizer(z_tok, device, what="--zeroshot-tokenizer") if z_tok != str(tok_dir) else tokenizer
            models["zeroshot"] = _predictor(base_tok, z_pred, config, device, "--zeroshot-predictor")
        check_tracking(config)  # where the run will be logged, before the scoring (never created here)
        n_origins = check_origins(config)
        aci_start = _aci_start(args, scratch)
        aci_state = {"from": aci_start} if aci_start is not None else {}  # filled with where aci started and ended
        if getattr(args, "_check", False):
            print(f"[kronos] check passed: the model, {'its calibrator, ' if calibrator is not None else ''}"
                  f"{'its return head, ' if head[0] is not None else ''}"
                  f"{'its zero-shot pair, ' if z_pred else ''}{n_origins:,} test "
                  "origins and the backtest's range are usable")
            return 0
        if not z_pred:
            console.print("no zero-shot pair: the predictor run started fresh and its directory is not here; "
                          "give --zeroshot-predictor (and --zeroshot-tokenizer) to score one")
        card = score_forecasters(config, models, console=console, calibrator=calibrator, ensemble=ensemble,
                                 aci_state=aci_state,
                                 head=head)
        if card.reason:  # never a FINISHED run without metrics
            raise UserError(f"nothing to score: {card.reason}")
        card.tags[ZEROSHOT_TAG] = label if z_pred else "unavailable"
        if "end" in aci_state:  # where aci's levels started (a walk-forward fold: the previous fold's end)
            from ..evaluation import aci_carry  # lazy: numpy

            card.tags[aci_carry.TAG] = aci_carry.describe(aci_start)
            card.metrics.update(aci_carry.metrics(aci_state))
        if run_id:
            card.tags[PREDICTOR_RUN_TAG] = run_id
        logged = _log(args, config, card, console, aci_state)
    print(f"logged: MLflow run {logged}")
    return 0


def _aci_start(args, scratch: str):
    """The levels ``--aci-start-run``'s run ended its aci at (checked: :func:`~kronos_mlflow.
    evaluation.aci_carry.start_from`), or None (the nominal levels)."""
    if not args.aci_start_run:
        return None
    from mlflow import MlflowClient  # lazy: urllib/http
    from ..evaluation import aci_carry  # lazy: numpy

    return aci_carry.start_from(MlflowClient(), args.aci_start_run, scratch)


def check_origins(config) -> int:
    """The test origins the scorecard will score (none: one line), and the backtest's range, read
    without writing the data cache before they pass (:mod:`kronos_mlflow.training.preflight`)."""
    with DataView(quiet_splits=("train", "val", "test")) as data:  # the scorecard reads the test split only
        return check_scorecard(data.config(config))


EVALUATIONS_FOLDER = "evaluations"


def _log(args, config, card, console, aci_state=None) -> str:
    """The evaluation's MLflow run (``MLFLOW_RUN_ID``'s when it hands one over, else a new one),
    claimed as this project's (:mod:`kronos_mlflow.tracking.ownership`), with a run directory of its own,
    ``{save_path}/evaluations/<run id>/`` (``owner.json`` and the ``evaluation/`` files), which
    is what lets a pipeline reuse it."""
    from ..tracking.mlflow import MLflowLogger  # lazy: numpy, urllib/http
    from ..evaluation.scorecard import record  # lazy: torch, mlflow, pandas

    logger = MLflowLogger(config["experiment_name"] or None,
                          run_name=config["run_name"] or f"evaluate {os.path.basename(args.model.rstrip('/'))}",
                          claim=Claim(command="evaluate"))
    try:
        root = Path(os.path.expanduser(str(config["save_path"]))) / EVALUATIONS_FOLDER / logger.run_id
        write_owner(root, logger.owner_token, logger.run_id, logger.experiment_id)
        logger.set_tags({"run_directory": str(root.resolve())})
        logger.log_hyperparams({"model": args.model, "zeroshot_tokenizer": args.zeroshot_tokenizer,
                                "zeroshot_predictor": args.zeroshot_predictor, **run_params(config)})
        record(card, root / "evaluation", logger, step=0, console=console, config=config)
        if aci_state and "end" in aci_state:  # what the next period's aci starts from (--aci-start-run this run)
            from ..evaluation import aci_carry  # lazy: numpy

            state = aci_carry.write(root / "evaluation" / aci_carry.FILE, aci_state, run_id=logger.run_id,
                                    test_time_range=run_params(config).get("test_time_range", ""),
                                    step=float(config["aci_step"]), start=card.tags.get(aci_carry.TAG, ""))
            logger.log_artifact(str(state), "evaluation")
    except KeyboardInterrupt:  # Ctrl-C while the scorecard is logged: a stop, not a failure
        logger.finalize("killed", "kronos-mlflow evaluate: stopped by SIGINT while its scorecard was logged")
        raise
    except BaseException as exc:
        logger.finalize("failed", f"kronos-mlflow evaluate: {type(exc).__name__}: {exc}")
        raise
    logger.finalize("success")
    return logger.run_id
