"""The held-out verdict's pieces: which windows, the paired bootstrap and the rule, the record
and its console line, the tokenizer's per-window losses (over two gloo ranks: in
tests/test_quality.py), the sweep's champion rule on a real MLflow store, and
``evaluate-tokenizer``'s bad input.

The end-to-end runs (``mlflow run .`` from a pretrained checkpoint, an empty test split, sweeps
that move the champion only on ``better``) are in tests/test_verdict_runs.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import small_config, small_market_path
from tiny_runs import TINY

from kronos_mlflow.stages.tokenizer.heldout import METRIC_NAMES, score
from kronos_mlflow.evaluation.verdict import HeldOut, decide, judge, paired_bootstrap, percent
from kronos_mlflow.evaluation.windows import evenly_spaced, heldout_windows, window_limit

# The names the issue and docs/run-records.md fix for a tokenizer run's verdict.
RUN_METRICS = {
    *(f"{p}test_{m}" for p in ("", "base_") for m in (
        "tokenizer_loss", "recon_loss_pre", "mse_open", "mse_high", "mse_low", "mse_close", "mse_vol", "mse_amt",
        "codebook_usage_full", "codebook_perplexity_full", "windows")),
    "test_loss_change", "test_loss_change_ci_low", "test_loss_change_ci_high",
}


def _config(tmp_path, **extra):
    sizes = {k: TINY[k] for k in ("d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits",
                                  "s2_bits", "batch_size")}
    return small_config(small_market_path(), tmp_path / "ds", **{**sizes, **extra})


def _model(seed=0):
    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(seed)
    return KronosTokenizer(**model_kwargs(load_config({k: TINY[k] for k in (
        "d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits", "s2_bits")}))).eval()


def _all_starts(split_dir: Path, split: str, window: int) -> np.ndarray:
    """Every window's first row, in (series, start) order, from the split's series offsets."""
    offsets = np.load(split_dir / f"{split}_offsets.npy")
    return np.concatenate([np.arange(a, b - window + 1) for a, b in zip(offsets[:-1], offsets[1:]) if b - a >= window]
                          or [np.empty(0, dtype=np.int64)])


# ----------------------------------------------------------------------------- which windows


def test_every_window_or_an_evenly_spaced_subset():
    assert evenly_spaced(5, 10).tolist() == [0, 1, 2, 3, 4]
    assert evenly_spaced(7, 7).tolist() == list(range(7))
    assert evenly_spaced(10, 4).tolist() == [0, 2, 5, 7]  # floor(i * 10 / 4)
    picked = evenly_spaced(100_003, 2000)
    assert len(picked) == 2000 and picked[0] == 0 and np.all(np.diff(picked) > 0) and picked[-1] < 100_003
    assert set(np.diff(picked)) <= {50, 51}  # evenly spaced
    assert evenly_spaced(0, 5).size == 0
    with pytest.raises(ValueError):
        evenly_spaced(10, 0)


def test_the_windows_depend_on_the_data_and_config_never_the_seed(tmp_path):
    a = heldout_windows(_config(tmp_path, seed=1, n_val_iter=30), "test")
    b = heldout_windows(_config(tmp_path, seed=2, n_val_iter=30), "test")
    assert len(a) == 30 and a.available > 30  # n_test_iter 0: as many as n_val_iter
    assert np.array_equal(a.start_rows, b.start_rows) and a.digest == b.digest
    # the evenly spaced subset of every window of the test split, in (series, start) order
    starts = _all_starts(Path(a.x.filename).parent, "test", a.window)
    assert len(starts) == a.available
    assert np.array_equal(a.start_rows, starts[(np.arange(30) * len(starts)) // 30])
    c = heldout_windows(_config(tmp_path, n_val_iter=30, n_test_iter=12), "test")
    assert len(c) == 12 and c.digest != a.digest
    every = heldout_windows(_config(tmp_path, n_test_iter=10**6), "test")
    assert np.array_equal(every.start_rows, starts)
    assert window_limit({"n_test_iter": 0, "n_val_iter": 36}) == 36
    assert window_limit({"n_test_iter": 5, "n_val_iter": 36}) == 5


def test_windows_are_normalised_as_training_normalises_them(tmp_path):
    windows = heldout_windows(_config(tmp_path, n_test_iter=9), "test")
    x, stamp = windows.batch(np.arange(len(windows)))
    assert x.shape == (9, 26, 6) and stamp.shape == (9, 26, 5)
    raw = np.stack([np.asarray(windows.x[s:s + 26], dtype=np.float64) for s in windows.start_rows])
    mean, std = raw[:, :20].mean(axis=1, keepdims=True), raw[:, :20].std(axis=1, keepdims=True)
    expected = np.clip((raw - mean) / (std + 1e-5), -5.0, 5.0)
    assert np.allclose(x.numpy(), expected, atol=1e-4)  # float32 arithmetic, as training


# ----------------------------------------------------------------------------- the interval and the rule


def test_the_paired_bootstrap_is_fixed_and_paired():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 1.5, 400)  # windows differ a lot from each other ...
    model = base * 0.9 + rng.normal(0, 0.002, 400)  # ... but the model is 10% better on each
    change, low, high = paired_bootstrap(model, base)
    assert paired_bootstrap(model, base) == (change, low, high)  # a fixed seed: the same interval
    assert low < change < high and change == pytest.approx(-0.1, abs=0.002)
    assert high - low < 0.005  # pairing cancels what the windows share
    assert decide(low, high, 0.005) == "better"
    change, low, high = paired_bootstrap(base, model)
    assert decide(low, high, 0.005) == "worse"
    assert paired_bootstrap(base, base) == (0.0, 0.0, 0.0)
    assert decide(0.0, 0.0, 0.005) == "inconclusive"
    noise = base + rng.normal(0, 0.05, 400)  # no change, only noise
    assert decide(*paired_bootstrap(noise, base)[1:], 0.005) == "inconclusive"
    with pytest.raises(ValueError, match="pair up"):
        paired_bootstrap(base[:3], base)


def test_a_change_too_small_to_matter_is_never_better():
    base = np.linspace(1.0, 2.0, 1000)
    model = base * 0.997  # 0.3% better on every window: certain, but below the 0.5% margin
    change, low, high = paired_bootstrap(model, base)
    assert high < 0 and decide(low, high, 0.005) == "inconclusive"
    assert decide(low, high, 0.001) == "better"
    assert judge(model[:1], base[:1], {}, {}, min_change=0.0, base_label="fresh").verdict == "inconclusive"


def test_the_record_reads_as_documented():
    result = HeldOut("better", base_label="./Kronos-Tokenizer-base", windows=2000,
                     metrics={"tokenizer_loss": 0.0123, "windows": 2000.0},
                     base_metrics={"tokenizer_loss": 0.0150, "windows": 2000.0},
                     change=-0.18, ci_low=-0.20, ci_high=-0.16)
    assert result.line() == ("test, 2,000 windows: 0.0123 vs starting weights 0.0150: -18% (95% CI -20% .. -16%): "
                             "better")
    assert result.tags() == {"verdict": "better", "verdict_base": "./Kronos-Tokenizer-base"}
    assert result.run_metrics() == {"test_tokenizer_loss": 0.0123, "test_windows": 2000.0,
                                    "base_test_tokenizer_loss": 0.0150, "base_test_windows": 2000.0,
                                    "test_loss_change": -0.18, "test_loss_change_ci_low": -0.20,
                                    "test_loss_change_ci_high": -0.16}
    assert HeldOut(**json.loads(json.dumps(result.as_json()))).run_metrics() == result.run_metrics()
    assert [percent(v) for v in (-0.18, -0.023, 0.0041, 0.0, -1e-9)] == ["-18%", "-2.3%", "+0.41%", "0.00%", "0.00%"]
    empty = judge([], [], {}, {}, min_change=0.005, base_label="fresh")
    assert empty.verdict == "unavailable" and empty.run_metrics() == {}


def test_a_verdict_against_fresh_weights_says_so_in_its_lines():
    """A run that started fresh is judged against random weights: its lines say ``fresh weights``,
    never ``the start`` or ``starting weights`` (which read as the published model)."""
    from kronos_mlflow.evaluation.next_steps import training_lines

    fresh = HeldOut("better", base_label="fresh", windows=300, metrics={"tokenizer_loss": 0.01},
                    base_metrics={"tokenizer_loss": 0.08}, change=-0.8691, ci_low=-0.88, ci_high=-0.85)
    assert fresh.line() == "test, 300 windows: 0.0100 vs fresh weights 0.0800: -87% (95% CI -88% .. -85%): better"
    assert fresh.tags() == {"verdict": "better", "verdict_base": "fresh"}
    where = {"run_id": "abc", "experiment_id": "0", "tracking_uri": "sqlite:///m.db", "run_directory": Path("/r")}
    (done, *_) = training_lines({"best_val_loss": 0.5, "best_epoch": 0, "test": fresh.as_json()}, **where)
    assert done == "done: run abc: best_val_loss 0.500000 (epoch 1), verdict better (test loss -86.91% against fresh weights)"
    published = HeldOut(**{**fresh.as_json(), "base_label": "NeoQuasar/Kronos-Tokenizer-base"})
    (done, *_) = training_lines({"best_val_loss": 0.5, "best_epoch": 0, "test": published.as_json()}, **where)
    assert done.endswith("verdict better (test loss -86.91% against the start)")
    assert "vs starting weights 0.0800" in published.line()


def test_an_inconclusive_verdict_whose_interval_excludes_zero_says_why():
    close = HeldOut("inconclusive", base_label="./tok", windows=1000, metrics={"tokenizer_loss": 0.9965},
                    base_metrics={"tokenizer_loss": 1.0}, change=-0.0035, ci_low=-0.0036, ci_high=-0.0034)
    assert close.line() == ("test, 1,000 windows: 0.9965 vs starting weights 1.0000: -0.35% (95% CI -0.36% .. -0.34%): "
                            "inconclusive: the whole interval is smaller than verdict_min_change 0.5%")
    part = HeldOut(**{**close.as_json(), "ci_low": -0.008, "ci_high": -0.002})
    assert part.line().endswith("inconclusive: part of the interval is smaller than verdict_min_change 0.5%")
    across = HeldOut(**{**close.as_json(), "ci_low": -0.004, "ci_high": 0.002})
    assert across.line().endswith(": inconclusive")  # the interval holds 0: nothing more to say
    assert HeldOut(**{**close.as_json(), "reason": "one window cannot tell a change from noise"}).line().endswith(
        "inconclusive (one window cannot tell a change from noise)")
    from kronos_mlflow.evaluation.next_steps import training_lines

    (done, *_) = training_lines({"best_val_loss": 0.5, "best_epoch": 0, "test": close.as_json()}, run_id="abc",
                               experiment_id="0", tracking_uri="sqlite:///m.db", run_directory=Path("/r"))
    assert done.endswith("verdict inconclusive (test loss -0.35% against the start: the whole interval is smaller "
                         "than verdict_min_change 0.5%)")


# ----------------------------------------------------------------------------- the tokenizer's losses


def test_the_loss_of_a_window_is_the_validation_loss_of_that_window(tmp_path):
    config = _config(tmp_path, n_test_iter=23, batch_size=5)
    windows = heldout_windows(config, "test")
    model = _model()
    losses, metrics = score(model, windows, "cpu", batch_size=5)
    assert set(metrics) == set(METRIC_NAMES) and metrics["windows"] == 23
    x, _ = windows.batch(np.arange(23))
    with torch.no_grad():
        (_, z), _, _, _ = model(x)
    expected = [torch.nn.functional.mse_loss(z[i], x[i]).item() for i in range(23)]
    assert np.allclose(losses, expected, rtol=1e-6)
    assert metrics["tokenizer_loss"] == pytest.approx(np.mean(expected), rel=1e-6)
    assert np.mean([metrics[f"mse_{f}"] for f in ("open", "high", "low", "close", "vol", "amt")]) == pytest.approx(
        metrics["tokenizer_loss"], rel=1e-5)
    result = judge(losses, losses * 1.1, metrics, metrics, min_change=0.005, base_label="fresh")
    assert set(result.run_metrics()) == RUN_METRICS


# ----------------------------------------------------------------------------- the sweep's champion rule


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A real sqlite MLflow store and a good checkpoint ``ckpt``, made once for the module."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("evaluation-store")
    uri = f"sqlite:///{root}/mlflow.db"
    MlflowClient(uri).search_experiments()
    _model().save_pretrained(root / "ckpt")
    return root, uri


@pytest.fixture()
def champion_store(workspace, tmp_path):
    """A real sqlite MLflow store with a registered model whose alias champion names a run."""
    from mlflow import MlflowClient

    client = MlflowClient(workspace[1])
    champion = client.create_run("0", tags={"verdict": "better", "data_digest": "d1", "test_windows_digest": "w1"})
    client.log_metric(champion.info.run_id, "test_tokenizer_loss", 0.50)
    client.create_registered_model("tok")
    version = client.create_model_version("tok", source=str(tmp_path / "model"), run_id=champion.info.run_id)
    client.set_registered_model_alias("tok", "champion", version.version)

    def trial(verdict="better", loss=0.40, data="d1", windows="w1", model=True):
        run = client.create_run("0", tags={"verdict": verdict, "data_digest": data, "test_windows_digest": windows,
                                           "optuna.trial_number": "3"})
        client.log_metric(run.info.run_id, "test_tokenizer_loss", loss)
        if model:  # the checkpoint where a logged model keeps it (best_model/artifacts/best_model)
            client.log_artifacts(run.info.run_id, str(workspace[0] / "ckpt"), "best_model/artifacts/best_model")
        client.set_terminated(run.info.run_id)  # a trial is judged once its process has ended its run
        return client.get_run(run.info.run_id)

    return client, trial


def test_the_champion_moves_only_for_a_better_trial_that_beats_it(champion_store):
    from kronos_mlflow.workflows.sweep.champion import promotion

    client, trial = champion_store
    assert promotion(client, "tok", trial(), {}).move  # better, and 0.40 < 0.50 on the same windows
    stays = promotion(client, "tok", trial(verdict="inconclusive"), {})
    assert not stays.move and stays.reason.startswith("best trial 3's test verdict is inconclusive, not better")
    stays = promotion(client, "tok", trial(loss=0.55), {})
    assert not stays.move and "0.550000 does not beat the champion's (version 1) 0.500000" in stays.reason
    assert promotion(client, "tok", trial(loss=0.55, data="d2"), {}).move  # other data: the verdict decides
    assert promotion(client, "tok", trial(verdict="worse"), {}, promote="always").move
    assert promotion(client, "no-such-model", trial(), {}).move  # no champion yet
    stays = promotion(client, "tok", trial(model=False), {}, promote="always")  # never a model that is not there
    assert not stays.move and stays.reason.startswith("best trial 3 cannot be the champion: its logged model does not load")


# ----------------------------------------------------------------------------- evaluate-tokenizer's bad input


@pytest.mark.parametrize("argv, needle", [
    (["/nonexistent/ckpt"], "/nonexistent/ckpt"),
    (["runs:/0123456789abcdef/best_model"], "runs:/0123456789abcdef/best_model"),
    (["models:/no-such-model@champion"], "models:/no-such-model@champion"),
    (["NeoQuasar/Kronos-Tokenizer-base"], "NeoQuasar/Kronos-Tokenizer-base"),  # HF_HUB_OFFLINE=1
    (["ckpt", "--split", "train"], "'train'"),
    (["ckpt", "--n-test-iter", "-3"], "n_test_iter"),
    (["ckpt", "--verdict-min-change", "nan"], "verdict_min_change"),
    (["ckpt", "--base", "/nonexistent/base"], "/nonexistent/base"),
])
def test_evaluate_tokenizer_bad_input_is_one_line_and_exit_2(workspace, tmp_path, monkeypatch, capsys,
                                                             argv, needle):
    from kronos_mlflow.cli.main import main

    root, uri = workspace
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    capsys.readouterr()  # (creating the store logs on stderr)
    try:
        rc = main(["evaluate-tokenizer", *argv, "--qlib-data-path", str(small_market_path()), "--lookback-window",
                   "20", "--predict-window", "5", "--dataset-path", str(tmp_path / "ds")])
    except SystemExit as exc:  # argparse's errors
        rc = exc.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("kronos-mlflow evaluate-tokenizer: error: ") and needle in lines[0], lines[0]
    assert not (tmp_path / "ds").exists() or argv[0] == "ckpt"
