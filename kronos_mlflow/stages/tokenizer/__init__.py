"""Stage one: the VQ tokenizer (upstream's ``train_tokenizer.py``).

``training`` (loss, validation, plots), ``heldout`` (a test window's loss and the metrics);
the spec below says the rest: its names, its model, how it is logged and judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...config.core import model_kwargs
from ...config.keys import EVALUATION_KEYS
from ...config.stage_keys import StageKeys
from ...errors import UserError
from ...config.published import source
from ...config.sections import as_section
from ...evaluation.sources import resolve_tokenizer
from ...tracking.keys import (
    TOKENIZER_INITIAL_VAL_METRIC, TOKENIZER_LEARNING_RATE, TOKENIZER_TRAIN_LOSS, TOKENIZER_VAL_METRIC, VERDICT_TAG,
)
from ..registry import StageSpec


#: What a tokenizer run never reads (the predictor's keys and the scorecard's): left out of its
#: digest, so that its run directory and training state do not depend on them.
NOT_READ = ("stage", "predictor_learning_rate", "predictor_grad_clip_norm", "predictor_validation",
            "predictor_save_folder_name", "pretrained_predictor_path", "finetuned_tokenizer_path", "n_layers",
            *EVALUATION_KEYS)


class TokenizerSpec(StageSpec):
    name = "tokenizer"
    config_keys = StageKeys("tokenizer_learning_rate", "tokenizer_save_folder_name", "grad_clip_norm",
                            "pretrained_tokenizer_path", models={"tokenizer": ("pretrained_tokenizer_path",)},
                            digest_excludes=NOT_READ,
                            linear_layers=("embed", "q_proj", "k_proj", "v_proj", "out_proj", "w1", "w2", "w3",
                                           "quant_embed", "post_quant_embed_pre", "post_quant_embed", "head"),
                            published={"pretrained_tokenizer_path": "NeoQuasar/Kronos-Tokenizer-base"})
    train_loss = TOKENIZER_TRAIN_LOSS
    learning_rate = TOKENIZER_LEARNING_RATE
    val_metric = TOKENIZER_VAL_METRIC
    initial_val_metric = TOKENIZER_INITIAL_VAL_METRIC
    heldout_loss = "tokenizer_loss"
    default_study = "kronos-lr-wd"
    champion_suffix = "-tokenizer"
    pipeline_verdict_tag = VERDICT_TAG  # held-out token loss against the starting weights
    pipeline_position = 1.0  # the pipeline's first step
    pipeline_flags = {"epochs": ("tokenizer epochs", "epochs"),
                      "learning_rate": ("tokenizer peak learning rate", "tokenizer_learning_rate")}

    def training(self, config, layout, info):
        from .training import TokenizerStage  # lazy: torch, mlflow, pandas

        return TokenizerStage()

    def build_model(self, config, training=None, *, tokenizer=None):
        """``pretrained_tokenizer_path`` when given, else fresh weights (base architecture)."""
        from ...model import KronosTokenizer  # lazy: torch

        path = source(config, "pretrained_tokenizer_path")  # auto: the published one when at hand
        return KronosTokenizer.from_pretrained(path) if path else KronosTokenizer(**model_kwargs(config))

    def layers(self, model):
        """The input projection ``embed``; the encoder's blocks, then the decoder's."""
        return [model.embed], [*model.encoder, *model.decoder]

    def heldout(self, training=None):
        from .heldout import PIECE  # lazy: torch, mlflow, pandas

        return PIECE

    def log_model(self, mlflow_logger, layout, config, result, heldout, dataset):
        from ...serving.model_logging import best_epoch_metrics, log_best_model  # lazy: torch, mlflow, pandas

        log_best_model(mlflow_logger, str(layout.best_model), config, step=max(result["best_epoch"], 0),
                       metrics=best_epoch_metrics(result), heldout_metrics=heldout, heldout_dataset=dataset)

    def model_problem(self, uri, tracking_uri):
        try:
            resolve_tokenizer(uri, "cpu", tracking_uri=tracking_uri, what="the logged model")
        except UserError as exc:
            return f"its logged model does not load ({exc})"
        return None

    def champion_test_loss(self, client, registered_model_name, version, config: Mapping[str, Any],
                           windows_digest):
        """The champion's tokenizer scored on the test windows ``windows_digest`` names (rebuilt
        from ``config``; None when they cannot be)."""
        from ...evaluation.windows import heldout_windows  # lazy: torch, numpy
        from .heldout import PIECE  # lazy: torch, mlflow, pandas

        windows = heldout_windows(config, "test")
        if not len(windows) or windows.digest != windows_digest:
            return None
        model = resolve_tokenizer(f"models:/{registered_model_name}/{version.version}", "cpu",
                                  tracking_uri=client.tracking_uri, what="the champion")
        print(f"[sweep] scoring the champion (version {version.version}) on the best trial's {len(windows):,} test "
              "windows", flush=True)
        _, metrics = PIECE.score(model, windows, "cpu", batch_size=int(as_section(config, "training").batch_size))
        return float(metrics[PIECE.loss])

    def check_objective(self, config: Mapping[str, Any], model) -> None:
        """``objective: val_skill`` forecasts with ``pretrained_predictor_path``'s predictor: it
        loads and pairs with ``model`` (one line naming it otherwise)."""
        if as_section(config, "training").objective in ("val_skill", "val_ic"):
            from ..predictor.sources import build_predictor  # lazy: torch, mlflow, pandas

            build_predictor(config, model)  # refuses a missing checkpoint or other bits


SPEC = TokenizerSpec()  # registered by the command (kronos_mlflow.stages.build_registry)
