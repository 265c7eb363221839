"""``kronos-mlflow compare``: runs made with MlflowClient directly (sorting, --top, --parent,
--json, --url, bad input) and one real tiny training (its new metrics, tags and plots, and how
compare shows it)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import urllib.parse

import pytest
from tiny_runs import isolate, run_dir, sqlite_uri, tiny_config

from kronos_mlflow.cli import compare
from kronos_mlflow.cli.main import main as cli_main


def _cli(capsys, *args):
    try:
        rc = cli_main(["compare", *args])
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


_START_MS = itertools.count(1_700_000_000_000, 1000)  # distinct, increasing start times, one second apart


def _make_run(client, exp_id, name, *, lr=None, wd=0.1, epochs=3, val=(), usage=(), status="FINISHED",
              tags=None, best=None, heldout=None):
    run = client.create_run(exp_id, start_time=next(_START_MS), run_name=name, tags=tags or {})
    rid = run.info.run_id
    for key, value in (heldout or {}).items():  # the test verdict: metrics, and the tag
        if key == "verdict":
            client.set_tag(rid, key, value)
        else:
            client.log_metric(rid, key, value)
    if lr is not None:
        for key, value in (("learning_rate", lr), ("weight_decay", wd), ("epochs", epochs)):
            client.log_param(rid, key, str(value))
    for step, value in enumerate(val):
        client.log_metric(rid, "val_tokenizer_loss_epoch", value, step=step)
    for step, (s1, full) in enumerate(usage):
        client.log_metric(rid, "val_codebook_usage_s1", s1, step=step)
        client.log_metric(rid, "val_codebook_usage_full", full, step=step)
    if best is None and val:
        best = min(val)
    if best is not None:
        client.log_metric(rid, "best_val_loss", best, step=list(val).index(best) if best in val else 0)
    if status != "RUNNING":
        client.set_terminated(rid, status)
    return rid


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """An sqlite store: experiment 'exp-a' with plain runs and a sweep, experiment 'other'.

    Built once for the module: the tests only read it (one adds an experiment of its own).
    """
    from mlflow import MlflowClient

    tmp_path = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("exp-a")
    other = client.create_experiment("other")
    ids = {}
    ids["r1"] = _make_run(client, exp, "lr=1e-03 wd=0.1", lr=1e-3, val=(0.5, 0.3, 0.4),
                          usage=((10, 40), (12, 50), (14, 60)), tags={"codebook_bits": "4+4"},
                          heldout={"test_tokenizer_loss": 0.0123, "base_test_tokenizer_loss": 0.015,
                                   "test_loss_change": -0.18, "test_loss_change_ci_low": -0.2,
                                   "test_loss_change_ci_high": -0.16, "verdict": "better"})
    ids["r2"] = _make_run(client, exp, "lr=2e-04 wd=0.01", lr=2e-4, wd=0.01, val=(0.25, 0.2, 0.21),
                          usage=((9, 30), (11, 33), (11, 35)), tags={"codebook_bits": "4+4"})
    ids["failed"] = _make_run(client, exp, "failed one", lr=5e-3, status="FAILED")
    ids["running"] = _make_run(client, exp, "still running", lr=1e-4, status="RUNNING")
    parent = _make_run(client, exp, "sweep s1", tags={"sweep.role": "parent", "optuna.study_name": "s1"}, best=0.22)
    ids["parent"] = parent
    for n, (val, state, status) in enumerate([((0.3, 0.22), "COMPLETE", "FINISHED"),
                                             ((0.4, 0.35), "COMPLETE", "FINISHED"),
                                             ((0.9,), "PRUNED", "KILLED")]):
        tags = {"mlflow.parentRunId": parent, "optuna.study_name": "s1", "optuna.trial_number": str(n),
                "optuna.trial_state": state}
        ids[f"t{n}"] = _make_run(client, exp, f"trial-{n}", lr=1e-3 / (n + 1), epochs=2, val=val,
                                 best=None if state == "PRUNED" else min(val), status=status, tags=tags)
    ids["elsewhere"] = _make_run(client, other, "other run", lr=1e-3, val=(0.1,))
    return uri, client, exp, other, ids


def test_table_sorted_by_best_val_loss_missing_last(store, capsys):
    uri, _, _, _, ids = store
    rc, out, err = _cli(capsys, "--experiment", "exp-a", "--tracking-uri", uri)
    assert rc == 0, err
    lines = out.strip().splitlines()
    header = lines[0].split()
    assert header[:13] == ["name", "learning_rate", "weight_decay", "epochs", "best_val_loss", "test_loss",
                           "base_loss", "change", "verdict", "codes_s1", "codes_full", "duration", "status"]
    assert "trial" in header and header[-1] == "run_id"
    order = [line.split()[-1] for line in lines[2:]]
    # 0.2 < 0.22 < 0.3 < 0.35; then no best_val_loss, newest first; the sweep parent is left out
    assert order == [ids["r2"], ids["t0"], ids["r1"], ids["t1"], ids["t2"], ids["running"], ids["failed"]]
    assert ids["parent"] not in out and ids["elsewhere"] not in out
    assert "1 sweep parent run not listed" in err
    r1 = next(line for line in lines if ids["r1"] in line)
    # usage at the best epoch (step 1), not the last one; epochs done = planned
    assert "12/16" in r1 and " 50 " in r1 and "1.00e-03" in r1 and "0.300000" in r1 and "FINISHED" in r1
    # the test verdict: the best checkpoint's loss, the starting weights', the change and its interval
    assert "0.012300" in r1 and "0.015000" in r1 and "-18% [-20%, -16%]" in r1 and " better " in r1
    r2 = next(line for line in lines if ids["r2"] in line)
    assert " - " in r2 and "better" not in r2  # no verdict recorded: dashes
    pruned = next(line for line in lines if ids["t2"] in line)
    assert "1/2" in pruned and "#2 PRUNED" in pruned and "KILLED" in pruned


def test_top_and_json(store, capsys):
    uri, _, exp, _, ids = store
    rc, out, _ = _cli(capsys, "--experiment", "exp-a", "--tracking-uri", uri, "--top", "2", "--json")
    assert rc == 0
    data = json.loads(out)
    assert [r["run_id"] for r in data["runs"]] == [ids["r2"], ids["t0"]]
    first = data["runs"][0]
    assert first["learning_rate"] == pytest.approx(2e-4) and first["best_val_loss"] == pytest.approx(0.2)
    assert first["best_epoch"] == 1 and first["codebook_usage_s1"] == 11 and first["epochs_done"] == 3
    assert data["experiment_ids"] == [exp]
    assert data["compare_url"].startswith("http://127.0.0.1:5000/#/compare-runs?")


def test_parent_lists_the_sweep_trials(store, capsys):
    uri, _, _, _, ids = store
    rc, out, _ = _cli(capsys, "--parent", ids["parent"], "--tracking-uri", uri)  # experiment: the parent's
    assert rc == 0
    order = [line.split()[-1] for line in out.strip().splitlines()[2:]]
    assert order == [ids["t0"], ids["t1"], ids["t2"]]
    assert "#0 COMPLETE" in out and "#1 COMPLETE" in out and "#2 PRUNED" in out


def test_url_for_a_local_store(store, capsys):
    uri, _, exp, _, ids = store
    rc, out, err = _cli(capsys, "--experiment", "exp-a", "--tracking-uri", uri, "--top", "3", "--url")
    assert rc == 0
    *table, url = out.strip().splitlines()  # the table, then the address
    assert table[0].startswith("name ") and len(table) == 2 + 3
    base, _, query = url.partition("/#/compare-runs?")
    assert base == "http://127.0.0.1:5000"
    params = urllib.parse.parse_qs(query)
    assert json.loads(params["runs"][0]) == [ids["r2"], ids["t0"], ids["r1"]]
    assert json.loads(params["experiments"][0]) == [exp]
    assert "[" not in query and '"' not in query  # url-encoded
    assert "mlflow ui --backend-store-uri" in err


def test_url_for_a_server_drops_credentials_and_keeps_the_path():
    url = compare.compare_url("https://bob:secret@mlflow.example.com:8443/tracking/", ["a1", "b2"], ["3"])
    assert url == ("https://mlflow.example.com:8443/tracking/#/compare-runs?runs=%5B%22a1%22%2C%22b2%22%5D"
                   "&experiments=%5B%223%22%5D")
    assert compare.compare_url("http://127.0.0.1:5055", ["x"], ["1"]).startswith("http://127.0.0.1:5055/#/compare-runs?")


def test_experiment_from_the_environment_and_by_id(store, capsys, monkeypatch):
    uri, _, _, other, ids = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "other")
    rc, out, _ = _cli(capsys)
    assert rc == 0 and ids["elsewhere"] in out and ids["r1"] not in out
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    rc, out, _ = _cli(capsys, "--experiment", other)  # an id works too
    assert rc == 0 and ids["elsewhere"] in out


def test_an_empty_experiment_is_not_an_error(store, capsys):
    uri, client, _, _, _ = store
    client.create_experiment("empty")
    rc, out, err = _cli(capsys, "--experiment", "empty", "--tracking-uri", uri)
    assert rc == 0 and out == "" and "no runs" in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--experiment", "nope"], "experiment 'nope' does not exist"),
        (["--parent", "0123456789abcdef0123456789abcdef"], "0123456789abcdef0123456789abcdef"),
        (["--parent", "x' OR '1'='1"], "is not a run id"),
        (["--top", "0"], "--top"),
        (["--top", "many"], "'many' is not a whole number"),
        (["--tracking-uri", "sqlite:////no/such/dir/mlflow.db"], "/no/such/dir/mlflow.db"),
        (["--tracking-uri", "http://127.0.0.1:9"], "127.0.0.1:9"),
        (["--tracking-uri", "/no/such/mlruns"], "/no/such/mlruns"),
    ],
)
def test_bad_input_is_one_line_exit_2(store, capsys, args, needle):
    uri = store[0]
    if "--tracking-uri" not in args:
        args = [*args, "--tracking-uri", uri]
    rc, out, err = _cli(capsys, *args)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("kronos-mlflow compare: error:"), err
    assert "Traceback" not in err


def test_the_command_line_entry_point(store, commands):
    """``python -m kronos_mlflow compare`` as a real process, and through the fork server (which
    must show the same); a missing experiment is one line and exit code 2."""
    uri, _, _, _, ids = store
    argv = [sys.executable, "-m", "kronos_mlflow", "compare", "--tracking-uri", uri, "--experiment", "exp-a",
            "--top", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ids["r2"] in proc.stdout
    forked = commands.run(argv)
    assert (forked.returncode, forked.stdout, forked.stderr) == (proc.returncode, proc.stdout, proc.stderr)
    proc = commands.run([sys.executable, "-m", "kronos_mlflow", "compare", "--tracking-uri", uri,
                         "--experiment", "missing"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_the_fork_server_runs_the_package_as_the_interpreter_does():
    """``python -m kronos_mlflow ...`` in the fork server: the function kronos_mlflow/__main__.py
    calls, with ``sys.argv[0]`` the path the interpreter gives a ``-m`` run (that file's)."""
    import importlib.util

    from commands import entry_of

    main_py = importlib.util.find_spec("kronos_mlflow.__main__").origin
    assert "from .cli.main import main" in open(main_py, encoding="utf-8").read()
    assert entry_of([sys.executable, "-m", "kronos_mlflow", "compare", "--top", "1"]) == (
        "kronos_mlflow.cli.main:main", [main_py, "compare", "--top", "1"])


# ----------------------------------------------------------------------------- a real tiny training


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One TINY training in this process (sqlite store), two epochs, learning rate 1e-3."""
    from kronos_mlflow.training import run as train

    tmp = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp)
        uri = sqlite_uri(tmp)
        try:
            result = train.main(tiny_config(tmp, learning_rate=1e-3, experiment_name="tiny"))
        finally:
            import mlflow

            # log_best_model sets MLflow's process-global tracking URI: do not leak it into later tests
            mlflow.set_tracking_uri(None)
    return tmp, uri, result


def test_a_real_run_records_quality_metrics_tags_and_plots(trained):
    from mlflow import MlflowClient

    from kronos_mlflow.evaluation.quality import METRIC_NAMES
    from kronos_mlflow.training.tags import git_commit

    tmp, uri, result = trained
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    rid = run.info.run_id
    for name in METRIC_NAMES:
        history = client.get_metric_history(rid, name)
        assert sorted(m.step for m in history) == [0, 1], name
    usage = {m.step: m.value for m in client.get_metric_history(rid, "val_codebook_usage_s1")}
    assert all(1 <= v <= 16 for v in usage.values())
    best = result["best_epoch"]
    assert result["best_val_quality"]["val_codebook_usage_s1"] == usage[best]
    tags = run.data.tags
    assert tags["instrument"] == "csi300" and tags["codebook_bits"] == "4+4"
    assert int(tags["model_size"]) > 1000 and tags["data_digest"]
    if git_commit():
        assert tags["mlflow.source.git.commit"] == git_commit()
    assert sorted(a.path for a in client.list_artifacts(rid, "plots")) == ["plots/reconstruction.png",
                                                                           "plots/token_usage.png"]
    summary = json.loads((run_dir(tmp / "outputs") / "summary.json").read_text())
    assert summary["final_result"]["best_val_quality"]["val_codebook_usage_s1"] == usage[best]


def test_compare_shows_the_real_run(trained, capsys):
    _, uri, result = trained
    rc, out, err = _cli(capsys, "--experiment", "tiny", "--tracking-uri", uri)
    assert rc == 0, err
    print(out)
    line = out.strip().splitlines()[2]
    assert line.startswith("tokenizer lr=1e-03 wd=0.1 ") and "1.00e-03" in line and f"{result['best_val_loss']:.6f}" in line
    assert "/16" in line and "FINISHED" in line


def test_runs_are_grouped_by_stage_and_each_group_ranked_by_its_own_number(tmp_path, capsys):
    """Tokenizer and predictor fine-tunes, evaluations and a pipeline parent in one experiment:
    one table per group, each ranked by its own number, showing only the columns that apply."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("mixed")
    ids = {}
    for name, best in (("tok-a", 0.15), ("tok-b", 0.12)):
        ids[name] = _make_run(client, exp, name, lr=1e-3, val=(0.2, best), usage=((9, 30), (11, 33)),
                              tags={"codebook_bits": "4+4"})
        client.log_param(ids[name], "stage", "tokenizer")
    for name, best in (("pred-a", 6.42), ("pred-b", 6.30), ("pred-c", 6.90)):
        ids[name] = _make_run(client, exp, name, lr=4e-5, best=best)
        client.log_param(ids[name], "stage", "predictor")
        for epoch, value in enumerate((best + 0.5, best, best + 0.1)):
            client.log_metric(ids[name], "val_predictor_loss_epoch", value, step=epoch)
        client.log_metric(ids[name], "test_predictor_loss", best + 0.2)
        client.log_metric(ids[name], "base_test_predictor_loss", best + 0.4)
    for name, skill in (("eval-a", 0.01), ("eval-b", 0.05)):
        ids[name] = _make_run(client, exp, name)
        for key, value in (("model", f"runs:/{name}/forecaster"), ("zeroshot_predictor", ""), ("epochs", "30"),
                           ("learning_rate", "4e-05"), ("stage", "predictor")):
            client.log_param(ids[name], key, value)
        client.log_metric(ids[name], "skill_vs_zeroshot", skill)
    ids["parent"] = _make_run(client, exp, "pipeline", tags={"pipeline.role": "parent"})

    rc, out, err = _cli(capsys, "--experiment", "mixed", "--tracking-uri", uri, "--top", "2")
    assert rc == 0, err
    blocks = [block.splitlines() for block in out.strip().split("\n\n")]
    assert [b[0] for b in blocks] == ["tokenizer runs (2), best first by best_val_loss:",
                                      "predictor runs (2), best first by best_val_loss:",
                                      "evaluation runs (2), best first by skill_vs_zeroshot:",
                                      "parent runs (1), newest first:"]
    order = [[line.split()[-1] for line in b[3:]] for b in blocks]
    assert order == [[ids["tok-b"], ids["tok-a"]], [ids["pred-b"], ids["pred-a"]],  # --top: per group
                     [ids["eval-b"], ids["eval-a"]], [ids["parent"]]]
    tok, pred, evaluation, parent = (b[1].split() for b in blocks)
    assert "codes_s1" in tok and "codes_s1" not in pred and "best_val_loss" in pred
    assert evaluation == ["name", "model", "skill_vs_zeroshot", "duration", "status", "run_id"]  # no epochs 30
    assert "learning_rate" not in parent and "epochs" not in parent
    assert "runs:/eval-b/forecaster" in out
    rc, out, _ = _cli(capsys, "--experiment", "mixed", "--tracking-uri", uri, "--json")
    runs = json.loads(out)["runs"]
    assert [r["group"] for r in runs] == ["tokenizer"] * 2 + ["predictor"] * 3 + ["evaluation"] * 2 + ["parent"]
    # a predictor row reads its own stage's validation history and held-out loss
    pred_b = next(r for r in runs if r["run_id"] == ids["pred-b"])
    assert (pred_b["epochs_done"], pred_b["best_epoch"]) == (3, 1)
    assert (pred_b["test_loss"], pred_b["base_test_loss"]) == (pytest.approx(6.5), pytest.approx(6.7))
    assert all(r["test_loss"] is None and r["epochs_done"] is None for r in runs if r["group"] == "evaluation")
