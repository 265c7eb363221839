"""Training-step benchmark: matmul ceiling, FLOPs per sample, step and epoch samples/s.

    python benchmarks/bench_train.py                        # CPU (or CUDA when present), batch 50
    python benchmarks/bench_train.py --baseline --json      # fast path and plain path, one run
    python benchmarks/bench_train.py --plain --steps 5      # the plain fp32 path only
    python benchmarks/bench_train.py --baseline --breakdown # + where each path's step time goes
    python benchmarks/bench_train.py --device cuda --largest-batch --json  # GPU: batch 50 and the largest

What it measures, all in one process:

- ``matmul``: fp32 ``(N x N) @ (N x N)`` GFLOP/s on the device (N = 2048), with the process's
  threads: the ceiling the training step is compared with. Measured at the start, at the start
  of every round of timed steps, and at the end; the step's ``fraction_of_matmul`` is the median
  over rounds of (that round's step FLOP/s / that round's matmul figure), since a shared
  machine's speed drifts over minutes.
- ``flops/sample``: forward + loss + backward of the configured tokenizer at window length
  ``lookback + predict + 1``, counted with ``torch.utils.flop_counter.FlopCounterMode`` (with
  formulas for the CPU flash-attention kernels, which it leaves at zero; causal share only).
- ``step``: samples/s of one full optimizer step (forward, loss, backward, clip, AdamW step,
  zero_grad) on a fixed batch, median over ``--steps`` timed steps (after ``--warmup`` ones).
  With ``--baseline`` the plain fp32 path (no fusions, for-loop AdamW, no compile: the code path
  before the speed work) is timed in the same run, interleaved with the fast path round by
  round (``--rounds``; each round starts with one untimed step, since switching models evicts
  caches), so both see the same machine noise; their ratio is reported.
- ``epoch``: samples/s of a whole (short) training epoch as ``train.py`` runs it: ``QlibDataset``
  on the demo market (or ``--qlib-data-path``), the loader ``train.py`` builds for the device, the
  same step, the one-cycle scheduler and the per-step loss read-back, timed from the first batch
  request to the last step. ``--epoch-steps`` batches per epoch (n_train_iter = batch x steps);
  ``--epochs`` epochs per path, interleaved between the paths, median reported. Each epoch
  follows three timed steps of the same path, and ``epoch / step`` is the median of the
  back-to-back ratios.
- ``--breakdown``: a few profiled steps per path (``torch.profiler``): the share of the step in
  matmuls, attention, inductor's fused kernels, copies, the optimizer and the rest; how fast
  the matmuls themselves run against the matmul figure; and the fraction the step would reach
  if everything but its matmuls took no time (the ceiling for this model on this machine).
- ``other processes' CPU share``: how much of the machine other processes used while timing
  (Linux ``/proc/stat``); above a few percent the figures are noise, whatever the spread says.

The fast path is whatever the config (defaults, or ``--config FILE.yaml`` / ``--set key=value``)
gives: ``compile``, ``precision``, ``adamw_impl``, ``fused_layers``, ``malloc_reuse``, ``num_threads``.
Both paths run in one process, so each path's allocator setting is applied before its steps
(see ``use_allocator``). Everything is written under a temporary directory (or ``--home``),
never into the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The config keys that select the plain fp32 path (see kronos_mlflow/config/core.py).
PLAIN = {"compile": "off", "precision": "fp32", "adamw_impl": "for-loop", "fused_layers": "off", "malloc_reuse": "off"}

#: glibc's own thresholds adapt upwards (mmap threshold up to 32 MiB, trim threshold twice it) as
#: large blocks are freed, and cannot be restored once set. When one path of a run keeps freed
#: memory (``malloc_reuse``) and the other does not, the other runs with those ceilings (the
#: plain path still faults ~30 k pages per step there). Runs whose paths all have it off leave
#: glibc untouched. Note that this benchmark's own 2048^2 matmul warms glibc's adaptive
#: thresholds up before any step, which a training process does not do: the page faults a
#: training run saves are better read from ``/usr/bin/time -v`` on ``kronos_mlflow.train``.
GLIBC_ADAPTIVE_CEILING = (32 << 20, 64 << 20)
_MIXED_ALLOCATORS = False  # set by _bench: whether the paths differ in malloc_reuse


def use_allocator(config) -> None:
    """Before a path's steps: its ``malloc_reuse`` setting, when the run's paths differ in it."""
    from kronos_mlflow.runtime import perf

    if not _MIXED_ALLOCATORS or not hasattr(perf, "configure_malloc"):
        return
    if not perf.configure_malloc(config.get("malloc_reuse", "off")):
        perf.set_malloc_thresholds(*GLIBC_ADAPTIVE_CEILING)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device, n: int = 2048, reps: int = 10) -> list[float]:
    """GFLOP/s of fp32 n x n matmuls, one figure per repetition (after two warm-up calls)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    for _ in range(2):
        torch.mm(a, b, out=out)
    _sync(device)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        _sync(device)
        rates.append(2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return rates


def flops_per_sample(model, x, compute_loss) -> tuple[float, dict[str, float]]:
    """Forward + loss + backward FLOPs of one batch, per sample (FlopCounterMode): the total and
    the share of each operator kind (``matmul``: mm/addmm/bmm, ``attention``: the SDPA kernels)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops()) as counter:
        loss, _ = compute_loss(model, x)
        loss.backward()
    model.zero_grad(set_to_none=True)
    kinds: dict[str, float] = {}
    for op, flops in counter.get_flop_counts().get("Global", {}).items():
        kind = _op_kind(str(op))
        kinds[kind] = kinds.get(kind, 0.0) + flops / x.shape[0]
    return counter.get_total_flops() / x.shape[0], kinds


def _cpu_attention_flops() -> dict:
    """FLOP formulas for the CPU flash-attention kernels, which torch's counter leaves at zero.

    torch's own SDPA formulas (the two batched matmuls forward, four backward), times the share
    of scores a causal kernel computes, ``(T + 1) / 2T``, so that skipped masked blocks are not
    counted as work done."""
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def causal_share(q_shape, is_causal) -> float:
        t = q_shape[-2]
        return (t + 1) / (2 * t) if is_causal else 1.0

    def forward(query, key, value, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs) -> int:
        return int(sdpa_flop_count(query, key, value) * causal_share(query, is_causal))

    def backward(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False, *args,
                 out_shape=None, **kwargs) -> int:
        return int(sdpa_backward_flop_count(grad_out, query, key, value) * causal_share(query, is_causal))

    ops = torch.ops.aten
    mapping = {}
    if hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[ops._scaled_dot_product_flash_attention_for_cpu] = forward
    if hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[ops._scaled_dot_product_flash_attention_for_cpu_backward] = backward
    return mapping


_MATMUL_OPS = {"aten.mm", "aten.addmm", "aten.bmm"}
_MEMORY_OPS = {"aten.copy_", "aten.fill_", "aten.zero_", "aten.cat", "aten.clone", "aten.contiguous"}


def _op_kind(name: str) -> str:
    """Operator kind for the time and FLOP breakdowns: matmul, attention, optimizer, memory, fused or other.
    ``name`` is a profiler key (``aten::mm``) or a FLOP counter key (``aten.mm``)."""
    name = name.lower().replace("::", ".").removesuffix(".default")
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return "attention"
    if name in _MATMUL_OPS:
        return "matmul"
    if "adamw" in name or "vector_norm" in name or "optimizer" in name:
        return "optimizer"
    if name in _MEMORY_OPS:
        return "memory"
    if name.startswith("graph_") or "cpp_fused" in name or "compiledfxgraph" in name:
        return "fused"  # inductor's generated kernels (the graph call's self time when not profiled apart)
    return "other"


def time_breakdown(path, x, steps: int = 3) -> dict[str, float]:
    """Share of one path's step time per operator kind (torch.profiler, self CPU time; ``fused``
    is inductor's generated kernels, ``other`` everything else: eager elementwise ops, Python).
    The profiler adds a little time per op: shares are what to read, not the seconds."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if path.device.type == "cuda" else [])
    use_allocator(path.config)
    path.step(x)
    _sync(path.device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            path.step(x)
        _sync(path.device)
    wall = time.perf_counter() - t0
    attr = "self_device_time_total" if path.device.type == "cuda" else "self_cpu_time_total"
    times: dict[str, float] = {}
    for ev in prof.key_averages():
        kind = _op_kind(ev.key)
        times[kind] = times.get(kind, 0.0) + getattr(ev, attr, 0.0) / 1e6
    total = sum(times.values())
    shares = {k: v / total for k, v in sorted(times.items(), key=lambda kv: -kv[1]) if total > 0}
    return {"shares": shares, "seconds_per_step": {k: v / steps for k, v in times.items()},
            "profiled_step_s": wall / steps}


class TrainPath:
    """A model + optimizer set up as ``train.py`` sets them up for ``config``, and its step."""

    def __init__(self, name: str, config: dict, state: dict, device, world_size: int = 1):
        import torch

        from kronos_mlflow.training import optim, loop as trainer
        from kronos_mlflow.stages.tokenizer.training import TokenizerStage
        from kronos_mlflow.config.core import model_kwargs
        from kronos_mlflow.model import KronosTokenizer

        self.name = name
        self.config = config
        self.device = device
        self.trainer = trainer
        self.stage = TokenizerStage()
        model = KronosTokenizer(**model_kwargs(config))
        model.load_state_dict(state)
        model = model.to(device)
        model.train()
        self.raw_model = model
        self.model = trainer.prepare_model(model, config, device)
        self.optimizer = optim.build_optimizer(model, config)
        self.scheduler = None
        self.step_times: list[float] = []
        self.step_faults: list[int] = []  # minor page faults of the process per timed step
        self._torch = torch

    def step(self, x) -> float:
        """One optimizer step on ``x`` (already on the device); returns the loss as a float."""
        config = self.config
        loss, parts = self.trainer.train_step(self.model, self.optimizer, x, config, stage=self.stage)
        # what the training loop does with them: one read of the four numbers for the logger
        avg = self._torch.stack([loss.float(), parts["bsq"].float(), parts["recon_pre"].float(),
                                 parts["recon_all"].float()]).tolist()[0]
        if self.scheduler is not None:
            self.scheduler.step()
        return avg

    def timed_steps(self, x, n: int, rewarm: bool = True) -> None:
        use_allocator(self.config)
        if rewarm:  # the other path just ran: one untimed step brings this one's memory back
            self.step(x)
            _sync(self.device)
        for _ in range(n):
            _sync(self.device)
            faults = _minor_faults()
            t0 = time.perf_counter()
            self.step(x)
            _sync(self.device)
            self.step_times.append(time.perf_counter() - t0)
            self.step_faults.append(_minor_faults() - faults)

    def epoch(self, config: dict, epoch_seed: int = 0, rank: int = 0, world_size: int = 1) -> tuple[float, int]:
        """One training epoch as train_model runs it (no validation): (seconds, samples)."""
        import torch

        from kronos_mlflow.data import QlibDataset
        from kronos_mlflow.data.loaders import train_loader_for

        ds = QlibDataset("train", config, progress=False)
        loader = train_loader_for(ds, config, rank, world_size, device=self.device)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer=self.optimizer, max_lr=config["tokenizer_learning_rate"], steps_per_epoch=len(loader),
            epochs=1, pct_start=0.03, div_factor=10)
        ds.set_epoch_seed(epoch_seed)
        use_allocator(config)
        samples = 0
        _sync(self.device)
        t0 = time.perf_counter()
        for batch_x, _ in loader:
            batch_x = batch_x.to(self.device, non_blocking=True)
            self.step(batch_x)
            samples += batch_x.shape[0]
        _sync(self.device)
        seconds = time.perf_counter() - t0
        self.scheduler = None
        return seconds, samples


class OtherLoad:
    """Share of the machine's CPU time used by other processes during a with-block (Linux;
    ``share`` stays None elsewhere). A noisy neighbour shows here, not only in the spread."""

    share: float | None = None

    @staticmethod
    def _read():
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                v = [int(n) for n in fh.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        t = os.times()
        return v[0] + v[1] + v[2] + v[5] + v[6] + v[7], v[3] + v[4], t.user + t.system

    def __enter__(self):
        self._start = self._read()
        return self

    def __exit__(self, *exc):
        end = self._read()
        if self._start is None or end is None:
            return False
        tick = os.sysconf("SC_CLK_TCK")
        busy, idle = (end[0] - self._start[0]) / tick, (end[1] - self._start[1]) / tick
        own = end[2] - self._start[2]
        self.share = max(0.0, min(1.0, (busy - own) / max(busy + idle, 1e-9)))
        return False


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device running out of memory."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def largest_batch(fits, start: int, limit: int) -> int:
    """The largest batch size in [start, limit] for which ``fits(batch)`` is True, assuming
    that fitting is monotone: doubling from ``start`` until one fails, then bisecting. Returns
    0 when not even ``start`` fits."""
    if start < 1 or limit < start:
        raise ValueError(f"need 1 <= start <= limit, got start {start}, limit {limit}")
    if not fits(start):
        return 0
    good, bad = start, None
    while bad is None:
        nxt = min(good * 2, limit)
        if nxt == good:
            return good
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
    while bad - good > max(1, good // 32):  # to within ~3%: each try costs a few steps
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def _minor_faults() -> int:
    """The process's minor page faults so far (0 where getrusage has no such count)."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError):
        return 0


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, or cuda")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--steps", type=int, default=12, help="timed optimizer steps per path (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per path first (compile happens here)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds the timed steps are split into")
    p.add_argument("--epoch-steps", type=int, default=20, help="batches in each timed epoch (0: skip the epochs)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per path, interleaved (median reported)")
    p.add_argument("--baseline", action="store_true", help="also time the plain fp32 path and report the ratio")
    p.add_argument("--plain", action="store_true", help="time only the plain fp32 path")
    p.add_argument("--matmul-size", type=int, default=2048)
    p.add_argument("--config", default=None, metavar="FILE.yaml", help="config file for the fast path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--qlib-data-path", default="", help="Qlib directory for the epoch (default: the demo market)")
    p.add_argument("--home", default=None, help="KRONOS_MLFLOW_HOME and dataset_path root (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--largest-batch", action="store_true",
                   help="also find the largest batch whose step fits in device memory and time epochs at it")
    p.add_argument("--max-batch-size", type=int, default=65536, help="upper end of the --largest-batch search")
    p.add_argument("--breakdown", action="store_true",
                   help="profile a few steps per path: time share per operator kind, matmul efficiency")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = p.parse_args(argv)
    from kronos_mlflow.stages import build_registry

    build_registry()  # as every command does before it loads a config
    if args.home:
        return _bench(args, Path(args.home).expanduser())
    with tempfile.TemporaryDirectory(prefix="kronos-bench-train-") as tmp:
        return _bench(args, Path(tmp))


def _bench(args, home: Path) -> int:
    os.environ["KRONOS_MLFLOW_HOME"] = str(home)
    os.environ.setdefault("TQDM_DISABLE", "1")

    import torch

    from kronos_mlflow.config import core as cfg
    from kronos_mlflow.stages.tokenizer import training as tokenizer_training
    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.runtime.distributed import resolve_device
    from kronos_mlflow.model import KronosTokenizer

    device = resolve_device(args.device)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    overrides.update({"qlib_data_path": args.qlib_data_path, "dataset_path": str(home / "processed"),
                      "batch_size": args.batch_size, "device": device.type,
                      "n_train_iter": args.batch_size * max(args.epoch_steps, 1)})
    fast_cfg = load_config(overrides, path=args.config)
    has_fast = all(k in cfg.DEFAULTS for k in PLAIN)
    plain_cfg = load_config({**overrides, **(PLAIN if has_fast else {})}, path=args.config)
    global _MIXED_ALLOCATORS
    from kronos_mlflow.runtime import perf

    both_paths = has_fast and args.baseline and not args.plain
    if both_paths and hasattr(perf, "resolve_malloc_reuse"):
        _MIXED_ALLOCATORS = len({perf.resolve_malloc_reuse(c["malloc_reuse"]) for c in (fast_cfg, plain_cfg)}) > 1
    if has_fast:
        # the process settings of the first path that runs (plain only: glibc stays untouched)
        settings = perf.configure_process(plain_cfg if args.plain else fast_cfg, device, local_world_size=1)
        threads = {k: settings[k] for k in ("num_threads", "interop_threads")}
    else:
        threads = {"num_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()}

    paths: list[str] = []
    if not args.plain and has_fast:
        paths.append("fast")
    if args.plain or args.baseline or not has_fast:
        paths.append("plain")

    torch.manual_seed(args.seed)
    state = KronosTokenizer(**model_kwargs(fast_cfg)).state_dict()
    window = fast_cfg["lookback_window"] + fast_cfg["predict_window"] + 1
    x = torch.randn(args.batch_size, window, 6, generator=torch.Generator().manual_seed(args.seed)).clamp_(-5, 5)
    x = x.to(device)

    results: dict = {
        "python": platform.python_version(), "torch": torch.__version__, "device": str(device),
        "cpus": os.cpu_count(), **threads, "batch_size": args.batch_size, "window": window,
        "model": {k: fast_cfg[k] for k in ("d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers",
                                           "s1_bits", "s2_bits")},
        "paths": paths,
    }
    mm = matmul_gflops(device, args.matmul_size)

    counter_model = KronosTokenizer(**model_kwargs(fast_cfg)).to(device)
    counter_model.load_state_dict(state)
    counter_model.train()
    results["flops_per_sample"], results["flops_per_sample_by_kind"] = flops_per_sample(counter_model, x,
                                                                                         tokenizer_training.compute_loss)
    del counter_model

    built: dict[str, TrainPath] = {}
    setup_s: dict[str, float] = {}
    for name in paths:
        t0 = time.perf_counter()
        use_allocator(fast_cfg if name == "fast" else plain_cfg)
        built[name] = TrainPath(name, fast_cfg if name == "fast" else plain_cfg, state, device)
        for _ in range(args.warmup):  # compile (when on) happens in the first step
            built[name].step(x)
        _sync(device)
        setup_s[name] = time.perf_counter() - t0
    results["setup_and_warmup_s"] = setup_s
    results["settings"] = {name: {k: str(built[name].config.get(k)) for k in PLAIN if k in built[name].config}
                           for name in paths}
    results["resolved"] = {name: perf.describe(built[name].config, device) for name in paths}

    # Timed steps, interleaved round by round so both paths see the same machine, each round
    # opening with its own matmul figure: a shared machine's speed drifts over minutes, so each
    # round's steps are compared with the ceiling measured next to them.
    per_round = max(1, -(-args.steps // max(args.rounds, 1)))
    done = 0
    rounds: list[dict] = []
    with OtherLoad() as load:
        while done < args.steps:
            n = min(per_round, args.steps - done)
            round_mm = matmul_gflops(device, args.matmul_size, reps=5)
            mm += round_mm
            entry = {"matmul_gflops": _median(round_mm), "step_s": {}}
            for name in paths:
                before = len(built[name].step_times)
                built[name].timed_steps(x, n, rewarm=len(paths) > 1)
                entry["step_s"][name] = _median(built[name].step_times[before:])
            rounds.append(entry)
            done += n
    results["other_processes_cpu_share"] = load.share
    mm += matmul_gflops(device, args.matmul_size)
    results["matmul_gflops"] = _median(mm)
    results["matmul_gflops_min_max"] = [min(mm), max(mm)]
    results["rounds"] = rounds

    flops_step = results["flops_per_sample"] * args.batch_size
    per_path = {}
    for name in paths:
        med = _median(built[name].step_times)
        fractions = [flops_step / r["step_s"][name] / 1e9 / r["matmul_gflops"] for r in rounds]
        per_path[name] = {
            "step_s_median": med,
            "step_s_min_max": [min(built[name].step_times), max(built[name].step_times)],
            "step_samples_per_s": args.batch_size / med,
            "minor_page_faults_per_step": _median(built[name].step_faults),
            "achieved_gflops": flops_step / med / 1e9,
            # median over rounds of (the round's step FLOP/s / the round's matmul figure)
            "fraction_of_matmul": _median(fractions),
            "fraction_of_matmul_min_max": [min(fractions), max(fractions)],
        }

    # Whole epochs, through the data pipeline, interleaved too; each preceded by a few steps of
    # the same path on the fixed batch, so epoch / step compares figures taken back to back.
    if args.epoch_steps > 0:
        from kronos_mlflow.data import prepare_splits

        prepare_splits(fast_cfg, progress=False)
        rates: dict[str, list[float]] = {name: [] for name in paths}
        ratios: dict[str, list[float]] = {name: [] for name in paths}
        shares: dict[str, list[float]] = {name: [] for name in paths}
        for e in range(max(1, args.epochs)):  # fast, plain, fast, plain, ...
            for name in paths:
                before = len(built[name].step_times)
                built[name].timed_steps(x, 3, rewarm=len(paths) > 1)
                near_step = args.batch_size / _median(built[name].step_times[before:])
                del built[name].step_times[before:], built[name].step_faults[before:]
                with OtherLoad() as load:
                    seconds, samples = built[name].epoch(built[name].config, epoch_seed=e)
                rates[name].append(samples / seconds)
                ratios[name].append(samples / seconds / near_step)
                if load.share is not None:
                    shares[name].append(load.share)
                per_path[name]["epoch_samples"] = samples
        for name in paths:
            per_path[name]["epoch_samples_per_s"] = _median(rates[name])
            per_path[name]["epoch_samples_per_s_all"] = rates[name]
            per_path[name]["epoch_other_processes_cpu_share"] = max(shares[name]) if shares[name] else None
            per_path[name]["epoch_vs_step"] = _median(ratios[name])
            per_path[name]["epoch_vs_step_all"] = ratios[name]
    if args.breakdown:
        mm_flops_step = results["flops_per_sample_by_kind"].get("matmul", 0.0) * args.batch_size
        for name in paths:
            near_mm = _median(matmul_gflops(device, args.matmul_size, reps=5))
            bd = time_breakdown(built[name], x)
            mm_s = bd["seconds_per_step"].get("matmul", 0.0)
            bd["matmul_gflops_near"] = near_mm
            bd["matmul_fraction_of_matmul_figure"] = mm_flops_step / mm_s / 1e9 / near_mm if mm_s > 0 else None
            # the step's fraction if everything but its matmuls took no time: this model's ceiling
            bd["fraction_if_only_matmuls"] = flops_step / mm_s / 1e9 / near_mm if mm_s > 0 else None
            per_path[name]["breakdown"] = bd
    if args.largest_batch:
        results["largest_batch"] = _largest_batch_epochs(args, built[paths[0]], fast_cfg, window, device)
    results["per_path"] = per_path

    main_path = paths[0]
    results["step_samples_per_s"] = per_path[main_path]["step_samples_per_s"]
    results["epoch_samples_per_s"] = per_path[main_path].get("epoch_samples_per_s", float("nan"))
    results["fraction_of_matmul"] = per_path[main_path]["fraction_of_matmul"]
    if "fast" in per_path and "plain" in per_path:
        results["step_speedup_vs_plain"] = per_path["fast"]["step_samples_per_s"] / per_path["plain"]["step_samples_per_s"]
        if args.epoch_steps > 0:
            results["epoch_speedup_vs_plain"] = (per_path["fast"]["epoch_samples_per_s"]
                                                 / per_path["plain"]["epoch_samples_per_s"])

    _print_table(results, args)
    if args.json:
        print(json.dumps(results, default=str))
    return 0


def _largest_batch_epochs(args, path: TrainPath, config: dict, window: int, device) -> dict:
    """The largest batch one step of ``path`` fits at (two steps, so the optimizer state is
    there), then epochs of ``--epoch-steps`` batches at that size: samples/s, median."""
    import torch

    def fits(batch: int) -> bool:
        try:
            x = torch.randn(batch, window, 6, device=device).clamp_(-5, 5)
            for _ in range(2):
                path.step(x)
            _sync(device)
            return True
        except Exception as exc:  # noqa: BLE001 - only running out of memory means "does not fit"
            if not is_out_of_memory(exc):
                raise
            return False
        finally:
            x = None  # noqa: F841
            path.optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    batch = largest_batch(fits, args.batch_size, args.max_batch_size)
    out: dict = {"batch_size": batch}
    if batch == 0:
        return out
    from kronos_mlflow.config.core import load_config

    steps = max(args.epoch_steps, 2)
    cfg = load_config({**config, "batch_size": batch, "n_train_iter": batch * steps})
    from kronos_mlflow.data import prepare_splits

    prepare_splits(cfg, progress=False)
    rates = []
    for e in range(max(1, args.epochs)):
        seconds, samples = path.epoch(cfg, epoch_seed=e)
        rates.append(samples / seconds)
    out.update({"epoch_samples_per_s": _median(rates), "epoch_samples_per_s_all": rates,
                "peak_memory_gib": (torch.cuda.max_memory_allocated(device) / 2**30
                                    if device.type == "cuda" else None)})
    return out


def _print_table(r: dict, args) -> None:
    print(f"kronos_mlflow training benchmark: {r['device']}, batch {r['batch_size']} x window {r['window']}, "
          f"model {r['model']}, torch {r['torch']}, {r['cpus']} CPUs, {r['num_threads']} threads "
          f"(interop {r['interop_threads']})")
    for name, s in r.get("settings", {}).items():
        resolved = r.get("resolved", {}).get(name, "")
        print(f"  {name}: {s}{'  -> ' + str(resolved) if resolved else ''}")
    print(f"{'measure':46s} " + " ".join(f"{n:>14s}" for n in r["paths"]))
    print("-" * (47 + 15 * len(r["paths"])))

    def row(label, key, fmt):
        vals = [r["per_path"][n].get(key) for n in r["paths"]]
        print(f"{label:46s} " + " ".join(f"{format(v, fmt) if v is not None else '-':>14s}" for v in vals))

    row("step time, median (s)", "step_s_median", ".3f")
    print(f"{'  min .. max (s)':46s} " + " ".join(
        f"{'%.3f..%.3f' % tuple(r['per_path'][n]['step_s_min_max']):>14s}" for n in r["paths"]))
    row("step samples/s (median)", "step_samples_per_s", ".2f")
    row("minor page faults per step (median)", "minor_page_faults_per_step", ".0f")
    row("achieved GFLOP/s", "achieved_gflops", ".1f")
    row("fraction of the matmul figure (median of rounds)", "fraction_of_matmul", ".3f")
    print(f"{'  min .. max over rounds':46s} " + " ".join(
        f"{'%.3f..%.3f' % tuple(r['per_path'][n]['fraction_of_matmul_min_max']):>14s}" for n in r["paths"]))
    if args.epoch_steps > 0:
        row(f"epoch samples/s (data + steps), median of {args.epochs}", "epoch_samples_per_s", ".2f")
        row("epoch / step (each epoch vs steps just before)", "epoch_vs_step", ".3f")
        row("  other processes' CPU share, worst epoch", "epoch_other_processes_cpu_share", ".3f")
    row_s = r["setup_and_warmup_s"]
    print(f"{'setup + warm-up steps (s)':46s} " + " ".join(f"{row_s[n]:14.1f}" for n in r["paths"]))
    print(f"{'fp32 matmul %d^3 GFLOP/s (median)' % args.matmul_size:46s} {r['matmul_gflops']:14.1f}"
          f"   (min {r['matmul_gflops_min_max'][0]:.1f}, max {r['matmul_gflops_min_max'][1]:.1f})")
    print(f"{'FLOPs per sample (fwd + bwd, counted)':46s} {r['flops_per_sample'] / 1e9:13.3f}G")
    if r.get("other_processes_cpu_share") is not None:
        print(f"{'other processes CPU share while timing steps':46s} {r['other_processes_cpu_share']:14.3f}"
              "   (noise: above ~0.05 the machine was shared)")
    kinds = r.get("flops_per_sample_by_kind") or {}
    if kinds:
        print(f"{'  of which':46s} " + ", ".join(f"{k} {v / r['flops_per_sample']:.1%}" for k, v in
                                                  sorted(kinds.items(), key=lambda kv: -kv[1])))
    if "step_speedup_vs_plain" in r:
        print(f"{'fast / plain, step samples/s':46s} {r['step_speedup_vs_plain']:14.3f}")
    if "epoch_speedup_vs_plain" in r:
        print(f"{'fast / plain, epoch samples/s':46s} {r['epoch_speedup_vs_plain']:14.3f}")
    lb = r.get("largest_batch")
    if lb:
        rate = lb.get("epoch_samples_per_s")
        print(f"{'largest batch that fits (fast path)':46s} {lb['batch_size']:14d}"
              + (f"   epoch samples/s there {rate:.1f}" if rate else ""))
    for name in r["paths"]:
        bd = r["per_path"][name].get("breakdown")
        if not bd:
            continue
        print(f"{name} step by operator kind (profiled, {bd['profiled_step_s']:.3f} s/step): " + ", ".join(
            f"{k} {v:.1%}" for k, v in bd["shares"].items()))
        if bd["matmul_fraction_of_matmul_figure"] is not None:
            print(f"  its matmuls run at {bd['matmul_fraction_of_matmul_figure']:.3f} of the matmul figure "
                  f"({bd['matmul_gflops_near']:.0f} GFLOP/s, measured just before); "
                  f"with everything else free the step would be at {bd['fraction_if_only_matmuls']:.3f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
