"""The store gate (kronos_mlflow/tracking/gate.py): who may write a run, on a real sqlite store.

Every door's refusal through the real command lines is in tests/test_hostile_input.py (the
``gate`` area: each door x MLFLOW_RUN_ID of a FINISHED run, a deleted run, a run of another
experiment, a run holding another command's work); this file checks the rules one by one, that
every command and MLproject entry point is classified, and that no other module creates runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kronos_mlflow.errors import UserError
from kronos_mlflow.tracking.ownership import TAG, new_token, read_owner, token_hash, write_owner
from kronos_mlflow.tracking import gate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def _client(tmp_path_factory):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}")


@pytest.fixture()
def store(_client, monkeypatch):
    """The module's store (made once: a sqlite store's set-up costs seconds), its default experiment
    a fresh one of this test's own (``MLFLOW_EXPERIMENT_ID``, as ``mlflow run`` sets it)."""
    import uuid

    monkeypatch.setenv("MLFLOW_TRACKING_URI", _client.tracking_uri)
    for key in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", gate.HANDOVER_ENV):
        monkeypatch.delenv(key, raising=False)
    _client.exp = _client.create_experiment(uuid.uuid4().hex)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", _client.exp)
    return _client


def _bare(client, entry: str | None = "pipeline", experiment: str | None = None):
    """A run as ``mlflow run`` makes it: RUNNING, mlflow.* tags, the -P params."""
    tags = {"mlflow.source.type": "PROJECT", "mlflow.user": "me"}
    if entry:
        tags[gate.ENTRY_POINT_TAG] = entry
    run = client.create_run(experiment or client.exp, tags=tags)
    client.log_param(run.info.run_id, "epochs", "1")
    return client.get_run(run.info.run_id)


def _why(client, run_id, command="pipeline", experiment_id=None, owner=None):
    return gate.refusal(client.get_run(run_id), command=command, experiment_id=experiment_id or client.exp,
                        directory_owner=owner)


def test_a_bare_run_of_the_entry_point_is_accepted(store):
    run = _bare(store)
    assert _why(store, run.info.run_id) is None
    assert _why(store, _bare(store, entry=None).info.run_id) is None  # made by mlflow.start_run: no entry point


@pytest.mark.parametrize("damage, needle", [
    (lambda c, r: c.set_terminated(r), "FINISHED"),
    (lambda c, r: (c.set_terminated(r, "KILLED")), "KILLED"),
    (lambda c, r: (c.set_terminated(r), c.delete_run(r)), "deleted"),
    (lambda c, r: c.log_metric(r, "best_val_loss", 0.5), "1 metric"),
    (lambda c, r: c.set_tag(r, "mlflow.note.content", "x") or c.set_tag(r, "verdict", "better"), "tags verdict"),
    (lambda c, r: c.set_tag(r, TAG, token_hash(new_token())), "already belongs to another training"),
    (lambda c, r: c.set_tag(r, gate.HANDOVER_TAG, token_hash(new_token())), "handed to another process"),
])
def test_a_run_holding_anything_else_is_refused(store, damage, needle):
    run_id = _bare(store).info.run_id
    damage(store, run_id)
    why = _why(store, run_id)
    assert why is not None and needle in why and run_id in why and "MLFLOW_RUN_ID" in why


def test_a_launch_whose_training_went_elsewhere_is_still_its_bare_run(store):
    """A training that resumed its saved run tags the launch's run kronos.continued_in_run; a torchrun
    restart of that launch is handed the same run again."""
    run_id = _bare(store, entry="main").info.run_id
    store.set_tag(run_id, "kronos.continued_in_run", "0" * 32)
    store.set_tag(run_id, "mlflow.note.content", "Training continued in run ...")
    assert _why(store, run_id, command="train") is None


def test_another_entry_point_or_experiment_is_refused(store):
    run_id = _bare(store, entry="main").info.run_id
    assert "entry point 'main'" in _why(store, run_id, command="pipeline")
    assert _why(store, run_id, command="train") is None
    other = store.create_experiment("colleagues")
    elsewhere = _bare(store, experiment=other).info.run_id
    assert f"in experiment {other}" in _why(store, elsewhere)
    assert _why(store, elsewhere, experiment_id=other) is None


def test_a_handed_over_child_needs_its_token(store, monkeypatch):
    parent = store.create_run(store.exp).info.run_id
    child = gate.child_run(store, store.exp, parent, "pipeline tokenizer", {"pipeline.step": "tokenizer"})
    assert "handed to another process" in _why(store, child)
    env = gate.handover_env(child)
    assert env["MLFLOW_RUN_ID"] == child and gate.HANDOVER_ENV in env
    monkeypatch.setenv(gate.HANDOVER_ENV, env[gate.HANDOVER_ENV])
    assert _why(store, child) is None
    monkeypatch.setenv(gate.HANDOVER_ENV, new_token())
    assert "handed to another process" in _why(store, child)


def test_a_child_env_never_passes_on_its_own_token(store, monkeypatch):
    from kronos_mlflow.tracking.child_runs import child_env

    monkeypatch.setenv(gate.HANDOVER_ENV, "f" * 64)
    child = gate.child_run(store, store.exp, store.create_run(store.exp).info.run_id, "trial 0")
    env = child_env(child, "0", store.tracking_uri)
    assert env[gate.HANDOVER_ENV] != "f" * 64 and env["MLFLOW_RUN_ID"] == child
    assert "f" * 64 not in child_env("0" * 32, "0", store.tracking_uri).values()


def test_a_restarted_training_keeps_the_run_its_directory_claimed(store, tmp_path):
    run_id = _bare(store, entry="main").info.run_id
    token = new_token()
    write_owner(tmp_path / "run", token, run_id, store.exp)
    store.set_tag(run_id, TAG, token_hash(token))
    owner = read_owner(tmp_path / "run")
    assert _why(store, run_id, command="train", owner=owner) is None
    write_owner(tmp_path / "other", new_token(), run_id, store.exp)
    assert "already belongs" in _why(store, run_id, command="train", owner=read_owner(tmp_path / "other"))


def test_handed_run_reads_only(store, monkeypatch):
    run = _bare(store)
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    assert gate.handed_run(store, command="pipeline", experiment_id=store.exp).info.run_id == run.info.run_id
    store.set_terminated(run.info.run_id)
    before = store.get_run(run.info.run_id)
    with pytest.raises(gate.RunRefused, match="FINISHED"):
        gate.command_run(store, store.exp, command="pipeline", run_name="pipeline", tags={"pipeline.role": "parent"})
    after = store.get_run(run.info.run_id)
    assert after.data.tags == before.data.tags and after.info.status == "FINISHED"
    assert len(store.search_runs([store.exp])) == 1  # no new run either
    for bad in ("../x", "0" * 31, "٣" * 32, "A" * 32):
        monkeypatch.setenv("MLFLOW_RUN_ID", bad)
        with pytest.raises(UserError, match="not an MLflow run id"):
            gate.handed_run_id()


def test_check_handed_never_makes_a_store(tmp_path, monkeypatch):
    db = tmp_path / "none" / "mlflow.db"
    db.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("MLFLOW_RUN_ID", "0" * 32)
    with pytest.raises(gate.RunRefused, match="does not exist"):
        gate.check_handed("pipeline")
    assert not db.exists()


def test_every_command_and_entry_point_is_classified():
    """A new command or entry point cannot slip past the gate unclassified."""
    from kronos_mlflow.cli.main import SUBCOMMANDS

    classes = [set(gate.DOORS), set(gate.OWN_RUNS), set(gate.OWNED_RUNS), set(gate.NO_RUN)]
    assert sum(len(c) for c in classes) == len(set().union(*classes)), "a command is in two classes"
    assert set().union(*classes) == set(SUBCOMMANDS) | {"sweep"}
    entries = set(yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"])
    assert entries == {e for doors in gate.DOORS.values() for e in doors}


def test_only_the_gate_creates_runs():
    """No module but the gate calls ``create_run`` (a run this project writes is obtained there)."""
    offenders = []
    for path in (ROOT / "kronos_mlflow").rglob("*.py"):
        if path.name == "gate.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.create_run\(", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []


def test_a_champion_moves_only_to_the_runs_own_model(store):
    """A ``best_model_uri`` tag is a claim: another run's model, a path, a registry name are refused."""
    mine, theirs = (store.create_run(store.exp).info.run_id for _ in range(2))
    model = store.create_logged_model(store.exp, name="best_model", source_run_id=mine)
    other = store.create_logged_model(store.exp, name="best_model", source_run_id=theirs)
    for uri in (f"runs:/{mine}/best_model", f"models:/{model.model_id}"):
        store.set_tag(mine, "best_model_uri", uri)
        assert gate.own_model_uri(store, store.get_run(mine), "tag") == uri
    for uri in (f"runs:/{theirs}/best_model", f"models:/{other.model_id}", f"runs:/{mine}/../x",
                "models:/kr-tokenizer@champion", "/etc/passwd", f"models:/m-{'0' * 32}"):
        store.set_tag(mine, "best_model_uri", uri)
        with pytest.raises(gate.RunRefused, match="is not a model run"):
            gate.own_model_uri(store, store.get_run(mine), "tag")
