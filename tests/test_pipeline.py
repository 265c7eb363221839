"""``mlflow run . -e pipeline`` end to end, on the demo market with the tiny sizes: one parent run
and three child runs, the champion rules, reuse of FINISHED steps, ``force``, and a predictor step
stopped by SIGTERM that the same command continues. Every scenario runs in the first
pipeline's directory and store, one after the other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiny_runs import fault_injection, pipeline_workdir, process_under

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"epochs": 1, "predictor_epochs": 1, "batch_size": 8, "n_train_iter": 64, "n_val_iter": 36, "comet": "off",
         "backtest_signal_stride": 0}  # the backtest on the scorecard's own origins: no forecasts of its own
STEPS = ("tokenizer", "predictor", "evaluation")


def _command(root: Path, **params) -> list[str]:
    values = {**SMALL, "config_file": root / "tiny.yaml", **params}
    return [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "pipeline",
            *[a for k, v in values.items() for a in ("-P", f"{k}={v}")]]


def _pipeline(root: Path, env: dict, **params) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(_command(root, **params), cwd=root, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)
    return proc, time.monotonic() - started


def _runs(env: dict):
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    return client, client.search_runs(["0"], order_by=["attributes.start_time ASC"])


def _parents(runs):
    return [r for r in runs if r.data.tags.get("pipeline.role") == "parent"]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The first pipeline, with a registered model name, typed twice at the same moment on a fresh
    store: every step trains once."""
    root, env = pipeline_workdir(tmp_path_factory.mktemp("pipeline"))
    started = time.monotonic()
    logs = [open(root / f"first-{i}.log", "w+") for i in range(2)]
    procs = [subprocess.Popen(_command(root, registered_model_name="kr"), cwd=root, env=env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) for log in logs]
    codes = [proc.wait(timeout=900) for proc in procs]
    seconds = time.monotonic() - started
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    assert codes == [0, 0], [out[-3000:] for out in outputs]
    return root, env, outputs, seconds


@pytest.mark.slow
def test_two_identical_pipelines_at_once_make_one_set_of_runs_and_the_champion_rules(first, monkeypatch):
    """Each step was claimed by one pipeline and trained once; the other waited for it and reused
    it: one tokenizer, one predictor and one evaluation run, each step's metrics logged once."""
    root, env, outputs, seconds = first
    client, runs = _runs(env)
    parents = _parents(runs)
    assert len(parents) == 2
    steps = [r for r in runs if "pipeline.step" in r.data.tags]
    children = {r.data.tags["pipeline.step"]: r for r in steps}
    assert len(steps) == 3 and sorted(children) == sorted(STEPS), [r.data.tags.get("pipeline.step") for r in steps]
    for step in STEPS:
        assert {p.data.tags[f"pipeline.{step}_run_id"] for p in parents} == {children[step].info.run_id}
        assert sorted(p.data.tags[f"pipeline.{step}_reused"] for p in parents) == ["false", "true"]
        assert children[step].info.status == "FINISHED"
        trainer = next(p for p in parents if p.data.tags[f"pipeline.{step}_reused"] == "false")
        assert children[step].data.tags["mlflow.parentRunId"] == trainer.info.run_id
        for key in children[step].data.metrics:  # no metric point twice
            history = [(m.step, m.timestamp) for m in client.get_metric_history(children[step].info.run_id, key)]
            assert len({st for st, _ in history}) == len(history), (step, key)
    assert any("another pipeline" in out and "waiting for it" in out for out in outputs), outputs[0][-2000:]
    parent = next(p for p in parents if p.data.tags["pipeline.tokenizer_reused"] == "false")
    tags = parent.data.tags
    tokenizer, predictor, evaluation = (children[s] for s in STEPS)
    assert tokenizer.data.params["stage"] == "tokenizer" and predictor.data.params["stage"] == "predictor"
    assert predictor.data.params["finetuned_tokenizer_path"] == f"runs:/{tokenizer.info.run_id}/best_model"
    assert evaluation.data.tags["predictor_run_id"] == predictor.info.run_id
    assert "skill_vs_persistence" in parent.data.metrics and "skill_vs_zeroshot" in parent.data.metrics
    assert tags["verdict_vs_zeroshot"] == evaluation.data.tags["verdict_vs_zeroshot"]
    assert tags["tokenizer_verdict"] == tokenizer.data.tags["verdict"]
    # the predictor step (evaluate off) fit the calibrator its logged model carries; the evaluation
    # step scored that very calibrator, with the diagnostics, histvol and their pictures
    assert "evaluation/calibrator.json" in {a.path for a in client.list_artifacts(predictor.info.run_id, "evaluation")}
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)  # a models:/ id is looked up in the store
    model_dir = Path(mlflow.artifacts.download_artifacts(artifact_uri=predictor.data.tags["best_model_uri"],
                                                         dst_path=str(root / "served"),
                                                         tracking_uri=client.tracking_uri,
                                                         registry_uri=client.tracking_uri))
    assert (model_dir / "artifacts" / "calibrator" / "calibrator.json").is_file()
    assert evaluation.data.tags["calibration"] == "model"
    assert evaluation.data.metrics["calibration_origins"] == predictor.data.metrics["calibration_origins"]
    assert {f"evaluation/{n}" for n in ("pit.png", "reliability.png", "calibrator.json")} <= {
        a.path for a in client.list_artifacts(evaluation.info.run_id, "evaluation")}
    assert {"test_coverage_90", "test_pit_ks", "test_brier_up", "histvol_test_wql_close", "calibrated_test_coverage_80",
            "wql_skill_calibrated_vs_raw", "wql_skill_vs_histvol"} <= set(evaluation.data.metrics)
    assert evaluation.data.tags["verdict_calibrated_vs_raw"] in ("better", "worse", "inconclusive")
    # each alias moves only on a better verdict against the starting weights
    from kronos_mlflow.workflows.sweep.champion import current_champion

    for step, verdict in (("tokenizer", tokenizer.data.tags["verdict"]),
                          ("predictor", evaluation.data.tags["verdict_vs_zeroshot"])):
        champion = current_champion(client, f"kr-{step}")
        if verdict == "better":
            assert champion.run_id == children[step].info.run_id and tags[f"{step}_champion"] == f"kr-{step}/1"
        else:
            assert champion is None and "not better" in tags[f"{step}_champion_unchanged"]
    print(f"two pipelines at once: {seconds:.1f} s; steps " + ", ".join(
        f"{s} {max(p.data.metrics[f'{s}_seconds'] for p in parents):.1f} s" for s in STEPS))


@pytest.mark.slow
def test_the_same_command_again_trains_nothing_and_promote_always_moves_both(first):
    """A hand-made run with the tokenizer run's tags copied (newer, FINISHED, the same digests,
    owner tag, directory and model URI) is named and passed over: the genuine run is reused."""
    root, env, _, _ = first
    client, before = _runs(env)
    genuine = next(r for r in before if r.data.tags.get("pipeline.step") == "tokenizer")
    forged = client.create_run("0", run_name="copied tags",
                               tags={k: v for k, v in genuine.data.tags.items() if not k.startswith("mlflow.")})
    client.set_terminated(forged.info.run_id, "FINISHED")
    _, before = _runs(env)
    proc, seconds = _pipeline(root, env, registered_model_name="kr", promote="always")
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = _runs(env)
    new = [r for r in runs if r.info.run_id not in {b.info.run_id for b in before}]
    (parent,) = new  # no child: every step reused
    for step in STEPS:
        assert parent.data.tags[f"pipeline.{step}_reused"] == "true"
        assert parent.data.metrics[f"{step}_seconds"] == 0.0
    assert parent.data.tags["pipeline.tokenizer_run_id"] == genuine.info.run_id
    # the new parent's description links the reused steps (they stay under the first parent)
    note = parent.data.tags["mlflow.note.content"]
    for step in STEPS:
        run_id = parent.data.tags[f"pipeline.{step}_run_id"]
        assert f"- {step}: [{run_id}](#/experiments/{parent.info.experiment_id}/runs/{run_id}) (reused)" in note
    assert f"[pipeline] done: parent run {parent.info.run_id}; look at it: mlflow ui --backend-store-uri" in proc.stdout
    assert (f"[pipeline] tokenizer: run {forged.info.run_id} has this config but is not reused: run "
            f"{forged.info.run_id}'s directory") in proc.stdout, proc.stdout[-3000:]
    assert "[pipeline] tokenizer: reused run" in proc.stdout
    from kronos_mlflow.workflows.sweep.champion import current_champion

    for step in ("tokenizer", "predictor"):
        assert current_champion(client, f"kr-{step}").run_id == parent.data.tags[f"pipeline.{step}_run_id"]
    print(f"second identical pipeline: {seconds:.1f} s")


@pytest.mark.slow
def test_force_trains_every_step_again(first):
    root, env, _, _ = first
    _, before = _runs(env)
    proc, _ = _pipeline(root, env, force="true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = _runs(env)
    new = [r for r in runs if r.info.run_id not in {b.info.run_id for b in before}]
    (parent,) = _parents(new)
    children = [r for r in new if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["pipeline.step"] for r in children) == sorted(STEPS)
    assert all(parent.data.tags[f"pipeline.{s}_reused"] == "false" for s in STEPS)
    assert all(r.info.status == "FINISHED" for r in children)


def _faults():
    return fault_injection()


def _predictor_process(faults, root_pid: int) -> int:
    pid = process_under(root_pid, b"kronos_mlflow.train", b"predictor")
    if pid is not None:
        return pid
    raise AssertionError("no predictor training process under the pipeline")


def _wait_for_first_epoch(folder: Path, earlier: set[Path], proc: subprocess.Popen, timeout_s: float) -> None:
    """Return once a run directory under ``folder`` that is not in ``earlier`` holds the training
    state of epoch 0 (or later); fail if ``proc`` ends first."""
    deadline = time.monotonic() + timeout_s
    while True:
        for path in set(folder.glob("cfg-*")) - earlier:
            try:
                if json.loads((path / "checkpoints" / "last" / "state.json").read_text())["epoch"] >= 0:
                    return
            except (OSError, ValueError, KeyError):
                pass
        assert proc.poll() is None, f"the pipeline exited (code {proc.returncode}) before the predictor's epoch 0"
        assert time.monotonic() < deadline, f"no predictor epoch saved within {timeout_s:.0f} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_in_the_predictor_step_then_the_same_command_continues(first):
    """In the first pipeline's directory, with more predictor epochs (a new predictor config; the
    tokenizer step is reused): the predictor's training process SIGTERMed after its first epoch
    ends the step KILLED and the command fails; the same command again reuses the tokenizer,
    continues the stopped predictor run from its saved state (no epoch logged twice) and makes it
    the new parent's predictor step."""
    faults = _faults()
    root, env, _, _ = first
    _, before = _runs(env)
    known = {r.info.run_id for r in before}
    folder = root / "outputs" / "finetune_predictor_demo"
    earlier = set(folder.glob("cfg-*"))  # the finished predictor runs' directories
    params = {"predictor_epochs": 6}  # epochs of under a second: the SIGTERM after the first lands in training
    with open(root / "sigterm.log", "w") as log:
        proc = subprocess.Popen(_command(root, **params), cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_first_epoch(folder, earlier, proc, timeout_s=300)
        os.kill(_predictor_process(faults, proc.pid), signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            faults.kill_tree(proc.pid)
    output = (root / "sigterm.log").read_text()
    assert proc.returncode != 0
    assert "kronos-mlflow pipeline: step predictor ended KILLED" in output, output[-3000:]
    client, runs = _runs(env)
    (stopped,) = [r for r in runs if r.data.tags.get("pipeline.step") == "predictor" and r.info.run_id not in known]
    assert stopped.info.status == "KILLED"

    again, _ = _pipeline(root, env, **params)
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert "[pipeline] tokenizer: reused run" in said
    assert f"[pipeline] predictor: continuing run {stopped.info.run_id}" in said
    assert "[kronos] resuming at epoch" in said
    client, runs = _runs(env)
    parent = _parents(runs)[-1]
    assert parent.data.tags["pipeline.tokenizer_reused"] == "true"
    assert parent.data.tags["pipeline.predictor_run_id"] == stopped.info.run_id
    run = client.get_run(stopped.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    history = client.get_metric_history(run.info.run_id, "val_predictor_loss_epoch")
    assert sorted({m.step for m in history}) == sorted(m.step for m in history)  # no epoch logged twice
