"""The fast training path computes what the plain fp32 path computes.

Fast path: fused q/k/v and w1/w3 matmuls, one-pass rotary, one batched decoder pass
(``KronosTokenizer.fused``), fused/foreach AdamW, thread settings, the device-side window
loader, and ``torch.compile`` where it is switched on. Plain path: the spec's computation op for
op and torch's for-loop AdamW (what ``benchmarks/bench_train.py --baseline`` times). No timing
here: speed is measured by the benchmark only.
"""

from __future__ import annotations

import importlib
import shutil

import pytest
import torch
from data_helpers import small_config, small_market  # noqa: F401

from kronos_mlflow.training import optim, loop as trainer
from kronos_mlflow.runtime import perf
from kronos_mlflow.config.core import load_config
from kronos_mlflow.data import loaders
from kronos_mlflow.errors import ConfigError
from kronos_mlflow.runtime.distributed import unwrap
from kronos_mlflow.model import BASE_CONFIG, KronosTokenizer
from kronos_mlflow.stages.tokenizer import training as tokenizer_training
from kronos_mlflow.stages.tokenizer.training import TokenizerStage

PLAIN = {"compile": "off", "precision": "fp32", "adamw_impl": "for-loop", "fused_layers": "off"}
FAST = {"compile": "off", "precision": "fp32", "adamw_impl": "auto", "fused_layers": "on"}
SMALL = {**BASE_CONFIG, "d_model": 64, "ff_dim": 128, "n_enc_layers": 3, "n_dec_layers": 3,
         "s1_bits": 6, "s2_bits": 6}


def _model(cfg=None, seed=0) -> KronosTokenizer:
    torch.manual_seed(seed)
    model = KronosTokenizer(**(cfg or BASE_CONFIG))
    with torch.no_grad():  # off the default init (RMSNorm gains of one, zero biases)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.train()


def _x(b=6, t=101, seed=1) -> torch.Tensor:
    return torch.randn(b, t, 6, generator=torch.Generator().manual_seed(seed)).clamp(-5, 5)


def _loss_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    loss, parts = tokenizer_training.compute_loss(model, x)
    loss.backward()
    return loss.detach(), parts, {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_grads_close(fast, plain, rtol=1e-5):
    assert fast.keys() == plain.keys()
    for name, want in plain.items():
        scale = want.abs().max().item()
        torch.testing.assert_close(fast[name], want, rtol=rtol, atol=rtol * scale, msg=name)


# ----------------------------------------------------------------------------------- model


def test_plain_path_is_the_model_default_and_set_fused_switches_every_block():
    model = KronosTokenizer(**SMALL)
    assert not model.fused and not any(getattr(m, "fused", False) for m in model.modules())
    model.fused = True
    assert model.fused and all(m.fused for m in model.modules() if hasattr(m, "fused"))
    assert model.set_fused(False) is model and not model.encoder[0].ffn.fused
    assert model.set_fused(True).decoder[-1].self_attn.fused
    assert "fused" not in str(list(model.state_dict()))  # nothing new in the checkpoint
    assert len(model.state_dict()) == len(KronosTokenizer(**SMALL).state_dict())


@pytest.mark.parametrize("cfg", [BASE_CONFIG, SMALL], ids=["base", "small"])
def test_fused_forward_equals_plain_forward(cfg):
    model = _model(cfg).eval()
    x = _x()
    with torch.no_grad():
        model.set_fused(True)
        (zp_f, z_f), loss_f, q_f, idx_f = model(x)
        model.set_fused(False)
        (zp_p, z_p), loss_p, q_p, idx_p = model(x)
    torch.testing.assert_close(z_f, z_p, atol=1e-6, rtol=0)
    torch.testing.assert_close(zp_f, zp_p, atol=1e-6, rtol=0)
    torch.testing.assert_close(loss_f, loss_p, atol=1e-6, rtol=0)
    assert torch.equal(q_f, q_p) and torch.equal(idx_f, idx_p)
    assert z_f.shape == zp_f.shape == x.shape and z_f.is_contiguous() and zp_f.is_contiguous()


def test_batched_decoder_alone_equals_two_passes():
    """Only the batched decoder pass (blocks on their plain path) against the two passes."""
    model = _model(SMALL).eval()
    x = _x(b=5, t=33)
    with torch.no_grad():
        model.set_fused(False)
        (zp_p, z_p), _, _, _ = model(x)
        object.__setattr__(model, "_fused", True)  # batched decoder on, blocks still plain
        assert not model.decoder[0].self_attn.fused
        (zp_b, z_b), _, _, _ = model(x)
    torch.testing.assert_close(z_b, z_p, atol=1e-6, rtol=0)
    torch.testing.assert_close(zp_b, zp_p, atol=1e-6, rtol=0)


def test_decode_still_equals_forward_z_on_the_fast_path():
    model = _model(SMALL).eval()
    x = _x(b=3, t=40)
    with torch.no_grad():
        (_, z), _, _, idx = model(x)
        torch.testing.assert_close(model.decode(idx), z, atol=1e-6, rtol=0)
        torch.testing.assert_close(model.decode(model.encode(x, half=True), half=True), z, atol=1e-6, rtol=0)


def test_rotate_equals_the_spec_rotation():
    from kronos_mlflow.model import RotaryPositionalEmbedding

    rot = RotaryPositionalEmbedding(16)
    q = torch.randn(2, 3, 7, 16)  # (B, H, T, hd), head-major
    k = torch.randn(2, 3, 7, 16)
    want_q, want_k = rot(q, k)
    both = torch.cat((q, k), dim=1).transpose(1, 2)  # (B, T, 2H, hd), time-major, strided
    got = rot.rotate(both).transpose(1, 2)
    assert torch.equal(got[:, :3], want_q) and torch.equal(got[:, 3:], want_k)


@pytest.mark.parametrize("cfg", [BASE_CONFIG, SMALL], ids=["base", "small"])
def test_fast_loss_and_gradients_equal_plain(cfg):
    x = _x(b=2, t=40)  # the architecture is what differs; a short window keeps the base model quick
    fast = _model(cfg).set_fused(True)
    plain = _model(cfg).set_fused(False)
    loss_f, parts_f, grads_f = _loss_and_grads(fast, x)
    loss_p, parts_p, grads_p = _loss_and_grads(plain, x)
    torch.testing.assert_close(loss_f, loss_p, rtol=1e-5, atol=0)
    for key in parts_p:
        torch.testing.assert_close(parts_f[key], parts_p[key], rtol=1e-5, atol=1e-7)
    _assert_grads_close(grads_f, grads_p)


def test_fast_path_with_dropout_trains():
    """Dropout still applies on the fused path (training), and not in eval."""
    cfg = {**SMALL, "attn_dropout_p": 0.2, "ffn_dropout_p": 0.2, "resid_dropout_p": 0.2}
    model = _model(cfg)
    x = _x(b=2, t=20)
    torch.manual_seed(0)
    a = model(x)[0][1]
    torch.manual_seed(1)
    b = model(x)[0][1]
    assert not torch.equal(a, b)
    model.eval()
    with torch.no_grad():
        model.set_fused(False)
        want = model(x)[0][1]
        model.set_fused(True)
        torch.testing.assert_close(model(x)[0][1], want, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------- optimizer


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_adamw_kernels_equal_the_for_loop_after_a_step(impl):
    cfg = load_config({"weight_decay_scope": "matrices"})
    x = _x(b=4)
    models, opts = [], []
    for name in ("for-loop", impl):
        model = _model(SMALL)
        _loss_and_grads(model, x)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=cfg["grad_clip_norm"])
        opt = optim.build_optimizer(model, {**cfg, "adamw_impl": name})
        models.append(model)
        opts.append(opt)
    assert opts[1].defaults["fused" if impl == "fused" else "foreach"] is True
    assert not opts[0].defaults["foreach"] and not opts[0].defaults["fused"]
    for _ in range(2):
        for opt in opts:
            opt.step()
    for (name, want), got in zip(models[0].named_parameters(), models[1].parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=name)
        s_want, s_got = opts[0].state[want], opts[1].state[got]
        torch.testing.assert_close(s_got["exp_avg"], s_want["exp_avg"], rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(s_got["exp_avg_sq"], s_want["exp_avg_sq"], rtol=1e-5, atol=1e-12)


def test_adamw_auto_resolves_to_an_available_kernel():
    impl = perf.resolve_adamw("auto", torch.device("cpu"))
    assert impl in ("fused", "foreach")
    model = KronosTokenizer(**SMALL)
    opt = optim.build_optimizer(model, load_config({}))
    assert opt.defaults["fused" if impl == "fused" else "foreach"] is True


# ----------------------------------------------------------------------------------- the whole step


def _steps(config, model, xs):
    prepared = trainer.prepare_model(model, config, torch.device("cpu"))
    opt = optim.build_optimizer(model, config)
    losses = []
    for x in xs:
        loss, parts = trainer.train_step(prepared, opt, x, config, stage=TokenizerStage())
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_train_step_fast_equals_plain(accumulation_steps):
    """Two full steps (forward, loss, backward, clip, AdamW) on the fast path (fused layers,
    fused/foreach AdamW) and on the plain one give the same losses and weights."""
    overrides = {**{k: SMALL[k] for k in ("d_model", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits",
                                          "s2_bits")}, "accumulation_steps": accumulation_steps, "batch_size": 4}
    fast_cfg = load_config({**overrides, **FAST})
    plain_cfg = load_config({**overrides, **PLAIN})
    xs = [_x(b=4, seed=s) for s in (1, 2)]
    fast, plain = _model(SMALL), _model(SMALL)
    losses_f = _steps(fast_cfg, fast, xs)
    losses_p = _steps(plain_cfg, plain, xs)
    assert fast.fused and not plain.fused
    assert losses_f == pytest.approx(losses_p, rel=1e-5)
    for (name, want), got in zip(plain.named_parameters(), fast.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


def test_bf16_autocast_path_runs_and_keeps_fp32_losses():
    """precision bf16 (what auto picks on CUDA) exercised on the CPU: finite fp32 loss, grads."""
    model = _model(SMALL)
    x = _x(b=2, t=30)
    loss, parts = tokenizer_training.compute_loss(model, x, "bf16")
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert parts["recon_all"].dtype == torch.float32
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    plain = tokenizer_training.compute_loss(model, x, "fp32")[0]
    assert abs(loss.item() - plain.item()) < 0.05 * abs(plain.item()) + 0.05


def _can_compile() -> bool:
    if not hasattr(torch, "compile") or not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return False
    try:
        importlib.import_module("torch._inductor")
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.mark.slow  # inductor compiles C++ kernels: seconds to tens of seconds
@pytest.mark.skipif(not _can_compile(), reason="torch.compile (inductor) is unavailable here")
@pytest.mark.parametrize("fused_layers", ["off", "on"])  # CPU's auto, CUDA's auto
def test_compiled_step_equals_eager(fused_layers):
    """compile: on (what auto gives on CUDA, and on CPU for long runs) gives the plain eager
    path's loss and grads."""
    cfg = {**SMALL, "d_model": 32, "ff_dim": 64, "n_enc_layers": 1, "n_dec_layers": 1}
    x = _x(b=3, t=24)
    eager = _model(cfg)
    compiled_model = _model(cfg)
    config = load_config({"compile": "on", "fused_layers": fused_layers})
    compiled = trainer.prepare_model(compiled_model, config, torch.device("cpu"))
    assert compiled is not compiled_model and unwrap(compiled) is compiled_model
    assert compiled_model.fused is (fused_layers == "on") and not eager.fused
    try:
        loss_c, parts_c = tokenizer_training.compute_loss(compiled, x)
    except Exception as exc:  # noqa: BLE001 - a broken toolchain is "unavailable", not a failure
        pytest.skip(f"torch.compile cannot build kernels here: {type(exc).__name__}")
    loss_c.backward()
    grads_c = {n: p.grad.clone() for n, p in compiled_model.named_parameters()}
    loss_e, _, grads_e = _loss_and_grads(eager, x)
    torch.testing.assert_close(loss_c.detach(), loss_e, rtol=1e-5, atol=0)
    _assert_grads_close(grads_c, grads_e)


# ----------------------------------------------------------------------------------- settings


def test_speed_settings_resolve():
    cpu = torch.device("cpu")
    assert perf.resolve_precision("auto", cpu) == "fp32"
    assert perf.resolve_precision("bf16", cpu) == "bf16"
    # compile auto on CPU: long runs only (and only with a C++ compiler on PATH)
    assert perf.resolve_compile("auto", cpu, run_steps=perf.CPU_COMPILE_MIN_STEPS - 1) is False
    assert perf.resolve_compile("auto", cpu, run_steps=10**6) is (perf._cxx_compiler() is not None)
    assert perf.resolve_compile("on", cpu, run_steps=1) is True and perf.resolve_compile("off", cpu) is False
    assert perf.run_steps(load_config({"epochs": 3, "n_train_iter": 1000, "batch_size": 50}), world_size=2) == 30
    assert perf.resolve_fused("auto", cpu) is False and perf.resolve_fused("auto", torch.device("cuda", 0)) is True
    assert perf.resolve_fused("on", cpu) is True
    assert perf.adamw_kwargs("for-loop") == {"foreach": False, "fused": False}
    cfg = load_config({})
    assert (cfg["compile"], cfg["precision"], cfg["adamw_impl"], cfg["fused_layers"], cfg["num_threads"]) == (
        "auto", "auto", "auto", "auto", 0)
    assert load_config({"compile": True})["compile"] == "on"  # YAML's bare `on`
    assert load_config({"compile": "false"})["compile"] == "off"
    assert load_config({"fused_layers": False})["fused_layers"] == "off"
    with pytest.raises(ConfigError, match="fused_layers"):
        load_config({"fused_layers": "sometimes"})
    with pytest.raises(ConfigError, match="precision"):
        load_config({"precision": "fp16"})
    with pytest.raises(ConfigError, match="num_threads"):
        load_config({"num_threads": -1})
    with pytest.raises(ConfigError, match="adamw_impl"):
        load_config({"adamw_impl": "sgd"})


def test_threads_are_cpus_over_local_processes():
    before = torch.get_num_threads()
    try:
        cpus = perf.available_cpus()
        got = perf.configure_threads(0, n_local_processes=2)
        assert got["num_threads"] == max(1, cpus // 2) == torch.get_num_threads()
        assert perf.configure_threads(1)["num_threads"] == 1
        assert perf.configure_threads(0, n_local_processes=1)["num_threads"] == cpus
    finally:
        torch.set_num_threads(before)


def test_prepare_and_unwrap_model():
    model = KronosTokenizer(**SMALL)
    cpu = torch.device("cpu")
    prepared = trainer.prepare_model(model, load_config({"fused_layers": "on"}), cpu, run_steps=10)
    assert prepared is model and model.fused  # a 10-step CPU run: compile auto stays off
    assert unwrap(prepared) is model
    assert trainer.prepare_model(model, load_config({}), cpu, run_steps=10) is model and not model.fused


# ----------------------------------------------------------------------------------- device-side windows


@pytest.mark.parametrize("world_size", [1, 2])
def test_device_window_loader_equals_the_dataloader(small_market, tmp_path, world_size):  # noqa: F811
    """The CUDA loader's gather + normalise, run on CPU tensors, gives the DataLoader's batches."""
    from kronos_mlflow.data import QlibDataset

    config = small_config(small_market, tmp_path / "ds", batch_size=7, n_train_iter=61)  # odd: uneven ranks
    ds = QlibDataset("train", config, progress=False)
    for rank in range(world_size):
        for epoch in (0, 3):
            ds.set_epoch_seed(epoch)
            want = list(loaders.train_loader_for(ds, config, rank, world_size))
            device_loader = loaders.DeviceWindowLoader(ds, config["batch_size"], "cpu", rank, world_size)
            got = list(device_loader)
            assert len(device_loader) == len(got) == len(want) > 0
            for (gx, gs), (wx, ws) in zip(got, want):
                assert gx.shape == wx.shape and gx.dtype == wx.dtype == torch.float32
                torch.testing.assert_close(gx, wx, rtol=1e-5, atol=2e-5)
                assert torch.equal(gs, ws)


def test_train_loader_for_cuda_picks_the_device_loader(small_market, tmp_path, monkeypatch):  # noqa: F811
    from kronos_mlflow.data import QlibDataset

    config = small_config(small_market, tmp_path / "ds", batch_size=5, n_train_iter=20)
    ds = QlibDataset("train", config, progress=False)
    made = {}

    class Recorder(loaders.DeviceWindowLoader):
        def __init__(self, ds, batch_size, device, rank, world_size, drop_last):
            made.update(device=str(device), batch_size=batch_size, rank=rank, world_size=world_size)
            super().__init__(ds, batch_size, "cpu", rank, world_size, drop_last)

    monkeypatch.setattr(loaders, "DeviceWindowLoader", Recorder)
    loader = loaders.train_loader_for(ds, config, 1, 2, device="cuda:1")
    assert isinstance(loader, Recorder)
    assert made == {"device": "cuda:1", "batch_size": 5, "rank": 1, "world_size": 2}
    cpu_loader = loaders.train_loader_for(ds, config, 0, 1, device=torch.device("cpu"))
    assert isinstance(cpu_loader, torch.utils.data.DataLoader)


def test_normalisation_in_torch_matches_numpy():
    """The z-score the device loader uses (torch) against the one QlibDataset uses (numpy)."""
    import numpy as np

    from kronos_mlflow.config.features import normalize_windows

    rng = np.random.default_rng(0)
    raw = (rng.standard_normal((9, 40, 6)) * rng.uniform(0.1, 1e4, size=(1, 1, 6)) + 50).astype(np.float32)
    want = normalize_windows(raw, 30, 5.0)
    got = normalize_windows(torch.from_numpy(raw), 30, 5.0)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-5, atol=2e-5)


# ----------------------------------------------------------------------------------- allocator

_FAULTS_SCRIPT = r"""
import json, resource, sys
import torch
from kronos_mlflow.runtime import perf
from kronos_mlflow.training import loop as trainer, optim
from kronos_mlflow.config.core import load_config, model_kwargs
from kronos_mlflow.model import KronosTokenizer
from kronos_mlflow.stages import build_registry
from kronos_mlflow.stages.tokenizer.training import TokenizerStage

build_registry()
config = load_config({"malloc_reuse": sys.argv[1], "compile": "off", "d_model": 64, "ff_dim": 128,
                      "n_heads": 2, "n_enc_layers": 2, "n_dec_layers": 2, "s1_bits": 4, "s2_bits": 4})
settings = perf.configure_process(config, torch.device("cpu"), local_world_size=1)

# A 64 MiB block: above glibc's largest adaptive mmap threshold (32 MiB), so with its defaults
# every allocation is a fresh mmap whose pages fault in when first written.
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

torch.manual_seed(0)
model = KronosTokenizer(**model_kwargs(config))
optimizer = optim.build_optimizer(model, config)
x = torch.randn(64, 101, 6)
losses = [float(trainer.train_step(model, optimizer, x, config, stage=TokenizerStage())[0]) for _ in range(3)]
print(json.dumps({"reuse": settings["malloc_reuse"], "faults": faults, "losses": losses}))
"""


@pytest.mark.slow  # two training processes
@pytest.mark.skipif(not perf.malloc_reuse_available(), reason="needs glibc (mallopt)")
def test_malloc_reuse_keeps_freed_memory_for_the_next_allocation():
    """With ``malloc_reuse`` a large block freed and allocated again reuses the same pages (no
    fresh page faults), where glibc's defaults map and fault it in anew every time. Training
    gives the same losses either way. Each setting runs in its own process: mallopt is
    process-wide and glibc's adaptive defaults cannot be restored once changed."""
    import json
    import resource
    import subprocess
    import sys

    out = {}
    for choice in ("off", "on"):
        proc = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, choice], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[choice] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["off"]["reuse"] is False and out["on"]["reuse"] is True
    pages = (64 << 20) // resource.getpagesize()
    assert all(f > pages // 2 for f in out["off"]["faults"][1:]), out  # every time: a new mapping
    assert all(f < pages // 100 for f in out["on"]["faults"][1:]), out  # after the first: reused
    assert out["on"]["losses"] == out["off"]["losses"]


def test_malloc_reuse_choices():
    assert load_config({})["malloc_reuse"] == "auto"
    assert load_config({"malloc_reuse": False})["malloc_reuse"] == "off"
    with pytest.raises(ConfigError, match="malloc_reuse"):
        load_config({"malloc_reuse": "always"})
    assert perf.resolve_malloc_reuse("off") is False
    assert perf.resolve_malloc_reuse("auto") is perf.malloc_reuse_available()


# ----------------------------------------------------------------------------------- the benchmark


@pytest.mark.slow  # the benchmark script in its own process
def test_bench_train_reports_what_it_promises(tmp_path):
    """``benchmarks/bench_train.py`` on a tiny model: the JSON line has the issue's keys with
    sane values, both paths, the per-round figures and the breakdown. Nothing is timed here."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_train.py"
    tiny = ["d_model=32", "ff_dim=64", "n_heads=2", "n_enc_layers=2", "n_dec_layers=2", "s1_bits=4", "s2_bits=4",
            "compile=off"]
    cmd = [sys.executable, str(bench), "--baseline", "--breakdown", "--steps", "2", "--rounds", "2", "--warmup", "1",
           "--epoch-steps", "2", "--epochs", "1", "--batch-size", "8", "--matmul-size", "256", "--device", "cpu",
           "--home", str(tmp_path), "--json", *[a for kv in tiny for a in ("--set", kv)]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("matmul_gflops", "flops_per_sample", "step_samples_per_s", "epoch_samples_per_s",
                "fraction_of_matmul"):
        assert isinstance(r[key], float) and r[key] > 0, key
    assert r["paths"] == ["fast", "plain"] and len(r["rounds"]) == 2
    assert set(r["flops_per_sample_by_kind"]) == {"matmul", "attention"}  # CPU flash attention is counted
    assert abs(sum(r["flops_per_sample_by_kind"].values()) - r["flops_per_sample"]) < 1
    for name in r["paths"]:
        path = r["per_path"][name]
        assert path["epoch_samples"] == 16
        assert abs(sum(path["breakdown"]["shares"].values()) - 1) < 1e-6
        assert path["breakdown"]["shares"]["matmul"] > 0
    assert r["resolved"]["plain"]["adamw_impl"] == "for-loop" and r["resolved"]["plain"]["malloc_reuse"] is False
    assert "fraction of the matmul figure" in proc.stdout
    assert list(tmp_path.iterdir()) and not (Path(__file__).resolve().parents[1] / "processed").exists()


@pytest.mark.parametrize("capacity", [0, 49, 50, 51, 777, 4096, 10_000])
def test_largest_batch_search(capacity):
    """The GPU batch search: the largest size that fits, to within ~3%, never one that does not,
    and few tries (each costs a couple of optimizer steps on the device)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_train", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= capacity

    got = bench.largest_batch(fits, 50, 8192)
    if capacity < 50:
        assert got == 0
    else:
        assert got <= min(capacity, 8192) and got >= min(capacity, 8192) * 0.96
    assert len(tried) <= 16
    assert bench.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not bench.is_out_of_memory(RuntimeError("shape mismatch"))
    with pytest.raises(ValueError, match="start"):
        bench.largest_batch(fits, 0, 10)
