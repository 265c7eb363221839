"""``predictor_objective: tokens+return`` (docs/objectives.md#training-the-head-with-the-predictor):
the return head trains with the predictor in every fine-tune mode, its file sits beside a backbone
upstream's class loads, its loss is logged, ``objective: val_ic`` scores its signal, and the
training state a resumed run reads holds it.

One tiny run through what users type (``python -m kronos_mlflow.train_predictor``); the modes and
the training state in process (one optimizer step each).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY, isolated_env, tiny_values

PREDICTOR_SIZES = {"s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 16, "n_heads": 2, "ff_dim": 32,
                   "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "token_dropout_p": 0.0,
                   "learn_te": True}


def _config(**changes):
    from kronos_mlflow.config.core import validate

    return validate({**TINY, "stage": "predictor", "n_layers": 2, "predictor_objective": "tokens+return", **changes})


def _pair(seed: int = 1):
    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.model import Kronos, KronosTokenizer

    torch.manual_seed(seed)
    tokenizer = KronosTokenizer(**model_kwargs({k: TINY[k] for k in ("d_model", "n_heads", "ff_dim", "n_enc_layers",
                                                                    "n_dec_layers", "s1_bits", "s2_bits")}))
    return tokenizer, Kronos(**PREDICTOR_SIZES)


def _batch(n: int = 8, seed: int = 2):
    from kronos_mlflow.config.features import normalize_windows

    g = torch.Generator().manual_seed(seed)
    window = TINY["lookback_window"] + TINY["predict_window"] + 1
    close = 10 * torch.exp(torch.cumsum(torch.randn(n, window, generator=g) * 0.02, dim=1))
    bars = torch.stack([close, close * 1.01, close * 0.99, close, close * 100, close * 1000], dim=-1)
    return normalize_windows(bars, TINY["lookback_window"], 5.0), torch.zeros(n, window, 5, dtype=torch.long)


@pytest.mark.parametrize("mode", ["full", "lora", "freeze"])
def test_every_mode_trains_the_head_beside_what_it_trains(mode):
    """The head is attached after the mode's own changes, so it trains in each: in the optimizer,
    moved by one step; what the mode freezes stays as it was; the step's parts hold the return loss."""
    from kronos_mlflow.model import finetune
    from kronos_mlflow.model.return_head import head_of
    from kronos_mlflow.stages import get
    from kronos_mlflow.stages.predictor.training import PredictorStage
    from kronos_mlflow.training.loop import train_step
    from kronos_mlflow.training.optim import build_optimizer

    config = _config(finetune_mode=mode, freeze_layers=1, lora_rank=2, predictor_learning_rate=1e-2)
    tokenizer, model = _pair()
    model = finetune.apply(model, config, get("predictor"))
    head = head_of(model)
    assert head is not None and all(p.requires_grad for p in head.parameters())
    optimizer = build_optimizer(model, config)
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert all(id(p) in in_optimizer for p in head.parameters())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    x, stamp = _batch()
    loss, parts = train_step(model.train(), optimizer, x, config, "fp32", stage=PredictorStage(tokenizer, config),
                             batch_stamp=stamp)
    assert math.isfinite(float(loss)) and 0.0 <= float(parts["return"]) <= 2.0
    for name, p in model.named_parameters():
        moved = not torch.equal(before[name], p.detach())
        if name.startswith("return_head."):
            assert moved, name  # the head always trains
        elif not p.requires_grad:
            assert not moved, name  # what the mode freezes stays
    assert head.tap.context is None  # read and let go: no graph kept between steps


def test_the_training_state_holds_the_head_and_a_resume_restores_it(tmp_path):
    """A LoRA run's state keeps only what trains: its adapters and its head; loading it into a
    model built afresh (another seed) gives the head back bit for bit."""
    from kronos_mlflow.model import finetune
    from kronos_mlflow.model.return_head import head_of
    from kronos_mlflow.stages import get
    from kronos_mlflow.training import checkpoint
    from kronos_mlflow.training.optim import build_optimizer

    config = _config(finetune_mode="lora", lora_rank=2)
    _, model = _pair()
    model = finetune.apply(model, config, get("predictor"))
    with torch.no_grad():
        for p in head_of(model).parameters():
            p.add_(0.5)  # as if trained
    optimizer = build_optimizer(model, config)
    checkpoint.save_training_state(tmp_path / "last", model=model, optimizer=optimizer, scheduler=None, epoch=0,
                                   global_step=3, best_val_loss=1.0, run_ids={}, config_digest="x", config=config,
                                   extra={}, rng_states=checkpoint.gather_rng_states(), trained_only=True)
    torch.manual_seed(7)
    _, fresh = _pair(seed=9)
    fresh = finetune.apply(fresh, {**config, "seed": 5}, get("predictor"))
    checkpoint.load_training_state(tmp_path / "last", model=fresh, optimizer=build_optimizer(fresh, config),
                                   scheduler=None, map_location="cpu", rank=0, trained_only=True)
    for (name, a), b in zip(head_of(model).state_dict().items(), head_of(fresh).state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_default_objective_attaches_nothing():
    """``predictor_objective: tokens``: no head, no hook; the model a run trains is upstream's."""
    from kronos_mlflow.model import finetune
    from kronos_mlflow.stages import get

    _, model = _pair()
    model = finetune.apply(model, _config(predictor_objective="tokens"), get("predictor"))
    assert not hasattr(model, "return_head") and not model.norm._forward_hooks


def test_train_predictor_with_tokens_return_saves_the_head_beside_an_upstream_backbone(tmp_path, commands):
    """``python -m kronos_mlflow.train_predictor --predictor-objective tokens+return --objective val_ic``:
    return_head.safetensors beside best_model, whose own files hold no head tensor and load
    strictly in upstream's class; the return loss logged per step and per epoch, finite; the
    validation IC of the head's signal, as its tag says."""
    import safetensors.torch
    from mlflow import MlflowClient

    from kronos_mlflow.model import Kronos
    from kronos_mlflow.model.return_head import HEAD_FILE, load_head

    values = tiny_values(tmp_path, n_layers=2, evaluate="off", calibration="off", pretrained_tokenizer_path="fresh",
                         pretrained_predictor_path="fresh", predictor_learning_rate=1e-3, n_val_skill_windows=100)
    flags = [a for k, v in values.items() if v != "" for a in (f"--{k.replace('_', '-')}", str(v))]
    env = isolated_env(tmp_path)
    proc = commands.run([sys.executable, "-m", "kronos_mlflow.train_predictor", *flags, "--predictor-objective",
                         "tokens+return", "--return-loss-weight", "2", "--objective", "val_ic"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "and the return head (1,153)" in proc.stdout + proc.stderr
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs(["0"])
    best = Path(run.data.tags["run_directory"]) / "checkpoints" / "best_model"
    assert (best / HEAD_FILE).is_file()
    assert not [k for k in safetensors.torch.load_file(best / "model.safetensors") if "return_head" in k]
    Kronos.from_pretrained(best)  # strict: upstream's tensors, nothing more
    head, window = load_head(best)
    assert window == {"lookback": TINY["lookback_window"], "horizon": TINY["predict_window"]} and head.d_model == 16
    assert run.data.params["predictor_objective"] == "tokens+return" and run.data.params["return_loss_weight"] == "2.0"
    per_epoch = [m.value for m in client.get_metric_history(run.info.run_id, "val_return_loss")]
    per_step = [m.value for m in client.get_metric_history(run.info.run_id, "train_return_loss_each_batch")]
    assert len(per_epoch) == TINY["epochs"] and all(0.0 <= v <= 2.0 for v in per_epoch + per_step)
    assert run.data.tags["val_ic_signal"] == "return_head" and "val_rank_ic" in run.data.metrics
