"""The training loop in this process: ``fit`` with a NullLogger, no process group, no MLflow."""

from __future__ import annotations

import math

import pytest
import torch
from recording import Recorder

from kronos_mlflow.stages.tokenizer.training import TokenizerStage
from kronos_mlflow import checkpoint, trainer
from kronos_mlflow.config import model_kwargs
from kronos_mlflow.console import Console
from kronos_mlflow.layout import RunLayout
from kronos_mlflow.model import KronosTokenizer
from kronos_mlflow.tracking import NullLogger


def _model(config):
    torch.manual_seed(0)
    return KronosTokenizer(**model_kwargs(config))


def test_fit_trains_keeps_the_best_checkpoint_and_the_training_state(tiny):
    config = tiny(compile="off")
    layout = RunLayout.of(config)
    logger = Recorder()
    result = trainer.fit(_model(config), torch.device("cpu"), config, logger, trainer.RunFiles(layout),
                         Console(False), stage=TokenizerStage())
    assert len(result["val_loss_history"]) == config["epochs"]
    assert result["best_val_loss"] == min(result["val_loss_history"])
    assert result["best_epoch"] == result["val_loss_history"].index(result["best_val_loss"])
    assert math.isfinite(result["val_loss_initial"])
    steps = [s for s, m in logger.metrics if "train_tokenizer_loss_batch" in m]
    assert steps == list(range(result["steps"])) and result["steps"] > 0
    epochs = [s for s, m in logger.metrics if "val_tokenizer_loss_epoch" in m]
    assert epochs == list(range(config["epochs"]))
    assert len(logger.calls_to("persist")) == config["epochs"] + 1  # before each training state (and the first)
    best = KronosTokenizer.from_pretrained(layout.best_model)
    assert sum(p.numel() for p in best.parameters()) > 0
    state = checkpoint.read_training_state(layout.training_state)
    assert state["epoch"] == config["epochs"] - 1


def test_files_off_writes_nothing_and_the_loop_is_the_same(tiny):
    """What a rank other than 0 gets: the same losses, no files."""
    config = tiny(compile="off", epochs=1)
    layout = RunLayout.of(config)
    silent = trainer.fit(_model(config), torch.device("cpu"), config, NullLogger(),
                         trainer.RunFiles(layout, enabled=False), Console(False), stage=TokenizerStage())
    assert not layout.root.exists()
    writing = trainer.fit(_model(config), torch.device("cpu"), config, NullLogger(), trainer.RunFiles(layout),
                          Console(False), stage=TokenizerStage())
    assert silent["val_loss_history"] == writing["val_loss_history"]
    assert layout.best_model.is_dir()


def test_should_stop_prunes_after_the_epoch(tiny):
    config = tiny(compile="off", epochs=3)
    seen = []

    def stop_after_first(epoch, val_loss):
        seen.append((epoch, val_loss))
        return True

    logger = Recorder()
    with pytest.raises(trainer.TrainingPruned, match="after epoch 1/3 "):
        trainer.fit(_model(config), torch.device("cpu"), config, logger, trainer.RunFiles(RunLayout.of(config)),
                    Console(False), should_stop=stop_after_first, stage=TokenizerStage())
    assert [e for e, _ in seen] == [0] and math.isfinite(seen[0][1])
    assert [s for s, m in logger.metrics if "val_tokenizer_loss_epoch" in m] == [0]


def test_seed_contract_train_model_accepts_none_logger(tiny):
    from kronos_mlflow.train import train_model

    config = tiny(compile="off", epochs=1)
    model, result = train_model(_model(config), torch.device("cpu"), config, str(RunLayout.of(config).root),
                                None, 0, 1)
    assert isinstance(model, KronosTokenizer) and math.isfinite(result["best_val_loss"])
