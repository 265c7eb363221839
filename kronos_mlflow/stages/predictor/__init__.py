"""Stage two: the Kronos predictor on a frozen tokenizer's tokens (upstream's
``train_predictor.py``).

``training`` (loss, causal validation, head accuracy and perplexity), ``heldout`` (a test
window's teacher-forced loss), ``sources`` (the tokenizer it trains on, the predictor it starts
from); the spec below says the rest: its names, its model, how it is logged and judged.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...config.stage_keys import StageKeys
from ...errors import UserError, same_on_every_rank
from ...evaluation.sources import resolve_model, resolve_tokenizer
from ...tracking.keys import (
    PREDICTOR_INITIAL_VAL_METRIC, PREDICTOR_LEARNING_RATE, PREDICTOR_TRAIN_LOSS, PREDICTOR_VAL_METRIC,
)
from ..registry import StageSpec



class PredictorSpec(StageSpec):
    name = "predictor"
    config_keys = StageKeys("predictor_learning_rate", "predictor_save_folder_name", "predictor_grad_clip_norm",
                            "pretrained_predictor_path",
                            models={"tokenizer": ("finetuned_tokenizer_path", "pretrained_tokenizer_path"),
                                    "predictor": ("pretrained_predictor_path",)},
                            mlproject_params=("tokenizer", "pretrained_predictor_path"),
                            linear_layers=("fusion_proj", "q_proj", "k_proj", "v_proj", "out_proj", "w1", "w2", "w3",
                                           "proj_s1", "proj_s2"),
                            published={"pretrained_predictor_path": "NeoQuasar/Kronos-small"})
    train_loss = PREDICTOR_TRAIN_LOSS
    learning_rate = PREDICTOR_LEARNING_RATE
    val_metric = PREDICTOR_VAL_METRIC
    initial_val_metric = PREDICTOR_INITIAL_VAL_METRIC
    heldout_loss = "predictor_loss"
    default_study = "kronos-predictor-lr-wd"  # never the tokenizer's study
    champion_suffix = "-predictor"
    pipeline_verdict_tag = "verdict_vs_zeroshot"  # the scorecard's verdict against the zero-shot pair
    pipeline_position = 2.0  # on the tokenizer step's logged model
    pipeline_flags = {
        "predictor_epochs": ("predictor epochs", "epochs"),
        "predictor_learning_rate": ("predictor peak learning rate", "predictor_learning_rate"),
        "pretrained_predictor_path": ("the predictor to fine-tune (a directory or hub id; auto: the published one "
                                      "when at hand, else fresh; fresh: fresh weights)", "pretrained_predictor_path"),
        "calibration": ("its logged model's calibrator (the evaluation's flag)", "calibration"),
        "objective": ("what the predictor step's epochs are scored on and its run records as its objective: "
                      "val_loss, val_skill or val_ic (docs/objectives.md)", "objective"),
        "predictor_objective": ("what the predictor trains on: tokens, or tokens+return (a return head beside "
                                "it; docs/objectives.md)", "predictor_objective"),
        "return_loss_weight": ("predictor_objective tokens+return: the return head's loss weight",
                               "return_loss_weight"),
    }
    retrained_every_fold = True  # walkforward_retrain: predictor

    def training(self, config, layout, info):
        """The frozen tokenizer is written once, by rank 0, into ``checkpoints/tokenizer/``
        (unless a resumed run has it there); every rank then reads that copy."""
        from ...runtime.distributed import barrier, broadcast_object  # lazy: torch, numpy
        from ...model import KronosTokenizer  # lazy: torch
        from .sources import configured_tokenizer  # lazy: torch, mlflow, pandas
        from .training import PredictorStage

        answer = "ok"
        if info.is_main and not (layout.tokenizer / "model.safetensors").is_file():
            try:
                configured_tokenizer(config).save_pretrained(layout.tokenizer)
            except UserError as exc:
                answer = str(exc)
        if info.distributed:
            answer = broadcast_object(answer)
        if answer != "ok":
            raise same_on_every_rank(UserError(answer))
        barrier()
        return PredictorStage(KronosTokenizer.from_pretrained(layout.tokenizer, map_location=info.device), config)

    def build_model(self, config, training=None, *, tokenizer=None):
        """``pretrained_predictor_path``, else fresh weights, for the training piece's frozen
        tokenizer (else ``tokenizer``, else the one the config names)."""
        from .sources import build_predictor, configured_tokenizer  # lazy: torch, mlflow, pandas

        if training is not None:
            tokenizer = training.tokenizer
        return build_predictor(config, tokenizer if tokenizer is not None else configured_tokenizer(config))

    def layers(self, model):
        """The token and calendar embeddings; the ``transformer`` blocks (not the dependency
        layer and heads above them)."""
        return [model.embedding, model.time_emb], list(model.transformer)

    def extend_model(self, model, config):
        """The return head of ``predictor_objective: tokens+return`` (model/return_head.py)."""
        from ...model.return_head import attach  # lazy: torch

        return attach(model, config)

    def heldout(self, training=None):
        from .heldout import piece  # lazy: torch, mlflow, pandas

        return piece(training.tokenizer)

    def run_tags(self, config):
        from .sources import tokenizer_tags  # lazy: torch, mlflow, pandas

        return tokenizer_tags(config)

    def log_model(self, mlflow_logger, layout, config, result, heldout, dataset):
        from ...serving.model_logging import log_predictor_model  # lazy: torch, mlflow, pandas

        log_predictor_model(mlflow_logger, layout, config, result, heldout, dataset)

    def model_problem(self, uri, tracking_uri):
        """A forecaster: its tokenizer and predictor both load."""
        from ...model import Kronos  # lazy: torch

        try:
            with tempfile.TemporaryDirectory(prefix="kronos-reuse-") as scratch:
                tokenizer, predictor, _ = resolve_model(uri, Path(scratch), tracking_uri=tracking_uri)
                resolve_tokenizer(str(tokenizer), "cpu", what="the logged tokenizer")
                Kronos.from_pretrained(str(predictor))
        except UserError as exc:
            return f"its logged model does not load ({exc})"
        return None

    def forecasts(self, config: Mapping[str, Any]) -> bool:
        return True  # its logged model is a forecaster; its scorecard forecasts

    def loads_checkpoints(self, config):
        return True  # its tokenizer, even a fresh one, is what its bits must match

    def scores_at_end(self, config):
        return config.get("evaluate", "on") == "on"

    def handed_over(self, model_uri):
        """The tokenizer step's model; the pipeline's own evaluation step makes the scorecard."""
        return {"finetuned_tokenizer_path": model_uri, "evaluate": "off"}


SPEC = PredictorSpec()  # registered by the command (kronos_mlflow.stages.build_registry)
