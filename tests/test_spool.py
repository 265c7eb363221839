"""Tracking outages: MLflowLogger keeps, retries and spools; ``kronos-mlflow upload-spool`` replays.

Fast tests use a sqlite store with the client's ``log_batch`` made to fail as a dead server
makes it fail (MLflow's own "API request ... failed with exception" wrapping a requests
ConnectionError). The slow tests run a REAL ``mlflow server`` on 127.0.0.1 that is stopped
(SIGTERM to its process group) in the middle of a run and started again on the same port and
database; they count every ``(key, step)`` on the server afterwards: none lost, none twice.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import requests
from servers import MlflowServer, free_port, returns_within
from tiny_runs import TRACKING_ENV, isolated_env, train_command
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException

from kronos_mlflow.tracking import spool
from kronos_mlflow.errors import UserError
from kronos_mlflow.tracking.ownership import TAG as OWNER_TAG
from kronos_mlflow.tracking.ownership import Claim, new_token, token_hash
from kronos_mlflow.tracking import MLflowLogger, MultiLogger, is_connection_error

KEYS = ("train_tokenizer_loss_batch", "tokenizer_learning_rate")
PASSWORD = "pw-SHOULD-NOT-LEAK-4711"


def _metrics(step: int) -> dict[str, float]:
    return {KEYS[0]: 1.0 / (step + 1), KEYS[1]: 1e-4 * (1 + step % 7)}


def _count(client: MlflowClient, run_id: str, keys=KEYS) -> dict[str, dict]:
    """Per key: steps present, values lost from 0..n-1, values present more than once."""
    out = {}
    for key in keys:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        out[key] = {"n": len(steps), "unique": len(set(steps)), "steps": sorted(set(steps))}
    return out


# ----------------------------------------------------------------------------- fast: no server


@pytest.fixture()
def sqlite_env(tracking_env):
    """The module's sqlite store (conftest's ``sqlite_store``), clean tracking variables, cwd = tmp_path."""
    return tracking_env


def _dead_server_error():
    """What MlflowClient raises when the server refuses connections (rest_utils.http_request)."""
    try:
        try:
            raise requests.exceptions.ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=1): Max retries "
                                                      "exceeded (Caused by NewConnectionError: Connection refused)")
        except requests.exceptions.ConnectionError as exc:
            raise MlflowException(f"API request to http://127.0.0.1:1/api/2.0/mlflow/runs/log-batch failed with "
                                  f"exception {exc}")
    except MlflowException as wrapped:
        return wrapped


class Outage:
    """Makes a logger's client fail like an unreachable server while ``down`` is true."""

    def __init__(self, logger: MLflowLogger):
        self.down = False
        self.calls = 0
        logger._http = True  # the sqlite store stands in for an http server
        for name in ("log_batch", "log_artifact", "log_artifacts", "set_terminated"):
            real = getattr(logger.client, name)
            setattr(logger.client, name, self._wrap(real))

    def _wrap(self, real):
        def call(*args, **kwargs):
            self.calls += 1
            if self.down:
                raise _dead_server_error()
            return real(*args, **kwargs)
        return call


def test_connection_errors_are_told_from_refusals():
    assert is_connection_error(_dead_server_error())
    assert is_connection_error(requests.exceptions.ReadTimeout("read timed out"))
    assert is_connection_error(MlflowException("API request to http://h/api failed with error code 503 != 200"))
    server_error = RestException({"error_code": "INTERNAL_ERROR", "message": "db is gone"})
    assert is_connection_error(server_error)  # HTTP 500 from the server itself
    assert not is_connection_error(RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad"}))
    assert not is_connection_error(RestException({"error_code": "PERMISSION_DENIED", "message": "no"}))
    assert not is_connection_error(ValueError("not a network problem"))


def test_outage_keeps_metrics_and_sends_them_when_back(sqlite_env, tmp_path, capsys):
    logger = MLflowLogger(experiment_name="fast-outage", flush_every_s=0.0, spool_dir=tmp_path / "spool",
                          retry_backoff_s=(0.05, 0.2), finalize_wait_s=5)
    outage = Outage(logger)
    for step in range(5):
        logger.log_metrics(_metrics(step), step)
    outage.down = True
    (tmp_path / "plot.png").write_bytes(b"png")
    for step in range(5, 25):
        before = outage.calls
        logger.log_metrics(_metrics(step), step)
        assert outage.calls - before <= 1  # never blocked on the dead server: one attempt per call at most
        time.sleep(0.01)  # a training step's pace: the 0.05 s backoff runs out now and then
    logger.log_artifact(str(tmp_path / "plot.png"), "plots")
    (tmp_path / "plot.png").unlink()  # a temporary file: the logger kept a copy
    logger.set_tags({"stage": "outage"})
    logger.log_hyperparams({"late_param": 3})
    calls_during = outage.calls
    assert calls_during < 25  # backoff: not one request per step
    outage.down = False
    for step in range(25, 30):
        logger.log_metrics(_metrics(step), step)
    logger.finalize("success")
    client = MlflowClient(sqlite_env)
    counts = _count(client, logger.run_id)
    for key in KEYS:
        assert counts[key]["steps"] == list(range(30)) and counts[key]["n"] == 30, key
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["stage"] == "outage"
    assert run.data.params["late_param"] == "3"
    assert [a.path for a in client.list_artifacts(logger.run_id, "plots")] == ["plots/plot.png"]
    assert logger.delayed_metrics >= 40 and logger.spooled_metrics == 0 and logger.outages == 1
    err = capsys.readouterr().err
    assert f"{logger.delayed_metrics} metric values were delayed by 1 tracking-server outage" in err
    assert "none lost" in err
    assert not list((tmp_path / "spool").glob("*.jsonl"))


def test_memory_bound_spills_to_spool_and_uploads_when_back(sqlite_env, tmp_path):
    logger = MLflowLogger(experiment_name="spill", flush_every_s=0.0, spool_dir=tmp_path / "spool",
                          retry_backoff_s=(0.05, 0.1), max_buffered_metrics=10, finalize_wait_s=5)
    outage = Outage(logger)
    outage.down = True
    for step in range(40):
        logger.log_metrics(_metrics(step), step)
    assert logger.pending <= 10 and logger.spooled_metrics >= 60
    assert Path(logger.spool_file).is_file()
    outage.down = False
    logger.finalize("success")  # retries (past the backoff) within finalize_wait_s
    counts = _count(MlflowClient(sqlite_env), logger.run_id)
    for key in KEYS:
        assert counts[key]["steps"] == list(range(40)) and counts[key]["n"] == 40, key
    assert logger.delayed_metrics == 80 and logger.spooled_metrics == 0
    assert not (tmp_path / "spool" / f"{logger.run_id}.jsonl").exists()


def test_server_still_down_at_the_end_writes_the_spool(sqlite_env, tmp_path, capsys):
    logger = MLflowLogger(experiment_name="spooled", flush_every_s=0.0, spool_dir=tmp_path / "spool",
                          retry_backoff_s=(0.05, 0.1), finalize_wait_s=0.3)
    outage = Outage(logger)
    logger.log_metrics(_metrics(0), 0)
    outage.down = True
    for step in range(1, 6):
        logger.log_metrics(_metrics(step), step)
    logger.set_tags({"late": "tag"})
    returns_within(10, logger.finalize, "failed", "RuntimeError: boom")  # a bounded wait (0.3 s asked)
    path = tmp_path / "spool" / f"{logger.run_id}.jsonl"
    header, records, ignored = spool.read_spool(path)
    assert header["run_id"] == logger.run_id and ignored == 0
    kinds = [r["type"] for r in records]
    assert kinds.count("metric") == 10 and kinds[-1] == "terminate" and records[-1]["status"] == "FAILED"
    assert {"key": "failure_reason", "value": "RuntimeError: boom", "type": "tag"} in records
    err = capsys.readouterr().err.strip().splitlines()
    line = [x for x in err if "upload-spool" in x]
    assert len(line) == 1 and "10 metric values were delayed" in line[0] and str(path) in line[0]
    # the server comes back: upload (in process, through the same client code the CLI uses)
    client = MlflowClient(sqlite_env)
    counts = spool.upload_spool(path, client)
    assert counts["metrics"] == 10 and counts["metrics_present"] == 0 and counts["status"] == "FAILED"
    run = client.get_run(logger.run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == "RuntimeError: boom"
    assert run.data.tags["late"] == "tag"
    for key in KEYS:
        assert _count(client, logger.run_id)[key]["steps"] == list(range(6))
    # idempotent: the same spool again sends nothing
    again = Path(str(path) + ".uploaded")
    assert again.is_file() and not path.exists()
    os.replace(again, path)
    counts = spool.upload_spool(path, client)
    assert counts["metrics"] == 0 and counts["metrics_present"] == 10
    assert all(v["n"] == 6 for v in _count(client, logger.run_id).values())


def test_other_errors_still_raise(sqlite_env, tmp_path):
    logger = MLflowLogger(experiment_name="refused", flush_every_s=0.0, spool_dir=tmp_path / "spool")
    logger._http = True

    def refuse(*args, **kwargs):
        raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "refused"})

    logger.client.log_batch = refuse
    with pytest.raises(RestException):
        logger.log_metrics({"a": 1.0}, 0)


def test_a_locked_sqlite_store_is_waited_for(sqlite_env, tmp_path):
    """Another process writing the sqlite store ("database is locked"): the call is retried, the
    run still ends FINISHED with every value (mlflow run ending its run at the same moment)."""
    logger = MLflowLogger(experiment_name="locked", flush_every_s=0.0, spool_dir=tmp_path / "spool")
    real_terminated, calls = logger.client.set_terminated, []

    def locked_twice(*args, **kwargs):
        calls.append(args)
        if len(calls) <= 2:
            raise MlflowException("(sqlite3.OperationalError) database is locked")
        return real_terminated(*args, **kwargs)

    logger.client.set_terminated = locked_twice
    logger.log_metrics({"a": 1.0}, 0)
    logger.finalize("killed", "stopped by SIGTERM")
    run = MlflowClient(sqlite_env).get_run(logger.run_id)
    assert len(calls) == 3 and run.info.status == "KILLED" and run.data.metrics["a"] == 1.0


def test_resumed_run_skips_steps_already_logged(sqlite_env, tmp_path):
    first = MLflowLogger(experiment_name="resume-skip", flush_every_s=0.0)
    for step in range(7):  # a killed attempt had sent steps 0..6 of its second epoch
        first.log_metrics(_metrics(step), step)
    first.flush()
    second = MLflowLogger(run_id=first.run_id, flush_every_s=0.0)
    multi = MultiLogger([second], skip_steps=second.skipped_steps)
    assert second.skip_logged_steps(KEYS, min_step=5) == 4
    for step in range(5, 10):  # the resumed attempt replays from step 5
        multi.log_metrics(_metrics(step), step)
    multi.finalize("success")
    counts = _count(MlflowClient(sqlite_env), first.run_id)
    for key in KEYS:
        assert counts[key]["steps"] == list(range(10)) and counts[key]["n"] == 10


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "is empty"),
        (b"\xff\xfe\x00garbage\n", "not UTF-8"),
        (b'{"type": "metric"}\n', "not a kronos-mlflow spool"),
        (b'{"type":"header","format":"kronos-mlflow-spool","version":1,"run_id":"r"}\nnot json\n{}\n', "line 2"),
        (b'{"type":"header","format":"kronos-mlflow-spool","version":1,"run_id":"r"}\n'
         b'{"type":"metric","key":"a","value":"NaN","step":0,"timestamp":1}\n', "finite number"),
        (b'{"type":"header","format":"kronos-mlflow-spool","version":9,"run_id":"r"}\n', "version 9"),
        (b'{"type":"header","format":"kronos-mlflow-spool","version":1,"run_id":"r"}\n'
         b'{"type":"terminate","status":"DONE","end_time":1}\n', "status 'DONE'"),
    ],
)
def test_bad_spool_files_are_one_line(tmp_path, content, needle):
    path = tmp_path / "r.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError) as info:
        spool.read_spool(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_last_line_cut_short_is_ignored(tmp_path):
    path = tmp_path / "r.jsonl"
    spool.append_records(path, {"run_id": "r"}, [{"type": "metric", "key": "a", "value": 1.0, "step": 0,
                                                  "timestamp": 5}])
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"type": "metric", "key": "a", "val')  # killed while appending
    header, records, ignored = spool.read_spool(path)
    assert len(records) == 1 and ignored == 1


# ----------------------------------------------------------------------------- a spool is data, not commands


def _db_hash(uri: str) -> str:
    import hashlib

    return hashlib.sha256(Path(uri.split(":///", 1)[1]).read_bytes()).hexdigest()


def _writer_spool(tmp_path: Path, client: MlflowClient, status: str = "FINISHED") -> tuple[Path, str]:
    """A run left RUNNING on the server and the spool a logger writes for it: a metric, a tag,
    an artifact copied next to the spool, the terminal status."""
    token = new_token()
    run = client.create_run("0", run_name="spooled", tags={OWNER_TAG: token_hash(token)})
    folder = tmp_path / "spool"
    copy = spool.artifacts_dir(spool.spool_path(folder, run.info.run_id)) / "0000" / "summary.json"
    copy.parent.mkdir(parents=True)
    copy.write_text('{"best_val_loss": 0.5}\n')
    path = spool.spool_path(folder, run.info.run_id)
    header = {"run_id": run.info.run_id, "experiment_id": "0", "tracking_uri": "x", "owner_token": token}
    spool.append_records(path, header, [
        {"type": "metric", "key": "best_val_loss", "value": 0.5, "step": 0, "timestamp": 5},
        {"type": "tag", "key": "late", "value": "tag"},
        {"type": "artifact", "local_path": os.path.relpath(copy, folder), "artifact_path": None},
        {"type": "terminate", "status": status, "end_time": 12345},
    ])
    return path, run.info.run_id


def test_dry_run_says_what_it_would_do_and_changes_nothing(sqlite_env, tmp_path, capsys):
    from kronos_mlflow.cli.main import main

    client = MlflowClient(sqlite_env)
    path, run_id = _writer_spool(tmp_path, client)
    before = _db_hash(sqlite_env)
    assert main(["upload-spool", str(path.parent), "--dry-run"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"kronos-mlflow upload-spool: {path.name}: would run {run_id} (experiment 0, RUNNING): send 1 metric "
                   "values (0 already there), 0 params, 1 tags, 1 artifacts (summary.json); end it FINISHED"]
    assert _db_hash(sqlite_env) == before and path.is_file()
    assert main(["upload-spool", str(path.parent)]) == 0  # the same line ("will"), then what was done
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and out[0].startswith(f"kronos-mlflow upload-spool: {path.name}: will run {run_id}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.end_time == 12345 and run.data.tags["late"] == "tag"
    assert [a.path for a in client.list_artifacts(run_id)] == ["summary.json"]


def test_an_ended_run_keeps_how_it_ended(sqlite_env, tmp_path):
    """A spool agreeing with a stopped run's status adds what is missing and leaves its status and
    end time; a spool saying another status, or naming a FINISHED run, is refused before anything
    is sent."""
    client = MlflowClient(sqlite_env)
    path, run_id = _writer_spool(tmp_path, client, status="KILLED")
    client.set_terminated(run_id, "KILLED", end_time=999)
    counts = spool.upload_spool(path, client, finish="keep")
    run = client.get_run(run_id)
    assert counts["status"] is None and counts["status_kept"] == "KILLED"
    assert run.info.status == "KILLED" and run.info.end_time == 999 and run.data.metrics["best_val_loss"] == 0.5
    other, other_id = _writer_spool(tmp_path / "b", client, status="FAILED")
    client.set_terminated(other_id, "KILLED", end_time=7)
    before = _db_hash(sqlite_env)
    with pytest.raises(UserError, match="already ended KILLED"):
        spool.upload_spool(other, client)
    assert _db_hash(sqlite_env) == before and other.is_file()
    done, done_id = _writer_spool(tmp_path / "c", client, status="FINISHED")
    client.set_terminated(done_id, "FINISHED", end_time=7)
    before = _db_hash(sqlite_env)
    with pytest.raises(UserError, match="which is FINISHED"):
        spool.upload_spool(done, client)
    assert _db_hash(sqlite_env) == before and done.is_file()


def test_an_artifact_linked_outside_the_spool_is_refused(sqlite_env, tmp_path):
    """A symlink inside the spool's artifact copies that points elsewhere is refused, naming it."""
    client = MlflowClient(sqlite_env)
    path, run_id = _writer_spool(tmp_path, client)
    (tmp_path / "private.txt").write_text("not for the server\n")
    copy_dir = spool.artifacts_dir(path) / "0000"
    os.symlink(tmp_path / "private.txt", copy_dir / "link.txt")
    spool.append_records(path, {}, [{"type": "artifact", "local_path": os.path.relpath(copy_dir, path.parent),
                                     "artifact_path": "more"}])
    before = _db_hash(sqlite_env)
    with pytest.raises(UserError, match="link.txt"):
        spool.upload_spool(path, client)
    assert _db_hash(sqlite_env) == before


# ----------------------------------------------------------------------------- slow: a real server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module's slow tests; a test that stops it leaves it to server_env to restart."""
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as srv:
        yield srv


@pytest.fixture()
def server_env(server, monkeypatch, tmp_path):
    for name in TRACKING_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    return server


FIGURES: dict[str, dict] = {}


@pytest.mark.slow
def test_real_server_stopped_and_restarted_mid_run(server_env, tmp_path, capsys):
    server = server_env
    logger = MLflowLogger(tracking_uri=server.url, experiment_name="outage-restart", flush_every_s=0.1,
                          flush_max_metrics=50, spool_dir=tmp_path / "spool", retry_backoff_s=(0.25, 1.0),
                          http_timeout_s=3, finalize_wait_s=30)
    logger.log_hyperparams({"lr": 0.1})
    for step in range(30):
        logger.log_metrics(_metrics(step), step)
    logger.flush()
    t_stop = time.monotonic()
    server.stop()
    stop_s = time.monotonic() - t_stop
    (tmp_path / "summary.json").write_text('{"best_val_loss": 0.5}')
    slowest = 0.0
    for step in range(30, 90):  # "training" goes on while the server is away
        t0 = time.monotonic()
        # one refused connection at most per call, never MLflow's minutes of retries (a deadline, not a timing)
        returns_within(10, logger.log_metrics, _metrics(step), step)
        slowest = max(slowest, time.monotonic() - t0)  # a figure, printed below
        time.sleep(0.02)  # a training step's pace, so that timed flushes (every 0.1 s) happen during the outage
    logger.log_artifact(str(tmp_path / "summary.json"))
    logger.set_tags({"during_outage": "yes"})
    restart_s = server.start()
    for step in range(90, 120):
        logger.log_metrics(_metrics(step), step)
        time.sleep(0.05)  # a training step's pace: the logger's retry backoff (0.25-1 s) runs out meanwhile
    logger.finalize("success")
    client = MlflowClient(server.url)
    counts = _count(client, logger.run_id)
    expected = 120
    lost = sum(len(set(range(expected)) - set(c["steps"])) for c in counts.values())
    duplicated = sum(c["n"] - c["unique"] for c in counts.values())
    FIGURES["restart"] = {"delayed": logger.delayed_metrics, "lost": lost, "duplicated": duplicated,
                          "stop_s": round(stop_s, 1), "restart_s": round(restart_s, 1), "slowest_log_call_s": round(slowest, 3)}
    print(json.dumps(FIGURES["restart"]), file=sys.__stdout__)
    assert lost == 0 and duplicated == 0, counts
    assert logger.delayed_metrics >= 120  # the 60 outage steps x 2 keys at least
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["during_outage"] == "yes"
    assert "summary.json" in [a.path for a in client.list_artifacts(logger.run_id)]
    assert "none lost" in capsys.readouterr().err
    assert not list((tmp_path / "spool").glob("*.jsonl"))


@pytest.mark.slow
def test_real_server_stays_down_then_upload_spool(server_env, tmp_path, monkeypatch, commands):
    server = server_env
    # A password in the URI (this server has no auth and ignores it): never printed, never spooled.
    uri = f"http://kronos:{PASSWORD}@127.0.0.1:{server.port}"
    logger = MLflowLogger(tracking_uri=uri, experiment_name="outage-spool", flush_every_s=0.1,
                          spool_dir=tmp_path / "spool", retry_backoff_s=(0.25, 0.5), http_timeout_s=3,
                          finalize_wait_s=2)
    logger.log_hyperparams({"lr": 0.1})
    for step in range(20):
        logger.log_metrics(_metrics(step), step)
    logger.flush()
    server.stop()
    (tmp_path / "summary.json").write_text('{"best_val_loss": 0.5}')
    for step in range(20, 60):
        logger.log_metrics(_metrics(step), step)
    logger.log_artifact(str(tmp_path / "summary.json"))
    logger.log_hyperparams({"late_param": "x"})
    captured = io.StringIO()
    with redirect_stderr(captured):
        logger.finalize("success")
    spool_dir = tmp_path / "spool"
    path = spool_dir / f"{logger.run_id}.jsonl"
    assert path.is_file()
    message = captured.getvalue()
    assert PASSWORD not in message and "kronos:***@127.0.0.1" in message
    assert f"kronos-mlflow upload-spool {path}" in message
    for file in spool_dir.rglob("*"):
        if file.is_file():
            assert PASSWORD.encode() not in file.read_bytes(), file
    spooled = logger.spooled_metrics
    assert spooled == 80

    server.start()
    env = dict(os.environ)
    for name in TRACKING_ENV:
        env.pop(name, None)
    cmd = [sys.executable, "-m", "kronos_mlflow", "upload-spool", str(spool_dir), "--tracking-uri", uri]
    # the replay as a real process, as the user types it; the two repeats through the fork server
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert f"run {logger.run_id}: 80 metric values sent (0 already there)" in proc.stdout
    assert "status FINISHED" in proc.stdout
    client = MlflowClient(server.url)
    counts = _count(client, logger.run_id)
    lost = sum(len(set(range(60)) - set(c["steps"])) for c in counts.values())
    duplicated = sum(c["n"] - c["unique"] for c in counts.values())
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params["late_param"] == "x"
    assert "summary.json" in [a.path for a in client.list_artifacts(logger.run_id)]
    assert not path.exists() and Path(str(path) + ".uploaded").is_file()
    # Again: nothing left to upload; and the same spool once more changes nothing.
    again = commands.run(cmd, env=env, timeout=120)
    assert again.returncode == 0 and "no spool files" in again.stdout
    os.replace(str(path) + ".uploaded", path)
    again = commands.run(cmd[:4] + [str(path)] + cmd[5:], env=env, timeout=120)
    assert again.returncode == 0 and "0 metric values sent (80 already there)" in again.stdout, again.stderr
    counts = _count(client, logger.run_id)
    duplicated += sum(c["n"] - c["unique"] for c in counts.values())
    FIGURES["spool"] = {"delayed": logger.delayed_metrics, "spooled": spooled, "lost": lost, "duplicated": duplicated}
    print(json.dumps(FIGURES["spool"]), file=sys.__stdout__)
    assert lost == 0 and duplicated == 0, counts


@pytest.mark.slow
def test_upload_spool_server_down_is_one_line(tmp_path, commands):
    path = tmp_path / "r.jsonl"
    spool.append_records(path, {"run_id": "abc"}, [{"type": "metric", "key": "a", "value": 1.0, "step": 0,
                                                    "timestamp": 5}])
    env = {k: v for k, v in os.environ.items() if k not in TRACKING_ENV}
    proc = commands.run([sys.executable, "-m", "kronos_mlflow", "upload-spool", str(path), "--tracking-uri",
                         f"http://u:{PASSWORD}@127.0.0.1:{free_port()}"], env=env, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unreachable" in lines[0] and PASSWORD not in proc.stderr
    assert path.is_file()  # untouched


@pytest.mark.slow
def test_training_against_a_password_uri_leaks_no_secret(server_env, tmp_path):
    """A whole (tiny) training run through the real server with every credential set: the
    console, the outputs, the server's database and artifacts hold none of them."""
    server = server_env
    secrets = {
        "COMET_API_KEY": "cometkey-SPOOLTEST-SHOULD-NOT-LEAK-1",
        "MLFLOW_TRACKING_PASSWORD": "mlflowpass-SPOOLTEST-SHOULD-NOT-LEAK-2",
        "MLFLOW_TRACKING_TOKEN": "mlflowtoken-SPOOLTEST-SHOULD-NOT-LEAK-3",
    }
    uri = f"http://kronos:{PASSWORD}@127.0.0.1:{server.port}"
    env = isolated_env(tmp_path, uri, {**secrets, "MLFLOW_TRACKING_USERNAME": "kronos"})
    cmd = train_command(tmp_path, epochs=1, comet="offline", run_name="leak-check")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    values = [PASSWORD, *secrets.values()]
    found = [(where, v) for where, text in (("stdout", proc.stdout), ("stderr", proc.stderr))
             for v in values if v in text]
    for base in (tmp_path, server.root):
        for path in Path(base).rglob("*"):
            if path.is_file():
                blob = path.read_bytes()
                found += [(str(path), v) for v in values if v.encode() in blob]
    assert found == []
    runs = MlflowClient(server.url).search_runs(
        [MlflowClient(server.url).get_experiment_by_name("Default").experiment_id],
        filter_string="attributes.run_name = 'leak-check'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"


def test_persist_then_kill_during_outage_loses_nothing(sqlite_env, tmp_path):
    """Before a checkpoint, persist() puts buffered metrics on disk while the server is down; a
    restarted attempt on the same run adopts that spool, does not log its steps twice, and
    sends it once the server answers."""
    spool_dir = tmp_path / "spool"
    first = MLflowLogger(experiment_name="persist", flush_every_s=3600, spool_dir=spool_dir,
                         retry_backoff_s=(0.05, 0.1))
    outage = Outage(first)
    for step in range(3):
        first.log_metrics(_metrics(step), step)
    first.flush()
    outage.down = True
    for step in range(3, 8):
        first.log_metrics(_metrics(step), step)
    first.flush()  # fails: still buffered
    first.persist()  # "epoch end": on disk now
    assert first.spooled_metrics == 10 and first.pending == 0
    for step in range(8, 10):  # logged after the checkpoint, then the process is killed
        first.log_metrics(_metrics(step), step)
    first._finalized = True  # (a SIGKILL runs no finalize and no atexit)

    # the restart resumes the run its training state names, proving it with the state's token
    claim = Claim(token=first.owner_token, named_by="the training state")
    second = MLflowLogger(run_id=first.run_id, experiment_name="persist", flush_every_s=0.0, spool_dir=spool_dir,
                          claim=claim)  # server back
    assert second.spooled_metrics == 10
    multi = MultiLogger([second])
    for step in range(6, 12):  # the restarted attempt replays from its checkpoint (step 8), and a bit before
        multi.log_metrics(_metrics(step), step)
    multi.finalize("success")
    counts = _count(MlflowClient(sqlite_env), first.run_id)
    for key in KEYS:
        assert counts[key]["steps"] == list(range(12)) and counts[key]["n"] == 12, counts
    assert not list(spool_dir.glob("*.jsonl"))
