"""Where a run keeps its files, in one place: ``{save_path}/{tokenizer_save_folder_name}/``.

    checkpoints/best_model/   the best epoch's checkpoint (config.json + model.safetensors)
    checkpoints/last/         the training state a killed run resumes from
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


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> RunLayout:
        return cls(Path(os.path.expanduser(str(config["save_path"]))) / str(config["tokenizer_save_folder_name"]))

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best_model(self) -> Path:
        return self.checkpoints / "best_model"

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
