"""Serving the registered champion with MLflow's real scoring server (slow: about a minute).

The shared ``mlflow run .`` (tests/shared_runs.py) registered its best model; the test gives
version 1 the ``champion`` alias (as a sweep does), starts ``mlflow models serve -m
models:/<name>@champion --env-manager local`` on a free 127.0.0.1 port, posts real demo-market windows to ``/invocations`` and checks the answer
against ``KronosTokenizer`` run on the same windows with the same normalisation. A request of
the wrong shape gets a 400 whose last line is the model's one-line message; a shorter window is accepted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from servers import post_json, serve_on_free_port, stop_process_group
from shared_runs import REGISTERED_MODEL
from tiny_runs import isolated_env, run_dir

pytestmark = pytest.mark.slow
MODEL = REGISTERED_MODEL


def _serve(tmp_path: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """``mlflow models serve`` on a free local port."""
    return serve_on_free_port(
        lambda port: [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{MODEL}@champion",
                      "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        "/ping", tmp_path, "mlflow models serve", env)


def _expected(checkpoint: Path, x: np.ndarray, lookback: int, clip: float) -> dict[str, np.ndarray]:
    """KronosTokenizer on the raw windows, normalised as training does (lookback mean/std, clip)."""
    import torch

    from kronos_mlflow.config.features import NORM_EPS, normalize_windows
    from kronos_mlflow.model import KronosTokenizer

    model = KronosTokenizer.from_pretrained(str(checkpoint)).eval()
    past = x[:, :lookback, :]
    mean, std = past.mean(axis=1, keepdims=True), past.std(axis=1, keepdims=True)
    with torch.no_grad():
        t = torch.from_numpy(normalize_windows(x, lookback, clip))
        s1, s2 = model.encode(t, half=True)
        full = model.encode(t)
        recon = model.decode(full).numpy() * (std + NORM_EPS) + mean
    return {"reconstruction": recon, "tokens": full.numpy(), "s1_tokens": s1.numpy(), "s2_tokens": s2.numpy()}


def test_champion_served_over_rest_matches_the_tokenizer(user_run, tmp_path, monkeypatch):
    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.serving.model_logging import example_windows

    # the shared run (tests/shared_runs.py) registered its best model as version 1
    client = user_run.client()
    client.set_registered_model_alias(MODEL, "champion", "1")
    env = isolated_env(tmp_path, user_run.uri)

    monkeypatch.setenv("KRONOS_MLFLOW_HOME", user_run.env["KRONOS_MLFLOW_HOME"])  # its demo market, read only
    config = load_config(path=str(user_run.config))
    x = example_windows(config, n=3)  # real windows of the demo market's validation split
    assert x.shape == (3, config["lookback_window"] + config["predict_window"] + 1, 6)
    checkpoint = run_dir(user_run.save_path, config["tokenizer_save_folder_name"]) / "checkpoints" / "best_model"
    expected = _expected(checkpoint, x, config["lookback_window"], config["clip"])

    # `mlflow models serve` starts uvicorn by name: the environment's bin/ must be on PATH
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc, base = _serve(tmp_path, env)
    try:
        status, body = post_json(f"{base}/invocations", {"inputs": x.tolist()})
        assert status == 200, body
        got = body["predictions"]
        assert sorted(got) == ["reconstruction", "s1_tokens", "s2_tokens", "tokens"]
        for key in ("tokens", "s1_tokens", "s2_tokens"):
            assert np.array_equal(np.asarray(got[key]), expected[key]), key
        np.testing.assert_allclose(np.asarray(got["reconstruction"], dtype=np.float32), expected["reconstruction"],
                                   rtol=1e-4, atol=1e-4)

        # the request of docs/serving.md: the model's own serving example, downloaded through the alias
        (tmp_path / "example").mkdir()
        download = subprocess.run([sys.executable, "-m", "mlflow", "artifacts", "download", "-u",
                                   f"models:/{MODEL}@champion/serving_input_example.json", "-d", "example"],
                                  cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert download.returncode == 0, download.stderr[-2000:]
        example = tmp_path / "example" / "serving_input_example.json"
        status, body = post_json(f"{base}/invocations", json.loads(example.read_text()))
        assert status == 200, body
        assert np.asarray(body["predictions"]["tokens"]).shape == (2, x.shape[1])

        status, body = post_json(f"{base}/invocations", {"inputs": x[..., :5].tolist()})  # 5 features, not 6
        assert status == 400, body
        assert body["error_code"] == "INVALID_PARAMETER_VALUE"
        # MLflow's scoring server puts the request before the model's own message; that is one short line
        last = body["message"].strip().splitlines()[-1]
        assert len(last) < 300, last
        assert last == ("Error: input of shape (3, 26, 5) is not windows of (B, T, 6) with T >= 2: open, high, "
                        "low, close, vol, amt per step"), last
        # any window length the model supports is accepted
        status, body = post_json(f"{base}/invocations", {"inputs": x[:, :12].tolist()})
        assert status == 200, body
        assert np.asarray(body["predictions"]["tokens"]).shape == (3, 12)
    finally:
        stop_process_group(proc)
