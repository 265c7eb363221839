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

from ..config.keys import DATA, FINETUNE, OPTIMIZER, TRACKING
from ..config.sections import as_section
from ..config.stage_keys import stage_keys, stage_of

#: What MLflow calls a run it was given no name for (``bright-owl-123``): a name this project may replace.
GENERATED = re.compile(r"[a-z]+-[a-z]+-[0-9]{1,3}")
Fold = tuple[int, int]  # (fold number, number of folds)


def market(data: Any) -> str:
    """``demo`` for the built-in demo market (an empty ``qlib_data_path``), else the instrument.
    ``data``: the config's data section, or the whole config."""
    data = as_section(data, DATA)
    if not str(data.qlib_data_path or "").strip():
        return "demo"
    return str(data.instrument or "").strip() or "market"


def mode_words(finetune: Any) -> list[str]:
    """The fine-tune mode as a name shows it: nothing for ``full``, ``lora r=8``, ``freeze 2``.
    ``finetune``: the config's finetune section, or the whole config."""
    finetune = as_section(finetune, FINETUNE)
    mode = str(finetune.finetune_mode or "full")
    if mode == "lora":
        return ["lora", f"r={finetune.lora_rank}"]
    if mode == "freeze":
        return ["freeze", str(finetune.freeze_layers)]
    return []


def _fold(fold: Fold | None) -> list[str]:
    return [f"fold {fold[0]}/{fold[1]}"] if fold else []


def given(tracking: Any) -> str:
    """The config's own ``run_name`` ('' when none was given). ``tracking``: the config's
    tracking section, or the whole config."""
    return str(as_section(tracking, TRACKING).run_name or "").strip()


def training(config: Mapping[str, Any], *, fold: Fold | None = None) -> str:
    """A training run's name (a loaded config: its stage's learning rate is known)."""
    if given(config):
        return given(config)
    stage = stage_of(config)
    lr = float(config[stage_keys(config).learning_rate])
    decay = float(as_section(config, OPTIMIZER).adam_weight_decay)
    return " ".join([*_fold(fold), stage, *mode_words(config), f"lr={lr:.0e}", f"wd={decay:g}", market(config)])


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
