"""The training loop in this process: ``fit`` with a NullLogger, no process group, no MLflow."""

from __future__ import annotations

import math

import pytest
import torch
from recording import Recorder

from kronos_mlflow.stages.tokenizer.training import TokenizerStage
from kronos_mlflow.training import checkpoint, loop as trainer
from kronos_mlflow.config.core import model_kwargs
from kronos_mlflow.runtime.console import Console
from kronos_mlflow.config.layout import RunLayout
from kronos_mlflow.errors import ConfigError
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
    from kronos_mlflow.training.run import train_model

    config = tiny(compile="off", epochs=1)
    model, result = train_model(_model(config), torch.device("cpu"), config, str(RunLayout.of(config).root),
                                None, 0, 1)
    assert isinstance(model, KronosTokenizer) and math.isfinite(result["best_val_loss"])


def test_a_log_file_gets_progress_lines_with_steps_loss_rate_and_eta(tiny, capsys, monkeypatch):
    """stderr not a terminal (captured): no bar, a line each KRONOS_PROGRESS_SECONDS in training and
    validation, with the epoch, steps done of the epoch's, the loss, the rate and an ETA."""
    import re

    monkeypatch.setenv("KRONOS_PROGRESS_SECONDS", "1e-9")  # every item: a line
    config = tiny(compile="off", epochs=1, log_interval=10**6)
    trainer.fit(_model(config), torch.device("cpu"), config, NullLogger(), trainer.RunFiles(RunLayout.of(config)),
                Console(True), stage=TokenizerStage())
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    steps = re.findall(r"^\[kronos\] epoch 1/1: (\d+)/(\d+) steps, loss=(\S+) lr=\S+ global_step=\d+, "
                       r"(\S+) steps/s, ETA (\d+s|\d+m\d\ds)$", out, flags=re.MULTILINE)
    assert steps, out
    total = int(steps[0][1])
    assert [int(done) for done, *_ in steps] == list(range(1, total + 1))  # one line per step
    assert all(int(t) == total and math.isfinite(float(loss)) and float(rate) > 0 for _, t, loss, rate, _ in steps)
    assert steps[-1][4] == "0s"  # nothing left at the epoch's last step
    assert re.search(r"^\[kronos\] epoch 1/1: validation: \d+/\d+ batches, \S+ batches/s, ETA \S+$", out, flags=re.MULTILINE)
    assert re.search(r"^\[kronos\] starting weights: validation: \d+/\d+ batches", out, flags=re.MULTILINE)
    assert "[kronos] epoch 1/1: train_loss=" in out  # the epoch's summary stays


def test_progress_lines_every_n_items_or_t_seconds_and_none_on_other_ranks(monkeypatch, capsys):
    monkeypatch.setenv("KRONOS_PROGRESS_SECONDS", "3600")
    ticker = Console(True).progress(range(7), 7, "epoch 2/3", every=3, unit="steps")
    for i in ticker:
        ticker.note(f"loss={i:.1f}")
    out = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in out] == ["[kronos] epoch 2/3: 3/7 steps", "[kronos] epoch 2/3: 6/7 steps"]
    assert out[0].startswith("[kronos] epoch 2/3: 3/7 steps, loss=2.0, ") and " steps/s, ETA " in out[0]
    assert list(Console(False).progress(range(7), 7, "x", every=1)) == list(range(7))
    assert capsys.readouterr().out == ""  # a rank other than 0 says nothing
    monkeypatch.delenv("KRONOS_PROGRESS_SECONDS")  # the default (30 s): no line for a fast loop
    assert list(Console(True).progress([[1, 2], [3]], 3, "scorecard: x", unit="origins", size=len)) == [[1, 2], [3]]
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("KRONOS_PROGRESS_SECONDS", "5s")  # refused (config/settings.py), never the default
    with pytest.raises(ConfigError, match=r"KRONOS_PROGRESS_SECONDS \(seconds\): '5s' is not a number; expected a "
                                          r"number > 0 and <= 86400"):
        Console(True).progress(range(3), 3, "x")
