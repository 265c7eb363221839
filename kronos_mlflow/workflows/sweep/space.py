"""The search space file (``sweeps/search_space.yaml``) and drawing a trial's parameters from it."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...config.core import ALIASES, CHOICES, MAX_VALUES
from ...errors import ConfigError
from ...config.checks import shown
from ...config.yamlfile import read_mapping

DEFAULT_SPACE = Path(__file__).resolve().parents[3] / "sweeps" / "search_space.yaml"
PARAMS = ("learning_rate", "weight_decay")
#: What a space may add (docs/finetune-modes.md): the fine-tune mode as a choice, and two integers
#: (each drawn only for the mode that reads it when the space draws the mode too).
CHOICE_PARAMS = {"finetune_mode": CHOICES["finetune_mode"]}
INT_PARAMS = {"lora_rank": ("lora", 1), "freeze_layers": ("freeze", 0)}  # name -> (its mode, lowest value)
OPTIONAL = (*CHOICE_PARAMS, *INT_PARAMS)


def _config_max() -> dict[str, float]:
    return {name: float(MAX_VALUES[ALIASES[name]]) for name in PARAMS}


_CONFIG_MAX = _config_max()


def load_search_space(path: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """Read and check the YAML search space; errors name the parameter and what is accepted."""
    path = Path(path or DEFAULT_SPACE)
    raw = read_mapping(path, "search space file", "must map parameter names to ranges")
    unknown = set(raw) - set(PARAMS) - set(OPTIONAL)
    if unknown:
        raise ConfigError(f"search space: unknown parameter '{shown(sorted(unknown)[0])}'; expected "
                          f"{', '.join(PARAMS)}, and optionally {', '.join(OPTIONAL)}")
    space = {}
    for name in PARAMS:
        spec = raw.get(name)
        if not isinstance(spec, dict):
            raise ConfigError(f"search space: '{name}' needs a mapping with low and high")
        try:
            low, high = _float(spec["low"]), _float(spec["high"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ConfigError(f"search space: '{name}' needs numeric low and high") from None
        log = bool(spec.get("log", True))
        if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
            raise ConfigError(
                f"search space: {name} range [{low:g}, {high:g}] is empty or inverted; expected low < high"
            )
        if log and low <= 0:
            raise ConfigError(f"search space: {name} low {low:g} must be > 0 on a log scale (set include_zero for 0)")
        if low < 0:
            raise ConfigError(f"search space: {name} low {low:g} must be >= 0")
        top = _CONFIG_MAX[name]
        if high > top:  # a trial would be refused by the training's own config check
            raise ConfigError(f"search space: {name} high {high:g} is above what training accepts; expected at "
                              f"most {top:g}")
        space[name] = {"low": low, "high": high, "log": log, "include_zero": bool(spec.get("include_zero", False))}
    if space["learning_rate"]["include_zero"]:
        raise ConfigError("search space: learning_rate cannot include_zero; a zero learning rate does not train")
    for name, accepted in CHOICE_PARAMS.items():
        if name in raw:
            space[name] = _choices(name, raw[name], accepted)
    for name, (_, lowest) in INT_PARAMS.items():
        if name in raw:
            space[name] = _int_range(name, raw[name], lowest)
    return space


def _float(value: Any) -> float:
    """A YAML number, or its text in ASCII digits (``float`` reads ``"٣"`` as 3.0); else ValueError."""
    if isinstance(value, bool) or isinstance(value, str) and not value.strip().isascii():
        raise ValueError(f"not a number: {shown(value)}")
    return float(value)


def _choices(name: str, spec: Any, accepted: tuple[str, ...]) -> dict[str, Any]:
    values = spec.get("choices") if isinstance(spec, dict) else None
    if not isinstance(values, list) or not values or not all(str(v) in accepted for v in values) \
            or len(set(map(str, values))) != len(values):
        raise ConfigError(f"search space: {name} needs 'choices', a list of distinct values among "
                          f"{', '.join(accepted)}; got {shown(spec)}")
    return {"choices": [str(v) for v in values]}


def _int_range(name: str, spec: Any, lowest: int) -> dict[str, Any]:
    top = int(MAX_VALUES[name])
    try:
        low, high = spec["low"], spec["high"]
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high))
    except (KeyError, TypeError):
        ok = False
    if not ok or not lowest <= low <= high <= top:
        raise ConfigError(f"search space: {name} needs integer low and high with {lowest} <= low <= high <= {top}; "
                          f"got {shown(spec)}")
    return {"low": low, "high": high, "log": bool(spec.get("log", False)) and low > 0}


def suggest(trial, space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Draw learning_rate and weight_decay (``include_zero`` adds a categorical switch to 0), then
    what the space adds: ``finetune_mode`` first, then each integer its mode reads."""
    values: dict[str, Any] = {}
    for name in PARAMS:
        spec = space[name]
        if spec["include_zero"] and trial.suggest_categorical(f"{name}_is_zero", [False, True]):
            values[name] = 0.0
            continue
        values[name] = trial.suggest_float(name, spec["low"], spec["high"], log=spec["log"])
    for name in CHOICE_PARAMS:
        if name in space:
            values[name] = trial.suggest_categorical(name, space[name]["choices"])
    for name, (mode, _) in INT_PARAMS.items():
        if name in space and values.get("finetune_mode", mode) == mode:
            spec = space[name]
            values[name] = trial.suggest_int(name, spec["low"], spec["high"], log=spec["log"])
    return values
