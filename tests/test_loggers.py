"""kronos_mlflow.tracking against the real SDKs, offline.

MLflow runs on a temporary sqlite store (one per module: creating the schema costs ~1.5 s);
Comet runs as an ``OfflineExperiment`` whose zip archive is opened and parsed back
(``messages.json``: one JSON object per line). Nothing here opens a network connection: the
unreachable-server test dials a closed local port.
"""

from __future__ import annotations

import json
import logging
import math
import os
import zipfile
from typing import Any

import mlflow  # before comet_ml, always (see kronos_mlflow.tracking.comet)
import numpy as np
import pytest
from recording import Recorder
from servers import returns_within
import torch
from mlflow import MlflowClient

from kronos_mlflow.errors import ConfigError, UserError
from kronos_mlflow.tracking import (
    CometLogger,
    ExperimentLogger,
    MLflowLogger,
    MultiLogger,
    NullLogger,
    build_logger,
    build_tracking,
    comet_mode,
)

FAKE_COMET_KEY = "fake-comet-key-0123456789abcdef"
LOGGER_NAME = "kronos_mlflow.tracking"


# ------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def env(tracking_env, monkeypatch):
    """conftest's ``tracking_env`` (the module's sqlite store, cwd = tmp_path), as a monkeypatch."""
    return monkeypatch


@pytest.fixture
def client(sqlite_store) -> MlflowClient:
    return MlflowClient(sqlite_store)


def warnings_from(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME and text in r.getMessage()]


def read_archive(path: str) -> dict[str, Any]:
    """Parse a Comet offline zip: metrics, params, others, tags, assets, and every member's bytes."""
    out: dict[str, Any] = {"metrics": [], "params": {}, "others": {}, "assets": [], "members": {}}
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            out["members"][name] = zf.read(name)
    out["experiment"] = json.loads(out["members"]["experiment.json"])
    for line in out["members"]["messages.json"].decode().splitlines():
        if not line.strip():
            continue
        msg = json.loads(line)
        payload = msg["payload"]
        if msg["type"] == "metric_msg":
            m = payload["metric"]
            out["metrics"].append((m["metricName"], m["step"], m["metricValue"]))
        elif msg["type"] == "parameter_msg":
            p = payload["param"]
            out["params"][p["paramName"]] = p["paramValue"]
        elif msg["type"] == "log_other":
            out["others"][payload["key"]] = payload["value"]
        elif msg["type"] == "file_upload":
            out["assets"].append(payload["additional_params"]["fileName"])
    return out


# ------------------------------------------------------------------------------------------
# protocol, NullLogger, MultiLogger (no SDK)


def test_null_logger_satisfies_protocol_and_does_nothing():
    null = NullLogger()
    assert isinstance(null, ExperimentLogger)
    assert null.log_hyperparams({"a": 1}) is None
    assert null.log_metrics({"x": 1.0}, 0) is None
    assert null.log_artifact("/does/not/exist") is None
    assert null.set_tags({"a": "b"}) is None
    assert null.persist() is None
    assert null.finalize("failed", "why") is None


def test_other_ranks_get_a_null_logger_and_no_backends():
    tracking = build_tracking({"comet": "offline"}, rank=1)
    assert isinstance(tracking.logger, NullLogger) and tracking.mlflow is None and tracking.comet is None
    assert tracking.run_ids() == {"mlflow_run_id": None, "comet_experiment_key": None, "owner_token": None}
    assert isinstance(build_logger({}, rank=3), NullLogger)


def test_multi_logger_fans_out_in_order():
    journal: list = []
    multi = MultiLogger([Recorder("a", journal), Recorder("b", journal)])
    assert isinstance(multi, ExperimentLogger)
    multi.log_hyperparams({"lr": 0.1})
    multi.log_metrics({"loss": 1.0}, 3)
    multi.set_tags({"t": "v"})
    multi.log_artifact("f.txt", "dir")
    multi.finalize("success")
    multi.finalize("success")  # idempotent
    assert journal == [
        ("a", "log_hyperparams", {"lr": 0.1}), ("b", "log_hyperparams", {"lr": 0.1}),
        ("a", "log_metrics", {"loss": 1.0}, 3), ("b", "log_metrics", {"loss": 1.0}, 3),
        ("a", "set_tags", {"t": "v"}), ("b", "set_tags", {"t": "v"}),
        ("a", "log_artifact", "f.txt", "dir"), ("b", "log_artifact", "f.txt", "dir"),
        ("a", "finalize", "success", None), ("b", "finalize", "success", None),
    ]


def test_multi_logger_drops_failing_optional_backend_once(caplog):
    journal: list = []
    essential = Recorder("mlflow", journal)
    optional = Recorder("comet", journal, essential=False, fail_on="log_metrics")
    multi = MultiLogger([essential, optional])
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        multi.log_hyperparams({"a": 1})
        for step in range(3):
            multi.log_metrics({"loss": float(step)}, step)
        multi.finalize("success")
    assert optional.attempts == 2  # log_hyperparams, then the failing log_metrics; never again
    assert multi.loggers == [essential]
    assert [m for m in journal if m[0] == "mlflow" and m[1] == "log_metrics"] == [
        ("mlflow", "log_metrics", {"loss": float(s)}, s) for s in range(3)
    ]
    dropped = warnings_from(caplog, "dropped")
    assert len(dropped) == 1 and "Recorder failed in log_metrics" in dropped[0] and "comet broke" in dropped[0]


def test_multi_logger_propagates_essential_failure_but_finalizes_everyone():
    journal: list = []
    multi = MultiLogger([Recorder("mlflow", journal, fail_on="finalize"), Recorder("comet", journal, essential=False)])
    with pytest.raises(RuntimeError, match="mlflow broke"):
        multi.finalize("failed", "oops")
    assert ("comet", "finalize", "failed", "oops") in journal
    multi2 = MultiLogger([Recorder("mlflow", [], fail_on="log_metrics")])
    with pytest.raises(RuntimeError):
        multi2.log_metrics({"x": 1.0}, 0)


def test_multi_logger_cleans_metrics_once(caplog):
    journal: list = []
    multi = MultiLogger([Recorder("a", journal), Recorder("b", journal)])
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        for step in range(3):
            multi.log_metrics({"ok": np.float32(0.5), "t": torch.tensor(2.0), "bad": float("nan"), "s": "x"}, step)
    assert journal[0] == ("a", "log_metrics", {"ok": 0.5, "t": 2.0}, 0)
    assert len(warnings_from(caplog, "'bad'")) == 1
    assert len(warnings_from(caplog, "'s'")) == 1


def test_finalize_rejects_unknown_status():
    with pytest.raises(ValueError, match="success"):
        MultiLogger([]).finalize("done")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# MLflowLogger


def test_mlflow_params_truncated_batched_and_scrubbed(env, client, caplog):
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    env.setenv("COMET_API_KEY", FAKE_COMET_KEY)
    logger = MLflowLogger(experiment_name="params", run_name="p")
    batches: list[int] = []
    real_log_batch = logger.client.log_batch

    def spy(run_id, metrics=(), params=(), tags=(), **kw):
        if params:
            batches.append(len(params))
        return real_log_batch(run_id, metrics=metrics, params=params, tags=tags, **kw)

    logger.client.log_batch = spy
    params: dict[str, Any] = {f"p{i:03d}": i for i in range(250)}
    params.update({
        "long": "x" * (MAX_PARAM_VAL_LENGTH + 500),
        "train_time_range": ["2011-01-01", "2022-12-31"],
        "feature_list": ["open", "close"],
        "nested": {"depth": 2},
        "api_key": FAKE_COMET_KEY,
        "note": f"key {FAKE_COMET_KEY}",
        "tokenizer_learning_rate": 2e-4,
    })
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        logger.log_hyperparams(params)
        logger.log_hyperparams({"p000": 0, "p001": 99})  # same value: fine; changed: skipped + warning
    assert batches and max(batches) <= 100 and sum(batches) == 250 + 6
    logged = client.get_run(logger.run_id).data.params
    assert len(logged) == 256
    assert logged["p001"] == "1" and logged["p249"] == "249"
    assert len(logged["long"]) == MAX_PARAM_VAL_LENGTH
    assert logged["train_time_range"] == "2011-01-01:2022-12-31"
    assert logged["feature_list"] == "open,close"
    assert logged["nested.depth"] == "2"
    assert logged["tokenizer_learning_rate"] == "0.0002"
    assert "api_key" not in logged and logged["note"] == "key ***"
    assert FAKE_COMET_KEY not in json.dumps(logged)
    assert len(warnings_from(caplog, "truncated")) == 1
    changed = warnings_from(caplog, "'p001'")
    assert len(changed) == 1 and "not logged" in changed[0]
    logger.finalize("success")


def test_mlflow_metrics_buffered_flushed_once_per_step(env, client, caplog):
    logger = MLflowLogger(experiment_name="metrics", flush_every_s=3600, flush_max_metrics=10_000)
    assert isinstance(logger, ExperimentLogger)
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        for step in range(5):
            logger.log_metrics({
                "loss": 1.0 / (step + 1),
                "np": np.float64(step),
                "tensor": torch.tensor(float(step) * 2),
                "bad": float("nan") if step % 2 else float("inf"),
                "text": "nope",
                "val loss@epoch": step,
            }, step)
        assert client.get_metric_history(logger.run_id, "loss") == []  # still buffered
        logger.finalize("success")
    history = client.get_metric_history(logger.run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3, 4]
    assert [m.value for m in history] == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    assert [m.value for m in client.get_metric_history(logger.run_id, "tensor")] == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert [m.step for m in client.get_metric_history(logger.run_id, "val loss_epoch")] == [0, 1, 2, 3, 4]
    run = client.get_run(logger.run_id)
    assert set(run.data.metrics) == {"loss", "np", "tensor", "val loss_epoch"}
    assert len(warnings_from(caplog, "'bad'")) == 1
    assert len(warnings_from(caplog, "'text'")) == 1
    assert len(warnings_from(caplog, "is logged as 'val loss_epoch'")) == 1


def test_mlflow_metrics_flush_by_count_and_time(env, client, monkeypatch):
    logger = MLflowLogger(experiment_name="metrics", flush_every_s=3600, flush_max_metrics=4)
    for step in range(3):
        logger.log_metrics({"a": step, "b": step}, step)  # flushes when 4 values are waiting
    assert [m.step for m in client.get_metric_history(logger.run_id, "a")] == [0, 1]
    logger.flush_every_s = 0.0
    logger.log_metrics({"a": 3}, 3)  # the interval has passed: flush now
    assert [m.step for m in client.get_metric_history(logger.run_id, "a")] == [0, 1, 2, 3]
    logger.finalize("success")
    assert [m.step for m in client.get_metric_history(logger.run_id, "a")] == [0, 1, 2, 3]


def test_mlflow_artifacts_tags_and_success(env, client, tmp_path):
    (tmp_path / "summary.json").write_text('{"best_val_loss": 0.5}')
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "sub" / "weights.bin").write_bytes(b"\0" * 8)
    env.setenv("MLFLOW_TRACKING_PASSWORD", "tag-secret-value")
    logger = MLflowLogger(experiment_name="artifacts", run_name="art", tags={"origin": "test"})
    logger.log_artifact(str(tmp_path / "summary.json"))
    logger.log_artifact(str(ckpt), "checkpoints/best_model")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        logger.log_artifact(str(tmp_path / "missing.txt"))
    logger.set_tags({"stage": "demo", "leak": "pw=tag-secret-value"})
    logger.finalize("success")
    logger.finalize("failed", "ignored: already finalized")
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "art"
    assert run.data.tags["origin"] == "test" and run.data.tags["stage"] == "demo"
    assert run.data.tags["leak"] == "pw=***"
    assert "failure_reason" not in run.data.tags
    assert "mlflow.user" in run.data.tags  # context tags, as mlflow.start_run would add
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert repo not in run.info.artifact_uri  # artifacts stay in the temporary store
    top = {a.path for a in client.list_artifacts(logger.run_id)}
    assert top == {"summary.json", "checkpoints"}
    best = {a.path for a in client.list_artifacts(logger.run_id, "checkpoints/best_model")}
    assert best == {"checkpoints/best_model/config.json", "checkpoints/best_model/sub"}


def test_mlflow_failed_sets_reason(env, client):
    env.setenv("COMET_API_KEY", FAKE_COMET_KEY)
    logger = MLflowLogger(experiment_name="failures")
    logger.log_metrics({"loss": 1.0}, 0)
    logger.finalize("failed", f"RuntimeError: boom\n  with key {FAKE_COMET_KEY}\n" + "y" * 5000)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FAILED"
    reason = run.data.tags["failure_reason"]
    assert reason.startswith("RuntimeError: boom with key ***")
    assert "\n" not in reason and len(reason) <= 1000
    assert [m.step for m in client.get_metric_history(logger.run_id, "loss")] == [0]


def test_mlflow_attaches_to_mlflow_run_id(env, client):
    experiment_id = client.create_experiment("attach")
    parent = client.create_run(experiment_id, run_name="made-by-mlflow-run")
    client.log_param(parent.info.run_id, "epochs", "2")
    env.setenv("MLFLOW_RUN_ID", parent.info.run_id)
    env.setenv("MLFLOW_EXPERIMENT_ID", experiment_id)  # as mlflow run sets it
    env.setenv("MLFLOW_EXPERIMENT_NAME", "some-other-experiment")  # the shell's: the run (and its id) win
    before = len(client.search_runs([experiment_id]))
    logger = MLflowLogger(run_name=None)
    assert logger.run_id == parent.info.run_id and logger.experiment_id == experiment_id
    assert logger.attached
    logger.log_hyperparams({"epochs": 2, "lr": 0.1})  # same value as `mlflow run` logged: fine
    logger.log_metrics({"loss": 0.3}, 0)
    logger.finalize("success")
    assert len(client.search_runs([experiment_id])) == before
    run = client.get_run(parent.info.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "made-by-mlflow-run"
    assert run.data.params == {"epochs": "2", "lr": "0.1"}
    assert client.get_experiment_by_name("some-other-experiment") is None



def test_workers_started_together_share_one_new_experiment(env, sqlite_store):
    """Every place that gets-or-creates an experiment (a training run, a sweep's or pipeline's
    parent, evaluate-tokenizer --log) goes through one function; workers that all look the new
    name up before any creates it (as two sweep workers started together do) end in one
    experiment, none in the store's unique-constraint refusal."""
    import threading

    from kronos_mlflow.tracking.child_runs import experiment_id_of
    from kronos_mlflow.tracking.gate import experiment_named

    together = threading.Barrier(3)

    class Worker(MlflowClient):  # its first lookup answers only once every worker has looked
        looked = False

        def get_experiment_by_name(self, name):
            found = super().get_experiment_by_name(name)
            if not self.looked:
                self.looked = True
                together.wait(timeout=30)
            return found

    got, errors = [], []

    def work(get):
        try:
            got.append(get(Worker(sqlite_store), "started-together"))
        except Exception as exc:  # noqa: BLE001 - the assertion shows it
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(get,)) for get in (experiment_named, experiment_id_of,
                                                                         experiment_named)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not errors, errors
    assert len(got) == 3 and len(set(got)) == 1
    assert MlflowClient(sqlite_store).get_experiment_by_name("started-together").experiment_id == got[0]


def test_mlflow_reopens_finished_run_and_renames(env, client, caplog):
    experiment_id = client.create_experiment("resume")
    first = client.create_run(experiment_id, run_name="old")
    client.log_param(first.info.run_id, "lr", "0.1")
    client.set_terminated(first.info.run_id, "FINISHED")
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        logger = MLflowLogger(run_id=first.info.run_id, run_name="new")
        assert client.get_run(first.info.run_id).info.status == "RUNNING"
        logger.log_hyperparams({"lr": 0.2})
    assert client.get_run(first.info.run_id).data.params["lr"] == "0.1"
    assert len(warnings_from(caplog, "'lr'")) == 1
    logger.finalize("failed", "resumed and failed")
    run = client.get_run(first.info.run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "new"


@pytest.mark.parametrize("ended, tag", [("killed", "stop_reason"), ("failed", "failure_reason")])
def test_a_resumed_run_that_finishes_keeps_no_earlier_reason(env, client, ended, tag):
    """Stopped (or failed), then resumed by the same command, then finished: the run is FINISHED
    without the earlier attempt's stop_reason / failure_reason; stopped again, it gets the new one."""
    first = MLflowLogger(experiment_name="resume-reason")
    first.log_metrics({"loss": 0.5}, 0)
    first.finalize(ended, "stopped by SIGTERM" if ended == "killed" else "RuntimeError: boom")
    run_id = first.run_id
    assert tag in client.get_run(run_id).data.tags
    resumed = MLflowLogger(run_id=run_id)
    assert tag not in client.get_run(run_id).data.tags
    resumed.log_metrics({"loss": 0.4}, 1)
    resumed.finalize("success")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert not {"stop_reason", "failure_reason"} & set(run.data.tags)
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1]
    again = MLflowLogger(run_id=run_id)
    again.finalize("killed", "stopped by SIGINT")
    assert client.get_run(run_id).data.tags["stop_reason"] == "stopped by SIGINT"


def test_mlflow_experiment_selection(env, client):
    named = MLflowLogger(experiment_name="by-name")
    assert client.get_experiment(named.experiment_id).name == "by-name"
    again = MLflowLogger(experiment_name="by-name")
    assert again.experiment_id == named.experiment_id
    env.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    from_env = MLflowLogger()
    assert client.get_experiment(from_env.experiment_id).name == "from-env"
    env.delenv("MLFLOW_EXPERIMENT_NAME")
    env.setenv("MLFLOW_EXPERIMENT_ID", named.experiment_id)
    assert MLflowLogger().experiment_id == named.experiment_id
    env.delenv("MLFLOW_EXPERIMENT_ID")
    assert MLflowLogger().experiment_id == "0"  # MLflow's Default experiment
    assert named.tracking_uri == os.environ["MLFLOW_TRACKING_URI"]
    for lg in (named, again, from_env):
        lg.finalize("success")


def test_mlflow_user_errors(env, client):
    env.setenv("MLFLOW_RUN_ID", "0123456789abcdef0123456789abcdef")
    with pytest.raises(UserError, match="MLFLOW_RUN_ID"):
        MLflowLogger()
    env.delenv("MLFLOW_RUN_ID")
    env.setenv("MLFLOW_EXPERIMENT_ID", "987654")
    with pytest.raises(UserError, match="987654"):
        MLflowLogger()
    env.delenv("MLFLOW_EXPERIMENT_ID")
    gone = client.create_experiment("deleted-one")
    client.delete_experiment(gone)
    with pytest.raises(UserError, match="deleted"):
        MLflowLogger(experiment_name="deleted-one")


def test_mlflow_unreachable_server_fails_fast_without_password(env):
    env.setenv("MLFLOW_TRACKING_URI", "http://alice:s3cret-pw@127.0.0.1:9")
    with pytest.raises(UserError) as info:  # a deadline well below MLflow's minutes of retries
        returns_within(30, MLflowLogger, experiment_name="never")
    message = str(info.value)
    assert "\n" not in message
    assert "s3cret-pw" not in message
    assert "http://alice:***@127.0.0.1:9" in message
    assert "unreachable" in message and "unset MLFLOW_TRACKING_URI" in message


@pytest.fixture
def http_server():
    """A local HTTP server answering every GET with the status in ``server.status``."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(self.server.status)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.status = 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_probe_accepts_any_answer_but_a_proxy_error(http_server):
    from kronos_mlflow.tracking.server import probe_tracking_server as _probe_tracking_server

    uri = f"http://bob:pw-1234@127.0.0.1:{http_server.server_address[1]}/prefix"
    for status in (200, 401, 404, 500):
        http_server.status = status
        _probe_tracking_server(uri, timeout=5)
    http_server.status = 502
    with pytest.raises(UserError, match="a proxy could not reach it") as info:
        _probe_tracking_server(uri, timeout=5)
    assert "pw-1234" not in str(info.value) and "use another tracking URI" in str(info.value)
    _probe_tracking_server("sqlite:///nowhere.db", timeout=5)  # not http: nothing to probe


def test_mlflow_log_input(env, client):
    import pandas as pd

    logger = MLflowLogger(experiment_name="inputs")
    dataset = mlflow.data.from_pandas(pd.DataFrame({"close": [1.0, 2.0]}), name="demo-market")
    logger.log_input(dataset, context="training")
    logger.finalize("success")
    inputs = client.get_run(logger.run_id).inputs.dataset_inputs
    assert [d.dataset.name for d in inputs] == ["demo-market"]
    assert {t.key: t.value for t in inputs[0].tags}["mlflow.data.context"] == "training"


# ------------------------------------------------------------------------------------------
# CometLogger (offline; one shared experiment)


@pytest.fixture(scope="module")
def comet_run(tmp_path_factory):
    """One offline experiment, logged to and finalized; yields (logger, parsed archive)."""
    root = tmp_path_factory.mktemp("comet")
    asset = root / "summary.json"
    asset.write_text('{"best_val_loss": 0.25}')
    folder = root / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "w.bin").write_bytes(b"1234")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMET_API_KEY", FAKE_COMET_KEY)
        mp.chdir(root)
        logger = CometLogger(
            "offline", project_name="kronos-test", experiment_name="offline-demo",
            offline_directory=str(root / "archives"), tags=["finetune_demo"],
        )
        assert isinstance(logger, ExperimentLogger)
        logger.log_hyperparams({
            "epochs": 2, "lr": 2e-4, "name": "demo", "train_time_range": ["2011-01-01", "2022-12-31"],
            "nested": {"depth": 3}, "api_key": FAKE_COMET_KEY, "note": f"uses {FAKE_COMET_KEY}",
        })
        for step in range(3):
            logger.log_metrics({"train_tokenizer_loss_batch": 1.0 / (step + 1), "nan": float("nan"),
                                "t": torch.tensor(step)}, step)
        logger.log_metrics({"val_tokenizer_loss_epoch": 0.5}, 0)
        logger.set_tags({"mlflow_run_id": "abc123", "secret_in_value": FAKE_COMET_KEY})
        logger.log_artifact(str(asset))
        logger.log_artifact(str(folder), "checkpoints/best_model")
        assert logger.offline_archive is None
        logger.finalize("failed", f"boom\nkey={FAKE_COMET_KEY}")
        logger.finalize("success")  # idempotent
        yield logger, read_archive(logger.offline_archive)


def test_comet_offline_archive_holds_metrics(comet_run):
    logger, archive = comet_run
    assert os.path.basename(logger.offline_archive).startswith(logger.experiment_key)
    ours = [m for m in archive["metrics"] if m[0] in ("train_tokenizer_loss_batch", "val_tokenizer_loss_epoch", "t")]
    # Comet writes the metrics of one call in its own order; each (name, step) appears once.
    assert sorted(ours) == [
        ("t", 0, 0), ("t", 1, 1), ("t", 2, 2),
        ("train_tokenizer_loss_batch", 0, 1.0), ("train_tokenizer_loss_batch", 1, 0.5),
        ("train_tokenizer_loss_batch", 2, pytest.approx(1 / 3)),
        ("val_tokenizer_loss_epoch", 0, 0.5),
    ]
    assert [m[1] for m in ours if m[0] == "train_tokenizer_loss_batch"] == [0, 1, 2]
    assert not [m for m in archive["metrics"] if m[0] == "nan" or (isinstance(m[2], float) and math.isnan(m[2]))]


def test_comet_offline_archive_holds_params_tags_others_assets(comet_run):
    _, archive = comet_run
    params = archive["params"]
    assert params["epochs"] == 2 and params["lr"] == 2e-4 and params["name"] == "demo"
    assert params["train_time_range"] == "2011-01-01:2022-12-31"
    assert params["nested.depth"] == 3
    assert "api_key" not in params and params["note"] == "uses ***"
    others = archive["others"]
    assert others["Name"] == "offline-demo"
    assert others["mlflow_run_id"] == "abc123" and others["secret_in_value"] == "***"
    assert others["status"] == "failed" and others["failure_reason"] == "boom key=***"
    assert archive["experiment"]["project_name"] == "kronos-test"
    assert archive["experiment"]["tags"] == ["finetune_demo"]
    assert sorted(archive["assets"]) == [
        "checkpoints/best_model/config.json", "checkpoints/best_model/sub/w.bin", "summary.json",
    ]


def test_comet_archive_never_contains_the_api_key(comet_run):
    logger, archive = comet_run
    with open(logger.offline_archive, "rb") as fh:
        assert FAKE_COMET_KEY.encode() not in fh.read()
    for name, data in archive["members"].items():
        assert FAKE_COMET_KEY.encode() not in data, name
    # auto logging stayed off: no env details, code, git or stdout messages
    messages = archive["members"]["messages.json"].decode()
    for unwanted in ("installed_packages", "os_packages", "system_details", "git_metadata", "standard_output"):
        assert unwanted not in messages


def test_comet_set_up_env_before_import():
    assert os.environ["COMET_DISABLE_AUTO_LOGGING"] == "1"
    assert os.environ["COMET_ERROR_TRACKING_ENABLE"] == "false"


def test_comet_rejects_bad_mode():
    with pytest.raises(ValueError, match="online"):
        CometLogger("sometimes")  # type: ignore[arg-type]


def test_comet_online_dead_experiment_becomes_noop(monkeypatch, caplog):
    """comet_ml returns a dead Experiment (alive False) when it cannot reach Comet: warn, then no-op."""
    import comet_ml

    calls: list = []

    class DeadExperiment:
        alive = False

        def __init__(self, **kwargs):
            calls.append(("init", kwargs))

        def get_key(self):
            return "dead0000"

        def __getattr__(self, name):
            return lambda *a, **k: calls.append((name, a, k))

    monkeypatch.setattr(comet_ml, "Experiment", DeadExperiment)
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        logger = CometLogger("online", project_name="p", experiment_name="n", tags=["t"])
    init_kwargs = calls[0][1]
    assert "api_key" not in init_kwargs  # the key is Comet's business (env or config file)
    assert init_kwargs["log_code"] is False and init_kwargs["log_env_details"] is False
    assert init_kwargs["auto_output_logging"] is False and init_kwargs["display_summary_level"] == 0
    assert len(warnings_from(caplog, "could not reach the Comet server")) == 1
    logger.log_hyperparams({"a": 1})
    logger.log_metrics({"x": 1.0}, 0)
    logger.set_tags({"k": "v"})
    logger.log_artifact("/does/not/exist")
    logger.finalize("success")
    assert [c[0] for c in calls] == ["init", "end"]
    assert logger.experiment_key == "dead0000" and logger.offline_archive is None


@pytest.mark.slow  # a fresh interpreter importing comet_ml and mlflow
def test_comet_logger_does_not_hijack_mlflow(tmp_path):
    """In a fresh process without COMET_DISABLE_AUTO_LOGGING, CometLogger then mlflow.start_run
    must not create a second Comet experiment (comet_ml patches mlflow when imported carelessly)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, sys
        from kronos_mlflow.tracking import CometLogger
        assert "mlflow" not in sys.modules and "comet_ml" not in sys.modules
        comet = CometLogger("offline", project_name="p", offline_directory={str(tmp_path / "ours")!r})
        import mlflow
        mlflow.set_tracking_uri({f"sqlite:///{tmp_path}/hijack.db"!r})
        with mlflow.start_run():
            mlflow.log_metric("x", 1.0)
        comet.finalize("success")
        print("ZIPS", sorted(os.listdir({str(tmp_path / "ours")!r})), sorted(os.listdir(".")))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMET_", "MLFLOW_"))}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", COMET_ERROR_TRACKING_ENABLE="false",
               COMET_AUTO_LOG_ENV_DETAILS="false")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("ZIPS"))
    assert line.count(".zip") == 1, line  # ours only: nothing in cwd
    assert not (tmp_path / ".cometml-runs").exists()


# ------------------------------------------------------------------------------------------
# build_logger


def test_build_logger_rank_nonzero_is_null(env, client):
    def n_runs() -> int:
        return len(client.search_runs([e.experiment_id for e in client.search_experiments()]))

    before = n_runs()
    logger = build_logger({"comet": "offline", "experiment_name": "ranks"}, rank=1)
    assert isinstance(logger, NullLogger)
    assert n_runs() == before
    assert client.get_experiment_by_name("ranks") is None

    class Dist:
        rank = 3

    assert isinstance(build_logger({"comet": "off"}, Dist()), NullLogger)


def test_comet_mode(monkeypatch):
    monkeypatch.delenv("COMET_API_KEY", raising=False)
    assert comet_mode({"comet": "auto"}) is None
    assert comet_mode({}) is None
    assert comet_mode({"comet": "off"}) is None
    assert comet_mode({"comet": "offline"}) == "offline"
    assert comet_mode({"comet": "online"}) == "online"
    monkeypatch.setenv("COMET_API_KEY", FAKE_COMET_KEY)
    assert comet_mode({"comet": "auto"}) == "online"
    with pytest.raises(ConfigError, match="maybe"):
        comet_mode({"comet": "maybe"})


def test_build_logger_auto_without_key_is_mlflow_only(env, client):
    tracking = build_tracking({"comet": "auto", "experiment_name": "build", "run_name": "auto-run"}, rank=0,
                              mlflow_tags={"launcher": "pytest"})
    logger = tracking.logger
    assert isinstance(logger, MultiLogger) and logger.loggers == [tracking.mlflow]
    assert tracking.comet is None and isinstance(tracking.mlflow, MLflowLogger)
    logger.log_metrics({"loss": 1.0}, 0)
    logger.finalize("success")
    run = client.get_run(tracking.mlflow.run_id)
    assert run.info.run_name == "auto-run" and run.data.tags["launcher"] == "pytest"
    assert "comet_experiment_key" not in run.data.tags
    assert run.info.status == "FINISHED"


def test_build_logger_online_without_key_is_refused_before_any_run(env, client, monkeypatch, tmp_path):
    """``comet: online`` insists: without a key the run is refused (one line naming the fix)
    before an MLflow run exists; ``auto`` and ``offline`` need no key."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.comet.config either
    monkeypatch.delenv("COMET_CONFIG", raising=False)
    before = len(client.search_runs(["0"]))
    with pytest.raises(UserError, match="comet: 'online' needs a Comet API key") as info:
        build_tracking({"comet": "online", "experiment_name": "online-refused"}, rank=0)
    assert "\n" not in str(info.value)
    assert client.get_experiment_by_name("online-refused") is None  # no experiment, no run made
    assert len(client.search_runs(["0"])) == before
    (tmp_path / ".comet.config").write_text("[comet]\napi_key = " + FAKE_COMET_KEY + "\n")
    from kronos_mlflow.tracking.comet import comet_key_configured

    assert comet_key_configured()  # a key in Comet's own config file counts


def test_build_logger_offline_cross_links(env, client, tmp_path):
    config = {"comet": "offline", "experiment_name": "build", "run_name": "linked",
              "comet_project_name": "kronos-test", "comet_offline_directory": str(tmp_path / "comet"),
              "comet_name": "", "comet_tag": "finetune_demo"}
    tracking = build_tracking(config, rank=0)
    logger = tracking.logger
    assert isinstance(tracking.comet, CometLogger) and logger.loggers == [tracking.mlflow, tracking.comet]
    assert tracking.run_ids() == {"mlflow_run_id": tracking.mlflow.run_id,
                                  "comet_experiment_key": tracking.comet.experiment_key,
                                  "owner_token": tracking.mlflow.owner_token}
    logger.log_hyperparams({"epochs": 1})
    logger.log_metrics({"loss": 0.5}, 0)
    logger.finalize("success")
    run = client.get_run(tracking.mlflow.run_id)
    assert run.data.tags["comet_experiment_key"] == tracking.comet.experiment_key
    assert run.data.tags["comet_mode"] == "offline"
    archive = read_archive(tracking.comet.offline_archive)
    assert archive["others"]["mlflow_run_id"] == tracking.mlflow.run_id
    assert archive["others"]["Name"] == "linked"  # comet_name empty: the run name
    assert ("loss", 0, 0.5) in archive["metrics"] and archive["params"]["epochs"] == 1
