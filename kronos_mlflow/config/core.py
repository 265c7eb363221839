"""One configuration dict for the whole job, with upstream Kronos's key names.

``load_config(overrides=None, path=None)`` starts from ``DEFAULTS``, merges a YAML file, then
``overrides`` (a mapping, e.g. parsed command-line flags), and validates the result. Every
error is a :class:`~kronos_mlflow.errors.ConfigError` whose message names the key to change.
Each key is declared once, with its section, default, help and rules, in
:mod:`kronos_mlflow.config.keys`; :func:`kronos_mlflow.config.sections.sections` gives a
validated config as typed, frozen sections.

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
import os
from collections.abc import Mapping
from typing import Any

from . import published, checks
from ..errors import ConfigError
from .stage_keys import DEFAULT_STAGE, MLPROJECT_PARAMS
from .model_spec import BASE_CONFIG, MAX_PARAMETERS, PREDICTOR_CONFIGS, count_parameters, count_predictor_parameters
from .keys import KEY, KEYS, LORA_GROUPS, horizons, lora_targets  # noqa: F401
from .timeranges import (check_data_span, data_span, format_time_range, parse_date, parse_date_or_auto,  # noqa: F401
                         parse_time_range, time_bounds)
from .yamlfile import read_mapping
from .secrets import is_secret_key  # noqa: F401 - the one secret rule set: kronos_mlflow/config/secrets.py

#: key -> its default and its help, from the declarations (:data:`kronos_mlflow.config.keys.KEYS`).
DEFAULTS: dict[str, Any] = {key.name: key.default for key in KEYS}
HELP: dict[str, str] = {key.name: key.help for key in KEYS}

# Short, user-facing names (MLproject parameters, command-line flags) -> config keys.
ALIASES: dict[str, str] = {
    "learning_rate": "tokenizer_learning_rate",
    "lr": "tokenizer_learning_rate",
    "weight_decay": "adam_weight_decay",
    "tokenizer": "finetuned_tokenizer_path",
}
from .keys import DATA_WINDOW_KEYS, EVALUATION_KEYS  # noqa: E402,F401
from .stage_keys import (STAGE_ALIASES, StageKeys, registered, stage_keys, stage_names, stage_of)  # noqa: E402,F401

# Views of the declarations for the modules that read them (the rules live on each Key).
TIME_RANGE_KEYS = tuple(key.name for key in KEYS if key.kind == "time_range")
#: Time ranges that may be empty ([] = a default range chosen where the key is used).
OPTIONAL_TIME_RANGE_KEYS = tuple(key.name for key in KEYS if key.kind == "optional_time_range")
DATE_KEYS = tuple(key.name for key in KEYS if key.kind == "date")
FREQS = KEY["freq"].choices
#: key -> the values it accepts (keys with a fixed set; ``stage`` accepts the registered stages).
CHOICES: dict[str, tuple[str, ...]] = {key.name: key.choices for key in KEYS if isinstance(key.choices, tuple)
                                       and key.choices}
#: key -> its largest value (every number has one, or a rule of its own: a fraction, a probability).
MAX_VALUES: dict[str, int | float] = {key.name: key.high for key in KEYS if key.high is not None}
# Paths that must be directories (or creatable as one); empty means "not used" where allowed.
DIRECTORY_KEYS = tuple(key.name for key in KEYS if key.directory)



def canonical_key(name: str, stage: str = DEFAULT_STAGE) -> str:
    """Map a flag or parameter name (dashes or underscores, alias or key) onto a config key;
    ``learning_rate`` names the learning rate of ``stage``."""
    key = name.strip().lstrip("-").replace("-", "_")
    if key not in DEFAULTS:  # upstream's inference_T keeps its case; every other name is lower-case
        key = key.lower()
    if key in STAGE_ALIASES and stage in registered():
        return getattr(registered()[stage], STAGE_ALIASES[key])
    return ALIASES.get(key, key)


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


def validate(config: Mapping[str, Any]) -> dict[str, Any]:
    """Coerce and check every key; return a new dict. Raises ConfigError naming the key."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key not in DEFAULTS:
            raise _unknown(key)
        out[key] = KEY[key].coerce(value)
    for key in DEFAULTS:
        out.setdefault(key, copy.deepcopy(DEFAULTS[key]))
    for key in KEYS:  # each key's own rules (its sign, range, own check, place, choices): keys.py
        key.check(out, config)
    if out["backtest_n_symbol_hold"] and out["backtest_n_symbol_drop"] > out["backtest_n_symbol_hold"]:
        raise ConfigError(f"backtest_n_symbol_drop: {out['backtest_n_symbol_drop']} is more than backtest_n_symbol_hold "
                          f"{out['backtest_n_symbol_hold']}; expected 0 to backtest_n_symbol_hold")
    if out["batch_size"] % out["accumulation_steps"]:
        raise ConfigError(
            f"batch_size {out['batch_size']} is not divisible by accumulation_steps {out['accumulation_steps']}; "
            "choose values so that batch_size % accumulation_steps == 0"
        )
    if out["d_model"] % out["n_heads"] or (out["d_model"] // out["n_heads"]) % 2:
        raise ConfigError(
            f"d_model {out['d_model']} must split into n_heads {out['n_heads']} heads of even size"
        )
    check_data_span(out)
    check_models_and_objective(out)
    return out


def check_models_and_objective(out: Mapping[str, Any], *, hub: bool = False) -> None:
    """The checks across keys of the models a config builds and of its objective: fresh models
    within the parameter limit; ``objective: val_skill`` with what it forecasts with and on.

    ``auto`` counts as what it resolves to (kronos_mlflow/config/published.py): without ``hub``
    (validation) only as far as the Hugging Face cache tells, and a check that waits on the hub's
    answer is left to the record made after validation, which asks with ``hub``
    (:func:`kronos_mlflow.training.resolved.resolve`)."""
    models = stage_keys(out).models
    start = published.source if hub else published.known
    starts = {key: start(out, key) for keys in models.values() for key in keys}
    # auto: fresh unless the published checkpoint is at hand; a model whose start waits on the hub: not yet known
    fresh = {model for model, keys in models.items()
             if not any(starts[key] for key in keys) and not any(starts[key] is None for key in keys)}
    if "predictor" in fresh:
        sizes = {**PREDICTOR_CONFIGS["Kronos-mini"], **{k: out[k] for k in ("n_layers", "d_model", "n_heads", "ff_dim",
                                                                             "s1_bits", "s2_bits")}}
        n = count_predictor_parameters(sizes)
        if n > MAX_PARAMETERS:
            raise ConfigError(
                f"d_model {out['d_model']}, ff_dim {out['ff_dim']} and n_layers {out['n_layers']} give a fresh predictor "
                f"of {n:,} parameters; expected at most {MAX_PARAMETERS:,}: lower them")
    if out["objective"] in ("val_skill", "val_ic") and "predictor" not in models and start(
            out, "pretrained_predictor_path") == "":
        said = ("auto found no published predictor: " + published.reason(out, "pretrained_predictor_path")
                if out["pretrained_predictor_path"].strip().lower() == published.AUTO else
                "pretrained_predictor_path is " + (out["pretrained_predictor_path"].strip() or "empty"))
        raise ConfigError(f"objective {out['objective']} for the tokenizer forecasts with pretrained_predictor_path's "
                          "predictor "
                          f"on each epoch's tokenizer, and {said}; expected a predictor "
                          "checkpoint with the tokenizer's bits (e.g. NeoQuasar/Kronos-small), or objective val_loss")
    if out["objective"] in ("val_skill", "val_ic") and (time_bounds(*out["val_time_range"])[1]
                                                   <= time_bounds(*out["train_time_range"])[1]):
        raise ConfigError(f"objective {out['objective']} forecasts the bars of val_time_range after train_time_range, and "
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
