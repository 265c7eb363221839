"""The config keys of each stage: which key plays which role (its learning rate, run folder,
gradient clipping, starting checkpoint), what each model it builds is loaded from, its entry
point's own MLproject parameters and the keys left out of its digest. Data only, read by
:mod:`kronos_mlflow.config.core` while a config is loaded and by each stage's spec
(:mod:`kronos_mlflow.stages`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


#: MLproject parameter names -> config keys; a run logs both spellings as params.
MLPROJECT_PARAMS: dict[str, str] = {
    "epochs": "epochs",
    "learning_rate": "tokenizer_learning_rate",
    "weight_decay": "adam_weight_decay",
    "batch_size": "batch_size",
    "accumulation_steps": "accumulation_steps",
    "n_train_iter": "n_train_iter",
    "n_val_iter": "n_val_iter",
    "n_test_iter": "n_test_iter",
    "nproc_per_node": "nproc_per_node",
    "qlib_data_path": "qlib_data_path",
    "instrument": "instrument",
    "freq": "freq",
    "membership_gaps": "membership_gaps",
    "dataset_begin_time": "dataset_begin_time",
    "dataset_end_time": "dataset_end_time",
    "train_time_range": "train_time_range",
    "val_time_range": "val_time_range",
    "test_time_range": "test_time_range",
    "pretrained_tokenizer_path": "pretrained_tokenizer_path",
    "seed": "seed",
    "comet": "comet",
    "registered_model_name": "registered_model_name",
    "finetune_mode": "finetune_mode",
    "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "lora_targets": "lora_targets",
    "freeze_layers": "freeze_layers",
}

#: The scorecard's keys (a predictor run's end-of-run evaluation; docs/forecast-evaluation.md).
EVALUATION_KEYS = ("evaluate", "eval_stride", "n_eval_windows", "inference_T", "inference_top_p", "inference_top_k",
                   "inference_sample_count", "eval_horizons", "bootstrap_unit", "calibration", "calibration_min_origins",
                   "backtest_time_range",
                   "backtest_n_symbol_hold", "backtest_n_symbol_drop", "backtest_hold_thresh", "backtest_benchmark",
                   "backtest_signal_stride", "backtest_n_random")
#: Where the windows come from and how long they are: what a scoring command (``evaluate``,
#: ``evaluate-tokenizer``) takes from the run that made the model it scores, unless given.
DATA_WINDOW_KEYS = ("qlib_data_path", "instrument", "freq", "membership_gaps", "dataset_begin_time",
                    "dataset_end_time", "train_time_range", "val_time_range", "test_time_range",
                    "lookback_window", "predict_window", "max_context", "clip")
#: Where a command writes (its data cache, its outputs, their folders): always the command's own
#: (its config file, flags, defaults), never taken from a run's recorded settings.
PLACES_TO_WRITE = ("dataset_path", "save_path", "comet_offline_directory", "tokenizer_save_folder_name",
                   "predictor_save_folder_name")
#: What only a predictor run reads: left out of a tokenizer run's digest, so that a tokenizer
#: run's directory and training state do not depend on them.
PREDICTOR_ONLY_KEYS = ("stage", "predictor_learning_rate", "predictor_grad_clip_norm", "predictor_validation",
                       "predictor_save_folder_name", "pretrained_predictor_path", "finetuned_tokenizer_path",
                       "n_layers", *EVALUATION_KEYS)


@dataclass(frozen=True)
class StageKeys:
    """The config keys of one stage, resolved when a config is loaded (``learning_rate`` names
    the stage's own); the stage's spec (:mod:`kronos_mlflow.stages`) reads them from here,
    because a config is loaded and checked before any stage code runs."""

    learning_rate: str  # its learning rate
    save_folder: str  # its run folder under save_path
    grad_clip: str  # its gradient clipping norm
    pretrained: str  # the checkpoint it starts from ('' : fresh weights)
    #: what each model the run builds is loaded from (the first key set wins; none: fresh weights)
    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    mlproject_params: tuple[str, ...] = ()  # its entry point's own MLproject parameters (besides main's)
    digest_excludes: tuple[str, ...] = ()  # keys it never reads: left out of its config digest
    #: the names of its model's Linear layers (what ``lora_targets`` may name)
    linear_layers: tuple[str, ...] = ()


#: Each stage's keys (upstream's names).
STAGE_CONFIG: dict[str, StageKeys] = {
    "tokenizer": StageKeys("tokenizer_learning_rate", "tokenizer_save_folder_name", "grad_clip_norm",
                           "pretrained_tokenizer_path", models={"tokenizer": ("pretrained_tokenizer_path",)},
                           digest_excludes=PREDICTOR_ONLY_KEYS,
                           linear_layers=("embed", "q_proj", "k_proj", "v_proj", "out_proj", "w1", "w2", "w3",
                                          "quant_embed", "post_quant_embed_pre", "post_quant_embed", "head")),
    "predictor": StageKeys("predictor_learning_rate", "predictor_save_folder_name", "predictor_grad_clip_norm",
                           "pretrained_predictor_path",
                           models={"tokenizer": ("finetuned_tokenizer_path", "pretrained_tokenizer_path"),
                                   "predictor": ("pretrained_predictor_path",)},
                           mlproject_params=("tokenizer", "pretrained_predictor_path"),
                           linear_layers=("fusion_proj", "q_proj", "k_proj", "v_proj", "out_proj", "w1", "w2", "w3",
                                          "proj_s1", "proj_s2")),
}
STAGES = tuple(STAGE_CONFIG)
#: Aliases that name the running stage's own key (``learning_rate`` of a predictor run is
#: ``predictor_learning_rate``).
STAGE_ALIASES = {"learning_rate": "learning_rate", "lr": "learning_rate"}


def stage_keys(config: Mapping[str, Any]) -> StageKeys:
    """The keys of the config's stage (a loaded config's ``stage`` is one of :data:`STAGES`)."""
    return STAGE_CONFIG[str(config.get("stage", "tokenizer"))]
