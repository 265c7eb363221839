"""The stage-two doors' up-front checks (kronos_mlflow/training/preflight.py): what they pass is what the
steps accept, ``--check`` makes nothing, and every run a door or its steps end FAILED says why.

The refusals themselves, door by door, are cases of tests/test_hostile_input.py.
"""

from __future__ import annotations

import shlex
import sys

import pytest
from data_helpers import small_config, small_market_path
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tiny_runs import TINY, create_sqlite_store, isolate

NO_ORIGIN = "2021-12-10:2021-12-31"


@pytest.fixture(scope="module")
def signals(tmp_path_factory):
    """The small market's test origins and the scorecard's signal on them, with Qlib's calendar."""
    import pandas as pd

    from kronos_mlflow.data import prepare_splits
    from kronos_mlflow.data.prepare import resolve_qlib_path
    from kronos_mlflow.evaluation.backtest import _init_qlib, _signal_series
    from kronos_mlflow.evaluation.origins import forecast_origins

    config = small_config(small_market_path(), tmp_path_factory.mktemp("cache"))
    prepare_splits(config, progress=False)
    origins = forecast_origins(config)
    _init_qlib(resolve_qlib_path(config))
    from qlib.data import D

    frame = pd.DataFrame({"score": 1.0}, index=origins.index())
    return config, origins, _signal_series("fine-tuned", frame), list(D.calendar(freq="day"))


@settings(max_examples=40, deadline=None)
@example(start=0, days=60, given_range=True)  # before every signal: refused
@example(start=640, days=60, given_range=True)  # over the signals: backtested
@given(start=st.integers(-30, 760), days=st.integers(0, 160), given_range=st.booleans())
def test_the_up_front_backtest_check_refuses_exactly_what_the_backtest_refuses(signals, start, days, given_range):
    """For any backtest range (or none: the test range), the door's check on the origins' dates
    and the provider's calendar file refuses exactly when the backtest itself would, on the
    scorecard's signal and Qlib's calendar, with the same line."""
    import pandas as pd

    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.errors import DataError
    from kronos_mlflow.evaluation.backtest import _time_range, check_signal_days

    config, origins, signal, calendar = signals
    first = pd.Timestamp("2020-01-01") + pd.Timedelta(days=start)
    extra = {"backtest_time_range": f"{first.date()}:{(first + pd.Timedelta(days=days)).date()}"} if given_range else {}
    config = load_config({**config, **extra})
    outcomes = []
    for check in (lambda: check_signal_days(config, origins.dates), lambda: _time_range(config, {"s": signal}, calendar)):
        try:
            check()
            outcomes.append(None)
        except DataError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]


def test_pipeline_check_makes_no_run_and_leaves_the_data_ready(tmp_path, monkeypatch, capsys):
    """``kronos-mlflow pipeline --check`` passes on a good config, creates no tracking store and no
    run, and leaves the prepared splits its steps will read; refused, it leaves no cache."""
    from kronos_mlflow.cli.main import main

    isolate(monkeypatch, tmp_path)
    market = small_market_path()
    (tmp_path / "tiny.yaml").write_text("".join(f"{k}: {v!r}\n" if isinstance(v, str) else f"{k}: {v}\n" for k, v in {
        **TINY, "comet": "off", "dataset_begin_time": "2020-01-01", "dataset_end_time": "2021-12-31",
        "dataset_path": str(tmp_path / "cache"), "save_path": str(tmp_path / "outputs")}.items()))
    argv = ["pipeline", "--check", "--config", str(tmp_path / "tiny.yaml"), "--qlib-data-path", str(market),
            "--instrument", "csi300", "--train-time-range", "2020-01-01:2021-06-30",
            "--val-time-range", "2021-05-01:2021-09-30"]
    assert main([*argv, "--test-time-range", NO_ORIGIN]) == 2
    assert "nothing to score" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()  # the refused check's splits were prepared aside, then removed
    assert main([*argv, "--test-time-range", "2021-09-01:2021-12-31"]) == 0
    assert "check passed" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("kronos-*/manifest.json"))) == 1
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "outputs").exists()


def test_a_check_makes_the_demo_market_only_once_every_check_passed(tmp_path, monkeypatch):
    """Checks on the demo market before it is made read a copy in a scratch folder: a refusal
    after the data was read leaves no demo market and no cache, and names the market's own
    place; checks that pass move the market and the splits prepared from it into place."""
    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.data.prepare import cache_dir_for, demo_market_made
    from kronos_mlflow.errors import UserError
    from kronos_mlflow.training.preflight import DataView

    isolate(monkeypatch, tmp_path)
    home = tmp_path / "home"
    config = load_config({**TINY, "qlib_data_path": "", "dataset_path": str(tmp_path / "cache")})
    with pytest.raises(UserError, match=f"read {home}/demo_market/"), DataView() as data:
        ready = data.config(config)
        raise UserError(f"a later check refused; read {ready['qlib_data_path']}")
    assert not home.exists() and not (tmp_path / "cache").exists()
    with DataView() as data:
        data.config(config)
    assert demo_market_made(config) and (cache_dir_for(config) / "manifest.json").is_file()


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """An isolated process on a migrated sqlite store: ``(client, RUNNING run id)``."""
    from mlflow import MlflowClient

    isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", create_sqlite_store(tmp_path))
    client = MlflowClient()
    return client, client.create_run("0", run_name="mlflow run's").info.run_id


def test_an_evaluation_with_nothing_to_score_ends_its_run_failed_saying_why(store, tmp_path, monkeypatch, capsys):
    """``kronos-mlflow evaluate`` with no test origin, started in a run (``mlflow run -e evaluate``,
    a pipeline's evaluation step): one line, exit 2, the run FAILED with that line as its
    ``failure_reason``, never FINISHED without metrics."""
    import torch

    from kronos_mlflow.cli.main import main
    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import Kronos, KronosTokenizer

    client, run_id = store
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    torch.manual_seed(0)
    KronosTokenizer(**model_kwargs(load_config(TINY))).save_pretrained(tmp_path / "pair" / "tokenizer")
    Kronos(s1_bits=4, s2_bits=4, n_layers=1, d_model=16, n_heads=2, ff_dim=32, ffn_dropout_p=0.0, attn_dropout_p=0.0,
           resid_dropout_p=0.0, token_dropout_p=0.0, learn_te=True).save_pretrained(tmp_path / "pair" / "predictor")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in
             {"qlib_data_path": small_market_path(), "instrument": "csi300", "dataset_begin_time": "2020-01-01",
              "dataset_end_time": "2021-12-31", "test_time_range": NO_ORIGIN, "lookback_window": 20,
              "predict_window": 5, "dataset_path": tmp_path / "cache"}.items()]
    assert main(["evaluate", "--model", str(tmp_path / "pair"), *flags]) == 2
    line = capsys.readouterr().err.strip()
    assert "nothing to score" in line and NO_ORIGIN in line
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == line and not run.data.metrics
    assert not (tmp_path / "cache").exists()


def test_a_step_or_trial_whose_process_left_its_run_running_ends_failed_saying_why(store, tmp_path):
    """A pipeline step's and a sweep trial's process that exits without ending its run (killed,
    out of memory): the parent ends the run FAILED with the exit code as its reason; the
    pipeline's parent holds the failed step's line."""
    from kronos_mlflow.tracking.child_runs import create_child
    from kronos_mlflow.workflows.pipeline import Pipeline, Step, StepFailed
    from kronos_mlflow.workflows.sweep.driver import SweepWorker
    from kronos_mlflow.tracking.project_run import end_run

    client, parent = store
    args = type("Args", (), {"force": False})()
    pipeline = Pipeline(args, client, "0", parent)
    step = Step("evaluation", {"save_path": str(tmp_path)}, [sys.executable, "-c", "raise SystemExit(3)"], "d" * 64, "e" * 64, resume=False)
    with pytest.raises(StepFailed) as failed:
        pipeline.run_step(step)
    child = client.get_run(client.get_run(parent).data.tags["pipeline.evaluation_run_id"])
    assert child.info.status == "FAILED" and "exited with code 3" in child.data.tags["failure_reason"]
    end_run(client, parent, "FAILED", f"kronos-mlflow pipeline: {failed.value}")  # how run() ends its parent
    run = client.get_run(parent)
    assert run.info.status == "FAILED" and "step evaluation ended FAILED" in run.data.tags["failure_reason"]

    trial = create_child(client, "0", parent, "trial-0")
    worker = SweepWorker(type("Args", (), {})(), [], None, None, None, client, "0", parent)
    worker._end(trial, "FAILED", "FAIL", reason=f"trial 0: training exited with code -9 ({shlex.join(['python'])} ...)")
    run = client.get_run(trial)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"].startswith("trial 0: training exited")


def test_train_check_warns_of_a_split_with_no_windows_each_time(tmp_path, commands):
    """``kronos-mlflow train --check`` with a test range the market holds no bar of: the check
    passes (the run trains, without a test verdict) and says so in one warning, when it prepares
    the splits and again once they are cached."""
    import tiny_runs

    values = {**TINY, "qlib_data_path": str(small_market_path()), "instrument": "csi300", "comet": "off",
              "dataset_begin_time": "2020-01-01", "dataset_end_time": "2021-12-31",
              "train_time_range": "2020-01-01:2021-06-30", "val_time_range": "2021-05-01:2021-09-30",
              "test_time_range": "2026-01-01:2026-06-30", "dataset_path": str(tmp_path / "cache"),
              "save_path": str(tmp_path / "outputs")}
    argv = ["kronos-mlflow", "train", "--check", *(w for k, v in values.items() for w in (f"--{k.replace('_', '-')}", v))]
    env = tiny_runs.isolated_env(tmp_path, tiny_runs.create_sqlite_store(tmp_path))  # a copy: no migration
    for _ in range(2):
        proc = commands.run(argv, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        said = [line for line in proc.stderr.splitlines() if "window" in line]
        assert len(said) == 1 and said[0].startswith("[kronos] warning: no test windows: test_time_range "
                                                     "2026-01-01:2026-06-30 with instrument 'csi300'"), said
        assert said[0].endswith("a run's test verdict is unavailable") and "check passed" in proc.stdout
    assert [p.name for p in (tmp_path / "cache").iterdir()]  # the splits, cached by the first check
