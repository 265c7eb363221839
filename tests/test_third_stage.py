"""A stage is one folder and a registration (docs/stages.md): ``tests/stages/sharp_tokenizer``, a
third stage that ``kronos_mlflow/`` never names, goes through the config, the pipeline's steps and
flags, the walk-forward, a sweep trial (a ``kronos_mlflow.train`` run), ``compare`` and its logged
model. Its commands find it through the ``kronos_mlflow.stages`` entry-point group, as a package
installed beside kronos_mlflow would declare it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_runs
from tiny_runs import TINY

from kronos_mlflow import stages
from kronos_mlflow.config import core as cfg, stage_keys
from kronos_mlflow.config.digest import config_digest
from kronos_mlflow.errors import ConfigError
from kronos_mlflow.stages import registry

PLUGINS = Path(__file__).resolve().parent / "stages"
PACKAGE = Path(stages.__file__).resolve().parents[1]
NAME = "sharp_tokenizer"


@pytest.fixture()
def sharp():
    """The stage registered in this process (importing its folder registers it), gone afterwards."""
    sys.path.insert(0, str(PLUGINS))
    try:
        import sharp_tokenizer

        yield sharp_tokenizer.SPEC
    finally:
        stage_keys.STAGES.pop(NAME, None)
        sys.modules.pop("sharp_tokenizer", None)
        sys.path.remove(str(PLUGINS))


def plugin_path(tmp: Path) -> str:
    """A PYTHONPATH under which ``sharp_tokenizer`` is an installed stage plugin: its folder, and a
    distribution whose entry point names it in the ``kronos_mlflow.stages`` group."""
    info = tmp / "site" / "sharp_tokenizer_stage-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sharp-tokenizer-stage\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{stages.ENTRY_POINTS}]\n{NAME} = sharp_tokenizer\n")
    return os.pathsep.join([str(PLUGINS), str(info.parent)])


def test_no_file_of_the_package_names_the_third_stage():
    hits = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*") if p.is_file() and p.suffix in (".py", ".txt")
            and NAME in p.read_text(errors="replace")]
    assert not hits and (PLUGINS / NAME / "__init__.py").is_file()


def test_the_registered_folder_is_a_stage_of_the_config_the_pipeline_the_walk_forward_and_the_sweep(sharp, tmp_path):
    from kronos_mlflow.workflows import pipeline as pl
    from kronos_mlflow.workflows.sweep import driver
    from kronos_mlflow.workflows.walkforward import command as wf, folds as fl

    assert stages.names() == ("tokenizer", NAME, "predictor") and stages.get(NAME) is sharp
    # the config: its stage, its keys (learning_rate is the tokenizer's key it shares), its own digest
    config = tiny_runs.tiny_config(tmp_path, stage=NAME, lr=0.002)
    assert config["tokenizer_learning_rate"] == 0.002 and stages.spec_of(config) is sharp
    tokenizer = tiny_runs.tiny_config(tmp_path, lr=0.002)
    assert config_digest(config) != config_digest(tokenizer)  # never one run folder for both
    with pytest.raises(ConfigError, match=f"stage: 'sharp' is not one of tokenizer, predictor, {NAME}"):
        cfg.load_config({"stage": "sharp"})
    # the pipeline: its step between the tokenizer and the predictor, its own flag, the shared ones
    assert pl.steps() == ("tokenizer", NAME, "predictor", "evaluation")
    flags = pl.flags()
    assert flags["sharp_epochs"][1] == {NAME: "epochs"} and flags["epochs"][1] == {"tokenizer": "epochs"}
    assert flags["batch_size"][1][NAME] == "batch_size" and NAME not in flags["calibration"][1]
    parser = argparse.ArgumentParser()
    pl.add_arguments(parser)
    args = parser.parse_args(["--sharp-epochs", "3", "--epochs", "1"])
    assert pl.step_config(args, NAME)["epochs"] == 3 and pl.step_config(args, "tokenizer")["epochs"] == 1
    assert pl.check_overrides(args, NAME)["stage"] == NAME
    # the walk-forward: trained once, on the first fold's ranges (as the tokenizer), unless retrain both
    plan = [fl.Fold(k, ("a", "b"), ("c", "d"), 0, ("e", "f"), 1, 1, 1,
                    {"train_time_range": ["2020-01-01", f"202{k}-01-01"]}) for k in (1, 2)]
    settings = fl.Settings.checked(folds=2, fold_length="1M", mode="expanding", train_length="", embargo="",
                                   val_length="", end="", retrain="predictor")
    args.step_overrides = None
    over = wf.fold_args(args, plan, settings, plan[1]).step_overrides
    assert over[NAME] == over["tokenizer"] == {"train_time_range": "2020-01-01:2021-01-01"}
    assert over["predictor"] == over["evaluation"] == {"train_time_range": "2020-01-01:2022-01-01"}
    # the sweep: its own default study, the keys it may not be given
    assert driver.default_study_name({"stage": NAME}) == "kronos-sharp-tokenizer-lr-wd"
    assert "tokenizer_learning_rate" in driver.chosen_keys()


def test_its_one_hyper_parameter_is_what_its_training_piece_computes(sharp):
    import torch

    from kronos_mlflow.model import KronosTokenizer
    from kronos_mlflow.stages.tokenizer.training import TokenizerStage

    torch.manual_seed(0)
    model = KronosTokenizer(**cfg.model_kwargs(cfg.load_config({**TINY})))
    x = torch.randn(4, TINY["lookback_window"], 6)
    ours = sharp.training({}, None, None).loss(model, x, None, "fp32")
    theirs = TokenizerStage().loss(model, x, None, "fp32")
    weight = sys.modules["sharp_tokenizer"].RECON_PRE_WEIGHT
    assert torch.allclose(ours.loss, theirs.loss - (1 - weight) / 2 * theirs.parts["recon_pre"])


@pytest.mark.slow
def test_a_sweep_trial_of_the_third_stage_trains_logs_its_model_and_compare_shows_it(sharp, tmp_path, monkeypatch,
                                                                                        capsys):
    """``python sweeps/sweep.py --stage sharp_tokenizer`` in a process that finds the stage through its
    entry point: the trial's ``kronos_mlflow.train`` run is the stage's, with its metrics, verdict
    and logged model; ``compare`` groups it under the stage."""
    import mlflow

    from kronos_mlflow.cli.main import main as cli_main

    monkeypatch.chdir(tmp_path)
    uri = tiny_runs.create_sqlite_store(tmp_path)
    env = {**tiny_runs.isolated_env(tmp_path, uri), "PYTHONPATH": plugin_path(tmp_path)}
    tiny_runs.write_config(tmp_path / "tiny.yaml", **{**TINY, "epochs": 1}, dataset_path=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(PACKAGE.parent / "sweeps" / "sweep.py"), "--config", str(tmp_path / "tiny.yaml"),
                           "--storage", f"sqlite:///{tmp_path}/optuna.db", "--n-trials", "1", "--stage", NAME,
                           "--qlib-data-path", "", "--comet", "off", "--output-dir", str(tmp_path / "out")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    trial = next(r for r in runs if "optuna.trial_number" in r.data.tags)
    assert trial.data.params["stage"] == NAME and trial.info.status == "FINISHED"
    assert {sharp.train_loss, sharp.val_metric, sharp.test_loss} <= set(trial.data.metrics)
    assert trial.data.tags["verdict"] in ("better", "worse", "inconclusive")
    parent = next(r for r in runs if r.info.run_id == trial.data.tags["mlflow.parentRunId"])
    assert parent.data.tags.get("optuna.study_name", sharp.default_study) == sharp.default_study, parent.data.tags
    # its logged model loads where the stage is unknown: a tokenizer's pyfunc
    model = mlflow.pyfunc.load_model(f"runs:/{trial.info.run_id}/best_model")
    assert model.metadata.get_input_schema() is not None
    # compare groups the trial under its stage, with its validation history
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    capsys.readouterr()
    assert cli_main(["compare", "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    row = rows[trial.info.run_id]
    assert row["group"] == NAME and row["epochs_done"] == 1, row


HALF = "half_tokenizer"
#: a plugin that registers its stage, then fails on an import of its own
HALF_PLUGIN = f'''
import dataclasses

from kronos_mlflow.stages.registry import register
from kronos_mlflow.stages.tokenizer import TokenizerSpec


class HalfSpec(TokenizerSpec):
    name = "{HALF}"
    config_keys = dataclasses.replace(TokenizerSpec.config_keys, mlproject_params=("half_only",))
    default_study = "kronos-half-lr-wd"
    champion_suffix = "-half"
    pipeline_position = 1.2
    pipeline_flags = {{"half_epochs": ("half tokenizer epochs", "epochs")}}


SPEC = register(HalfSpec())

import half_stage_dependency_not_installed  # noqa: E402,F401 - fails after the registration
'''


def test_a_plugin_that_fails_after_registering_leaves_no_trace(tmp_path):
    """A plugin whose module registers its stage and then fails on an import is left out whole,
    and so is one whose spec's pipeline flags are malformed, through what users type:
    ``kronos-mlflow pipeline --help`` shows the working plugin's flag and not the broken ones',
    with one warning for each; the stage is no ``--stage`` a command takes."""
    site = tmp_path / "site"
    odd = HALF_PLUGIN.replace(HALF, "odd_tokenizer").replace('"half_epochs": ("half tokenizer epochs", "epochs")',
                                                             '"odd-epochs": "epochs"')
    for module, name, text in (("half_stage", HALF, HALF_PLUGIN),
                               ("odd_stage", "odd_tokenizer", odd.split("\nimport half_stage")[0])):
        info = site / f"{module}-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{stages.ENTRY_POINTS}]\n{name} = {module}\n")
        (site / f"{module}.py").write_text(text)
    env = {**tiny_runs.isolated_env(tmp_path), "PYTHONPATH": os.pathsep.join([plugin_path(tmp_path), str(site)])}
    cli = str(Path(sys.executable).with_name("kronos-mlflow"))
    shown = subprocess.run([cli, "pipeline", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "--sharp-epochs" in shown.stdout and "half" not in shown.stdout and "odd" not in shown.stdout
    lines = sorted(shown.stderr.strip().splitlines())
    assert len(lines) == 2 and "Traceback" not in shown.stderr, shown.stderr
    assert f"stage plugin {HALF} (half_stage) does not load, left out" in lines[0], lines
    assert "half_stage_dependency_not_installed" in lines[0]
    assert "stage plugin odd_tokenizer (odd_stage) does not load, left out" in lines[1], lines
    assert "pipeline_flags['odd-epochs'] is not a lower-case flag name" in lines[1]
    refused = subprocess.run([sys.executable, "-m", "kronos_mlflow.train", "--stage", HALF, "--check"], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"stage: '{HALF}' is not one of tokenizer, predictor, {NAME}" in refused.stderr, refused.stderr


def test_what_a_failed_load_registered_is_taken_back_from_the_registry(sharp):
    """``all_or_nothing``: the stages (and so their config keys) registered inside a block that fails are
    gone (the pipeline's steps and flags, the sweep's MLproject parameters are read from them);
    those registered before stay."""
    from kronos_mlflow.workflows import pipeline as pl
    from kronos_mlflow.workflows.sweep import driver

    before = (stages.names(), cfg.registered(), pl.flags(), driver.chosen_keys())
    half = type("HalfSpec", (type(sharp),), {"name": HALF, "pipeline_flags": {"half_epochs": ("h", "epochs")}})
    with pytest.raises(ImportError):
        with registry.all_or_nothing():
            registry.register(half())
            assert HALF in stages.names() and HALF in cfg.registered()
            raise ImportError("a dependency of the plugin")
    assert (stages.names(), cfg.registered(), pl.flags(), driver.chosen_keys()) == before
    assert NAME in stages.names() and "half_epochs" not in pl.flags()
