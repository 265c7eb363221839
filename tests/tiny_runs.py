"""Tiny trainings for the quality, plots, compare and browser tests (a few seconds each).

``TINY`` is the architecture and data size of ``test_train.py``'s end-to-end runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = {
    "d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2, "s1_bits": 4, "s2_bits": 4,
    "lookback_window": 20, "predict_window": 5, "batch_size": 8, "n_train_iter": 64, "n_val_iter": 36,
    "epochs": 2, "log_interval": 1000,
}


def tiny_config(tmp: Path, **extra: Any) -> dict:
    """A validated config: TINY on the demo market, Comet off, every output under ``tmp``."""
    from kronos_mlflow.config import load_config

    return load_config({**TINY, "qlib_data_path": "", "comet": "off", "dataset_path": str(Path(tmp) / "cache"),
                        "save_path": str(Path(tmp) / "outputs"), **extra})


def train_command(tmp: Path, **extra: Any) -> list[str]:
    """``python -m kronos_mlflow.train`` with TINY (plus ``extra``) as flags."""
    values = {**TINY, "qlib_data_path": "", "comet": "off", "dataset_path": str(Path(tmp) / "cache"),
              "save_path": str(Path(tmp) / "outputs"), **extra}
    flags: list[str] = []
    for key, value in values.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return [sys.executable, "-m", "kronos_mlflow.train", *flags]


def isolated_env(tmp: Path, tracking_uri: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a training subprocess: demo market, caches and MLflow all under ``tmp``."""
    env = dict(os.environ)
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "COMET_API_KEY"):
        env.pop(name, None)
    env.update({
        "KRONOS_MLFLOW_HOME": str(Path(tmp) / "home"),
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "TQDM_DISABLE": "1",
        "COMET_DISABLE_AUTO_LOGGING": "1",
        "COMET_OFFLINE_DIRECTORY": str(Path(tmp) / "comet"),
        **(extra or {}),
    })
    return env


def run_dir(save_path: Path, folder: str = "finetune_tokenizer_demo") -> Path:
    """The one run directory under ``{save_path}/{folder}`` (``cfg-<digest>``: see layout.py)."""
    found = sorted(p for p in (Path(save_path) / folder).glob("cfg-*") if p.is_dir())
    assert len(found) == 1, f"expected one run directory under {Path(save_path) / folder}, found {found}"
    return found[0]
