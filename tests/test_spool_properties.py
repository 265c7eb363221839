"""The spool reader searched with Hypothesis: any JSON-lines file handed to ``upload-spool`` gives
an upload plan that touches only the run that owns the spool, or one refusal.

A real sqlite store holds four runs: the spool's own run (RUNNING, owned by a token), a FINISHED
run owned by another token, a RUNNING run with no owner, and a run in another experiment.
Generated spools mix well-formed records with every kind of damage (odd headers, foreign tokens,
MLflow's own tags, bad metric values, artifact paths outside the spool, statuses, garbage lines).
For each: :func:`plan_upload` raises exactly one one-line :class:`SpoolError`, or its plan is for
the owned run and :func:`apply_upload` changes nothing of the other runs, nor the owned run's
name, parent or owner.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

from kronos_mlflow.tracking.ownership import TAG as OWNER_TAG
from kronos_mlflow.tracking.ownership import new_token, token_hash
from kronos_mlflow.tracking import spool
from kronos_mlflow.tracking.spool import SpoolError
from tiny_runs import create_sqlite_store

TOKEN = "ab" * 32
OTHER = "cd" * 32


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("spool-props")
    client = MlflowClient(create_sqlite_store(root))
    other_experiment = client.create_experiment("elsewhere")
    runs = {
        "own": client.create_run("0", run_name="own", tags={OWNER_TAG: token_hash(TOKEN)}).info.run_id,
        "finished": client.create_run("0", run_name="finished", tags={OWNER_TAG: token_hash(OTHER)}).info.run_id,
        "unowned": client.create_run("0", run_name="unowned").info.run_id,
        "elsewhere": client.create_run(other_experiment, run_name="elsewhere",
                                       tags={OWNER_TAG: token_hash(TOKEN)}).info.run_id,
    }
    client.set_terminated(runs["finished"], "FINISHED")
    return client, runs, root


def _snapshot(client, run_id):
    run = client.get_run(run_id)
    history = {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in run.data.metrics}
    artifacts = sorted(a.path for a in client.list_artifacts(run_id))
    return (run.info.status, run.info.end_time, dict(run.data.params), dict(run.data.tags), history, artifacts)


# ----------------------------------------------------------------------------- what a spool may hold
# Each spool is drawn as a well-formed spool of the owned run (what its writer leaves), then damaged
# in none, one or two places, so that the search reaches plans as well as each kind of refusal.

KEYS = st.sampled_from(["loss", "val_loss", "a/b", "x y", "ok.key-1:2", "best_val_loss"])
BAD_KEYS = st.sampled_from(["mlflow.runName", "mlflow.parentRunId", "mlflow.note.content", OWNER_TAG, "../x", "/abs",
                            "", "é", "k" * 260, "a//b", "mlflow.source.git.commit"])
TEXT = st.text(max_size=20)
ANY = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70), st.booleans(),
                st.none(), TEXT, st.lists(st.integers(), max_size=2))
LOCAL = ["own.artifacts/0000/summary.json", "own.artifacts/0000"]
BAD_LOCAL = ["/etc/hostname", "../outside.txt", "own.artifacts/link", "own.artifacts/missing.json", "", "."]

GOOD = st.one_of(
    st.fixed_dictionaries({"type": st.just("metric"), "key": KEYS, "value": st.floats(-1e6, 1e6),
                           "step": st.integers(0, 50), "timestamp": st.integers(0, 2**40)}),
    st.fixed_dictionaries({"type": st.just("param"), "key": KEYS, "value": TEXT}),
    st.fixed_dictionaries({"type": st.just("tag"), "key": KEYS, "value": TEXT}),
    st.fixed_dictionaries({"type": st.just("artifact"), "local_path": st.sampled_from(LOCAL),
                           "artifact_path": st.sampled_from([None, "a", "d/e"])}),
    st.fixed_dictionaries({"type": st.just("terminate"), "status": st.sampled_from(["FINISHED", "FAILED", "KILLED"]),
                           "end_time": st.integers(0, 2**40)}),
)
FIELD_DAMAGE = {
    "key": BAD_KEYS, "value": ANY, "step": ANY, "timestamp": ANY, "local_path": st.one_of(st.sampled_from(BAD_LOCAL), ANY),
    "artifact_path": st.one_of(st.sampled_from(["../b", "/c", "a\\b"]), ANY), "end_time": ANY,
    "status": st.sampled_from(["RUNNING", "done", 1, None]), "type": st.one_of(st.sampled_from(["header", "metrics"]), ANY),
}


@st.composite
def spools(draw):
    """``(header, records, file name, garbage)``; run ids are placeholders (``<own>``, ...) that the
    test replaces with the store's."""
    header = {"type": "header", "format": "kronos-mlflow-spool", "version": 1, "run_id": "<own>",
              "experiment_id": "0", "owner_token": TOKEN}
    body = draw(st.lists(GOOD, max_size=5))
    name, garbage = "header", None
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        kind = draw(st.sampled_from(["header", "field", "record", "name", "garbage"]))
        if kind == "header":
            key, value = draw(st.sampled_from([
                ("run_id", "<finished>"), ("run_id", "<unowned>"), ("run_id", "<elsewhere>"),
                ("run_id", "0123456789abcdef0123456789abcdef"), ("run_id", 7), ("owner_token", OTHER),
                ("owner_token", None), ("owner_token", "zz"), ("experiment_id", "7"), ("experiment_id", None),
                ("format", "other"), ("version", 2), ("type", "head")]))
            if value is None:
                header.pop(key, None)
            else:
                header[key] = value
        elif kind == "field" and any(isinstance(r, dict) and r for r in body):
            i = draw(st.sampled_from([j for j, r in enumerate(body) if isinstance(r, dict) and r]))
            field = draw(st.sampled_from(sorted(map(str, body[i]))))
            body[i] = {**body[i], field: draw(FIELD_DAMAGE.get(field, ANY))}
        elif kind == "record":
            odd = draw(st.one_of(st.dictionaries(TEXT, ANY, max_size=3), ANY, st.just(header)))
            body.insert(draw(st.integers(0, len(body))), odd)
        elif kind == "name":
            name = "other"
        elif kind == "garbage":
            garbage = draw(st.sampled_from([b'{"type": "met', b"\xff\xfe", b"\n\n[1, 2"]))
    return header, body, name, garbage


def _file_name(header, name) -> str:
    run_id = str(header.get("run_id"))
    usable = run_id.strip() and "/" not in run_id and "\0" not in run_id and len(run_id.encode()) < 200
    return f"{run_id}.jsonl" if name == "header" and usable else "other.jsonl"


def _write(folder: Path, header, body, name, garbage) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / _file_name(header, name)
    stem = path.name[: -len(".jsonl")]
    # the fixed local paths name this spool's own artifact copies, whatever its name
    body = [({**r, "local_path": r["local_path"].replace("own.artifacts", f"{stem}.artifacts")}
             if isinstance(r, dict) and isinstance(r.get("local_path"), str) else r) for r in body]
    lines = [json.dumps(header, allow_nan=True)] + [json.dumps(r, allow_nan=True) for r in body]
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    path.write_bytes(data + (garbage or b""))
    copies = spool.artifacts_dir(path) / "0000"
    copies.mkdir(parents=True, exist_ok=True)
    (copies / "summary.json").write_text('{"best_val_loss": 0.5}\n')
    link = spool.artifacts_dir(path) / "link"
    if not link.exists():
        link.symlink_to("/etc")
    return path


WELL_FORMED = ({"type": "header", "format": "kronos-mlflow-spool", "version": 1, "run_id": "<own>",
                "experiment_id": "0", "owner_token": TOKEN},
               [{"type": "metric", "key": "loss", "value": 0.5, "step": 1, "timestamp": 5},
                {"type": "tag", "key": "late", "value": "x"},
                {"type": "artifact", "local_path": "own.artifacts/0000/summary.json", "artifact_path": None},
                {"type": "terminate", "status": "KILLED", "end_time": 9}], "header", None)
MISSING_COPY = (WELL_FORMED[0], [{"type": "metric", "key": "loss", "value": 0.5, "step": 2, "timestamp": 5},
                                 {"type": "artifact", "local_path": "own.artifacts/gone.json", "artifact_path": None}],
                "header", None)


@settings(max_examples=int(os.environ.get("KRONOS_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=spools())
@example(drawn=WELL_FORMED)  # what a writer leaves: it uploads
@example(drawn=MISSING_COPY)  # found: an artifact copy that is gone stopped the upload halfway
def test_any_spool_gives_a_plan_for_its_own_run_or_one_refusal(store, tmp_path_factory, drawn):
    client, runs, root = store
    header, body, name, garbage = drawn
    if isinstance(header.get("run_id"), str) and header["run_id"].startswith("<"):
        header = {**header, "run_id": runs[header["run_id"].strip("<>")]}
    folder = tmp_path_factory.mktemp("spool")
    path = _write(folder, header, body, name, garbage)
    others = {k: _snapshot(client, v) for k, v in runs.items() if k != "own"}
    own_before = client.get_run(runs["own"])
    try:
        plan = spool.plan_upload(path, client)
    except SpoolError as exc:
        message = str(exc)
        assert message and "\n" not in message
        assert {k: _snapshot(client, v) for k, v in runs.items() if k != "own"} == others
        return
    assert plan["run_id"] == runs["own"], plan["run_id"]
    assert all(not t.key.startswith("mlflow.") and t.key != OWNER_TAG for t in plan["tags"])
    assert all(Path(local).resolve().is_relative_to(folder.resolve()) for local, _ in plan["artifacts"])
    assert all(math.isfinite(m.value) for m in plan["metrics"])
    spool.apply_upload(plan, client, finish="keep")  # a plan never stops halfway
    assert {k: _snapshot(client, v) for k, v in runs.items() if k != "own"} == others
    after = client.get_run(runs["own"])
    for key in ("mlflow.runName", OWNER_TAG):
        assert after.data.tags.get(key) == own_before.data.tags.get(key)
    assert "mlflow.parentRunId" not in after.data.tags and after.info.run_name == "own"
    client.update_run(runs["own"], status="RUNNING")  # the next spool finds it as a writer leaves it


def test_a_new_token_is_64_hex_digits_and_its_hash_is_the_tag():
    token = new_token()
    assert len(token) == 64 and int(token, 16) >= 0 and token_hash(token).startswith("sha256:")
    assert token_hash(token) != token_hash(new_token())
