"""``objective: val_skill``: each epoch's weights forecast the validation split's origins and are
scored against persistence; a sweep ranks its trials by that skill and prunes on it.

In this process: the validation origins (their forecasts never reach into training's bars), the
loop's records and its training numbers (the same as with ``val_loss``), the per-epoch skill
recomputed from the saved checkpoint and hand-computed persistence errors, and the refusals.
Through the user's command: ``mlflow run . -e sweep -P objective=val_skill -P stage=predictor``
(the session's ``predictor_sweep``, tests/shared_sweeps.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from recording import Recorder

from kronos_mlflow.stages.tokenizer.training import TokenizerStage
from kronos_mlflow.training import loop as trainer
from kronos_mlflow.config.core import model_kwargs, time_bounds
from kronos_mlflow.runtime.console import Console
from kronos_mlflow.errors import ConfigError, UserError
from kronos_mlflow.evaluation.val_skill import epoch_hooks
from kronos_mlflow.config.layout import RunLayout
from kronos_mlflow.model import Kronos, KronosTokenizer

ROOT = Path(__file__).resolve().parents[1]
PREDICTOR_SIZES = {"s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 16, "n_heads": 2, "ff_dim": 32,
                   "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "token_dropout_p": 0.0,
                   "learn_te": True}


def _predictor_checkpoint(path: Path) -> Path:
    torch.manual_seed(1)
    Kronos(**PREDICTOR_SIZES).save_pretrained(path)
    return path


def _tokenizer(config):
    torch.manual_seed(0)
    return KronosTokenizer(**model_kwargs(config))


def test_validation_origins_forecast_only_bars_after_training(tiny):
    from kronos_mlflow.evaluation.origins import forecast_origins

    config = tiny(n_eval_windows=10**6, n_val_skill_windows=10**6)
    val, test = forecast_origins(config, "val"), forecast_origins(config, "test")
    assert len(val) == val.candidates > 0
    limited = forecast_origins({**config, "n_eval_windows": 100, "n_val_skill_windows": 200}, "val")
    assert 0 < len(limited) <= 200 < val.candidates and limited.candidates == val.candidates
    _, future = val.times(np.arange(len(val)))
    train_end = time_bounds(*config["train_time_range"])[1]
    val_start, val_end = time_bounds(*config["val_time_range"])
    assert (future[:, 0] > train_end).all() and (future <= val_end).all()
    past, _ = val.times(np.arange(len(val)))
    assert (past >= val_start).all()
    assert past[:, 0].min() <= train_end  # the lookback may read the overlap: that is what it is for
    assert val.digest != test.digest and "/val" in val.data_key and "/val" not in test.data_key
    with pytest.raises(ValueError, match="split 'train'"):
        forecast_origins(config, "train")


def test_a_tokenizer_run_on_val_skill_trains_the_same_and_records_each_epochs_skill(tiny, tmp_path):
    """Same losses as ``val_loss``; ``val_skill_vs_persistence`` per epoch with its interval;
    ``best_val_skill`` the best epoch's, equal to the skill of the saved best checkpoint with
    the predictor, recomputed here with persistence's errors by hand; the pruner reads the skill."""
    from kronos_mlflow.evaluation.forecasters import kronos_paths
    from kronos_mlflow.evaluation.origins import CLOSE, forecast_origins
    from kronos_mlflow.evaluation.scores import origin_scores
    from kronos_mlflow.model import KronosPredictor

    predictor = _predictor_checkpoint(tmp_path / "predictor")
    base = tiny(compile="off", epochs=2, n_val_skill_windows=100, pretrained_predictor_path=str(predictor))
    runs = {}
    for objective in ("val_loss", "val_skill"):
        config = {**base, "objective": objective, "save_path": str(tmp_path / objective)}
        logger, seen, stage = Recorder(), [], TokenizerStage()
        hooks = epoch_hooks(config, stage, torch.device("cpu"), rank=0, world_size=1)
        result = trainer.fit(_tokenizer(config), torch.device("cpu"), config, logger,
                             trainer.RunFiles(RunLayout.of(config)), Console(False),
                             should_stop=lambda epoch, value: seen.append((epoch, value)) and False, stage=stage,
                             hooks=hooks)
        runs[objective] = (config, logger, result, seen)
    (_, plain_log, plain, plain_seen), (config, log, result, seen) = runs["val_loss"], runs["val_skill"]
    assert result["val_loss_history"] == plain["val_loss_history"]  # training drew the same numbers
    assert log.history("train_tokenizer_loss_batch") == plain_log.history("train_tokenizer_loss_batch")
    assert not plain_log.history("val_skill_vs_persistence") and "best_val_skill" not in plain

    skills = log.history("val_skill_vs_persistence")
    assert [s for s, _ in skills] == [0, 1]
    assert seen == skills and plain_seen == list(enumerate(plain["val_loss_history"]))
    for name in ("val_skill_vs_persistence_ci_low", "val_skill_vs_persistence_ci_high", "val_mase_close",
                 "persistence_val_mase_close"):
        assert [s for s, _ in log.history(name)] == [0, 1], name
    for (_, low), (_, value), (_, high) in zip(log.history("val_skill_vs_persistence_ci_low"), skills,
                                              log.history("val_skill_vs_persistence_ci_high"), strict=True):
        assert low <= value <= high
    best = result["best_epoch"]
    assert result["best_val_skill"] == dict(skills)[best]
    assert log.history("best_val_skill") == [(best, result["best_val_skill"])]

    origins = forecast_origins(config, "val")
    every = np.arange(len(origins))
    history, actual = origins.history(every)[..., CLOSE], origins.future(every)[..., CLOSE]
    naive = np.abs(history[:, -1:] - actual).mean(axis=1) / np.abs(np.diff(history, axis=1)).mean(axis=1)
    assert dict(log.history("persistence_val_mase_close"))[best] == pytest.approx(np.nanmean(naive), rel=1e-9)
    pair = KronosPredictor(Kronos.from_pretrained(str(predictor)),
                           KronosTokenizer.from_pretrained(RunLayout.of(config).best_model), device="cpu",
                           max_context=config["max_context"], clip=config["clip"])
    drawn = kronos_paths(pair, origins, config)
    mase = origin_scores(drawn, history, actual)["mase"]
    both = np.isfinite(mase) & np.isfinite(naive)
    assert result["best_val_skill"] == pytest.approx(1 - mase[both].mean() / naive[both].mean(), rel=1e-6)
    # the kept epoch's paths, offered to the end of the run (calibration reuses them): what the
    # saved checkpoint draws on the same origins
    (kept,) = hooks[0].forecasts().values()
    assert list(hooks[0].forecasts()) == [origins.digest]
    np.testing.assert_allclose(kept, drawn, rtol=1e-6)


def test_val_skill_refusals_are_one_line(tiny, tmp_path):
    from kronos_mlflow.evaluation.val_skill import val_origins
    from kronos_mlflow.stages import spec_of

    # auto (the default) with no published predictor at hand, and fresh weights asked for
    with pytest.raises(ConfigError, match="objective val_skill for the tokenizer .* auto found no published predictor: "
                                          "fresh weights: NeoQuasar/Kronos-small is not in the Hugging Face cache"):
        tiny(objective="val_skill")
    for fresh, said in (("", "empty"), ("fresh", "fresh")):
        with pytest.raises(ConfigError, match=f"objective val_skill for the tokenizer .* pretrained_predictor_path is "
                                              f"{said}; expected a predictor checkpoint"):
            tiny(objective="val_skill", pretrained_predictor_path=fresh)
    with pytest.raises(ConfigError, match="objective: 'val_los' is not one of val_loss, val_skill"):
        tiny(objective="val_los")
    torch.manual_seed(1)
    Kronos(**{**PREDICTOR_SIZES, "s1_bits": 5}).save_pretrained(tmp_path / "five")
    config = tiny(objective="val_skill", pretrained_predictor_path=str(tmp_path / "five"))
    with pytest.raises(ConfigError, match="bits"):
        spec_of(config).check_objective(config, _tokenizer(config))
    with pytest.raises(ConfigError, match="val_time_range 2022-09-01:2024-06-30 ends no later than train_time_range"):
        tiny(objective="val_skill", stage="predictor", train_time_range="2011-01-01:2024-06-30")
    # a validation range past training's end by fewer bars than a forecast: no origin, refused
    short = tiny(objective="val_skill", stage="predictor", train_time_range="2011-01-01:2024-06-26")
    with pytest.raises(UserError, match="no forecast origins in val_time_range .* after train_time_range"):
        val_origins(short)


@pytest.mark.slow
def test_mlflow_run_sweep_on_val_skill_ranks_predictor_trials_by_their_forecast_skill(predictor_sweep, commands):
    """The shared ``mlflow run . -e sweep -P objective=val_skill -P stage=predictor``
    (tests/shared_sweeps.py): each trial a predictor run (its own metrics and folder, the given
    tokenizer) with its per-epoch skill, Optuna's intermediate values are those skills (the
    pruner reads them), each trial's value is its run's ``best_val_skill``, the study maximises
    and the parent's best is the highest."""
    import optuna

    sweep = predictor_sweep
    client, root, env = sweep.client(), sweep.root, sweep.env
    parent = sweep.parent()
    assert parent.data.tags["optuna.study_name"] == "kronos-predictor-lr-wd-val-skill"
    assert parent.data.tags["sweep.objective"] == "val_skill" and "best_val_loss" not in parent.data.metrics
    study = optuna.load_study(study_name="kronos-predictor-lr-wd-val-skill", storage=sweep.storage)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    trials = {t.user_attrs["mlflow_run_id"]: t for t in study.trials if "mlflow_run_id" in t.user_attrs}
    assert len(trials) == sweep.n_trials
    for run_id, trial in trials.items():
        run = client.get_run(run_id)
        assert run.data.params["objective"] == "val_skill" and run.data.params["stage"] == "predictor"
        # each trial a predictor run: its own metrics and folder, the tokenizer it was given
        assert run.data.tags["tokenizer_uri"] == str(sweep.tokenizer)
        assert "val_predictor_loss_epoch" in run.data.metrics and "train_tokenizer_loss_batch" not in run.data.metrics
        assert Path(run.data.tags["run_directory"]).parent.name.startswith("trial-")
        assert run.data.tags["optuna.trial_state"] == trial.state.name
        per_epoch = {m.step: m.value for m in client.get_metric_history(run_id, "val_skill_vs_persistence")}
        assert trial.intermediate_values == per_epoch and len(per_epoch) >= 1
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert trial.value == run.data.metrics["best_val_skill"]
            best_epoch = min(client.get_metric_history(run_id, "val_predictor_loss_epoch"), key=lambda m: m.value).step
            assert trial.value == per_epoch[best_epoch]  # the skill of the checkpoint the run logs
    complete = [t for t in trials.values() if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and parent.data.metrics["best_val_skill"] == max(t.value for t in complete)
    assert "best_val_skill" in sweep.stdout  # the trials table names the value it ranks by

    # `kronos-mlflow compare --parent`: the trials ranked as the sweep ranks them, highest skill first
    shown = commands.run(["kronos-mlflow", "compare", "--parent", parent.info.run_id], cwd=root, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    header, _, *lines = shown.stdout.strip().splitlines()
    assert "best_val_skill" in header.split()
    ranked = sorted(complete, key=lambda t: -t.value)
    listed = [line.split()[-1] for line in lines]
    assert listed[:len(ranked)] == [t.user_attrs["mlflow_run_id"] for t in ranked]

    # the same study name with the other objective: one line, exit 2, nothing trained
    before = len(client.search_runs(["0"]))
    script = [sys.executable, str(ROOT / "sweeps" / "sweep.py")]
    again = [*script, *[a if a != "val_skill" else "val_loss" for a in _sweep_flags(sweep.command)],
             "--study-name", "kronos-predictor-lr-wd-val-skill"]
    refused = commands.run(again, cwd=root, env=env, timeout=300)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert ("study 'kronos-predictor-lr-wd-val-skill' exists with direction maximize; this sweep minimises "
            "best_val_loss") in line
    assert len(client.search_runs(["0"])) == before  # refused before its parent run: no run at all


def _sweep_flags(mlflow_command: list[str]) -> list[str]:
    """The ``-P key=value`` of an ``mlflow run -e sweep`` as the flags of ``sweeps/sweep.py``."""
    pairs = [a.split("=", 1) for a in mlflow_command[mlflow_command.index("sweep") + 1:] if a != "-P"]
    renamed = {"config_file": "config"}
    return [a for k, v in pairs for a in (f"--{renamed.get(k, k).replace('_', '-')}", v)]


def test_a_study_of_the_other_objective_is_refused_and_default_names_follow_the_objective(tmp_path):
    from kronos_mlflow.errors import UserError as Refused
    from kronos_mlflow.workflows.sweep.driver import default_study_name
    from kronos_mlflow.training.trial import make_pruner
    from kronos_mlflow.workflows.sweep.study import open_storage, open_study

    assert default_study_name({"stage": "tokenizer", "objective": "val_loss"}) == "kronos-lr-wd"
    assert default_study_name({"stage": "tokenizer", "objective": "val_skill"}) == "kronos-lr-wd-val-skill"
    assert default_study_name({"stage": "predictor", "objective": "val_loss"}) == "kronos-predictor-lr-wd"
    assert default_study_name({"stage": "predictor", "objective": "val_skill"}) == "kronos-predictor-lr-wd-val-skill"
    storage = open_storage(f"sqlite:///{tmp_path}/optuna.db", heartbeat=False)
    study = open_study(storage, "s", make_pruner("none"), 0, direction="maximize", value_name="best_val_skill")
    assert study.direction.name == "MAXIMIZE"
    assert open_study(storage, "s", make_pruner("none"), 0, direction="maximize").direction.name == "MAXIMIZE"
    with pytest.raises(Refused, match="study 's' exists with direction maximize; this sweep minimises best_val_loss"):
        open_study(storage, "s", make_pruner("none"), 0)
