"""The names runs get in the MLflow UI's run list, made in one place so that runs can be told apart.

A training run is named after its stage, its fine-tune mode, its key settings and its market
(the instrument, or ``demo`` for the built-in demo market): ``tokenizer lr=2e-04 wd=0.1 csi300``,
``predictor lora r=8 lr=4e-05 wd=0.1 demo``, ``tokenizer freeze 2 lr=2e-04 wd=0.1 demo``. A
walk-forward fold's runs start with the fold (``fold 2/5 predictor ...``); a pipeline's parent
is ``pipeline demo``, a walk-forward's ``walkforward demo 5 folds``, its fold runs
``fold 2/5 demo``, an evaluation ``evaluate demo``. A config's own ``run_name`` always wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..config.stage_keys import stage_keys, stage_of

#: What MLflow calls a run it was given no name for (``bright-owl-123``): a name this project may replace.
GENERATED = re.compile(r"[a-z]+-[a-z]+-[0-9]{1,3}")
Fold = tuple[int, int]  # (fold number, number of folds)


def market(config: Mapping[str, Any]) -> str:
    """``demo`` for the built-in demo market (an empty ``qlib_data_path``), else the instrument."""
    if not str(config.get("qlib_data_path") or "").strip():
        return "demo"
    return str(config.get("instrument") or "").strip() or "market"


def mode_words(config: Mapping[str, Any]) -> list[str]:
    """The fine-tune mode as a name shows it: nothing for ``full``, ``lora r=8``, ``freeze 2``."""
    mode = str(config.get("finetune_mode") or "full")
    if mode == "lora":
        return ["lora", f"r={config.get('lora_rank')}"]
    if mode == "freeze":
        return ["freeze", str(config.get("freeze_layers"))]
    return []


def _fold(fold: Fold | None) -> list[str]:
    return [f"fold {fold[0]}/{fold[1]}"] if fold else []


def given(config: Mapping[str, Any]) -> str:
    """The config's own ``run_name`` ('' when none was given)."""
    return str(config.get("run_name") or "").strip()


def training(config: Mapping[str, Any], *, fold: Fold | None = None) -> str:
    """A training run's name (a loaded config: its stage's learning rate is known)."""
    if given(config):
        return given(config)
    stage = stage_of(config)
    lr = float(config[stage_keys(config).learning_rate])
    return " ".join([*_fold(fold), stage, *mode_words(config), f"lr={lr:.0e}",
                     f"wd={float(config['adam_weight_decay']):g}", market(config)])


def evaluation(config: Mapping[str, Any], *, fold: Fold | None = None) -> str:
    """An evaluation run's name (the scorecard of a pipeline's model)."""
    return given(config) or " ".join([*_fold(fold), "evaluate", market(config)])


def pipeline(config: Mapping[str, Any]) -> str:
    """A pipeline's parent run."""
    return f"pipeline {market(config)}"


def walkforward(config: Mapping[str, Any], folds: int) -> str:
    """A walk-forward's parent run."""
    return f"walkforward {market(config)} {folds} fold{'s' if folds != 1 else ''}"


def fold_run(config: Mapping[str, Any], fold: Fold) -> str:
    """A walk-forward fold's own run (the parent of its steps)."""
    return " ".join([*_fold(fold), market(config)])


def generated(name: str) -> bool:
    """Whether ``name`` is one MLflow made up (``mlflow run`` without ``--run-name``)."""
    return bool(GENERATED.fullmatch(str(name or "")))
