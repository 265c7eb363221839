"""finetune_mode (docs/finetune-modes.md): LoRA through peft and frozen depth, for both stages.

The model pieces in process (counts from the shapes, the merge against peft's unmerged model,
peft's adapter format); then what users type: ``mlflow run . -e predictor -P finetune_mode=lora``,
``mlflow run . -P finetune_mode=freeze`` (the tokenizer's main), a LoRA run killed under torchrun
and restarted, a sweep whose space draws the mode, and bad values as one line and exit 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_runs import TINY, create_sqlite_store, isolated_env, tiny_values, torchrun_to_the_end, write_config

ROOT = Path(__file__).resolve().parents[1]
PREDICTOR_SIZES = {"s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 16, "n_heads": 2, "ff_dim": 32,
                   "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "token_dropout_p": 0.0,
                   "learn_te": True}


def _predictor(seed: int = 1):
    from kronos_mlflow.model import Kronos

    torch.manual_seed(seed)
    return Kronos(**PREDICTOR_SIZES)


def _tokenizer(seed: int = 0):
    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(seed)
    return KronosTokenizer(**model_kwargs({k: TINY[k] for k in ("d_model", "n_heads", "ff_dim", "n_enc_layers",
                                                               "n_dec_layers", "s1_bits", "s2_bits")}))


def _config(**changes):
    from kronos_mlflow.config.core import validate

    return validate({**{k: v for k, v in TINY.items()}, "stage": "predictor", "n_layers": 2, **changes})


def _lora_formula(model, targets, rank):
    """r * (in + out) for every Linear layer whose name ends with a target."""
    return sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets)


def _inputs(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    s1 = torch.randint(0, 16, (3, 12), generator=g)
    s2 = torch.randint(0, 16, (3, 12), generator=g)
    stamp = (torch.rand(3, 12, 5, generator=g) * torch.tensor([60, 24, 7, 32, 13])).floor()
    return s1, s2, stamp


def _forward(model, s1, s2, stamp):
    """Both heads' logits, teacher-forced (without it the s2 head reads a sampled s1: random)."""
    with torch.no_grad():
        return model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=s1)


def _perturb_adapters(model, seed: int = 5):
    """Give every lora_B non-zero values (as training would): a merge then changes weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize("targets, names", [("attention", ("q_proj", "k_proj", "v_proj", "out_proj")),
                                            ("ffn", ("w1", "w2", "w3")), ("q_proj,proj_s1", ("q_proj", "proj_s1"))])
def test_lora_trains_rank_times_in_plus_out_per_target(targets, names):
    from kronos_mlflow.model import finetune
    from kronos_mlflow.stages import get

    config = _config(finetune_mode="lora", lora_rank=4, lora_targets=targets)
    model = _predictor()
    expected = _lora_formula(model, names, 4)
    total = sum(p.numel() for p in model.parameters())
    trained = finetune.apply(model, config, get("predictor"))
    counts = finetune.counts(trained)
    assert counts["trainable_params"] == expected > 0
    assert counts["trainable_fraction"] == round(expected / (total + expected), 6)
    assert all("lora_" in name for name, p in trained.named_parameters() if p.requires_grad)


def test_freeze_trains_all_but_the_embeddings_and_bottom_blocks():
    from kronos_mlflow.model import finetune
    from kronos_mlflow.config.core import validate
    from kronos_mlflow.stages import get

    tokenizer = _tokenizer()
    config = validate({**TINY, "finetune_mode": "freeze", "freeze_layers": 1})
    frozen = sum(p.numel() for p in tokenizer.embed.parameters()) + sum(p.numel() for p in tokenizer.encoder[0].parameters())
    total = sum(p.numel() for p in tokenizer.parameters())
    finetune.apply(tokenizer, config, get("tokenizer"))
    assert finetune.counts(tokenizer)["trainable_params"] == total - frozen
    assert not any(p.requires_grad for p in tokenizer.encoder[0].parameters())
    assert all(p.requires_grad for p in tokenizer.decoder[0].parameters())

    predictor = _predictor()
    config = _config(finetune_mode="freeze", freeze_layers=2)
    finetune.apply(predictor, config, get("predictor"))
    trained = {name.split(".")[0] for name, p in predictor.named_parameters() if p.requires_grad}
    assert trained == {"norm", "dep_layer", "head"}  # the embeddings and both blocks frozen


def test_full_and_freeze_runs_never_import_peft():
    """peft imports transformers (seconds of every process's start): only ``lora`` loads it."""
    code = """
import sys
import torch
from kronos_mlflow.model import finetune
from kronos_mlflow.config.core import validate
from kronos_mlflow.stages import build_registry, get
build_registry()
sys.path.insert(0, sys.argv[1])
from tiny_runs import TINY
for stage, extra in (("tokenizer", {}), ("predictor", {"n_layers": 2})):
    for mode in ("full", "freeze"):
        config = validate({**TINY, "stage": stage, "finetune_mode": mode, "freeze_layers": 1, **extra})
        spec = get(stage)
        model = finetune.apply(spec.build_model(config), config, spec)
        assert finetune.merged(model) is model and finetune.adapter_layers(model) == []
        assert finetune.save_adapter(model, config, "unused") is None
print(sorted(m for m in ("peft", "transformers") if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_the_merged_model_is_the_unmerged_one_and_leaves_its_base_alone(tmp_path):
    """The merged copy (what best_model holds) forecasts as the unmerged peft model does (to
    float rounding, 1e-5), the training model's base weights stay bit for bit, and the adapter
    written in peft's format loads with ``PeftModel.from_pretrained`` onto a fresh base."""
    from peft import PeftModel

    from kronos_mlflow.model import finetune
    from kronos_mlflow.model import Kronos
    from kronos_mlflow.stages import get

    config = _config(finetune_mode="lora", lora_rank=4)
    start = _predictor()
    base = {k: v.clone() for k, v in start.state_dict().items()}
    model = finetune.apply(_predictor(), config, get("predictor"))
    _perturb_adapters(model)
    model.eval()
    s1, s2, stamp = _inputs()
    unmerged = _forward(model, s1, s2, stamp)
    plain = finetune.merged(model).eval()
    assert not finetune.adapter_layers(plain) and finetune.adapter_layers(model)
    assert set(plain.state_dict()) == set(base)  # the hub layout of a full fine-tune
    for a, b in zip(_forward(plain, s1, s2, stamp), unmerged, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for name, tensor in model.state_dict().items():  # the base under each adapter is untouched
        plain_name = name.replace(".base_layer", "")
        if "lora_" not in name:
            assert torch.equal(tensor, base[plain_name]), name
    targets = [n for n in base if n.rsplit(".", 2)[-2] in config_targets(config) and n.endswith("weight")]
    assert targets and all(not torch.equal(plain.state_dict()[n], base[n]) for n in targets)

    plain.save_pretrained(tmp_path / "merged")
    reloaded = Kronos.from_pretrained(tmp_path / "merged").eval()
    adapter = finetune.save_adapter(model, config, tmp_path / "adapter")
    peft_model = PeftModel.from_pretrained(_predictor(), str(adapter)).eval()
    for a, b, c in zip(_forward(reloaded, s1, s2, stamp), _forward(peft_model, s1, s2, stamp), unmerged, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-5)


def config_targets(config):
    from kronos_mlflow.config.core import lora_targets

    return lora_targets(config)


def test_full_mode_keeps_the_digest_and_unused_keys_stay_out_of_it():
    """finetune_mode full (the default) digests as before the keys existed; the lora keys count
    only for lora, freeze_layers only for freeze."""
    from kronos_mlflow.config.digest import digest_config

    full = _config()
    assert not any(k in digest_config(full) for k in ("finetune_mode", "lora_rank", "freeze_layers"))
    assert digest_config(_config(lora_rank=2)) == digest_config(full)
    lora = digest_config(_config(finetune_mode="lora"))
    assert lora["lora_rank"] == 8 and "freeze_layers" not in lora
    assert digest_config(_config(finetune_mode="freeze", lora_rank=2)) == digest_config(_config(finetune_mode="freeze"))


@pytest.mark.parametrize("flags, says", [
    (["--finetune-mode", "lora", "--lora-rank", "0"], "lora_rank: '0' must be greater than 0"),
    (["--finetune-mode", "lora", "--lora-alpha", "-1"], "lora_alpha: '-1' must be greater than 0"),
    (["--finetune-mode", "lora", "--lora-dropout", "1"], "lora_dropout: 1.0 must be in [0, 1)"),
    (["--finetune-mode", "lora", "--lora-targets", "q_proj,nowhere"],
     "lora_targets: 'nowhere' matches no Linear layer of the tokenizer; expected attention, ffn, both, or names"),
    (["--finetune-mode", "freeze", "--freeze-layers", "3"],
     "freeze_layers: 3 is more than the 2 transformer blocks of the fresh tokenizer; expected 0 to 2"),
    (["--stage", "predictor", "--finetune-mode", "freeze", "--freeze-layers", "5", "--n-layers", "2"],
     "freeze_layers: 5 is more than the 2 transformer blocks of the fresh predictor; expected 0 to 2"),
    (["--finetune-mode", "half"], "finetune_mode: 'half' is not one of full, lora, freeze"),
])
def test_bad_values_are_one_line_and_exit_2(flags, says, isolated):
    from kronos_mlflow.training.run import cli

    err = io.StringIO()
    base = [a for k, v in tiny_values(isolated).items() for a in (f"--{k.replace('_', '-')}", str(v))]
    with contextlib.redirect_stderr(err):
        code = cli([*base, *flags, "--check"])
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and says in lines[0], err.getvalue()
    assert not (isolated / "outputs").exists()


def test_a_pretrained_model_too_shallow_to_freeze_is_refused_by_the_check(isolated, capsys):
    """The depth of a pretrained checkpoint is known once it loads: the check loads it."""
    from kronos_mlflow.training.run import cli

    _tokenizer().save_pretrained(isolated / "tok")
    base = [a for k, v in tiny_values(isolated).items() for a in (f"--{k.replace('_', '-')}", str(v))]
    code = cli([*base, "--pretrained-tokenizer-path", str(isolated / "tok"), "--finetune-mode", "freeze",
                "--freeze-layers", "4", "--check"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kronos-mlflow train: error: freeze_layers: 4 is more than the 2 transformer blocks of the "
                   "tokenizer model; expected 0 to 2"]


@pytest.mark.parametrize("stage", ["tokenizer", "predictor"])
@pytest.mark.parametrize("mode", ["lora", "freeze"])
def test_lora_or_freeze_on_fresh_weights_is_refused_unless_asked_for_by_name(stage, mode, isolated, capsys):
    """Adapters (or a trained top) on a random base mean nothing: auto finding no published
    checkpoint (the tests' Hugging Face cache is empty) or an empty path is refused in one line by
    --check, before any work; the stage's pretrained path set to ``fresh`` asks for it by name."""
    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.errors import ConfigError
    from kronos_mlflow.training.preflight import check_partial_start
    from kronos_mlflow.training.run import cli

    key = f"pretrained_{stage}_path"
    base = [a for k, v in tiny_values(isolated).items() for a in (f"--{k.replace('_', '-')}", str(v))]
    code = cli([*base, "--stage", stage, "--n-layers", "2", "--finetune-mode", mode, "--freeze-layers", "1", "--check"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"kronos-mlflow train: error: finetune_mode {mode} on fresh (random) weights: auto found no published "
        "checkpoint: fresh weights: "), err
    assert err[0].endswith(f"finetune_mode full, or {key}=fresh to train {mode} on fresh weights anyway")
    assert not (isolated / "outputs").exists()
    values = {**TINY, "stage": stage, "n_layers": 2, "finetune_mode": mode, "freeze_layers": 1}
    with pytest.raises(ConfigError, match=f"^finetune_mode {mode} on fresh \\(random\\) weights: {key} is empty; "):
        check_partial_start(load_config({**values, key: ""}))
    check_partial_start(load_config({**values, key: "fresh"}))  # asked for by name
    check_partial_start(load_config({**values, "finetune_mode": "full"}))  # every weight trains: fresh is fine


# ----------------------------------------------------------------------------- the user's commands

SIZES = {"epochs": 2, "batch_size": 8, "n_train_iter": 64, "n_val_iter": 16, "learning_rate": 1e-2}
# the kill-and-resume runs: epochs long enough that rank 1 dies inside the second one
KILLED_SIZES = {"epochs": 3, "batch_size": 8, "n_train_iter": 200, "n_val_iter": 36, "learning_rate": 1e-2}


def _workdir(root: Path, **config) -> tuple[Path, dict[str, str]]:
    root.mkdir(parents=True, exist_ok=True)
    values = {**{k: v for k, v in TINY.items() if k not in SIZES}, "n_layers": 2, "log_interval": 100000,
              "evaluate": "off", **config}
    write_config(root / "tiny.yaml", **values, save_path=str(root / "outputs"), dataset_path=str(root / "cache"))
    return root, isolated_env(root, create_sqlite_store(root))


def _mlflow_run(root: Path, env, entry: str, **params):
    params = {**SIZES, "config_file": str(root / "tiny.yaml"), "comet": "off", **params}
    if entry == "predictor":  # its backtest_signal_stride parameter (default 1: daily) wins over the file's
        params = {"backtest_signal_stride": 0, **params}
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", entry,
           *[a for k, v in params.items() for a in ("-P", f"{k}={v}")]]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs(["0"])
    return client, run, proc


@pytest.mark.slow
def test_mlflow_run_predictor_with_lora_logs_a_merged_model_and_its_adapter(tmp_path):
    import mlflow
    import numpy as np
    from peft import PeftModel

    from kronos_mlflow.config.core import LORA_GROUPS
    from kronos_mlflow.model import Kronos, KronosPredictor, KronosTokenizer

    root, env = _workdir(tmp_path)
    client, run, proc = _mlflow_run(root, env, "predictor", finetune_mode="lora", lora_rank=4, epochs=1,
                                    pretrained_predictor_path="fresh")  # adapters on fresh weights: asked by name
    params, tags = run.data.params, run.data.tags
    assert run.info.status == "FINISHED" and params["finetune_mode"] == "lora" and params["lora_rank"] == "4"
    checkpoints = Path(tags["run_directory"]) / "checkpoints"
    start = Kronos.from_pretrained(checkpoints / "start")
    best = Kronos.from_pretrained(checkpoints / "best_model")  # the hub layout: upstream's class loads it
    assert int(params["trainable_params"]) == _lora_formula(start, LORA_GROUPS["both"], 4)
    assert "finetune_mode lora: training LoRA adapters (rank 4, alpha 16) on" in proc.stdout + proc.stderr
    targets = LORA_GROUPS["both"]
    for name, tensor in start.state_dict().items():
        layer = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
        if layer in targets and name.endswith(".weight"):
            assert not torch.equal(tensor, best.state_dict()[name]), name  # trained through its adapter
        else:
            assert torch.equal(tensor, best.state_dict()[name]), name  # frozen: bit for bit the start
    # the adapter alone, in peft's format, as the run's artifact adapter/
    local = Path(client.download_artifacts(run.info.run_id, "adapter", str(tmp_path / "dl")))
    assert json.loads((local / "adapter_config.json").read_text())["r"] == 4
    peft_model = PeftModel.from_pretrained(Kronos.from_pretrained(checkpoints / "start"), str(local)).eval()
    s1, s2, stamp = _inputs()
    for a, b in zip(_forward(best.eval(), s1, s2, stamp), _forward(peft_model, s1, s2, stamp), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the training state holds the trained tensors only
    import safetensors.torch

    state = safetensors.torch.load_file(checkpoints / "last" / "model.safetensors")
    assert state and all("lora_" in name for name in state)
    # upstream's KronosPredictor forecasts with the merged pair, and so does the logged forecaster
    tokenizer = KronosTokenizer.from_pretrained(checkpoints / "tokenizer")
    predictor = KronosPredictor(best, tokenizer, device="cpu", max_context=64)
    import pandas as pd

    times = pd.date_range("2024-01-01", periods=30, freq="D")
    bars = pd.DataFrame(np.abs(np.random.default_rng(0).normal(10, 1, (20, 6))) + 1,
                        columns=["open", "high", "low", "close", "volume", "amount"])
    out = predictor.predict(bars, pd.Series(times[:20]), pd.Series(times[20:25]), pred_len=5, sample_count=1,
                            verbose=False)
    assert out.shape == (5, 6) and np.isfinite(out.to_numpy()).all()
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    try:
        forecaster = mlflow.pyfunc.load_model(tags["best_model_uri"])
    finally:
        mlflow.set_tracking_uri(None)
    paths = forecaster.predict(forecaster.input_example, params={"sample_count": 1, "seed": 1})["paths"]
    assert np.isfinite(paths).all()


@pytest.mark.slow
def test_mlflow_run_main_with_freeze_trains_the_top_of_the_tokenizer_only(tmp_path):
    from kronos_mlflow.model import KronosTokenizer

    root, env = _workdir(tmp_path)
    client, run, proc = _mlflow_run(root, env, "main", finetune_mode="freeze", freeze_layers=1,
                                    pretrained_tokenizer_path="fresh")  # freeze on fresh weights: asked by name
    params = run.data.params
    assert run.info.status == "FINISHED" and params["finetune_mode"] == "freeze"
    checkpoints = Path(run.data.tags["run_directory"]) / "checkpoints"
    start = KronosTokenizer.from_pretrained(checkpoints / "start")
    best = KronosTokenizer.from_pretrained(checkpoints / "best_model")
    frozen = ("embed.", "encoder.0.")
    n_frozen = sum(t.numel() for n, t in start.named_parameters() if n.startswith(frozen))
    assert int(params["trainable_params"]) == sum(p.numel() for p in start.parameters()) - n_frozen
    for name, tensor in start.state_dict().items():
        same = torch.equal(tensor, best.state_dict()[name])
        if name.startswith(frozen):
            assert same, name
        elif name.startswith(("decoder.", "head.")) and name.endswith("weight"):
            assert not same, name
    assert run.data.tags["verdict"] in ("better", "worse", "inconclusive")
    # the run ends saying where it is and how to look at it; output that is not a terminal gets
    # lines, not progress-bar redraws
    out = proc.stdout + proc.stderr
    assert "\r" not in out and "[kronos] epoch 1/2: train_loss=" in out and "[kronos] epoch 2/2: train_loss=" in out
    assert f"[kronos] done: run {run.info.run_id}: best_val_loss {run.data.metrics['best_val_loss']:.6f}" in out
    assert f"[kronos] files: {checkpoints.parent}" in out
    assert f"[kronos] look at it: mlflow ui --backend-store-uri {env['MLFLOW_TRACKING_URI']}" in out


@pytest.mark.slow
def test_a_killed_lora_run_resumes_under_torchrun_to_the_same_best_val_loss(tmp_path):
    """Plain torchrun, two workers, LoRA on fresh predictor weights: one uninterrupted run, then the
    same with rank 1 SIGKILLed after the first epoch; the group restarts into the same MLflow run
    and ends with the same validation history, best_val_loss and test loss, every step logged once."""
    from mlflow import MlflowClient

    results = {}
    for name in ("uninterrupted", "killed"):
        root, env = _workdir(tmp_path / name, finetune_mode="lora", lora_rank=4, pretrained_predictor_path="fresh")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--max-restarts", "2", "-m", "kronos_mlflow.train_predictor", "--config", str(root / "tiny.yaml"),
               "--qlib-data-path", "", "--comet", "off",
               *[f"--{k.replace('_', '-')}={v}" for k, v in KILLED_SIZES.items()]]
        output = torchrun_to_the_end(cmd, root, env,
                                     kill_rank_after_epoch0="finetune_predictor_demo" if name == "killed" else None)
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        (run,) = client.search_runs(["0"])
        history = sorted(client.get_metric_history(run.info.run_id, "val_predictor_loss_epoch"), key=lambda m: m.step)
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_predictor_loss_batch"))
        results[name] = (run, [m.value for m in history], steps, output)
    (ref, ref_val, ref_steps, _), (run, val, steps, output) = results["uninterrupted"], results["killed"]
    assert "[kronos] resuming at epoch 2/3" in output
    assert run.info.status == "FINISHED" and run.data.params["finetune_mode"] == "lora" and len(val) == 3
    assert val == pytest.approx(ref_val, rel=1e-6)
    assert run.data.metrics["best_val_loss"] == pytest.approx(ref.data.metrics["best_val_loss"], rel=1e-6)
    assert ref_steps and steps == ref_steps == list(range(len(ref_steps)))  # no step logged twice or lost
    assert run.data.metrics["test_predictor_loss"] == pytest.approx(ref.data.metrics["test_predictor_loss"], rel=1e-6)


@pytest.mark.slow
def test_a_sweep_whose_space_draws_the_mode_records_it_per_trial(predictor_sweep, commands):
    """The shared predictor sweep (tests/shared_sweeps.py: its space draws finetune_mode, lora
    and freeze trials on fresh weights asked for by name): each trial's mode in its params and
    run name, with its own setting only; ``kronos-mlflow compare`` shows the mode."""
    trials = predictor_sweep.trials()
    assert len(trials) == predictor_sweep.n_trials == 3
    for run in trials:
        params = run.data.params
        mode = params["finetune_mode"]
        assert mode in ("full", "lora", "freeze") and f"finetune_mode={mode}" in run.info.run_name
        assert ("lora_rank=" in run.info.run_name) == (mode == "lora")
        assert ("freeze_layers=" in run.info.run_name) == (mode == "freeze")
        assert int(params["trainable_params"]) > 0
    table = commands.run(["kronos-mlflow", "compare"], cwd=predictor_sweep.root, env=predictor_sweep.env, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    if any(r.data.params["finetune_mode"] != "full" for r in trials):
        assert " mode " in table.stdout.splitlines()[0] + " "


def test_the_next_step_names_the_store_used_without_its_credentials():
    from kronos_mlflow.evaluation.next_steps import look_command, training_lines

    assert look_command("sqlite:////tmp/x/mlflow.db") == "mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db"
    line = look_command("http://bob:hunter2@host:5000/", "3", "abc")
    assert line.startswith("open http://") and line.endswith("host:5000/#/experiments/3/runs/abc")
    assert "hunter2" not in line
    lines = training_lines({"best_val_loss": 0.5, "best_epoch": 2, "test": {"verdict": "better", "change": -0.04},
                            "scorecard": {"metrics": {"skill_vs_zeroshot": 0.013, "skill_vs_zeroshot_ci_low": 0.01,
                                                      "skill_vs_zeroshot_ci_high": 0.016},
                                          "tags": {"verdict_vs_zeroshot": "better"}}},
                           run_id="abc", experiment_id="3", tracking_uri="sqlite:///m.db", run_directory=Path("/r"))
    assert lines == ["done: run abc: best_val_loss 0.500000 (epoch 3), verdict better (test loss -4.00% against the start)",
                     "scorecard: skill_vs_zeroshot +0.0130 [+0.0100, +0.0160] (better), in /r/evaluation/scorecard.json",
                     "files: /r", "look at it: mlflow ui --backend-store-uri sqlite:///m.db"]
