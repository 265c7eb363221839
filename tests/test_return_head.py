"""The return head (model/return_head.py): it reads the predictor's context at the origin through
a hook that leaves the predictor's outputs as they were, never sees the horizon it predicts, fits
a ranking with its correlation loss, and keeps its own safetensors file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_runs import TINY

from kronos_mlflow.config.core import model_kwargs
from kronos_mlflow.config.features import normalize_windows
from kronos_mlflow.config.model_spec import PREDICTOR_CONFIGS
from kronos_mlflow.errors import CheckpointError
from kronos_mlflow.model import Kronos, KronosTokenizer
from kronos_mlflow.model.return_head import (HEAD_FILE, ContextTap, ReturnHead, correlation_loss, load_head,
                                             return_target, save_head)

LOOKBACK, HORIZON = 12, 4


def _pair():
    torch.manual_seed(0)
    tokenizer = KronosTokenizer(**model_kwargs(TINY)).eval()
    model = Kronos(**{**PREDICTOR_CONFIGS["Kronos-mini"], "s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 16,
                      "n_heads": 2, "ff_dim": 32})
    return tokenizer, model


def _windows(seed=0, batch=6):
    rng = np.random.default_rng(seed)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (batch, LOOKBACK + HORIZON + 1)), axis=1))
    bars = np.stack([close * 0.99, close * 1.01, close * 0.98, close, rng.lognormal(10, 1, close.shape),
                     rng.lognormal(12, 1, close.shape)], axis=-1).astype(np.float32)
    stamp = torch.zeros(batch, bars.shape[1], 5, dtype=torch.long)
    return bars, stamp


def _signal(tokenizer, model, head, raw, stamp):
    x = torch.from_numpy(normalize_windows(raw, LOOKBACK, 5.0))
    s1, s2 = tokenizer.encode(x, half=True)
    with ContextTap(model) as tap:
        outputs = model(s1[:, :-1], s2[:, :-1], stamp[:, :-1], use_teacher_forcing=True, s1_targets=s1[:, 1:])
    return head(tap.context, LOOKBACK - 1), outputs, x, head(tap.context, LOOKBACK)


def test_the_head_never_sees_the_horizon_it_predicts():
    tokenizer, model = _pair()
    model.train()  # training's mode (its dropout masks drawn alike below: the same seed)
    head = ReturnHead(model.d_model).eval()
    raw, stamp = _windows()
    changed = raw.copy()
    changed[:, LOOKBACK:] *= np.linspace(0.5, 1.8, changed.shape[0])[:, None, None]  # a different future
    with torch.no_grad():
        torch.manual_seed(5)
        a, _, xa, later_a = _signal(tokenizer, model, head, raw, stamp)
        torch.manual_seed(5)
        b, _, xb, later_b = _signal(tokenizer, model, head, changed, stamp)
    assert not torch.equal(return_target(xa, LOOKBACK, HORIZON), return_target(xb, LOOKBACK, HORIZON))
    assert torch.equal(a, b)  # the signal at the origin is the same whatever follows it
    assert not torch.equal(later_a, later_b)  # (a bar later, the changed future shows: the test can tell)


def test_the_tap_leaves_the_predictors_outputs_unchanged():
    tokenizer, model = _pair()
    model.eval()
    raw, stamp = _windows(1)
    x = torch.from_numpy(normalize_windows(raw, LOOKBACK, 5.0))
    s1, s2 = tokenizer.encode(x, half=True)
    with torch.no_grad():
        plain = model(s1[:, :-1], s2[:, :-1], stamp[:, :-1], use_teacher_forcing=True, s1_targets=s1[:, 1:])
        with ContextTap(model) as tap:
            tapped = model(s1[:, :-1], s2[:, :-1], stamp[:, :-1], use_teacher_forcing=True, s1_targets=s1[:, 1:])
        assert torch.equal(tap.context, model.context(s1[:, :-1], s2[:, :-1], stamp[:, :-1]))
    assert all(torch.equal(p, t) for p, t in zip(plain, tapped, strict=True))
    assert not model.norm._forward_hooks  # the hook is gone


def test_the_target_and_the_correlation_loss():
    x = torch.zeros(3, LOOKBACK + HORIZON + 1, 6)
    x[:, LOOKBACK - 1, 3] = torch.tensor([0.0, 1.0, 2.0])
    x[:, LOOKBACK - 1 + HORIZON, 3] = torch.tensor([1.0, 0.0, 4.0])
    assert return_target(x, LOOKBACK, HORIZON).tolist() == [1.0, -1.0, 2.0]
    with pytest.raises(ValueError, match="no bar"):
        return_target(x, LOOKBACK, HORIZON + 5)
    t = torch.tensor([1.0, -1.0, 2.0, 0.5])
    assert float(correlation_loss(3 * t + 1, t)) == pytest.approx(0.0, abs=1e-6)  # scale-free
    assert float(correlation_loss(-t, t)) == pytest.approx(2.0, abs=1e-6)
    flat = torch.ones(4, requires_grad=True)
    loss = correlation_loss(flat, t)
    loss.backward()
    assert float(loss) == 1.0 and torch.equal(flat.grad, torch.zeros(4))


def test_training_the_head_on_the_correlation_loss_finds_a_planted_ranking():
    torch.manual_seed(0)
    head = ReturnHead(8)
    feature = torch.randn(512, 1, 8)
    target = feature[:, 0, 0] * 0.3 + torch.randn(512)  # a correlation of about 0.29
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    for _ in range(150):
        optimizer.zero_grad()
        loss = correlation_loss(head(feature, 0), target)
        loss.backward()
        optimizer.step()
    assert 1 - float(loss) > 0.2


def test_the_head_file_round_trips_and_a_bad_one_is_one_line(tmp_path):
    torch.manual_seed(3)
    head = ReturnHead(16)
    path = save_head(head, tmp_path / "model", lookback=LOOKBACK, horizon=HORIZON)
    assert path.name == HEAD_FILE and path.stat().st_size < 20_000
    again, meta = load_head(tmp_path / "model")
    assert meta == {"lookback": LOOKBACK, "horizon": HORIZON}
    context = torch.randn(2, 5, 16)
    assert torch.equal(again(context, 4), head.eval()(context, 4))
    with pytest.raises(CheckpointError, match="no return head here"):
        load_head(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / HEAD_FILE).write_bytes(b"\x00" * 40)
    with pytest.raises(CheckpointError, match="not a return head") as info:
        load_head(tmp_path / "bad")
    assert "\n" not in str(info.value)
