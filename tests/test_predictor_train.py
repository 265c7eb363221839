"""Stage two on the shared loop: the predictor's training step is upstream's, its validation is
causal (upstream's leaking number one option away), and ``mlflow run . -e predictor`` trains it
end to end on the demo market from the tokenizer run's best model. ``torchrun -m
kronos_mlflow.train_predictor``: tests/test_forecast_eval.py; a killed worker resumed:
tests/test_finetune_modes.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

TOKENIZER_SIZES = {"d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2,
                   "s1_bits": 4, "s2_bits": 4}
PREDICTOR_SIZES = {"s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 16, "n_heads": 2, "ff_dim": 32,
                   "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "token_dropout_p": 0.0,
                   "learn_te": True}


def _tokenizer(seed: int = 0):
    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(seed)
    return KronosTokenizer(**model_kwargs(TOKENIZER_SIZES)).eval()


def _predictor(seed: int = 1, **changes):
    from kronos_mlflow.model import Kronos

    torch.manual_seed(seed)
    return Kronos(**{**PREDICTOR_SIZES, **changes})


def _batch(n: int = 6, length: int = 26, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, 6, generator=g).clamp(-5, 5)
    limits = torch.tensor([60, 24, 7, 32, 13])
    stamp = (torch.rand(n, length, 5, generator=g) * limits).floor()
    return x, stamp


def _upstream_loss(model, tokenizer, x, stamp):
    """train_predictor.py's loss, written from its description (docs/predictor-training.md)."""
    with torch.no_grad():
        s1, s2 = tokenizer.encode(x, half=True)
    logits = model(s1[:, :-1], s2[:, :-1], stamp[:, :-1])
    return model.head.compute_loss(logits[0], logits[1], s1[:, 1:], s2[:, 1:])


def test_training_step_is_upstreams_bit_for_bit(tiny):
    from kronos_mlflow.training.optim import build_optimizer
    from kronos_mlflow.stages.predictor.training import PredictorStage
    from kronos_mlflow.training.loop import train_step

    config = tiny(stage="predictor", adamw_impl="for-loop")
    tokenizer, model = _tokenizer(), _predictor(ffn_dropout_p=0.2, resid_dropout_p=0.2)  # dropout draws too
    ours, theirs = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    x, stamp = _batch()
    opt_ours = build_optimizer(ours, config)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=config["predictor_learning_rate"], betas=(0.9, 0.95),
                                   weight_decay=0.1, foreach=False)
    for step in range(2):
        torch.manual_seed(10 + step)
        loss, parts = train_step(ours, opt_ours, x, config, "fp32", stage=PredictorStage(tokenizer, config),
                                 batch_stamp=stamp)
        torch.manual_seed(10 + step)
        want, ce_s1, ce_s2 = _upstream_loss(theirs, tokenizer, x, stamp)
        want.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm=3.0)
        opt_theirs.step()
        opt_theirs.zero_grad()
        assert torch.equal(loss, want.detach()) and torch.equal(parts["s1"], ce_s1) and torch.equal(parts["s2"], ce_s2)
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(p.grad is None for p in tokenizer.parameters())  # the tokenizer is frozen


def test_validation_is_causal_and_upstreams_number_is_one_option_away(tiny):
    from kronos_mlflow.stages.predictor.training import PredictorStage

    tokenizer, model = _tokenizer(), _predictor()  # no dropout: train mode differs only by the causal mask
    loader = [_batch(seed=s) for s in (3, 4)]

    def upstream_mode(train: bool) -> float:
        model.train(train)
        torch.manual_seed(7)
        with torch.no_grad():
            return sum(_upstream_loss(model, tokenizer, x, stamp)[0].item() for x, stamp in loader) / len(loader)

    results = {}
    for mode in ("causal", "upstream"):
        stage = PredictorStage(tokenizer, tiny(stage="predictor", predictor_validation=mode))
        torch.manual_seed(7)
        results[mode] = stage.run_validation(model, loader, "cpu")
    assert results["causal"].loss == pytest.approx(upstream_mode(True), rel=1e-6)  # what training sees
    assert results["upstream"].loss == pytest.approx(upstream_mode(False), rel=1e-6)  # upstream's eval mode
    assert results["causal"].loss != pytest.approx(results["upstream"].loss, rel=1e-4)
    assert model.dep_layer.cross_attn.causal is None  # the switch is put back
    metrics = results["causal"].metrics
    assert set(metrics) == {"val_s1_accuracy", "val_s2_accuracy", "val_s1_perplexity", "val_s2_perplexity"}
    assert all(0 <= metrics[f"val_{h}_accuracy"] <= 1 and metrics[f"val_{h}_perplexity"] >= 1 for h in ("s1", "s2"))


def test_learning_rate_names_the_stages_own_key(tiny):
    from kronos_mlflow.config.core import load_config, run_params
    from kronos_mlflow.config.layout import RunLayout

    tokenizer_run = load_config({"learning_rate": 1e-3})
    predictor_run = load_config({"stage": "predictor", "learning_rate": 1e-3, "tokenizer": "runs:/abc/best_model"})
    assert tokenizer_run["tokenizer_learning_rate"] == 1e-3 and tokenizer_run["predictor_learning_rate"] == 4e-5
    assert predictor_run["predictor_learning_rate"] == 1e-3 and predictor_run["tokenizer_learning_rate"] == 2e-4
    assert predictor_run["finetuned_tokenizer_path"] == "runs:/abc/best_model"
    params = run_params(predictor_run)
    assert params["learning_rate"] == "0.001" and params["tokenizer"] == "runs:/abc/best_model"
    assert RunLayout.of(predictor_run).root.parent.name == "finetune_predictor_demo"
    assert RunLayout.of(tokenizer_run).root.parent.name == "finetune_tokenizer_demo"


# Bad input of the predictor's front doors (a missing, unloadable or mismatched tokenizer or
# predictor, bad keys): tests/test_hostile_input.py, area "predictor" (one line, exit 2, no file
# touched, no secret printed).


# ----------------------------------------------------------------------------- the user's commands


@pytest.mark.slow
def test_mlflow_run_predictor_trains_on_the_tokenizer_run(user_predictor_run, user_run):
    """The shared ``mlflow run . -e predictor`` (tests/shared_runs.py): two workers on
    ``tokenizer=runs:/<id>/best_model`` of the shared tokenizer run, in its store, experiment
    ``predictor``."""
    client, run = user_predictor_run.client(), user_predictor_run.run()
    assert run.info.status == "FINISHED"
    metrics, tags, params = run.data.metrics, run.data.tags, run.data.params
    for key in ("train_predictor_loss_batch", "train_S1_loss_each_batch", "train_S2_loss_each_batch",
                "predictor_learning_rate", "val_predictor_loss_epoch", "val_predictor_loss_initial", "best_val_loss",
                "val_s1_accuracy", "val_s2_accuracy", "val_s1_perplexity", "val_s2_perplexity",
                "test_predictor_loss", "base_test_predictor_loss", "test_loss_change", "test_s1_accuracy"):
        assert key in metrics, key
    assert "train_tokenizer_loss_batch" not in metrics
    assert tags["tokenizer_uri"] == f"runs:/{user_run.run_id}/best_model"
    assert tags["tokenizer_run_id"] == user_run.run_id
    assert tags["verdict"] in ("better", "worse", "inconclusive") and tags["verdict_base"] == "fresh"
    assert tags["world_size"] == "2" and params["stage"] == "predictor"
    assert params["learning_rate"] == "0.001" and params["predictor_learning_rate"] == "0.001"
    assert float(params["tokenizer_learning_rate"]) == 2e-4  # untouched: not this stage's
    history = sorted(client.get_metric_history(run.info.run_id, "val_predictor_loss_epoch"), key=lambda m: m.step)
    assert [m.step for m in history] == [0, 1] and metrics["best_val_loss"] == min(m.value for m in history)
    # the run directory keeps the tokenizer it trained on, identical to the tokenizer run's best model
    from kronos_mlflow.model import Kronos, KronosTokenizer

    run_dir = Path(tags["run_directory"])
    assert run_dir.parent.name == "finetune_predictor_demo"
    ours = KronosTokenizer.from_pretrained(run_dir / "checkpoints" / "tokenizer")
    theirs = KronosTokenizer.from_pretrained(next(user_run.save_path.rglob("best_model")))
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    best = Kronos.from_pretrained(run_dir / "checkpoints" / "best_model")
    assert (best.s1_bits, best.s2_bits) == (4, 4)
    assert "[kronos] test, " in user_predictor_run.stdout + user_predictor_run.stderr
    # best_model is the forecaster: both checkpoints, every sample path from raw bars and timestamps
    import mlflow
    import numpy as np

    mlflow.set_tracking_uri(user_run.uri)
    try:
        forecaster = mlflow.pyfunc.load_model(tags["best_model_uri"])
    finally:
        mlflow.set_tracking_uri(None)
    example = forecaster.input_example
    out = forecaster.predict(example, params={"sample_count": 2, "seed": 1})
    pred_len = example["timestamps"].shape[1] - example["bars"].shape[1]
    assert out["paths"].shape == (len(example["bars"]), 2, pred_len, 6) and np.isfinite(out["paths"]).all()
