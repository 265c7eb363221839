"""Where a run keeps its files, in one place: ``{save_path}/{tokenizer_save_folder_name}/{run key}/``,
the run key ``cfg-`` and 12 hex digits of :func:`kronos_mlflow.config.digest.config_digest`
(docs/run-records.md#where-a-runs-files-are: what each file is, and why a finished run's
directory is never reused).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core import stage_keys
from .digest import config_digest

_MAX_PHASE_BYTES = 16 << 20


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def of(cls, config: Mapping[str, Any], world_size: int = 1) -> RunLayout:
        """This run's directory: the first ``cfg-<digest>[-N]`` under the run folder that holds
        no finished run (:meth:`finished`; docs/run-records.md#where-a-runs-files-are)."""
        base = cls.folder(config)
        key = run_key(config, world_size)
        for n in range(1, 10_000):
            layout = cls(base / (key if n == 1 else f"{key}-{n}"))
            if not layout.finished():
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

    @property
    def phase(self) -> Path:
        """How far the run got after its last epoch (kronos_mlflow/training/checkpoint/phase.py)."""
        return self.checkpoints / "phase.json"

    def finished(self) -> bool:
        """The directory holds a finished run: its ``summary.json`` is written and no phase record
        says the run was stopped before its end (a stop while its model was logged continues
        here: docs/reliability.md#a-stop-after-the-last-epoch)."""
        if not self.summary.exists():
            return False
        try:
            if self.phase.stat().st_size > _MAX_PHASE_BYTES:
                return False  # not a record of ours: the run's own start says so, in one line
            reached = json.loads(self.phase.read_text(encoding="utf-8")).get("phase")
        except FileNotFoundError:
            return True  # a run finished before phases were recorded
        except (OSError, ValueError, AttributeError):
            return False  # damaged: the run's own start says so, in one line
        return reached in ("finished", "pruned")


def run_key(config: Mapping[str, Any], world_size: int = 1) -> str:
    """``cfg-`` + 12 hex digits of the config digest (the keys that decide the numbers, and
    the world size): the same for a restarted run, different for another config."""
    return "cfg-" + config_digest(config, world_size=world_size)[:12]
