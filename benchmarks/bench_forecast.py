"""Forecasting and predictor-training benchmark, ours against upstream Kronos on the same weights.

    python benchmarks/bench_forecast.py                                   # ours alone: Kronos-small's architecture
    python benchmarks/bench_forecast.py --upstream ~/src/Kronos           # + equality figures and upstream's timings
    python benchmarks/bench_forecast.py --upstream ~/src/Kronos --arch mini --series 4 --lookback 64 --pred-len 8 --repeats 1
    python benchmarks/bench_forecast.py --upstream ~/src/Kronos --json    # one JSON line
    python benchmarks/bench_forecast.py --upstream ~/src/Kronos --predictor models/Kronos-small --tokenizer models/Kronos-Tokenizer-base

``--upstream`` is a checkout of https://github.com/shiyu-coder/Kronos (its ``model/`` package is
imported from there; it needs ``einops``). Everything runs in one process, by default on random
weights: the tokenizer in the published base architecture, the predictor in ``--arch``'s (mini,
small, base), built by upstream's class and ours from one seed; ``--predictor`` /
``--tokenizer`` use checkpoint directories instead (loaded by ours, copied into upstream's).

What it measures:

- equality (with ``--upstream``): whether one seed builds the same fresh weights in both
  classes; the worst absolute difference of s1/s2 logits (eval mode; train mode from the same
  random state, dropout and the sampled s1 included) and of every gradient of the training
  loss; the tokenizer's tokens; the forecast of upstream's ``auto_regressive_inference`` and
  ours, greedy (``top_k=1``, the timed runs), sampled from one seed, and with a window that
  rolls (lookback + pred_len > max_context);
- forecast time: ``auto_regressive_inference`` of ``--series`` series x ``--sample-count`` paths,
  ``--lookback`` bars, ``--pred-len`` steps, ``--max-context``; upstream's and ours interleaved
  over ``--repeats`` rounds, medians and their ratio; and how far ``cross_rope="positions"``
  moves ours from upstream's forecast (share of generated tokens that differ);
- training-step time: forward (s2 on a sampled s1, as upstream trains), ``(CE_s1 + CE_s2) / 2``,
  backward, ``clip_grad_norm_(3.0)``, AdamW step, on one batch of ``--train-batch`` windows of
  ``--train-window`` tokens; upstream's model with torch's default AdamW against ours with the
  AdamW kernel and allocator setting training picks (``adamw_impl`` auto: fused where torch
  has it; ``malloc_reuse`` auto: freed memory kept under glibc) and, with
  ``--compile``, ``torch.compile`` (with inductor's ``fallback_random``, so its dropout masks and
  sampled s1 are eager's draws: its logits and gradients are compared with upstream's too);
  interleaved over ``--train-rounds`` rounds, medians, ratio.

Nothing is downloaded and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kronos_mlflow.model import BASE_CONFIG, PREDICTOR_CONFIGS, Kronos, KronosTokenizer  # noqa: E402
from kronos_mlflow.model.decoding import IncrementalDecoder  # noqa: E402
from kronos_mlflow.model.forecast import auto_regressive_inference, decode_paths, generate_tokens  # noqa: E402


def import_upstream(path: str):
    """Upstream's ``model.kronos`` module from a checkout (its ``model`` package on sys.path)."""
    root = Path(path).expanduser().resolve()
    if not (root / "model" / "kronos.py").is_file():
        sys.exit(f"--upstream {path}: no model/kronos.py there; expected a checkout of shiyu-coder/Kronos")
    sys.path.insert(0, str(root))
    try:
        from model import kronos  # type: ignore[import-not-found]
    except ImportError as exc:
        sys.exit(f"--upstream {path}: importing its model package failed ({exc}); pip install what it names")
    return kronos


def build_models(upstream, args):
    """(ours, theirs) for the tokenizer and the predictor with equal weights (theirs None without
    upstream), and whether one seed gave both classes the same fresh predictor weights."""
    if args.tokenizer:
        tokenizer = KronosTokenizer.from_pretrained(args.tokenizer)
    else:
        torch.manual_seed(args.seed)
        tokenizer = KronosTokenizer(**BASE_CONFIG)
    torch.manual_seed(args.seed + 1)
    model = Kronos.from_pretrained(args.predictor) if args.predictor else Kronos(**PREDICTOR_CONFIGS[f"Kronos-{args.arch}"])
    if upstream is None:
        return (tokenizer.eval(), model.eval()), None, None
    u_tokenizer = upstream.KronosTokenizer(**tokenizer.config)
    u_tokenizer.load_state_dict(tokenizer.state_dict())
    torch.manual_seed(args.seed + 1)
    u_model = upstream.Kronos(**model.config)
    ours, theirs = model.state_dict(), u_model.state_dict()
    same_init = list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    u_model.load_state_dict(ours)  # a no-op for fresh weights; the checkpoint's otherwise
    return (tokenizer.eval(), model.eval()), (u_tokenizer.eval(), u_model.eval()), None if args.predictor else same_init


def random_batch(batch: int, length: int, s1_bits: int, s2_bits: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    s1 = torch.randint(0, 2 ** s1_bits, (batch, length + 1), generator=gen)
    s2 = torch.randint(0, 2 ** s2_bits, (batch, length + 1), generator=gen)
    return s1, s2, random_stamps(batch, length, gen)


def random_stamps(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    cols = [torch.randint(0, n, (batch, length), generator=gen) for n in (60, 24, 7, 32, 13)]
    return torch.stack(cols, dim=-1).float()


def max_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


# ----------------------------------------------------------------------------- equality


def logits_and_grads(model, s1, s2, stamp, seed: int, train: bool):
    model.train(train)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    s1_logits, s2_logits = model(s1[:, :-1], s2[:, :-1], stamp)
    loss = model.head.compute_loss(s1_logits, s2_logits, s1[:, 1:], s2[:, 1:])[0]
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model.eval()
    return s1_logits.detach(), s2_logits.detach(), grads


def forecast_inputs(series: int, lookback: int, pred_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(series, lookback, 6, generator=gen).clamp(-5, 5)
    return x, random_stamps(series, lookback, gen), random_stamps(series, pred_len, gen)


def forecast_pair(upstream, ours, theirs, inputs, max_context, pred_len, sample_count, seed, **sampling):
    """(ours, upstream's) ``auto_regressive_inference`` outputs from one random state."""
    args = dict(max_context=max_context, pred_len=pred_len, clip=5, sample_count=sample_count, verbose=False,
                **sampling)
    torch.manual_seed(seed)
    a = auto_regressive_inference(*ours, *inputs, **args)
    torch.manual_seed(seed)
    b = upstream.auto_regressive_inference(*theirs, *inputs, **args)
    return a, b


def equality(upstream, ours, theirs, args) -> dict:
    model, u_model = ours[1], theirs[1]
    cfg = model.config
    s1, s2, stamp = random_batch(args.train_batch, args.train_window, cfg["s1_bits"], cfg["s2_bits"], args.seed)
    out: dict = {}
    for mode, train in (("eval", False), ("train", True)):
        a1, a2, ga = logits_and_grads(model, s1, s2, stamp, args.seed + 7, train)
        b1, b2, gb = logits_and_grads(u_model, s1, s2, stamp, args.seed + 7, train)
        out[f"logits_{mode}_max_abs_diff"] = max(max_diff(a1, b1), max_diff(a2, b2))
        out[f"grads_{mode}_max_abs_diff"] = max(max_diff(x, y) for x, y in zip(ga, gb))
    x, _, _ = forecast_inputs(4, 64, 1, args.seed)
    with torch.no_grad():
        a, b = ours[0].encode(x, half=True), theirs[0].encode(x, half=True)
        out["tokenizer_tokens_identical"] = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
        out["tokenizer_decode_max_abs_diff"] = max_diff(ours[0].decode(a, half=True), theirs[0].decode(b, half=True))
    small = forecast_inputs(4, 64, 8, args.seed + 1)
    a, b = forecast_pair(upstream, ours, theirs, small, 512, 8, 3, args.seed, T=1.0, top_k=0, top_p=0.9)
    out["sampled_forecast_max_abs_diff"] = max_diff(a, b)
    rolling = forecast_inputs(4, 60, 8, args.seed + 2)
    a, b = forecast_pair(upstream, ours, theirs, rolling, 64, 8, 3, args.seed, T=1.0, top_k=0, top_p=0.9)
    out["rolling_forecast_max_abs_diff"] = max_diff(a, b)
    return out


# ----------------------------------------------------------------------------- timing


def time_forecasts(upstream, ours, theirs, args) -> dict:
    inputs = forecast_inputs(args.series, args.lookback, args.pred_len, args.seed + 3)
    call = dict(max_context=args.max_context, pred_len=args.pred_len, clip=5, T=1.0, top_k=1, top_p=0.9,
                sample_count=args.sample_count, verbose=False)
    runs: dict[str, list[float]] = {"ours": [], "upstream": []}
    outputs: dict[str, np.ndarray] = {}
    for r in range(args.repeats):
        order = [("ours", auto_regressive_inference, ours)]
        if upstream is not None:
            pair = ("upstream", upstream.auto_regressive_inference, theirs)
            order = [pair, *order] if r % 2 == 0 else [*order, pair]
        for name, fn, models in order:
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            outputs[name] = fn(*models, *inputs, **call)
            runs[name].append(time.perf_counter() - t0)
            print(f"  forecast round {r + 1}/{args.repeats}: {name} {runs[name][-1]:.2f} s", file=sys.stderr)
    out = {"forecast_ours_s": statistics.median(runs["ours"]), "forecast_ours_runs_s": runs["ours"]}
    if upstream is not None:
        out["forecast_upstream_s"] = statistics.median(runs["upstream"])
        out["forecast_upstream_runs_s"] = runs["upstream"]
        out["forecast_speedup"] = out["forecast_upstream_s"] / out["forecast_ours_s"]
        out["greedy_forecast_max_abs_diff"] = max_diff(outputs["ours"], outputs["upstream"])
        out["greedy_forecast_identical"] = bool(np.array_equal(outputs["ours"], outputs["upstream"]))
    return out


def cross_rope_effect(ours, args) -> dict:
    """How far ``cross_rope="positions"`` (the rotation training uses) moves ours from upstream's
    (the default): the mean total-variation distance of the first step's s2 distributions (same
    s1), the share of greedily generated tokens that differ, and the greedy forecast's worst
    difference in normalised units."""
    inputs = forecast_inputs(args.series, args.lookback, args.pred_len, args.seed + 3)
    call = dict(max_context=args.max_context, pred_len=args.pred_len, clip=5, T=1.0, top_k=1, top_p=0.9,
                sample_count=1, verbose=False)
    paths, forecasts = {}, {}
    for mode in ("upstream", "positions"):
        torch.manual_seed(args.seed)
        s1, s2 = generate_tokens(*ours, *inputs, cross_rope=mode, **call)
        paths[mode] = (s1[:, -args.pred_len:], s2[:, -args.pred_len:])
        forecasts[mode] = decode_paths(ours[0], s1, s2, args.max_context, 1)[:, 0, -args.pred_len:]
    tokenizer, model = ours
    with torch.inference_mode():  # the first step's s2 distribution given the same s1, both ways
        s1_hist, s2_hist = tokenizer.encode(torch.clip(inputs[0], -5, 5), half=True)
        probs = []
        for mode in ("upstream", "positions"):
            decoder = IncrementalDecoder(model, args.series, 1, args.lookback, 1, mode)
            s1_logits, h_last = decoder.prefill(s1_hist, s2_hist, inputs[1])
            probs.append(torch.softmax(decoder.s2_logits(h_last, s1_logits.argmax(-1, keepdim=True)), -1))
    return {
        "cross_rope_positions_s2_total_variation": float(0.5 * (probs[0] - probs[1]).abs().sum(-1).mean()),
        "cross_rope_positions_s1_tokens_differ": float((paths["upstream"][0] != paths["positions"][0]).float().mean()),
        "cross_rope_positions_s2_tokens_differ": float((paths["upstream"][1] != paths["positions"][1]).float().mean()),
        "cross_rope_positions_forecast_max_abs_diff": max_diff(forecasts["upstream"], forecasts["positions"]),
    }


def train_step_fn(model, optimizer, batch, step_model=None):
    s1, s2, stamp = batch
    forward = model if step_model is None else step_model

    def step():
        optimizer.zero_grad(set_to_none=True)
        s1_logits, s2_logits = forward(s1[:, :-1], s2[:, :-1], stamp)
        loss = model.head.compute_loss(s1_logits, s2_logits, s1[:, 1:], s2[:, 1:])[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=3.0)
        optimizer.step()
        return loss
    return step


#: glibc raises its mmap / trim thresholds as large blocks are freed, up to these, and they cannot
#: be reset once set; the upstream path runs with them there (see benchmarks/bench_train.py).
GLIBC_ADAPTIVE_CEILING = (32 << 20, 64 << 20)


def upstream_model(upstream, cfg: dict, like: torch.nn.Module):
    """Upstream's predictor holding ``like``'s weights."""
    model = upstream.Kronos(**cfg)
    model.load_state_dict(like.state_dict())
    return model


def time_train_steps(upstream, ours, theirs, args) -> dict:
    from kronos_mlflow.runtime.perf import (
        adamw_kwargs, configure_malloc, malloc_reuse_available, resolve_adamw, set_malloc_thresholds,
    )

    cfg = ours[1].config
    batch = random_batch(args.train_batch, args.train_window, cfg["s1_bits"], cfg["s2_bits"], args.seed + 4)
    hyper = dict(lr=4e-5, betas=(0.9, 0.95), weight_decay=0.1)
    model = Kronos(**cfg)
    model.load_state_dict(ours[1].state_dict())
    model.train()
    impl = resolve_adamw("auto", torch.device("cpu"))
    step_model = None
    extra: dict = {}
    if args.compile:
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True  # eager's draws: upstream's dropout masks and sampled s1
        step_model = torch.compile(model)
        if upstream is not None:  # the compiled step's numbers against upstream's eager ones, one random state
            a1, a2, ga = logits_and_grads(step_model, *batch, args.seed + 7, True)
            b1, b2, gb = logits_and_grads(upstream_model(upstream, cfg, model), *batch, args.seed + 7, True)
            extra = {"compiled_logits_train_max_abs_diff": max(max_diff(a1, b1), max_diff(a2, b2)),
                     "compiled_grads_train_max_abs_diff": max(max_diff(x, y) for x, y in zip(ga, gb))}
            model.train()
    steps = {"ours": train_step_fn(model, torch.optim.AdamW(model.parameters(), **hyper, **adamw_kwargs(impl)),
                                   batch, step_model)}
    if upstream is not None:
        u_model = upstream_model(upstream, cfg, ours[1]).train()
        steps["upstream"] = train_step_fn(u_model, torch.optim.AdamW(u_model.parameters(), **hyper), batch)
    times: dict[str, list[float]] = {name: [] for name in steps}
    reuse = malloc_reuse_available()
    for r in range(args.train_rounds):
        names = list(steps) if r % 2 == 0 else list(reversed(steps))
        for name in names:
            if reuse:  # ours: training's malloc_reuse (auto); upstream: glibc's adaptive thresholds at their ceiling
                configure_malloc("auto") if name == "ours" else set_malloc_thresholds(*GLIBC_ADAPTIVE_CEILING)
            steps[name]()  # untimed: switching models evicts caches
            for _ in range(args.train_steps):
                t0 = time.perf_counter()
                steps[name]()
                times[name].append(time.perf_counter() - t0)
        print(f"  train round {r + 1}/{args.train_rounds}: " + ", ".join(
            f"{n} {statistics.median(t):.3f} s" for n, t in times.items()), file=sys.stderr)
    out = {"train_step_ours_s": statistics.median(times["ours"]), "train_adamw_ours": impl,
           "train_malloc_reuse_ours": reuse, "train_compiled_ours": bool(args.compile), **extra}
    if upstream is not None:
        out["train_step_upstream_s"] = statistics.median(times["upstream"])
        out["train_step_speedup"] = out["train_step_upstream_s"] / out["train_step_ours_s"]
    return out


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", metavar="PATH", help="a checkout of shiyu-coder/Kronos to compare with")
    p.add_argument("--arch", choices=("mini", "small", "base"), default="small", help="predictor architecture")
    p.add_argument("--predictor", metavar="DIR", help="a predictor checkpoint instead of random weights")
    p.add_argument("--tokenizer", metavar="DIR", help="a tokenizer checkpoint instead of random weights")
    p.add_argument("--series", type=int, default=32)
    p.add_argument("--lookback", type=int, default=400)
    p.add_argument("--pred-len", type=int, default=20)
    p.add_argument("--sample-count", type=int, default=8)
    p.add_argument("--max-context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3, help="forecast rounds (each times upstream's and ours)")
    p.add_argument("--train-batch", type=int, default=50)
    p.add_argument("--train-window", type=int, default=100, help="tokens in (upstream: lookback 90 + predict 10)")
    p.add_argument("--train-steps", type=int, default=3, help="timed steps per path per round")
    p.add_argument("--train-rounds", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="time our training step under torch.compile")
    p.add_argument("--no-equality", action="store_true", help="skip the equality figures (timings only)")
    p.add_argument("--no-train", action="store_true", help="skip the training-step timing")
    p.add_argument("--no-forecast", action="store_true", help="skip the forecast timing")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    upstream = import_upstream(args.upstream) if args.upstream else None
    ours, theirs, same_init = build_models(upstream, args)
    result: dict = {
        "arch": args.predictor or f"Kronos-{args.arch}", "series": args.series, "lookback": args.lookback, "pred_len": args.pred_len,
        "sample_count": args.sample_count, "max_context": args.max_context, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "machine": platform.machine(),
    }
    if upstream is not None:
        if same_init is not None:
            result["same_fresh_weights"] = same_init
        if not args.no_equality:
            result.update(equality(upstream, ours, theirs, args))
    if not args.no_forecast:
        result.update(time_forecasts(upstream, ours, theirs, args))
        result.update(cross_rope_effect(ours, args))
    if not args.no_train:
        result.update(time_train_steps(upstream, ours, theirs, args))
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for key, value in result.items():
            shown = f"{value:.4g}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
