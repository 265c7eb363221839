"""kronos_mlflow.training.checkpoint: the per-epoch training state.

The round trip is bit-exact (CPU fp32): 3 steps, save, load into fresh objects (other weights,
other RNG), 3 more steps == 6 uninterrupted steps, weights, optimizer moments, learning-rate
schedule and every RNG included. Damage (truncated tensors, missing or non-UTF-8 state.json, a
save killed before or during the swap) is one line, or is recovered from ``last.old``.
Kills are real: a subprocess ends itself with ``os._exit`` in the middle of a save, so no
cleanup handler runs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tiny_runs
import torch


from kronos_mlflow.training import checkpoint as ckpt
from kronos_mlflow.config.core import load_config, model_kwargs
from kronos_mlflow.errors import CheckpointError, UserError

ROOT = Path(__file__).resolve().parents[1]
TINY = {**tiny_runs.TINY, "precision": "fp32"}
STEPS_PER_EPOCH = 3
RUN_IDS = {"mlflow_run_id": "0123456789abcdef0123456789abcdef", "comet_experiment_key": "c0ffee" * 5}


def _config(**extra):
    return load_config({**TINY, **extra})


def _build(config, init_seed: int):
    """Model, AdamW and one-cycle schedule exactly as train_model builds them."""
    from kronos_mlflow.model import KronosTokenizer
    from kronos_mlflow.training.optim import build_optimizer

    torch.manual_seed(init_seed)
    model = KronosTokenizer(**model_kwargs(config))
    model.train()
    optimizer = build_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer=optimizer, max_lr=config["tokenizer_learning_rate"], steps_per_epoch=STEPS_PER_EPOCH,
        epochs=config["epochs"], pct_start=0.03, div_factor=10,
    )
    return model, optimizer, scheduler


def _steps(model, optimizer, scheduler, config, n: int) -> list[float]:
    """``n`` optimizer steps on batches drawn from torch's RNG (so the RNG state matters)."""
    from kronos_mlflow.stages.tokenizer.training import TokenizerStage
    from kronos_mlflow.training.loop import train_step

    lrs = []
    window = config["lookback_window"] + config["predict_window"] + 1
    for _ in range(n):
        x = torch.randn(config["batch_size"], window, 6)
        train_step(model, optimizer, x, config, stage=TokenizerStage())
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _save(directory, model, optimizer, scheduler, config, epoch=0, step=STEPS_PER_EPOCH, best=0.5, **kw):
    return ckpt.save_training_state(
        directory, model=model, optimizer=optimizer, scheduler=scheduler, epoch=epoch, global_step=step,
        best_val_loss=best, run_ids=RUN_IDS, config_digest=ckpt.config_digest(config), config=config, **kw,
    )


# ----------------------------------------------------------------------------- round trip


def test_resume_is_bit_exact_with_uninterrupted_training(tmp_path):
    config = _config()

    model, opt, sched = _build(config, init_seed=0)
    _seed_all(1)
    lrs_ref = _steps(model, opt, sched, config, 2 * STEPS_PER_EPOCH)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    ref_opt = opt.state_dict()
    ref_draws = _draws()

    model, opt, sched = _build(config, init_seed=0)
    _seed_all(1)
    lrs_a = _steps(model, opt, sched, config, STEPS_PER_EPOCH)
    directory = _save(ckpt.state_dir(tmp_path), model, opt, sched, config, epoch=0, best=0.25,
                      extra={"val_loss_history": [0.25], "best_epoch": 0})
    del model, opt, sched

    fresh, fresh_opt, fresh_sched = _build(config, init_seed=99)  # other weights
    _seed_all(12345)  # another RNG position
    state = ckpt.load_training_state(directory, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched,
                                     map_location="cpu", rank=0)
    assert state["next_epoch"] == 1 and state["global_step"] == STEPS_PER_EPOCH
    assert state["best_val_loss"] == 0.25 and state["run_ids"] == RUN_IDS
    assert state["extra"] == {"val_loss_history": [0.25], "best_epoch": 0}
    assert state["sampler"] == {"epoch": 1}
    assert fresh_sched.last_epoch == STEPS_PER_EPOCH
    lrs_b = _steps(fresh, fresh_opt, fresh_sched, config, STEPS_PER_EPOCH)

    assert lrs_a + lrs_b == lrs_ref  # the schedule continues where it stopped, to the bit
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, ref[name]), name
    got_opt = fresh_opt.state_dict()
    assert got_opt["param_groups"] == ref_opt["param_groups"]  # lr, betas (cycled momentum)...
    for pid, entry in ref_opt["state"].items():
        for key, value in entry.items():
            assert torch.equal(got_opt["state"][pid][key], value), (pid, key)
    assert _draws() == ref_draws  # python, numpy and torch RNG continue identically


def test_saved_files_are_safetensors_and_json_only(tmp_path):
    from safetensors import safe_open

    config = _config()
    model, opt, sched = _build(config, 0)
    _steps(model, opt, sched, config, 1)
    directory = _save(ckpt.state_dir(tmp_path), model, opt, sched, config)
    assert directory == tmp_path / "checkpoints" / "last"
    assert sorted(p.name for p in directory.iterdir()) == ["model.safetensors", "optimizer.safetensors", "state.json"]
    assert sorted(p.name for p in directory.parent.iterdir()) == ["last"]  # no temp, no .old left
    state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
    assert state["config_digest"] == ckpt.config_digest(config)
    assert state["run_ids"] == RUN_IDS and state["epoch"] == 0 and state["global_step"] == STEPS_PER_EPOCH
    assert len(state["rng"]) == 1 and set(state["rng"][0]) == {"python", "numpy", "torch", "cuda"}
    with safe_open(str(directory / "optimizer.safetensors"), "pt") as fh:
        names = set(fh.keys())
    n_params = len(list(model.parameters()))
    assert {f"optimizer.state.{i}.exp_avg" for i in range(n_params)} <= names
    with safe_open(str(directory / "model.safetensors"), "pt") as fh:
        assert set(fh.keys()) == set(model.state_dict())


def test_every_epoch_replaces_the_last_state(tmp_path):
    config = _config(epochs=5)
    model, opt, sched = _build(config, 0)
    for epoch in range(3):
        _steps(model, opt, sched, config, 1)
        _save(ckpt.state_dir(tmp_path), model, opt, sched, config, epoch=epoch, step=epoch + 1)
    found = ckpt.find_resumable(tmp_path, config)
    assert found["epoch"] == 2 and found["next_epoch"] == 3 and found["global_step"] == 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last"]


# ----------------------------------------------------------------------------- config digest


def test_config_digest_ignores_tracking_and_speed_keys_only():
    base = _config()
    digest = ckpt.config_digest(base)
    for key, value in {"run_name": "x", "experiment_name": "e", "comet": "off", "comet_name": "n",
                       "registered_model_name": "m", "log_interval": 7, "num_workers": 2, "device": "cpu",
                       "num_threads": 3, "compile": "off", "save_path": "/elsewhere", "dataset_path": "/c",
                       "nproc_per_node": 4}.items():
        assert ckpt.config_digest({**base, key: value}) == digest, key
    for key, value in {"tokenizer_learning_rate": 1e-3, "epochs": 3, "seed": 1, "batch_size": 4,
                       "adam_weight_decay": 0.0, "d_model": 32, "train_time_range": ["2020-01-01", "2020-06-30"],
                       "precision": "bf16", "qlib_data_path": "/data"}.items():
        assert ckpt.config_digest({**base, key: value}) != digest, key
    assert ckpt.config_digest(base, world_size=2) != ckpt.config_digest(base, world_size=1)
    # The same values written differently give the same validated config, hence the same digest.
    assert ckpt.config_digest(load_config({**TINY, "learning_rate": "2e-4"})) == \
        ckpt.config_digest(load_config({**TINY, "tokenizer_learning_rate": 0.0002}))


def test_find_resumable_modes(tmp_path):
    config = _config()
    assert ckpt.find_resumable(tmp_path, config) is None  # nothing saved yet
    with pytest.raises(CheckpointError, match="holds no training state"):
        ckpt.find_resumable(tmp_path, config, mode="must")
    model, opt, sched = _build(config, 0)
    _save(ckpt.state_dir(tmp_path), model, opt, sched, config)
    assert ckpt.find_resumable(tmp_path, config)["global_step"] == STEPS_PER_EPOCH
    assert ckpt.find_resumable(tmp_path, config, mode="never") is None
    other = _config(epochs=5)
    with pytest.warns(UserWarning, match=r"another config \(changed: epochs 2 -> 5\)"):
        assert ckpt.find_resumable(tmp_path, other) is None
    with pytest.raises(CheckpointError, match="resume is must but .*epochs 2 -> 5"):
        ckpt.find_resumable(tmp_path, other, mode="must")
    with pytest.raises(CheckpointError, match="resume: 'sometimes' is not one of"):
        ckpt.find_resumable(tmp_path, config, mode="sometimes")


def test_state_of_another_model_is_refused_and_leaves_objects_alone(tmp_path):
    config = _config()
    model, opt, sched = _build(config, 0)
    _save(ckpt.state_dir(tmp_path), model, opt, sched, config)
    bigger = _config(d_model=32)
    m2, o2, s2 = _build(bigger, 1)
    before = {k: v.clone() for k, v in m2.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        ckpt.load_training_state(ckpt.state_dir(tmp_path), model=m2, optimizer=o2, scheduler=s2, map_location="cpu")
    _one_line(info.value, "resume with the config that made it")
    assert all(torch.equal(v, before[k]) for k, v in m2.state_dict().items())
    # Another optimizer grouping is refused too.
    m3, o3, s3 = _build(_config(weight_decay_scope="matrices"), 0)
    with pytest.raises(CheckpointError, match="parameter group"):
        ckpt.load_training_state(ckpt.state_dir(tmp_path), model=m3, optimizer=o3, scheduler=s3, map_location="cpu")


# ----------------------------------------------------------------------------- damage


@pytest.fixture()
def saved(tmp_path):
    config = _config()
    model, opt, sched = _build(config, 0)
    _steps(model, opt, sched, config, 1)
    directory = _save(ckpt.state_dir(tmp_path), model, opt, sched, config)
    return tmp_path, directory, config


def _one_line(exc: BaseException, *needles: str) -> str:
    assert isinstance(exc, UserError)
    text = str(exc)
    assert "\n" not in text and text.strip()
    for needle in needles:
        assert needle in text, text
    return text


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors"])
def test_truncated_tensor_file_is_one_line(saved, name):
    save_dir, directory, config = saved
    path = directory / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as info:
        ckpt.find_resumable(save_dir, config)
    _one_line(info.value, name, "truncated")


def test_truncated_tensor_file_caught_by_the_reader_even_unverified(saved):
    save_dir, directory, config = saved
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    model, opt, sched = _build(config, 0)
    state = ckpt.read_training_state(directory, verify=False)  # header-only check passes...
    assert state["epoch"] == 0
    with pytest.raises(CheckpointError) as info:  # ...safetensors itself refuses the data
        ckpt.load_training_state(directory, model=model, optimizer=opt, scheduler=sched, map_location="cpu",
                                 verify=False)
    _one_line(info.value, "model.safetensors", "cannot be read")


def test_flipped_byte_fails_the_checksum(saved):
    save_dir, directory, config = saved
    path = directory / "optimizer.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        ckpt.find_resumable(save_dir, config)
    _one_line(info.value, "checksum")


def test_a_diverged_runs_state_is_refused_before_resuming(tmp_path):
    """NaN weights saved with valid sizes and checksums (a run that diverged): the resume check
    refuses them in one line, as --check does, instead of training on with NaN losses."""
    config = _config()
    model, opt, sched = _build(config, 0)
    _steps(model, opt, sched, config, 1)
    with torch.no_grad():
        next(iter(model.parameters())).fill_(float("nan"))
    _save(ckpt.state_dir(tmp_path), model, opt, sched, config)
    with pytest.raises(CheckpointError) as info:
        ckpt.find_resumable(tmp_path, config)
    _one_line(info.value, "model.safetensors", "NaN or infinite", "diverged run")


def test_missing_state_json(saved):
    save_dir, directory, config = saved
    (directory / "state.json").unlink()
    with pytest.raises(CheckpointError) as info:
        ckpt.find_resumable(save_dir, config)
    _one_line(info.value, "has no state.json")


def test_state_json_not_utf8(saved):
    save_dir, directory, config = saved
    (directory / "state.json").write_bytes(b'{"format": "\xff\xfe kronos"}')
    with pytest.raises(CheckpointError) as info:
        ckpt.find_resumable(save_dir, config)
    _one_line(info.value, "not UTF-8")


def test_state_json_truncated(saved):
    save_dir, directory, config = saved
    path = directory / "state.json"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError) as info:
        ckpt.find_resumable(save_dir, config)
    _one_line(info.value, "not valid JSON")


def test_state_json_with_wrong_types(saved):
    save_dir, directory, config = saved
    path = directory / "state.json"
    state = json.loads(path.read_text())
    state["global_step"] = "three"
    path.write_text(json.dumps(state))
    with pytest.raises(CheckpointError) as info:
        ckpt.find_resumable(save_dir, config)
    _one_line(info.value, "global_step")


# ----------------------------------------------------------------------------- killed saves

_KILL_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from kronos_mlflow.stages import build_registry
    build_registry()  # as every command does before it loads a config
    import test_checkpoint as t
    from kronos_mlflow.training import checkpoint as ckpt

    where = sys.argv[2]
    real_rename = os.rename

    def rename(src, dst):
        if where == "before-swap":
            os._exit(9)  # killed with the new state complete in its temp dir, before any rename
        if where == "mid-swap" and ".last.tmp-" in str(src):
            os._exit(9)  # killed after last -> last.old, before tmp -> last
        return real_rename(src, dst)

    if where == "mid-write":
        import safetensors.torch as st
        real_save = st.save_file

        def save_file(tensors, path, metadata=None):
            if path.endswith("optimizer.safetensors"):
                with open(path, "wb") as fh:
                    fh.write(b"partial")
                os._exit(9)  # killed while writing the second tensor file
            return real_save(tensors, path, metadata=metadata)

        st.save_file = save_file
    config = t._config()
    model, opt, sched = t._build(config, 0)
    t._steps(model, opt, sched, config, 2)
    os.rename = rename
    t._save(ckpt.state_dir(sys.argv[1]), model, opt, sched, config, epoch=1, step=6)
    """
)


def _killed_save(save_dir: Path, where: str) -> None:
    script = save_dir / "kill_save.py"
    script.write_text(_KILL_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script), str(save_dir), where], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 9, proc.stderr[-2000:]


@pytest.mark.parametrize("where", ["mid-write", "before-swap"])
def test_kill_during_save_leaves_last_intact(saved, where):
    save_dir, directory, config = saved
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    _killed_save(save_dir, where)
    temps = [p.name for p in directory.parent.iterdir() if p.name.startswith(".last.tmp-")]
    assert len(temps) == 1  # the killed save's temp directory is left behind...
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # ...and last is untouched
    found = ckpt.find_resumable(save_dir, config)
    assert found["epoch"] == 0 and found["global_step"] == STEPS_PER_EPOCH
    model, opt, sched = _build(config, 0)
    _save(directory, model, opt, sched, config, epoch=1, step=6)  # the next save cleans up
    assert sorted(p.name for p in directory.parent.iterdir()) == ["last"]


def test_kill_mid_swap_recovers_from_old(saved):
    save_dir, directory, config = saved
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    _killed_save(save_dir, "mid-swap")
    assert not directory.exists() and (directory.parent / "last.old").is_dir()
    found = ckpt.find_resumable(save_dir, config)  # renames last.old back
    assert found["epoch"] == 0
    assert directory.is_dir() and not (directory.parent / "last.old").exists()
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    model, opt, sched = _build(config, 5)
    state = ckpt.load_training_state(directory, model=model, optimizer=opt, scheduler=sched, map_location="cpu")
    assert state["global_step"] == STEPS_PER_EPOCH


def test_loader_recovers_old_without_find(saved):
    save_dir, directory, config = saved
    os.rename(directory, directory.parent / "last.old")  # as a kill mid-swap leaves it
    model, opt, sched = _build(config, 5)
    state = ckpt.load_training_state(directory, model=model, optimizer=opt, scheduler=sched, map_location="cpu")
    assert state["epoch"] == 0 and directory.is_dir()


def test_save_over_a_leftover_old_directory(saved):
    save_dir, directory, config = saved
    stale = directory.parent / "last.old"
    stale.mkdir()
    (stale / "junk").write_text("stale")
    model, opt, sched = _build(config, 0)
    _save(directory, model, opt, sched, config, epoch=0, step=3)
    assert sorted(p.name for p in directory.parent.iterdir()) == ["last"]
    assert ckpt.find_resumable(save_dir, config)["epoch"] == 0


def test_state_before_the_first_epoch(tmp_path):
    """epoch=-1: saved before training starts, so a crash in epoch 0 resumes into the same run."""
    config = _config()
    model, opt, sched = _build(config, 0)
    ckpt.save_training_state(ckpt.state_dir(tmp_path), model=model, optimizer=opt, scheduler=sched, epoch=-1,
                             global_step=0, best_val_loss=None, run_ids=RUN_IDS,
                             config_digest=ckpt.config_digest(config))
    found = ckpt.find_resumable(tmp_path, config)
    assert found["epoch"] == -1 and found["next_epoch"] == 0 and found["best_val_loss"] is None
    m2, o2, s2 = _build(config, 3)
    state = ckpt.load_training_state(found["directory"], model=m2, optimizer=o2, scheduler=s2, map_location="cpu")
    assert state["global_step"] == 0 and s2.last_epoch == 0
    assert all(torch.equal(a, b) for a, b in zip(m2.state_dict().values(), model.state_dict().values()))


def test_a_complete_run_is_not_resumed(tmp_path):
    """The same command after a finished run trains anew; resume must says why it cannot."""
    config = _config(epochs=2)
    model, opt, sched = _build(config, 0)
    _save(ckpt.state_dir(tmp_path), model, opt, sched, config, epoch=1, step=2)
    assert ckpt.find_resumable(tmp_path, config) is None
    with pytest.raises(CheckpointError, match="complete"):
        ckpt.find_resumable(tmp_path, config, mode="must")
