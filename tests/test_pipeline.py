"""``mlflow run . -e pipeline`` end to end, on the demo market with the tiny sizes: one parent run
and three child runs, the champion rules, reuse of FINISHED steps, a predictor step stopped by
SIGTERM that the same command continues, a command stopped by SIGINT in its training step
(``force``: the step trains again) that ends every run KILLED, and what ``force`` launches.
Every scenario runs in the first pipeline's directory and store, one after the other."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiny_runs import TRACKING_ENV, fault_injection, interrupt_when, pipeline_workdir, process_under

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
    with open(root / "tiny.yaml", "a") as config:  # the calibrator on 60 origins (calibration_min_origins: 30)
        config.write("n_val_skill_windows: 60\n")
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


def _exited(*words: bytes, timeout_s: float) -> None:
    """Return once no process whose argv holds every one of ``words`` runs (waiting on the
    first found to exit); fail past ``timeout_s``."""
    for path in Path("/proc").iterdir():
        try:
            argv = (path / "cmdline").read_bytes().split(b"\0") if path.name.isdigit() else []
        except OSError:
            continue
        if not all(word in argv for word in words):
            continue
        try:
            handle = os.pidfd_open(int(path.name))
        except ProcessLookupError:
            continue  # it has just exited
        try:
            ready, _, _ = select.select([handle], [], [], timeout_s)
        finally:
            os.close(handle)
        assert ready, f"process {path.name} {words} still runs after {timeout_s:.0f} s"
        return


@pytest.mark.slow
def test_mlflow_run_pipeline_interrupted_in_its_training_step_ends_its_runs_killed(first):
    """``mlflow run . -e pipeline -P force=true`` in the first pipeline's store, and SIGINT to
    that process (what users type, and what Ctrl-C reaches first) while the tokenizer step
    trains: force trains it again past its FINISHED run of the same config; MLflow passes the
    stop on, the pipeline passes it to its step, every run ends KILLED, the run MLflow handed
    over included (MLflow marks it FAILED once the pipeline has exited; the pipeline's detached
    helper puts KILLED back)."""
    root, env, _, _ = first
    _, earlier = _runs(env)
    known = {r.info.run_id for r in earlier}
    finished = {r.data.tags["config_digest"] for r in earlier
                if r.data.tags.get("pipeline.step") == "tokenizer" and r.info.status == "FINISHED"}
    with open(root / "sigint.out", "w") as out, open(root / "sigint.err", "w") as err:
        proc = subprocess.Popen(_command(root, force="true"), cwd=root, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def training_step() -> None:  # a process, with no event to wait on: looked for every 50 ms
        deadline = time.monotonic() + 600
        while process_under(proc.pid, b"kronos_mlflow.train") is None:
            assert proc.poll() is None, f"the pipeline exited (code {proc.returncode}) before its training step"
            assert time.monotonic() < deadline, "no training step within 600 s"
            time.sleep(0.05)

    before = interrupt_when(proc, training_step, root / "sigint.err")
    err = (root / "sigint.err").read_bytes()[before:].decode(errors="replace")
    assert proc.returncode != 0 and "Traceback" not in err, err[-3000:]
    ours = [line for line in err.splitlines() if line.startswith("kronos-mlflow pipeline: ")]
    assert ours == ["kronos-mlflow pipeline: stopped by SIGTERM; every run it left unfinished ended KILLED (2); the "
                    "same command again continues where it stopped"], err[-3000:]
    client, runs = _runs(env)
    new = [r for r in runs if r.info.run_id not in known]
    (parent,) = _parents(new)
    # the helper waits for `mlflow run` to exit, then ends the run it handed over KILLED again
    _exited(b"kronos_mlflow.launch", parent.info.run_id.encode(), timeout_s=90)
    runs = [client.get_run(r.info.run_id) for r in new]
    assert sorted(r.data.tags.get("pipeline.step", "parent") for r in runs) == ["parent", "tokenizer"]
    assert {r.info.status for r in runs} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in runs]
    assert all("stop_reason" in r.data.tags and "failure_reason" not in r.data.tags for r in runs)
    tokenizer = next(r for r in runs if r.data.tags.get("pipeline.step") == "tokenizer")
    assert tokenizer.data.tags["config_digest"] in finished and parent.data.params["force"] == "true"
    assert "reused run" not in (root / "sigint.out").read_text()


@pytest.mark.slow
def test_force_trains_every_step_again(first, monkeypatch, capsys):
    """``force=true`` as ``mlflow run . -e pipeline`` hands it to the pipeline, on the first
    pipeline's store (every step FINISHED and reusable): each step is launched again in a new
    child run of a new parent, a training with ``--resume never``, none reused. The launch of a
    step's process is replaced by one that ends the run it was handed FINISHED (a forced step's
    real training: the SIGINT test above)."""
    import mlflow
    from mlflow.projects.utils import load_project

    from kronos_mlflow.cli.main import build_parser
    from kronos_mlflow.workflows import pipeline as pipeline_module

    root, env, _, _ = first
    client, before = _runs(env)
    finished = {r.data.tags["config_digest"] for r in before
                if r.data.tags.get("pipeline.step") == "tokenizer" and r.info.status == "FINISHED"}
    for name in TRACKING_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in ("KRONOS_MLFLOW_HOME", "MLFLOW_TRACKING_URI", "COMET_OFFLINE_DIRECTORY"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.chdir(root)
    values = {k: str(v) for k, v in {**SMALL, "config_file": root / "tiny.yaml", "force": "true"}.items()}
    argv = shlex.split(load_project(str(ROOT)).get_entry_point("pipeline").compute_command(values, None))
    assert argv[:4] == ["python", "-m", "kronos_mlflow", "pipeline"]
    launched = []

    def step_process(command, step_env):
        launched.append(list(command))
        client.set_terminated(step_env["MLFLOW_RUN_ID"], "FINISHED")
        return 0

    monkeypatch.setattr(pipeline_module, "run_child", step_process)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        args = build_parser(argv[3:]).parse_args(argv[3:])
        assert pipeline_module.run(args) == 0
    finally:
        for sig, handler in handlers.items():  # the command's stop handlers
            signal.signal(sig, handler)
        mlflow.set_tracking_uri(None)
    _, runs = _runs(env)
    new = [r for r in runs if r.info.run_id not in {b.info.run_id for b in before}]
    (parent,) = _parents(new)
    children = [r for r in new if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["pipeline.step"] for r in children) == sorted(STEPS)
    assert all(parent.data.tags[f"pipeline.{s}_reused"] == "false" for s in STEPS)
    assert all(r.info.status == "FINISHED" for r in children) and parent.info.status == "FINISHED"
    assert len(launched) == 3 and [c[-2:] for c in launched[:2]] == [["--resume", "never"]] * 2
    assert next(r for r in children if r.data.tags["pipeline.step"] == "tokenizer").data.tags["config_digest"] in finished
    assert "reused run" not in capsys.readouterr().out
