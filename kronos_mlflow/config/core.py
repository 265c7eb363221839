"""One configuration dict for the whole job, with upstream Kronos's key names.

``load_config(overrides=None, path=None)`` starts from ``DEFAULTS``, merges a YAML file, then
``overrides`` (a mapping, e.g. parsed command-line flags), and validates the result. Every
error is a :class:`~kronos_mlflow.errors.ConfigError` whose message names the key to change.

Keys that exist in upstream's ``finetune/config.py`` keep its names and defaults. Short names
used on the command line and as MLproject parameters map onto them through ``ALIASES``
(``learning_rate`` -> ``tokenizer_learning_rate``, ``weight_decay`` -> ``adam_weight_decay``).

Credentials never live here: Comet reads ``COMET_API_KEY`` and MLflow reads
``MLFLOW_TRACKING_URI`` / ``MLFLOW_TRACKING_TOKEN`` / ``MLFLOW_TRACKING_PASSWORD`` from the
environment or their own config files. A key that looks like a secret is refused.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from . import published, checks
from ..errors import ConfigError
from .stage_keys import DEFAULT_STAGE, MLPROJECT_PARAMS
from .names import ascii_digits
from .model_spec import BASE_CONFIG, MAX_PARAMETERS, PREDICTOR_CONFIGS, count_parameters, count_predictor_parameters
from .checks import SEED_MAX
from .timeranges import (check_data_span, data_span, format_time_range, parse_date, parse_date_or_auto,  # noqa: F401
                         parse_time_range, time_bounds)
from .yamlfile import read_mapping

# Each entry: key -> (default, help). The type of the default is the type of the key
# (ints accept integral floats such as "1e5"; floats accept ints).
_SPEC: dict[str, tuple[Any, str]] = {
    # ---- data (upstream names and defaults) ----
    "qlib_data_path": ("", "Qlib provider directory (e.g. ~/.qlib/qlib_data/cn_data); empty (default) = the "
                       "built-in demo market."),
    "instrument": ("csi300", "Qlib instrument universe (a file under instruments/), e.g. csi300 or all."),
    "dataset_begin_time": ("auto", "First date read from Qlib; auto = the earliest start of the time ranges."),
    "dataset_end_time": ("auto", "Last date read from Qlib; auto = the latest end of the time ranges."),
    "lookback_window": (90, "Past steps per window; normalisation statistics come from this part."),
    "predict_window": (10, "Future steps per window (the window is lookback + predict + 1 long)."),
    "max_context": (512, "Longest context the forecasting model accepts (kept for compatibility)."),
    "feature_list": (["open", "high", "low", "close", "vol", "amt"], "The six K-line features, in order."),
    "time_feature_list": (["minute", "hour", "weekday", "day", "month"], "Calendar features, in order."),
    "train_time_range": (["2011-01-01", "2022-12-31"], "Training dates, START:END inclusive."),
    "val_time_range": (["2022-09-01", "2024-06-30"], "Validation dates (overlaps train to give its lookback)."),
    "test_time_range": (["2024-04-01", "2025-06-05"], "Test dates."),
    "dataset_path": ("./data/processed_datasets", "Where prepared splits are cached (safe formats, keyed)."),
    "clip": (5.0, "Normalised features are clipped to +-clip."),
    "num_workers": (0, "DataLoader worker processes per rank (windows are cheap: 0 is usually fastest)."),
    "freq": ("day", "Bar frequency read from Qlib: day, 1min, 5min, 15min, 30min or 60min."),
    "membership_gaps": ("split", "Index membership spans of one symbol: split (a window never crosses the gap between "
                                 "two spans) or join (the spans' bars form one series, as upstream)."),
    # ---- training (upstream names and defaults) ----
    "stage": (DEFAULT_STAGE, "What the run fine-tunes: tokenizer (stage one) or predictor (stage two: the Kronos "
                           "predictor on the frozen tokens of finetuned_tokenizer_path)."),
    "epochs": (30, "Training epochs."),
    "log_interval": (100, "Optimizer steps between console summaries."),
    "batch_size": (50, "Windows per optimizer step, per process."),
    "n_train_iter": (2000 * 50, "Training windows per epoch (over all processes)."),
    "n_val_iter": (400 * 50, "Validation windows per epoch (over all processes)."),
    "n_test_iter": (0, "Test windows the end-of-run evaluation scores (every test window up to this many, else an "
                       "evenly spaced subset of them); 0 = as many as n_val_iter."),
    "verdict_min_change": (0.005, "Smallest change of the test loss, as a fraction of the starting weights' (0.005 = "
                                  "0.5%), that the verdict calls better or worse; its whole 95% interval must lie "
                                  "beyond it."),
    "evaluate": ("on", "Predictor stage: score the fine-tuned pair against its zero-shot pair, persistence and (intraday) "
                       "seasonal naive on the test split's forecast origins at the end of the run: on or off."),
    "objective": ("val_loss", "What a sweep ranks trials by: val_loss (the validation loss, minimised) or val_skill "
                              "(each epoch's forecast skill against persistence on the validation split's origins, "
                              "maximised; a tokenizer forecasts with pretrained_predictor_path's predictor)."),
    "n_val_skill_windows": (500, "Most validation forecast origins objective val_skill scores each epoch (evenly "
                                 "spaced whole dates beyond it; each costs a forecast per epoch)."),
    "eval_stride": (0, "Calendar bars between two forecast origins of the scorecard; 0 = predict_window."),
    "n_eval_windows": (2000, "Most forecast origins the scorecard scores (evenly spaced whole dates beyond it)."),
    "eval_horizons": ("", "Forecast steps the scorecard also scores alone (test_mase_close_h<k>), comma separated, "
                          "each in 1..predict_window; empty = 1,5,predict_window."),
    "calibration": ("on", "on: quantiles and p_up recalibrated on validation origins, scored (finetuned_calibrated), "
                          "logged with the model and served by default (docs/calibration.md); off."),
    "calibration_min_origins": (30, "Fewest calibration origins (validation forecast origins) calibration on accepts."),
    "bootstrap_unit": ("date", "What the scorecard's bootstrap intervals resample: date (whole origin dates, since a "
                               "date's cross-section moves together) or origin (each origin alone)."),
    "inference_T": (0.6, "Sampling temperature of the scorecard's forecasts (upstream's inference default)."),
    "inference_top_p": (0.9, "Nucleus (top-p) sampling of the scorecard's forecasts, in (0, 1]."),
    "inference_top_k": (0, "Top-k sampling of the scorecard's forecasts; 0 = off (1 = greedy)."),
    "inference_sample_count": (5, "Sample paths per forecast origin in the scorecard."),
    "tokenizer_learning_rate": (2e-4, "Peak learning rate of the one-cycle schedule."),
    "accumulation_steps": (1, "Sub-batches each batch is split into (batch_size must divide evenly)."),
    "adam_beta1": (0.9, "AdamW beta1."),
    "adam_beta2": (0.95, "AdamW beta2."),
    "adam_weight_decay": (0.1, "AdamW weight decay."),
    "weight_decay_scope": ("all", "Parameters weight decay applies to: all (upstream) or matrices (2-D weights only)."),
    "grad_clip_norm": (2.0, "Gradients are clipped to this global norm before each step."),
    "cycle_momentum": ("on", "on (upstream's): the one-cycle schedule also cycles AdamW's beta1 between 0.85 and 0.95, "
                             "overriding adam_beta1; off: beta1 stays adam_beta1."),
    "predictor_learning_rate": (4e-5, "Predictor stage: peak learning rate of the one-cycle schedule."),
    "predictor_grad_clip_norm": (3.0, "Predictor stage: gradients are clipped to this global norm (upstream's 3.0)."),
    "predictor_validation": ("causal", "Predictor stage: causal (the s2 head never reads later positions, as in "
                                       "training) or upstream (eval-mode cross-attention reads them: upstream's "
                                       "optimistic validation loss, for exact replication)."),
    # ---- what a fine-tune trains (docs/finetune-modes.md) ----
    "finetune_mode": ("full", "What the run trains: full (every weight, upstream's), lora (low-rank adapters on "
                              "lora_targets through peft; the base weights stay frozen and the logged model is merged), "
                              "or freeze (the embeddings and the bottom freeze_layers blocks frozen, the rest trained)."),
    "lora_rank": (8, "finetune_mode lora: the rank r of each adapter (its B A has r columns and rows)."),
    "lora_alpha": (16.0, "finetune_mode lora: the adapters' scale is lora_alpha / lora_rank."),
    "lora_dropout": (0.0, "finetune_mode lora: dropout on each adapter's input, in [0, 1)."),
    "lora_targets": ("both", "finetune_mode lora: the Linear layers given adapters: attention (q_proj, k_proj, "
                             "v_proj, out_proj), ffn (w1, w2, w3), both, or a comma-separated list of layer names."),
    "freeze_layers": (2, "finetune_mode freeze: transformer blocks frozen from the bottom, with the embeddings "
                         "(a tokenizer's encoder blocks come first, then its decoder's)."),
    "seed": (100, "Random seed; each rank adds its rank."),
    "save_path": ("./outputs/models", "Root of the output directories."),
    "tokenizer_save_folder_name": ("finetune_tokenizer_demo", "Run folder under save_path."),
    "pretrained_tokenizer_path": ("auto", "Checkpoint directory or hub id; auto = the published "
                                          "NeoQuasar/Kronos-Tokenizer-base when the Hugging Face cache or hub has it, "
                                          "else fresh weights; fresh (or empty) = fresh weights, base architecture."),
    "predictor_save_folder_name": ("finetune_predictor_demo", "Predictor stage: run folder under save_path."),
    "pretrained_predictor_path": ("auto", "Predictor stage: checkpoint directory or hub id; auto = the published "
                                          "NeoQuasar/Kronos-small when the Hugging Face cache or hub has it, else "
                                          "fresh weights; fresh (or empty) = fresh weights, Kronos-mini's dropouts at "
                                          "the config's sizes."),
    "finetuned_tokenizer_path": ("", "Predictor stage: the frozen tokenizer: a checkpoint directory, "
                                     "runs:/<id>/best_model, models:/NAME@ALIAS or a hub id; empty = "
                                     "pretrained_tokenizer_path, else fresh tokenizer weights from the seed."),
    "device": ("auto", "auto (CUDA when present, else CPU), cpu, or cuda."),
    # ---- speed (none of these changes the numbers beyond float rounding, except precision bf16) ----
    "num_threads": (0, "Intra-op CPU threads per process; 0 = the CPUs this process may use / processes per node."),
    "compile": ("auto", "torch.compile the training model: auto (on for CUDA; on CPU for runs of 1000+ optimizer "
                        "steps, when a C++ compiler is present), on, or off."),
    "precision": ("auto", "auto (bf16 autocast and TF32 matmuls on CUDA, fp32 on CPU), fp32, or bf16 (autocast)."),
    "adamw_impl": ("auto", "AdamW kernel: auto (fused where torch has it, else foreach), fused, foreach, or for-loop."),
    "fused_layers": ("auto", "Stacked q/k/v and w1/w3 matmuls, one-pass rotary, one batched decoder pass (same numbers "
                             "to 1e-6): auto (on for CUDA, off on CPU, where it measured slower), on, or off."),
    "malloc_reuse": ("auto", "Keep freed tensor memory in the process for the next step instead of returning it to "
                             "the OS after every op (glibc): auto (on under glibc), on, or off (glibc's defaults)."),
    # ---- fresh-model architecture (used only when pretrained_tokenizer_path is empty) ----
    "d_model": (256, "Fresh model: hidden size."),
    "n_heads": (4, "Fresh model: attention heads."),
    "ff_dim": (512, "Fresh model: feed-forward size."),
    "n_enc_layers": (4, "Fresh model: encoder depth (n-1 blocks, as upstream)."),
    "n_dec_layers": (4, "Fresh model: decoder depth (n-1 blocks, as upstream)."),
    "n_layers": (4, "Fresh predictor: transformer blocks (it shares d_model, n_heads and ff_dim)."),
    "s1_bits": (10, "Fresh model: coarse code bits."),
    "s2_bits": (10, "Fresh model: fine code bits."),
    # ---- Qlib backtest of forecast signals (upstream's finetune/qlib_test.py names and defaults) ----
    "backtest_time_range": ([], "Backtest dates, START:END; empty (default) = the test range, from the first date "
                                "a signal has (upstream: 2024-07-01:2025-06-05)."),
    "backtest_n_symbol_hold": (0, "Backtest: symbols held (TopkDropoutStrategy's topk); 0 = upstream's 50, or a fifth "
                                  "of the symbols with a signal when that is fewer. A top-k holding half of them or "
                                  "more is skipped: it trades alike on any signal."),
    "backtest_n_symbol_drop": (5, "Backtest: held symbols swapped for better-scored ones each day (n_drop)."),
    "backtest_hold_thresh": (5, "Backtest: days a symbol is held before it may be sold (hold_thresh)."),
    "backtest_signal_stride": (1, "Backtest: trading days between two signal dates; the Kronos pairs forecast every "
                                  "symbol on each (1 = every day, as upstream; each date costs a forecast per "
                                  "symbol). 0 = the scorecard's origin dates only (no forecast of its own)."),
    "backtest_n_random": (20, "Backtest: random signals the fine-tuned signal is compared with, each one backtest "
                              "(backtest_random_*, tag backtest_verdict); 0 = none."),
    "backtest_benchmark": ("", "Backtest benchmark: a Qlib instrument code with a close series; empty = upstream's "
                               "index for the instrument (csi300 SH000300, csi800 SH000906, csi1000 SH000852; "
                               "SH000300 for any other universe)."),
    # ---- tracking ----
    "experiment_name": ("", "MLflow experiment; empty = MLFLOW_EXPERIMENT_NAME/ID or MLflow's default."),
    "run_name": ("", "MLflow run name; empty = one made from the learning rate and weight decay."),
    "registered_model_name": ("", "Register the best model under this name; empty = do not register."),
    "comet": ("auto", "auto (online when COMET_API_KEY is set, else off), online, offline, or off."),
    "comet_project_name": ("kronos-tokenizer", "Comet project."),
    "comet_workspace": ("", "Comet workspace; empty = the key's default."),
    "comet_offline_directory": ("", "Where offline Comet archives go; empty = COMET_OFFLINE_DIRECTORY or ./.cometml-runs."),
    "comet_tag": ("finetune_demo", "Tag added to the Comet experiment (upstream's key)."),
    "comet_name": ("finetune_demo", "Comet experiment name (upstream's key)."),
    "nproc_per_node": (1, "Processes per node the launcher started (recorded as a param)."),
    "system_metrics": ("on", "MLflow system metrics (CPU, memory, disk, network; GPU with nvidia-ml-py) on the run: "
                             "on or off."),
    "system_metrics_interval_s": (30.0, "Seconds between logged system-metric points (each the mean of 3 samples)."),
    # ---- fault tolerance ----
    "resume": ("auto", "Resume from {save_dir}/checkpoints/last: auto (when saved with the same config), "
                       "never (start over; the state is replaced), or must (refuse to start without one)."),
}

DEFAULTS: dict[str, Any] = {k: v[0] for k, v in _SPEC.items()}
HELP: dict[str, str] = {k: v[1] for k, v in _SPEC.items()}

# Short, user-facing names (MLproject parameters, command-line flags) -> config keys.
ALIASES: dict[str, str] = {
    "learning_rate": "tokenizer_learning_rate",
    "lr": "tokenizer_learning_rate",
    "weight_decay": "adam_weight_decay",
    "tokenizer": "finetuned_tokenizer_path",
}
from .stage_keys import (DATA_WINDOW_KEYS, EVALUATION_KEYS, STAGE_ALIASES, StageKeys,  # noqa: E402,F401
                         registered, stage_keys, stage_names, stage_of)

TIME_RANGE_KEYS = ("train_time_range", "val_time_range", "test_time_range")
#: Time ranges that may be empty ([] = a default range chosen where the key is used).
OPTIONAL_TIME_RANGE_KEYS = ("backtest_time_range",)
DATE_KEYS = ("dataset_begin_time", "dataset_end_time")
FREQS = ("day", "1min", "5min", "15min", "30min", "60min")
CHOICES: dict[str, tuple[str, ...]] = {
    "freq": FREQS,
    "membership_gaps": ("split", "join"),
    "comet": ("auto", "online", "offline", "off"),
    "device": ("auto", "cpu", "cuda"),
    "weight_decay_scope": ("all", "matrices"),
    "compile": ("auto", "on", "off"),
    "fused_layers": ("auto", "on", "off"),
    "malloc_reuse": ("auto", "on", "off"),
    "precision": ("auto", "fp32", "bf16"),
    "adamw_impl": ("auto", "fused", "foreach", "for-loop"),
    "resume": ("auto", "never", "must"),
    "system_metrics": ("on", "off"),
    "predictor_validation": ("causal", "upstream"),
    "cycle_momentum": ("on", "off"),
    "evaluate": ("on", "off"),
    "calibration": ("on", "off"),
    "objective": ("val_loss", "val_skill"),
    "bootstrap_unit": ("date", "origin"),
    "finetune_mode": ("full", "lora", "freeze"),
}
_POSITIVE = (
    "epochs", "batch_size", "n_train_iter", "n_val_iter", "tokenizer_learning_rate",
    "accumulation_steps", "lookback_window", "predict_window", "max_context", "clip",
    "grad_clip_norm", "log_interval", "d_model", "n_heads", "ff_dim", "n_enc_layers",
    "n_dec_layers", "s1_bits", "s2_bits", "nproc_per_node", "system_metrics_interval_s",
    "predictor_learning_rate", "predictor_grad_clip_norm", "n_layers",
    "backtest_hold_thresh", "n_eval_windows", "inference_T", "inference_sample_count",
    "n_val_skill_windows", "lora_rank", "lora_alpha", "calibration_min_origins",
)
_ON_OFF_KEYS = ("compile", "fused_layers", "malloc_reuse", "system_metrics", "cycle_momentum", "evaluate", "calibration")
_NON_NEGATIVE = ("adam_weight_decay", "num_workers", "seed", "num_threads", "n_test_iter", "backtest_n_symbol_drop",
                 "backtest_n_symbol_hold", "backtest_n_random", "backtest_signal_stride",
                 "freeze_layers",
                 "eval_stride", "inference_top_k")
_UNIT_OPEN = ("adam_beta1", "adam_beta2")
# Every number has a range. Sizes and counts that would allocate absurd amounts of memory or
# start absurd numbers of processes are refused up front; the seed is what every library takes
# (numpy's and Optuna's samplers: 32 bits); floats stay far inside float32 (the tensors' type).
MAX_VALUES = {"d_model": 65536, "ff_dim": 262144, "n_heads": 1024, "n_enc_layers": 256, "n_dec_layers": 256,
        "s1_bits": 31, "s2_bits": 31, "lookback_window": 100_000, "predict_window": 100_000,
        "batch_size": 10_000_000, "accumulation_steps": 10_000_000, "epochs": 1_000_000, "num_threads": 4096,
        "max_context": 1_000_000, "n_train_iter": 10**12, "n_val_iter": 10**12, "log_interval": 10**12,
        "num_workers": 256, "nproc_per_node": 256, "seed": SEED_MAX,
        "tokenizer_learning_rate": 1.0, "adam_weight_decay": 1e6, "clip": 1e30, "grad_clip_norm": 1e30,
        "system_metrics_interval_s": 86_400.0, "n_test_iter": 10**12,
        "predictor_learning_rate": 1.0, "predictor_grad_clip_norm": 1e30, "n_layers": 256,
        "backtest_n_symbol_hold": 100_000, "backtest_n_symbol_drop": 100_000, "backtest_hold_thresh": 100_000,
        "backtest_signal_stride": 10**9, "backtest_n_random": 10_000,
        "eval_stride": 10**9, "n_eval_windows": 10**9, "n_val_skill_windows": 10**9, "calibration_min_origins": 10**9, "inference_T": 1e6, "inference_top_k": 1 << 31,
        "inference_sample_count": 10_000, "lora_rank": 65536, "lora_alpha": 1e6, "freeze_layers": 512}
# inference_T: the forecasting loop's lowest temperature (model/sampling.py T_MIN, below it logits / T
# overflows); lookback_window: a forecast's lookback needs a spread to normalise by (model/predictor.py).
_MIN = {"system_metrics_interval_s": 0.1, "inference_T": 1e-4, "lookback_window": 2}
# Names that become one folder or file inside a parent directory.
_CHILD_NAMES = {"tokenizer_save_folder_name": "save_path", "predictor_save_folder_name": "save_path"}
# Paths that must be directories (or creatable as one); empty means "not used" where allowed.
DIRECTORY_KEYS = ("save_path", "dataset_path", "comet_offline_directory")

_SECRET_WORDS = {"token", "tokens", "password", "passwd", "pwd", "secret", "secrets", "credential",
                 "credentials", "apikey", "auth"}
_SECRET_PAIRS = re.compile(r"(api|access|private|secret)[_-]?key", re.IGNORECASE)


def canonical_key(name: str, stage: str = DEFAULT_STAGE) -> str:
    """Map a flag or parameter name (dashes or underscores, alias or key) onto a config key;
    ``learning_rate`` names the learning rate of ``stage``."""
    key = name.strip().lstrip("-").replace("-", "_")
    if key not in DEFAULTS:  # upstream's inference_T keeps its case; every other name is lower-case
        key = key.lower()
    if key in STAGE_ALIASES and stage in registered():
        return getattr(registered()[stage], STAGE_ALIASES[key])
    return ALIASES.get(key, key)


def is_secret_key(name: str) -> bool:
    """True for names that look like they hold a credential (api_key, token, password, ...)."""
    if _SECRET_PAIRS.search(name):
        return True
    return any(part in _SECRET_WORDS for part in re.split(r"[^a-z0-9]+", name.lower()))


def _unknown(key: str) -> ConfigError:
    if is_secret_key(key):
        return ConfigError(
            f"config key '{checks.shown(key)}' looks like a credential; credentials are never read from the config: "
            "set COMET_API_KEY / MLFLOW_TRACKING_TOKEN / MLFLOW_TRACKING_PASSWORD in the environment instead"
        )
    known = sorted(set(DEFAULTS) | set(ALIASES))
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"unknown config key '{checks.shown(key)}'{hint}; see `kronos-mlflow train --help` for the accepted keys")


def _coerce(key: str, value: Any) -> Any:
    default = DEFAULTS[key]
    if key in TIME_RANGE_KEYS:
        return parse_time_range(key, value)
    if key in OPTIONAL_TIME_RANGE_KEYS:
        empty = value is None or (isinstance(value, (str, list, tuple)) and not (value.strip() if isinstance(value, str)
                                                                                  else value))
        return [] if empty else parse_time_range(key, value)
    if key in DATE_KEYS:
        return parse_date_or_auto(key, value)
    if key in _ON_OFF_KEYS:
        # YAML reads a bare on/off/true/false as a boolean; the key takes them as on/off.
        text = str(value).strip().lower()
        if isinstance(value, bool) or text in ("true", "false", "yes", "no", "1", "0"):
            return "on" if (value if isinstance(value, bool) else text in ("true", "yes", "1")) else "off"
        return text
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: '{checks.shown(value)}' is not a boolean; expected true or false")
    if isinstance(default, int):
        if isinstance(value, bool):
            raise ConfigError(f"{key}: '{value}' is not an integer")
        if isinstance(value, int):  # however large: the ranges below refuse it by name
            return int(value)
        text = str(value).strip() if not isinstance(value, float) else ""
        checks.number_text(key, value, text, MAX_VALUES.get(key, 1.0))
        if re.fullmatch(r"[+-]?[0-9]+", text):  # exact: the ranges below refuse it by name
            return int(text)
        try:
            number = float(text) if not isinstance(value, float) else value
        except (ValueError, OverflowError):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not an integer") from None
        if not math.isfinite(number) or number != int(number):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not an integer")
        return int(number)
    if isinstance(default, float):
        if isinstance(value, bool):
            raise ConfigError(f"{key}: '{value}' is not a number")
        text = str(value).strip() if not isinstance(value, (int, float)) else ""
        checks.number_text(key, value, text, MAX_VALUES.get(key, 1.0))
        try:
            number = float(text) if not isinstance(value, (int, float)) else float(value)
        except (ValueError, OverflowError):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not a number") from None
        if not math.isfinite(number):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not a finite number")
        return number
    if isinstance(default, list):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not a list of names")
        return [i.strip() for i in items]
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)):
        raise ConfigError(f"{key}: '{checks.shown(value)}' is not a string")
    return str(value)


def validate(config: Mapping[str, Any]) -> dict[str, Any]:
    """Coerce and check every key; return a new dict. Raises ConfigError naming the key."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key not in DEFAULTS:
            raise _unknown(key)
        out[key] = _coerce(key, value)
    for key in DEFAULTS:
        out.setdefault(key, copy.deepcopy(DEFAULTS[key]))
    for key in _POSITIVE:
        if out[key] <= 0:
            raise ConfigError(f"{key}: {checks.shown(repr(config.get(key, out[key])))} must be greater than 0")
    for key in _NON_NEGATIVE:
        if out[key] < 0:
            raise ConfigError(f"{key}: {checks.shown(repr(config.get(key, out[key])))} must be 0 or greater")
    for key in _UNIT_OPEN:
        if not 0.0 <= out[key] < 1.0:
            raise ConfigError(f"{key}: {out[key]!r} must be in [0, 1)")
    if not 0.0 <= out["verdict_min_change"] < 1.0:
        raise ConfigError(f"verdict_min_change: {out['verdict_min_change']!r} must be in [0, 1): a fraction of the "
                          "starting weights' test loss (0.005 = 0.5%)")
    horizons(out)  # eval_horizons: steps inside the forecast
    if not 0.0 <= out["lora_dropout"] < 1.0:
        raise ConfigError(f"lora_dropout: {out['lora_dropout']!r} must be in [0, 1)")
    lora_targets(out)  # names of Linear layers the stage's models have
    if not 0.0 < out["inference_top_p"] <= 1.0:
        raise ConfigError(f"inference_top_p: {out['inference_top_p']!r} must be in (0, 1] (upstream's 0.9)")
    for key, limit in MAX_VALUES.items():
        if out[key] > limit:
            raise ConfigError(f"{key}: {checks.shown(out[key])} is too large; expected at most {checks.limit_text(limit)}")
    for key, limit in _MIN.items():
        if out[key] < limit:
            raise ConfigError(f"{key}: {checks.shown(out[key])} is too small; expected at least {checks.limit_text(limit)}")
    if not checks.NAME_RE.match(out["instrument"]):
        raise ConfigError(
            f"instrument: '{checks.shown(out['instrument'])}' is not a universe name; expected the name of a file "
            "under <qlib_data_path>/instruments/ (letters, digits, '_', '.', '-'), e.g. csi300 or all"
        )
    for key, parent in _CHILD_NAMES.items():
        checks.child_name(key, out[key], parent)
    checks.mlflow_experiment_name("experiment_name", out["experiment_name"])
    checks.mlflow_model_name("registered_model_name", out["registered_model_name"])
    checks.mlflow_run_name("run_name", out["run_name"])
    for key, choices in {**CHOICES, "stage": stage_names()}.items():
        if out[key] not in choices:
            raise ConfigError(f"{key}: '{checks.shown(out[key])}' is not one of {', '.join(choices)}")
    if out["backtest_n_symbol_hold"] and out["backtest_n_symbol_drop"] > out["backtest_n_symbol_hold"]:
        raise ConfigError(f"backtest_n_symbol_drop: {out['backtest_n_symbol_drop']} is more than backtest_n_symbol_hold "
                          f"{out['backtest_n_symbol_hold']}; expected 0 to backtest_n_symbol_hold")
    if out["backtest_benchmark"] and not checks.NAME_RE.match(out["backtest_benchmark"]):
        raise ConfigError(f"backtest_benchmark: '{checks.shown(out['backtest_benchmark'])}' is not an instrument code; "
                          "expected a Qlib code such as SH000300 (letters, digits, '_', '.', '-'), or empty")
    if out["batch_size"] % out["accumulation_steps"]:
        raise ConfigError(
            f"batch_size {out['batch_size']} is not divisible by accumulation_steps {out['accumulation_steps']}; "
            "choose values so that batch_size % accumulation_steps == 0"
        )
    if out["d_model"] % out["n_heads"] or (out["d_model"] // out["n_heads"]) % 2:
        raise ConfigError(
            f"d_model {out['d_model']} must split into n_heads {out['n_heads']} heads of even size"
        )
    if len(out["feature_list"]) != 6:
        raise ConfigError(f"feature_list: {checks.shown(out['feature_list'])} must name 6 features (open high low close vol amt)")
    if len(out["time_feature_list"]) != 5:
        raise ConfigError(f"time_feature_list: {checks.shown(out['time_feature_list'])} must name 5 calendar features")
    check_data_span(out)
    check_models_and_objective(out)
    return out


def check_models_and_objective(out: Mapping[str, Any]) -> None:
    """The checks across keys of the models a config builds and of its objective: fresh models
    within the parameter limit; ``objective: val_skill`` with what it forecasts with and on."""
    models = stage_keys(out).models
    # auto: fresh unless the published checkpoint is at hand (kronos_mlflow/config/published.py)
    fresh = {model for model, keys in models.items() if not any(published.source(out, key) for key in keys)}
    if "predictor" in fresh:
        sizes = {**PREDICTOR_CONFIGS["Kronos-mini"], **{k: out[k] for k in ("n_layers", "d_model", "n_heads", "ff_dim",
                                                                             "s1_bits", "s2_bits")}}
        n = count_predictor_parameters(sizes)
        if n > MAX_PARAMETERS:
            raise ConfigError(
                f"d_model {out['d_model']}, ff_dim {out['ff_dim']} and n_layers {out['n_layers']} give a fresh predictor "
                f"of {n:,} parameters; expected at most {MAX_PARAMETERS:,}: lower them")
    if out["objective"] == "val_skill" and "predictor" not in models and not published.source(
            out, "pretrained_predictor_path"):
        said = ("auto found no published predictor: " + published.reason(out, "pretrained_predictor_path")
                if out["pretrained_predictor_path"].strip().lower() == published.AUTO else
                "pretrained_predictor_path is " + (out["pretrained_predictor_path"].strip() or "empty"))
        raise ConfigError("objective val_skill for the tokenizer forecasts with pretrained_predictor_path's predictor "
                          f"on each epoch's tokenizer, and {said}; expected a predictor "
                          "checkpoint with the tokenizer's bits (e.g. NeoQuasar/Kronos-small), or objective val_loss")
    if out["objective"] == "val_skill" and (time_bounds(*out["val_time_range"])[1]
                                            <= time_bounds(*out["train_time_range"])[1]):
        raise ConfigError(f"objective val_skill forecasts the bars of val_time_range after train_time_range, and "
                          f"val_time_range {format_time_range(out['val_time_range'])} ends no later than train_time_range "
                          f"{format_time_range(out['train_time_range'])}; expected a val_time_range that goes "
                          "past the end of training, or objective val_loss")
    trained = "predictor" if "predictor" in models else "tokenizer"
    if out["finetune_mode"] == "freeze" and trained in fresh:
        blocks = (out["n_layers"] if "predictor" in models else out["n_enc_layers"] - 1 + out["n_dec_layers"] - 1)
        if out["freeze_layers"] > blocks:
            raise ConfigError(f"freeze_layers: {out['freeze_layers']} is more than the {blocks} transformer blocks of the "
                              f"fresh {out['stage']}; expected 0 to {blocks}")
    if "tokenizer" in fresh:
        # Sizes that are each allowed can still multiply into gigabytes: refuse before anything
        # is allocated (a checkpoint's config.json gets the same check in model/spec.py).
        n = fresh_parameter_count(out)
        if n > MAX_PARAMETERS:
            raise ConfigError(
                f"d_model {out['d_model']}, ff_dim {out['ff_dim']}, n_enc_layers {out['n_enc_layers']} and "
                f"n_dec_layers {out['n_dec_layers']} give {n:,} parameters (about {n * 16 / 1e9:,.0f} GB to train "
                f"with AdamW); expected at most {MAX_PARAMETERS:,}: lower them"
            )


def fresh_parameter_count(config: Mapping[str, Any]) -> int:
    """Trainable parameters of a fresh tokenizer built from ``config`` (no torch needed)."""
    return count_parameters(model_kwargs(config))


#: ``lora_targets``' groups: the Linear layers of every transformer block of both models.
LORA_GROUPS = {"attention": ("q_proj", "k_proj", "v_proj", "out_proj"), "ffn": ("w1", "w2", "w3")}
LORA_GROUPS["both"] = LORA_GROUPS["attention"] + LORA_GROUPS["ffn"]


def lora_targets(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``lora_targets`` as Linear layer names: a group of :data:`LORA_GROUPS`, or names the
    stage's models have (``stage_keys(config).linear_layers``); one line naming them otherwise."""
    raw = str(config.get("lora_targets") or "").strip()
    if raw in LORA_GROUPS:
        return LORA_GROUPS[raw]
    known = stage_keys(config).linear_layers
    names = [part.strip() for part in raw.split(",")]
    if not raw or not all(name in known for name in names):
        bad = next((name for name in names if name not in known), raw)
        raise ConfigError(f"lora_targets: '{checks.shown(bad)}' matches no Linear layer of the {stage_of(config)}; "
                          f"expected {', '.join(LORA_GROUPS)}, or names among {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def horizons(config: Mapping[str, Any]) -> list[int]:
    """``eval_horizons`` as steps (ascending, distinct); empty: 1, 5 and ``predict_window`` (those inside it)."""
    horizon, raw = int(config["predict_window"]), str(config.get("eval_horizons") or "").strip()
    default = sorted({k for k in (1, 5, horizon) if k <= horizon})
    if not raw:
        return default
    steps = [part.strip() for part in raw.split(",")]
    if not all(ascii_digits(s) and len(s) <= 7 and 1 <= int(s) <= horizon for s in steps):
        raise ConfigError(f"eval_horizons: {checks.shown(raw)} is not a comma-separated list of forecast steps; expected "
                          f"integers in 1..predict_window ({horizon}), e.g. {','.join(map(str, default))}")
    return sorted({int(s) for s in steps})


def load_config(overrides: Mapping[str, Any] | None = None, path: str | os.PathLike | None = None, *,
                beneath: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults, then ``beneath`` (what a scoring command takes from the run it scores), then
    the YAML file at ``path``, then ``overrides``; validated.

    Keys may be given as config keys or aliases, with dashes or underscores.
    """
    merged: dict[str, Any] = {canonical_key(str(name)): value for name, value in (beneath or {}).items()}
    sources: list[Mapping[str, Any]] = []
    if path:
        sources.append(read_mapping(path, "config file", "must hold a mapping of key: value"))
    if overrides:
        sources.append(overrides)
    stage = DEFAULT_STAGE
    for source in sources:  # the stage decides what learning_rate names: read it first
        for name, value in source.items():
            if canonical_key(str(name)) == "stage":
                stage = str(value).strip()
    if path:
        _one_name_each(sources[0], path, stage)
    for source in sources:
        for name, value in source.items():
            merged[canonical_key(str(name), stage)] = value
    return check_paths(validate(merged))


def _one_name_each(source: Mapping[str, Any], path, stage: str) -> None:
    """A config file sets each key once: two names of one key (``learning_rate`` and
    ``tokenizer_learning_rate`` for the tokenizer, ``Epochs`` and ``epochs``) are refused like a
    key given twice."""
    seen: dict[str, str] = {}
    for name in source:
        key = canonical_key(str(name), stage)
        if key in seen:
            raise ConfigError(f"config file '{path}' sets {checks.shown(key)} twice (as '{checks.shown(seen[key])}' "
                              f"and '{checks.shown(name)}'); each key may appear once")
        seen[key] = str(name)


def check_paths(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The output paths (``save_path``, ``dataset_path``, ``comet_offline_directory``) are
    directories or can be created as one: a regular file there, or a folder above it that is a
    file or not writable, is refused now rather than after the run has started. Returns ``config``."""
    for key in DIRECTORY_KEYS:
        if key == "comet_offline_directory" and not config[key]:
            continue
        checks.directory(key, config[key])
    return config


def flatten(config: Mapping[str, Any]) -> dict[str, str]:
    """Strings for logging as params: lists joined (time ranges as START:END)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if is_secret_key(key):
            continue
        if key in TIME_RANGE_KEYS or (key in OPTIONAL_TIME_RANGE_KEYS and value):
            out[key] = format_time_range(value)
        elif isinstance(value, (list, tuple)):
            out[key] = ",".join(map(str, value))
        else:
            out[key] = str(value)
    return out


def model_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments for a fresh tokenizer: the base hyper-parameters with the config's sizes."""
    sizes = ("d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits", "s2_bits")
    return {**BASE_CONFIG, **{key: config[key] for key in sizes}}


def run_params(config: Mapping[str, Any]) -> dict[str, str]:
    """What a run records as params: the MLproject names (``learning_rate`` the stage's own),
    then the whole resolved config."""
    flat = flatten(config)
    stage = stage_of(config)
    names = list(MLPROJECT_PARAMS) + list(stage_keys(config).mlproject_params)
    params = {name: flat[canonical_key(name, stage)] for name in names}
    params.update(flat)
    return params
