"""The config digest: which config keys decide the numbers a run produces, and their SHA-256.

Two users read it and must agree: the run directory's key (:func:`kronos_mlflow.config.layout.run_key`,
so another config never touches this run's files) and the training state (:mod:`kronos_mlflow.training.checkpoint`,
so a run resumes only with the config its state was made for).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from . import published
from .core import is_secret_key
from .stage_keys import registered, stage_of

__all__ = ["RESULT_NEUTRAL_KEYS", "digest_config", "config_digest"]

#: Config keys that do not change the numbers training produces: where things are written, how
#: they are named or tracked, how fast they are computed (threads, compile, kernel choice,
#: fused layers: same numbers up to float rounding), how often the console prints, the resume
#: switch itself, and the settings of the end-of-run test evaluation. Everything else (data,
#: sizes, optimizer, schedule, epochs, seed, precision, world size) is in the digest: resuming
#: with another value would continue a schedule or data order the checkpoint was not made for.
RESULT_NEUTRAL_KEYS = frozenset({
    # tracking and naming
    "experiment_name", "run_name", "registered_model_name",
    "comet", "comet_project_name", "comet_workspace", "comet_offline_directory", "comet_tag", "comet_name",
    "system_metrics", "system_metrics_interval_s",
    # console and locations (the save directory itself is where the state lives)
    "log_interval", "save_path", "tokenizer_save_folder_name", "predictor_save_folder_name", "dataset_path",
    # speed only: the epoch order is a pure function of (seed, epoch), whatever the workers
    "num_workers", "num_threads", "compile", "adamw_impl", "fused_layers", "malloc_reuse", "device",
    # recorded from the launcher; the real process count is passed as world_size
    "nproc_per_node",
    # the switch that decides whether to resume
    "resume",
    # the end-of-run test evaluation only (which test windows, what the verdict calls a change):
    # training does the same with any value, so a killed run resumes whatever they are now
    "n_test_iter", "verdict_min_change",
    # the Qlib backtest of the forecasts, after training
    "backtest_time_range", "backtest_n_symbol_hold", "backtest_n_symbol_drop", "backtest_hold_thresh",
    "backtest_benchmark", "backtest_signal_stride", "backtest_n_random",
    # the scorecard after training (docs/forecast-evaluation.md)
    "evaluate", "eval_stride", "n_eval_windows", "inference_T", "inference_top_p", "inference_top_k",
    "inference_sample_count", "eval_horizons", "bootstrap_unit", "calibration", "calibration_min_origins",
    # what a run measures besides training (objective val_skill forecasts inside a forked
    # random state: the training numbers are the same)
    "objective", "n_val_skill_windows",
})
#: Keys added after runs were made, left out of the digest at their default (which is what
#: those runs did): a run made before the key existed keeps its directory and resumes.
DEFAULT_OMITTED = {"cycle_momentum": "on", "finetune_mode": "full"}
#: Keys only one fine-tune mode reads: left out of the digest under the other modes.
MODE_KEYS = {"lora_rank": "lora", "lora_alpha": "lora", "lora_dropout": "lora", "lora_targets": "lora",
             "freeze_layers": "freeze"}


def digest_config(config: Mapping[str, Any], *, world_size: int | None = None) -> dict[str, Any]:
    """The part of ``config`` that decides the numbers: :data:`RESULT_NEUTRAL_KEYS` and
    credential-looking keys removed, ``world_size`` added when given. JSON types only."""
    out: dict[str, Any] = {}
    # A stage leaves out the keys it never reads (a tokenizer run the predictor's: its digest is
    # the same as before they existed).
    keys = registered().get(stage_of(config))
    other_stage = keys.digest_excludes if keys is not None else ()
    for key in sorted(config):
        if key in RESULT_NEUTRAL_KEYS or key in other_stage or is_secret_key(str(key)):
            continue
        if key in DEFAULT_OMITTED and config[key] == DEFAULT_OMITTED[key]:
            continue
        if key in MODE_KEYS and config.get("finetune_mode", "full") != MODE_KEYS[key]:
            continue
        # auto and fresh as what they chose: '' (fresh weights, what an empty value always meant) or
        # the published hub id, so a fresh start and a published one never share a digest
        out[str(key)] = _plain(published.source(config, key) if key in published.PUBLISHED else config[key])
    if world_size is not None:
        out["world_size"] = int(world_size)
    return out


def config_digest(config: Mapping[str, Any], *, world_size: int | None = None) -> str:
    """SHA-256 (hex) of the canonical JSON of :func:`digest_config`.

    Canonical: keys sorted, no whitespace, ASCII, floats as Python's shortest repr (so
    ``2e-4`` and ``0.0002`` in a YAML file give the same digest once the config is validated).
    """
    text = json.dumps(digest_config(config, world_size=world_size), sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
