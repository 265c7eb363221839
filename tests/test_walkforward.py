"""``mlflow run . -e walkforward`` end to end on the demo market with the tiny sizes: two
folds, each a pipeline under one parent; a walk-forward stopped by SIGINT in an evaluation step
ends every run it started KILLED; the fold table, what each fold forecasts, the pooled verdict
recomputed from the folds' own files, a second identical command that trains nothing,
``--aggregate`` equal to the command's own aggregate; and the fold table's refusals."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tiny_runs import TINY, interrupt_when, pipeline_workdir, process_under

from kronos_mlflow.config.core import load_config
from kronos_mlflow.config.sections import section
from kronos_mlflow.errors import UserError
from kronos_mlflow.evaluation.scores import skill
from kronos_mlflow.workflows.walkforward import folds as fl

ROOT = Path(__file__).resolve().parents[1]
MLFLOW_INFO = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO mlflow\.")
SMALL = {"epochs": 1, "predictor_epochs": 1, "batch_size": 8, "n_train_iter": 64, "n_val_iter": 36, "comet": "off",
         "folds": 2, "fold_length": "2M", "backtest_signal_stride": 0}  # the backtest on the scorecard's origins only


def _calendar(n: int = 400) -> np.ndarray:
    return np.array(pd.bdate_range("2020-01-01", periods=n), dtype="datetime64[s]")


def _config(**extra):
    return load_config({"lookback_window": 20, "predict_window": 5, "train_time_range": "2020-01-01:2020-12-31",
                        "val_time_range": "2020-06-01:2021-03-31", "test_time_range": "2021-01-01:2021-06-30", **extra})


def _settings(**extra) -> fl.Settings:
    values = {"folds": 3, "fold_length": "1M", "mode": "expanding", "train_length": "", "embargo": None,
              "val_length": "", "end": "", "retrain": "predictor", **extra}
    return fl.Settings.checked(**values)


def _index(calendar, day: str) -> int:
    return int(np.flatnonzero(calendar == np.datetime64(day, "s"))[0])


def assert_walk_forward(folds: list[fl.Fold], calendar: np.ndarray, lookback: int) -> None:
    """Consecutive disjoint test periods; each fold's validation ends `embargo` bars before its
    test starts; training ends the bar before validation; its config ranges give lookback only."""
    for before, fold in zip(folds, folds[1:], strict=False):
        assert _index(calendar, fold.test[0]) == _index(calendar, before.test[1]) + 1
    for fold in folds:
        t0, v0, v1 = (_index(calendar, d) for d in (fold.test[0], fold.val[0], fold.val[1]))
        assert t0 - v1 - 1 == fold.embargo
        assert _index(calendar, fold.train[1]) == v0 - 1
        assert _index(calendar, fold.ranges["test_time_range"][0]) == t0 - lookback
        assert fold.ranges["test_time_range"][1] == fold.test[1]
        assert fold.ranges["train_time_range"][1] == fold.train[1] < fold.val[0]


def test_each_folds_runs_are_named_after_the_fold_the_stage_and_the_market():
    """A walk-forward's parent, its fold runs and each fold's steps tell themselves apart in the UI."""
    import argparse

    from kronos_mlflow.tracking import run_names
    from kronos_mlflow.workflows.walkforward.command import fold_args

    calendar, config = _calendar(), _config()
    folds = fl.plan(config, _settings(), calendar)
    args = fold_args(argparse.Namespace(registered_model_name="kr", check=True), folds, _settings(), folds[1])
    assert args.run_name_fold == (2, 3)
    assert run_names.walkforward(config, len(folds)) == "walkforward demo 3 folds"
    assert run_names.fold_run(config, args.run_name_fold) == "fold 2/3 demo"
    predictor = load_config({"stage": "predictor", "qlib_data_path": "/data/cn", "instrument": "csi300"})
    assert run_names.training(predictor, fold=args.run_name_fold).startswith("fold 2/3 predictor lr=")
    assert run_names.training(predictor, fold=args.run_name_fold).endswith(" csi300")
    assert run_names.evaluation(predictor, fold=args.run_name_fold) == "fold 2/3 evaluate csi300"


def test_the_fold_table_is_consecutive_with_the_embargo_in_both_modes():
    calendar, config = _calendar(), _config()
    expanding = fl.plan(config, _settings(), calendar)
    assert [f.fold for f in expanding] == [1, 2, 3] and expanding[-1].test[1] == "2021-06-30"
    assert_walk_forward(expanding, calendar, 20)
    assert {f.train[0] for f in expanding} == {"2020-01-01"} and expanding[0].embargo == 5  # predict_window
    assert fl.plan(section(config, "data"), _settings(), calendar) == expanding  # the data section alone
    rolling = fl.plan(config, _settings(mode="rolling", train_length="60", embargo="2", val_length="15"), calendar)
    assert_walk_forward(rolling, calendar, 20)
    assert {f.train_bars for f in rolling} == {60} and {f.val_bars for f in rolling} == {15}
    assert [f.test for f in rolling] == [f.test for f in expanding]  # the test periods do not depend on the mode
    # predictor (default): every fold's tokenizer is the first fold's, trained before any test bar
    assert all(fl.stage_ranges(expanding, _settings(), f, False) == expanding[0].ranges for f in expanding)
    assert fl.stage_ranges(expanding, _settings(retrain="both"), expanding[2], False) == expanding[2].ranges
    assert fl.stage_ranges(expanding, _settings(), expanding[2], True) == expanding[2].ranges  # the predictor
    assert fl.table(expanding).splitlines()[1].split()[:2] == ["1", f"{expanding[0].train[0]}..{expanding[0].train[1]}"]


@pytest.mark.parametrize(("settings", "needle"), [
    ({"folds": "0"}, "folds: 0 is out of range; expected an integer from 1 to 100"),
    ({"fold_length": "3Q"}, "fold_length: '3Q' is not a length; expected a number of bars (60) or a calendar span"),
    ({"mode": "sideways"}, "walkforward_mode: 'sideways' is not one of expanding, rolling"),
    ({"mode": "rolling"}, "walkforward_mode rolling keeps train_length bars of training per fold, and train_length is "
                          "empty"),
    ({"retrain": "tokenizer"}, "walkforward_retrain: 'tokenizer' is not one of predictor, both"),
    ({"embargo": "-3"}, "embargo: -3 is out of range"),
    ({"end": "2021-02-30"}, "walkforward_end: '2021-02-30' is not a date"),
])
def test_bad_settings_are_one_line_naming_the_value(settings, needle):
    with pytest.raises(UserError) as caught:
        _settings(**settings)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_folds_that_cannot_be_built_are_refused_naming_the_fold():
    calendar, config = _calendar(), _config()
    with pytest.raises(UserError, match=r"^fold 1: its training period .* has \d+ bars; expected at least 25"):
        fl.plan(config, _settings(folds=16), calendar)
    with pytest.raises(UserError, match=r"^fold \d+: its training period .* would start before the calendar's first bar"):
        fl.plan(config, _settings(mode="rolling", train_length="1Y", folds=6), calendar)


@pytest.mark.parametrize(("flags", "needle"), [  # the other bad settings: the walk-forward rows of test_hostile_input
    (("--folds", "3", "--fold", "4"), "fold: 4 is out of range; expected an integer from 0 to 3"),
    (("--check", "--folds", "3", "--fold-length", "3Q"), "fold_length: '3Q' is not a length"),
])
def test_kronos_mlflow_walk_forward_refuses_bad_settings_in_one_line(tmp_path, commands, flags, needle):
    """Through the command a user types: exit 2, one line naming the value, no run, no traceback."""
    from mlflow import MlflowClient

    root, env = pipeline_workdir(tmp_path / "wf")
    proc = commands.run([sys.executable, "-m", "kronos_mlflow", "walk-forward", "--config", str(root / "tiny.yaml"),
                         *flags], cwd=root, env=env)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs(["0"]) == []


def _walk_forward(root: Path, env: dict, **params) -> subprocess.CompletedProcess:
    values = {**SMALL, "config_file": root / "tiny.yaml", **params}
    command = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "walkforward",
               *[a for k, v in values.items() for a in ("-P", f"{k}={v}")]]
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def _pooled(client, run_id: str) -> dict[str, float]:
    return {k: v for k, v in client.get_run(run_id).data.metrics.items() if k.startswith(("pooled_", "fold", "win_"))}


def _aggregate(commands, root: Path, env: dict, run_id: str) -> subprocess.CompletedProcess:
    return commands.run([sys.executable, "-m", "kronos_mlflow", "walk-forward", "--aggregate", run_id], cwd=root,
                        env=env)


def _walk_forward_process(root: Path, env: dict, log: Path, **params) -> subprocess.Popen:
    values = {**SMALL, "config_file": root / "tiny.yaml", **params}
    command = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "walkforward",
               *[a for k, v in values.items() for a in ("-P", f"{k}={v}")]]
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _evaluation_process(proc: subprocess.Popen, timeout_s: float) -> int:
    """The pid of the evaluation step's process under ``proc``, once it has started."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid = process_under(proc.pid, b"kronos_mlflow", b"evaluate")
        if pid is not None:
            return pid
        assert proc.poll() is None, f"the walk-forward exited (code {proc.returncode}) before its evaluation step"
        assert time.monotonic() < deadline, f"no evaluation step within {timeout_s:.0f} s"
        time.sleep(0.05)


def _parents(client) -> list:
    return [r for r in client.search_runs(["0"], order_by=["attributes.start_time ASC"])
            if r.data.tags.get("walkforward.role") == "parent"]


def _stopped_by_sigint(root: Path, env: dict) -> set[str]:
    """The whole walk-forward as ``mlflow run`` would type it, ``python -m kronos_mlflow
    walk-forward`` with every flag, on a fresh store; SIGINT to that process (not its group)
    once fold 1's evaluation step runs: it sends the stop on, waits for the step, and ends its
    runs KILLED (the finished steps stay FINISHED), one line on stderr, no traceback, exit code
    130 (what users met: the evaluation child left RUNNING and its parent FAILED). Its run ids."""
    from mlflow import MlflowClient
    from mlflow.projects.utils import load_project

    values = {k: str(v) for k, v in {**SMALL, "config_file": root / "tiny.yaml"}.items()}
    command = shlex.split(load_project(str(ROOT)).get_entry_point("walkforward").compute_command(values, None))
    assert command[:4] == ["python", "-m", "kronos_mlflow", "walk-forward"]
    with open(root / "sigint.out", "w") as out, open(root / "sigint.err", "w") as err:
        proc = subprocess.Popen([sys.executable, *command[1:]], cwd=root, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    before = interrupt_when(proc, lambda: _evaluation_process(proc, timeout_s=900), root / "sigint.err")
    said = (root / "sigint.err").read_bytes()[before:].decode(errors="replace")
    lines = [line for line in said.splitlines() if line.strip() and not MLFLOW_INFO.match(line)]
    assert proc.returncode == 130, said[-3000:]
    assert "Traceback" not in said and len(lines) == 1, said[-3000:]  # MLflow's INFO lines of a step ending aside
    assert lines[0].startswith("kronos-mlflow walk-forward: stopped by SIGINT; every run it left unfinished ended "
                               "KILLED"), lines
    assert "Traceback" not in (root / "sigint.err").read_text()
    runs = MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs(["0"], order_by=["attributes.start_time ASC"])
    status = {("walk-forward" if r.data.tags.get("walkforward.role") == "parent" else
               r.data.tags.get("pipeline.step") or f"fold {r.data.tags.get('walkforward.fold')}"): r.info.status
              for r in runs}
    assert status == {"walk-forward": "KILLED", "fold 1": "KILLED", "tokenizer": "FINISHED", "predictor": "FINISHED",
                      "evaluation": "KILLED"}, status
    assert all("stop_reason" in r.data.tags for r in runs if r.info.status == "KILLED")
    return {r.info.run_id for r in runs}


@pytest.mark.slow
def test_mlflow_run_walkforward_fold_by_fold_with_a_sigterm_then_the_whole_command(tmp_path, commands):
    """Two folds of 2M on the demo market, typed as a team would: the whole command stopped by
    SIGINT in fold 1's evaluation; -P fold=1 makes a parent (reusing the stopped command's
    finished steps); fold 2 into it is SIGTERMed in its evaluation step and the same command
    continues; --aggregate. The whole command then trains nothing (every step of every fold
    reused) and its parent holds the same numbers; its fold table, what each fold forecasts and
    the pooled verdict are checked against the folds' own files; the champion moves only on better."""
    from mlflow import MlflowClient

    root, env = pipeline_workdir(tmp_path / "wf")
    with open(root / "tiny.yaml", "a") as config:  # each fold's calibrator on 60 origins (calibration_min_origins: 30)
        config.write("n_val_skill_windows: 60\n")
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    stopped = _stopped_by_sigint(root, env)
    one = _walk_forward(root, env, fold=1)
    (parent,) = [p for p in _parents(client) if p.info.run_id not in stopped]
    pid = parent.info.run_id
    assert "fold  train" in one.stdout and f"--aggregate {pid}" in one.stdout
    early = _aggregate(commands, root, env, pid)
    assert early.returncode == 2 and "fold 2 has not run" in early.stderr and "Traceback" not in early.stderr

    proc = _walk_forward_process(root, env, tmp_path / "sigterm.log", fold=2, parent_run_id=pid)
    try:
        os.kill(_evaluation_process(proc, timeout_s=600), signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = (tmp_path / "sigterm.log").read_text()
    assert proc.returncode != 0 and "step evaluation ended" in said, said[-3000:]
    assert "the same command again continues from this step" in said
    again = _walk_forward(root, env, fold=2, parent_run_id=pid)
    assert "[pipeline] tokenizer: reused run" in again.stdout and "[pipeline] predictor: reused run" in again.stdout
    launchers = [r for r in client.search_runs(["0"]) if r.data.tags.get("walkforward.ran_into") == pid]
    assert len(launchers) == 2  # mlflow run's own runs of fold 2 (stopped, then continued) say where they went
    done = _aggregate(commands, root, env, pid)
    assert done.returncode == 0, done.stderr[-3000:]
    assert client.get_run(pid).info.status == "FINISHED"
    by_fold = _pooled(client, pid)

    # the whole command, with a registered model: every step of every fold reused, the same
    # numbers, and the champion alias moves only on a walk-forward verdict of better
    trained = {r.info.run_id for r in client.search_runs(["0"]) if r.data.tags.get("pipeline.step")}
    whole = _walk_forward(root, env, registered_model_name="kronos-wf")
    assert {r.info.run_id for r in client.search_runs(["0"]) if r.data.tags.get("pipeline.step")} == trained
    assert whole.stdout.count("reused run") == 2 * 3, whole.stdout[-3000:]
    parent = _parents(client)[-1]
    wid = parent.info.run_id
    assert wid != pid and parent.info.status == "FINISHED"
    assert "fold  train" in whole.stdout and f"[walk-forward] done: parent run {wid}" in whole.stdout
    assert sorted(_pooled(client, wid)) == sorted(by_fold) and _pooled(client, wid) == pytest.approx(by_fold, rel=1e-12)
    verdict = parent.data.tags["walkforward_verdict_vs_zeroshot"]
    aliases = {a for m in client.search_registered_models() for a in (m.aliases or {})}
    if verdict == "better":
        assert aliases and "champion_unchanged" not in parent.data.tags
    else:
        assert parent.data.tags["champion_unchanged"].startswith(f"walk-forward verdict vs zeroshot is {verdict}")
        assert f"champion unchanged: walk-forward verdict vs zeroshot is {verdict}" in whole.stdout
        assert not aliases
    metrics, fold_run = _each_fold(client, env, parent, tmp_path)

    # --aggregate recomputes the same verdict from the parent's own folds; a fold run is no parent
    proc = _aggregate(commands, root, env, wid)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert client.get_run(wid).data.metrics["pooled_skill_vs_zeroshot"] == metrics["pooled_skill_vs_zeroshot"]
    bad = _aggregate(commands, root, env, fold_run.info.run_id)
    assert bad.returncode == 2 and "is not a walk-forward parent" in bad.stderr and "Traceback" not in bad.stderr


def _each_fold(client, env: dict, parent, tmp_path: Path):
    """The walk-forward ``parent``'s fold table, what each fold forecasts and the pooled verdict,
    against the folds' own files; the parent's metrics and its last fold run."""
    import mlflow

    wid = parent.info.run_id
    table = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=wid, artifact_path="walkforward/folds.json", dst_path=str(tmp_path / "a"),
        tracking_uri=env["MLFLOW_TRACKING_URI"])).read_text())
    folds = [fl.Fold(**{**f, **{k: tuple(f[k]) for k in ("train", "val", "test")}}) for f in table["folds"]]
    calendar_file = next((Path(env["KRONOS_MLFLOW_HOME"]) / "demo_market").glob("*/calendars/day.txt"))
    calendar = np.array(calendar_file.read_text().split(), dtype="datetime64[s]")
    assert len(folds) == 2 and folds[-1].test[1] == "2025-06-05"
    assert_walk_forward(folds, calendar, TINY["lookback_window"])

    # each fold: a pipeline parent under the walk-forward parent, its evaluation's scorecard; no
    # origin forecasts a bar before the fold's training, validation and embargo end
    pooled, verdicts = [], []
    for fold in folds:
        fold_run = client.get_run(parent.data.tags[f"walkforward.fold{fold.fold}_run_id"])
        assert fold_run.data.tags["mlflow.parentRunId"] == wid and fold_run.info.status == "FINISHED"
        evaluation = client.get_run(fold_run.data.tags["pipeline.evaluation_run_id"])
        assert evaluation.data.params["test_time_range"] == ":".join(fold.ranges["test_time_range"])
        origins = pd.read_parquet(mlflow.artifacts.download_artifacts(
            run_id=evaluation.info.run_id, artifact_path="evaluation/origins.parquet",
            dst_path=str(tmp_path / f"o{fold.fold}"), tracking_uri=env["MLFLOW_TRACKING_URI"]))
        first_forecast = np.searchsorted(calendar, origins["datetime"].to_numpy(dtype="datetime64[s]"), side="right")
        assert calendar[first_forecast].min() >= np.datetime64(fold.test[0], "s") > np.datetime64(fold.val[1], "s")
        pooled.append(origins)
        verdicts.append(evaluation.data.tags["verdict_vs_zeroshot"])
    every = pd.concat(pooled)
    value, low, high = skill(every["finetuned_mase"], every["zeroshot_mase"], every["datetime"].to_numpy())
    metrics = client.get_run(wid).data.metrics
    assert metrics["pooled_skill_vs_zeroshot"] == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert metrics["folds_better_vs_zeroshot"] == sum(v == "better" for v in verdicts)
    history = client.get_metric_history(wid, "fold_skill_vs_zeroshot")
    assert sorted(m.step for m in history) == [1, 2]
    # each fold calibrated on its own validation; the parent pools coverage, PIT and the verdict
    for name in ("pooled_test_coverage_80", "pooled_calibrated_test_coverage_50", "pooled_calibrated_test_coverage_80",
                 "pooled_calibrated_test_coverage_90", "pooled_test_pit_ks", "pooled_calibrated_test_pit_ks",
                 "pooled_histvol_test_coverage_80", "pooled_wql_skill_calibrated_vs_raw"):
        assert name in metrics, name
    assert parent.data.tags["pooled_verdict_calibrated_vs_raw"] in ("better", "worse", "inconclusive")
    # aci across folds: fold 1 starts at the nominal levels, fold 2 where fold 1's ended (its evaluation run's
    # own aci_state.json); the forecasters table pools every forecaster over both folds
    first, second = (client.get_run(client.get_run(parent.data.tags[f"walkforward.fold{k}_run_id"])
                                    .data.tags["pipeline.evaluation_run_id"]) for k in (1, 2))
    assert first.data.tags["aci_start"] == "nominal" and second.data.tags["aci_start"] == first.info.run_id
    assert first.data.metrics["aci_start_level_80"] == pytest.approx(0.2)
    assert second.data.metrics["aci_start_level_80"] == pytest.approx(first.data.metrics["aci_end_level_80"])
    state = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=first.info.run_id, artifact_path="evaluation/aci_state.json", dst_path=str(tmp_path / "aci"),
        tracking_uri=env["MLFLOW_TRACKING_URI"])).read_text())
    assert state["run_id"] == first.info.run_id and state["start"] == "nominal"
    assert state["test_time_range"] == first.data.params["test_time_range"]
    for name in ("pooled_test_wql_close", "pooled_ensemble_test_wql_close", "pooled_aci_test_coverage_80",
                 "pooled_histvol_test_coverage_80_vol1", "pooled_ensemble_test_coverage_80_vol3"):
        assert name in metrics, name
    table = pd.read_csv(mlflow.artifacts.download_artifacts(
        run_id=wid, artifact_path="walkforward/forecasters.csv", dst_path=str(tmp_path / "t"),
        tracking_uri=env["MLFLOW_TRACKING_URI"]))
    assert {"finetuned (raw)", "finetuned_calibrated", "ensemble (served)", "aci", "histvol",
            "persistence"} <= set(table["forecaster"]) and (table["folds"] == 2).all()
    rows = table.set_index("forecaster")
    assert rows.loc["aci", "coverage_80"] == pytest.approx(metrics["pooled_aci_test_coverage_80"])
    print("walk-forward pooled coverage 50/80/90: raw " + "/".join(
        f"{metrics.get(f'pooled_test_coverage_{c}', float('nan')):.3f}" for c in (50, 80, 90)) + ", calibrated " + "/".join(
        f"{metrics[f'pooled_calibrated_test_coverage_{c}']:.3f}" for c in (50, 80, 90)) + ", histvol " + "/".join(
        f"{metrics[f'pooled_histvol_test_coverage_{c}']:.3f}" for c in (50, 80, 90)))
    artifacts = {a.path for a in client.list_artifacts(wid, "walkforward")}
    assert {"walkforward/summary.json", "walkforward/skill_by_fold.png", "walkforward/folds.json",
            "walkforward/forecasters.csv", "walkforward/forecasters.json", "walkforward/forecasters.md"} <= artifacts
    return metrics, fold_run
