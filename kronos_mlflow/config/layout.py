"""Where a run keeps its files, in one place: ``{save_path}/{tokenizer_save_folder_name}/{run key}/``.

The run key is ``cfg-`` and the first 12 hex digits of the config digest
(:func:`kronos_mlflow.config.digest.config_digest`, world size included): a run with another
config never touches this run's files, and the same command again (after a crash or a stop)
finds its own training state and resumes. When that directory holds a finished run
(``summary.json``), the same config again gets ``cfg-<digest>-2``, ``-3``, ...: a finished
run's best checkpoint is never overwritten.

    checkpoints/best_model/   the best epoch's checkpoint (config.json + model.safetensors)
    checkpoints/best_adapter/ a LoRA run's best adapters alone (peft's adapter_config.json + adapter_model.safetensors)
    checkpoints/last/         the training state a killed run resumes from
    checkpoints/start/        the starting weights (written when the run starts; the test verdict's base)
    checkpoints/tokenizer/    a predictor run's frozen tokenizer (written when the run starts)
    mlflow-spool/             what MLflow could not send during a tracking-server outage
    plots/                    reconstruction.png, token_usage.png
    summary.json              the result, config and run id
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core import stage_keys
from .digest import config_digest


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def of(cls, config: Mapping[str, Any], world_size: int = 1) -> RunLayout:
        """This run's directory: the first ``cfg-<digest>[-N]`` under the run folder that holds
        no finished run (see the module doc)."""
        base = cls.folder(config)
        key = run_key(config, world_size)
        for n in range(1, 10_000):
            layout = cls(base / (key if n == 1 else f"{key}-{n}"))
            if not layout.summary.exists():
                return layout
        raise RuntimeError(f"{base} holds 10,000 finished runs of one config")  # pragma: no cover

    @staticmethod
    def folder(config: Mapping[str, Any]) -> Path:
        """``{save_path}/{tokenizer_save_folder_name}`` (a predictor run:
        ``predictor_save_folder_name``): every run of this name, one directory each."""
        return Path(os.path.expanduser(str(config["save_path"]))) / str(config[stage_keys(config).save_folder])

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best_model(self) -> Path:
        return self.checkpoints / "best_model"

    @property
    def best_adapter(self) -> Path:
        """A LoRA run's best adapters alone, in peft's format (logged as ``adapter/``)."""
        return self.checkpoints / "best_adapter"

    @property
    def start_model(self) -> Path:
        return self.checkpoints / "start"

    @property
    def tokenizer(self) -> Path:
        return self.checkpoints / "tokenizer"

    @property
    def training_state(self) -> Path:
        return self.checkpoints / "last"

    @property
    def spool(self) -> Path:
        return self.root / "mlflow-spool"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


def run_key(config: Mapping[str, Any], world_size: int = 1) -> str:
    """``cfg-`` + 12 hex digits of the config digest (the keys that decide the numbers, and
    the world size): the same for a restarted run, different for another config."""
    return "cfg-" + config_digest(config, world_size=world_size)[:12]
