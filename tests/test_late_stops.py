"""A stop after the last epoch loses no training: Ctrl-C during the held-out verdict and then during
the model's logging of ``python -m kronos_mlflow.train``; each time the same command continues the
same run from the phase it reached (checkpoints/phase.json), never training again, and the run
ends FINISHED with the numbers of a run that was never stopped
(docs/reliability.md#a-stop-after-the-last-epoch). The phases' own rules (what the resume lookup
returns, a damaged record, a finished run) are checked in-process on a tiny saved state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tiny_runs import create_sqlite_store, isolated_env, run_dir, train_command

STEP, VAL = "train_tokenizer_loss_batch", "val_tokenizer_loss_epoch"


def _phase(root: Path) -> str | None:
    try:
        return json.loads((root / "checkpoints" / "phase.json").read_text())["phase"]
    except (OSError, ValueError, KeyError):
        return None


def _stop_after(command: list[str], tmp: Path, env: dict, phase: str, name: str, *,
                summary: bool = False) -> tuple[int, str]:
    """The command, stopped by Ctrl-C (SIGINT to its process) in the phase after ``phase``
    (``summary``: once summary.json is written too). The
    process is frozen (SIGSTOP) the moment phase.json says ``phase``, so the signal lands in the
    next phase however fast this machine is, as a Ctrl-Z, Ctrl-C and ``fg`` would; the test
    checks where it stopped. Returns the exit code and stderr."""
    with open(tmp / f"{name}.out", "w") as out, open(tmp / f"{name}.err", "w") as err:
        proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp / f"{name}.err").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no phase {phase} within 300 s"
            try:
                root = run_dir(tmp / "outputs")
            except AssertionError:
                root = None
            if root is not None and _phase(root) == phase and (not summary or (root / "summary.json").exists()):
                os.kill(proc.pid, signal.SIGSTOP)
                break
            time.sleep(0.002)
        assert _phase(root) == phase  # frozen before the next phase was recorded
        os.kill(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, (tmp / f"{name}.err").read_text()


def _figures(client, run) -> dict:
    metrics = {k: v for k, v in run.data.metrics.items() if k.startswith(("test_", "base_test_", "best_val"))}
    return {"metrics": metrics, "verdict": run.data.tags.get("verdict"), "val": [
        m.value for m in sorted(client.get_metric_history(run.info.run_id, VAL), key=lambda m: m.step)]}


@pytest.mark.slow
def test_ctrl_c_in_the_verdict_then_in_the_model_logging_continues_without_training_again(tmp_path, commands):
    from mlflow import MlflowClient

    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    ref_env = isolated_env(reference_dir, create_sqlite_store(reference_dir))
    done = commands.run(train_command(reference_dir), cwd=reference_dir, env=ref_env)
    assert done.returncode == 0, done.stderr[-3000:]
    ref_client = MlflowClient(ref_env["MLFLOW_TRACKING_URI"])
    (reference,) = ref_client.search_runs(["0"])

    env = isolated_env(tmp_path, create_sqlite_store(tmp_path))
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    command = train_command(tmp_path)
    code, err = _stop_after(command, tmp_path, env, "summarized", "first")  # in the held-out verdict
    assert code == 130, err[-3000:]
    lines = [line for line in err.splitlines() if "stopped by SIGINT" in line]
    assert lines == ["kronos-mlflow train: stopped by SIGINT after its training (phase reached: summarized); the "
                     "training state and the best checkpoint are kept: the same command continues from there "
                     "without training again"], err[-3000:]
    assert "Traceback" not in err
    (run,) = client.search_runs(["0"])
    assert run.info.status == "KILLED" and "after its training" in run.data.tags["stop_reason"]
    assert "verdict" not in run.data.tags

    # the verdict done, summary.json written: in the model's logging
    code, err = _stop_after(command, tmp_path, env, "scorecard", "second", summary=True)
    assert code == 130, err[-3000:]
    said = (tmp_path / "second.out").read_text()
    assert "epoch 1/2" not in said and "starting weights" not in said, said  # no epoch trained again
    assert "training is complete (2 epochs, 16 steps" in said and "the phase it reached (summarized)" in said, said
    (run,) = client.search_runs(["0"])
    assert run.info.status == "KILLED" and "(phase reached: scorecard)" in run.data.tags["stop_reason"]

    done = commands.run(command, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epoch 1/2" not in done.stdout and "the phase it reached (scorecard)" in done.stdout, done.stdout
    (run,) = client.search_runs(["0"])  # the same run throughout
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, STEP)) == list(range(16))  # once each
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, VAL)) == [0, 1]
    assert len(client.get_metric_history(run.info.run_id, "best_val_loss")) == 1
    assert len(client.get_metric_history(run.info.run_id, "test_tokenizer_loss")) == 1  # the verdict, once
    ours, theirs = _figures(client, run), _figures(ref_client, reference)
    assert ours == theirs and theirs["metrics"]["test_tokenizer_loss"] > 0
    assert run.data.tags["best_model_uri"] and _phase(run_dir(tmp_path / "outputs")) == "finished"
    results = [json.loads((run_dir(base / "outputs") / "summary.json").read_text())["final_result"]
               for base in (tmp_path, reference_dir)]
    for result in results:  # the time it took; the windows' digest names the data cache, a folder of each tmp
        del result["test"]["seconds"], result["test"]["windows_digest"]
    assert results[0] == results[1]


# ------------------------------------------------------------------ the resume lookup, in-process


def _saved_state(tmp: Path, config: dict, *, last: bool, marked: bool = True) -> Path:
    """A training state of a tiny module under ``tmp``'s run folder, saved after the last epoch
    (``last``) or the first; ``marked``: as this version marks a finished training."""
    import torch

    from kronos_mlflow.training import checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    epoch = config["epochs"] - 1 if last else 0
    directory = tmp / "run" / "checkpoints" / "last"
    checkpoint.save_training_state(
        directory, model=model, optimizer=optimizer, scheduler=None, epoch=epoch, global_step=8 * (epoch + 1),
        best_val_loss=1.0, run_ids={"mlflow_run_id": "abc"}, config_digest=checkpoint.config_digest(config),
        extra={"phase": "trained"} if marked and last else {})
    return tmp / "run"


def test_the_resume_lookup_continues_a_late_stop_and_not_a_finished_run(tmp_path):
    from kronos_mlflow.errors import CheckpointError
    from kronos_mlflow.training.checkpoint import find_resumable, phase, read_training_state
    from tiny_runs import tiny_config

    config = tiny_config(tmp_path)
    root = _saved_state(tmp_path, config, last=True)
    checkpoints = root / "checkpoints"
    found = find_resumable(root, config)  # stopped in the summary: the training is done, nothing after it
    assert found is not None and found["next_epoch"] == config["epochs"] and found["phase"] is None
    key = phase.state_key(read_training_state(checkpoints / "last"))
    for reached in ("summarized", "verdict", "scorecard", "calibration", "logged"):
        phase.write(checkpoints, reached, state=key, result={"best_val_loss": 1.0, "test": {"verdict": "better"}})
        found = find_resumable(root, config, mode="must")
        assert found["phase"]["phase"] == reached and found["phase"]["result"]["test"] == {"verdict": "better"}
    for ended in ("finished", "pruned"):  # the same command again starts a new run
        phase.write(checkpoints, ended, state=key)
        assert find_resumable(root, config) is None
        with pytest.raises(CheckpointError, match="is complete"):
            find_resumable(root, config, mode="must")
    phase.write(checkpoints, "finished", state={**key, "run_id": "another"})  # an earlier run's record
    assert find_resumable(root, config)["phase"] is None
    (checkpoints / "phase.json").write_text("{not json")
    with pytest.raises(CheckpointError) as info:
        find_resumable(root, config)
    assert "run phase file" in str(info.value) and "phase.json" in str(info.value) and "\n" not in str(info.value)

    older = _saved_state(tmp_path / "older", config, last=True, marked=False)  # saved before phases were recorded
    assert find_resumable(older, config) is None
    middle = _saved_state(tmp_path / "middle", config, last=False)  # stopped while training: resumed as ever
    assert find_resumable(middle, config)["next_epoch"] == 1


def test_a_continued_fit_trains_nothing_and_redoes_no_recorded_phase(tiny):
    """In-process: a fit that reached its scorecard phase, continued, logs no step, epoch or
    verdict metric and returns the recorded result; a trial pruned at its last epoch is never
    continued."""
    import torch
    from recording import Recorder

    from kronos_mlflow.config.layout import RunLayout
    from kronos_mlflow.model import KronosTokenizer
    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.runtime.console import Console
    from kronos_mlflow.stages.tokenizer.training import TokenizerStage
    from kronos_mlflow.training import loop
    from kronos_mlflow.training.checkpoint import find_resumable

    def fit(config, **kwargs):
        torch.manual_seed(0)
        logger = Recorder()
        result = loop.fit(KronosTokenizer(**model_kwargs(config)), torch.device("cpu"), config, logger,
                          loop.RunFiles(RunLayout.of(config)), Console(False), stage=TokenizerStage(), **kwargs)
        return result, [sorted(m) for _, m in logger.metrics]

    config = tiny(compile="off", epochs=1)
    first, logged = fit(config)
    assert any("train_tokenizer_loss_batch" in m for m in logged) and any("test_tokenizer_loss" in m for m in logged)
    state = find_resumable(RunLayout.of(config).root, config, world_size=1)
    assert state["phase"]["phase"] == "scorecard"  # the tokenizer has no scorecard: the phase is done at once
    again, logged = fit(config, resume_state=state)
    assert logged == [] and json.loads(json.dumps(first)) == again

    pruned = tiny(compile="off", epochs=1, seed=7)
    with pytest.raises(loop.TrainingPruned):
        fit(pruned, should_stop=lambda epoch, value: True)
    assert find_resumable(RunLayout.of(pruned).root, pruned, world_size=1) is None  # the same command trains anew


def test_a_run_stopped_while_its_model_was_logged_keeps_its_directory(tmp_path):
    """Its summary.json is written before the model is logged: the same command still finds the
    run's directory (a finished run's is never reused)."""
    from kronos_mlflow.config.layout import RunLayout
    from tiny_runs import tiny_config

    config = tiny_config(tmp_path)
    first = RunLayout.of(config)
    first.checkpoints.mkdir(parents=True)
    first.summary.write_text("{}")
    for reached, directory in (("scorecard", first.root), ("logged", first.root),
                               ("finished", first.root.with_name(first.root.name + "-2"))):
        first.phase.write_text(json.dumps({"phase": reached}))
        assert RunLayout.of(config).root == directory, reached
    first.phase.unlink()  # a run finished before phases were recorded
    assert RunLayout.of(config).root.name.endswith("-2")
