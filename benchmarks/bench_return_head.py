"""The return head's cost per training step against the plain predictor, measured in one run.

    python benchmarks/bench_return_head.py                     # default sizes, 8 timed steps each
    python benchmarks/bench_return_head.py --steps 20 --json

One training step of the predictor as the predictor stage takes it (tokenize the window under
no_grad, the forward on ``tokens[:, :-1]``, ``(CE_s1 + CE_s2) / 2``, backward, AdamW), with and
without the return head (model/return_head.py: the context tapped by a hook on the final norm,
the head at the origin, ``1 - corr`` against the normalised return, weight 1); and the stage's
own step (``train_step`` of ``PredictorStage``: clip included) with ``predictor_objective``
tokens and tokens+return, the joint training's step. The kinds of step alternate after a
warm-up, so all see the same machine. Sizes are the config defaults: a
fresh predictor (the config's sizes, Kronos-mini's dropouts), its tokenizer, a batch of 50 windows
of lookback 90 + horizon 10 + 1 bars. Reported: the median seconds per step of each, the ratio,
the head's parameters and the peak RSS (the process's: both kinds of step).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps of each kind (default 8)")
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.config.features import normalize_windows
    from kronos_mlflow.model import KronosTokenizer
    from kronos_mlflow.stages.predictor.sources import build_predictor
    from kronos_mlflow.model.return_head import ContextTap, ReturnHead, correlation_loss, return_target

    from kronos_mlflow.stages import build_registry

    build_registry()
    config = load_config({})
    lookback, horizon = int(config["lookback_window"]), int(config["predict_window"])
    torch.manual_seed(0)
    tokenizer = KronosTokenizer(**model_kwargs(config)).eval()
    model = build_predictor({**config, "pretrained_predictor_path": ""}, tokenizer).train()  # a fresh one
    head = ReturnHead(model.d_model).train()
    optimizer = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-5)
    raw = torch.randn(args.batch, lookback + horizon + 1, 6).cumsum(dim=1) + 100.0
    x = normalize_windows(raw, lookback, float(config["clip"]))
    stamp = torch.zeros(args.batch, x.shape[1], 5, dtype=torch.long)

    def step(with_head: bool) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            s1, s2 = tokenizer.encode(x, half=True)
        tap = ContextTap(model) if with_head else None
        try:
            s1_logits, s2_logits = model(s1[:, :-1], s2[:, :-1], stamp[:, :-1])
        finally:
            if tap is not None:
                tap.remove()
        loss = (F.cross_entropy(s1_logits.reshape(-1, s1_logits.shape[-1]), s1[:, 1:].reshape(-1))
                + F.cross_entropy(s2_logits.reshape(-1, s2_logits.shape[-1]), s2[:, 1:].reshape(-1))) / 2
        if with_head:
            loss = loss + correlation_loss(head(tap.context, lookback - 1), return_target(x, lookback, horizon))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - t0

    # The stage's own step (training/loop.train_step: the loss, clip, AdamW), predictor_objective
    # tokens and tokens+return (the head a submodule of the model, its tap kept on the final norm).
    from kronos_mlflow.model.return_head import attach
    from kronos_mlflow.stages.predictor.training import PredictorStage
    from kronos_mlflow.training.loop import train_step

    joint_config = {**config, "predictor_objective": "tokens+return"}
    staged = {}
    for name, cfg in (("tokens", config), ("joint", joint_config)):
        torch.manual_seed(0)
        m = attach(build_predictor({**config, "pretrained_predictor_path": ""}, tokenizer), cfg).train()
        staged[name] = (m, torch.optim.AdamW(m.parameters(), lr=1e-5), PredictorStage(tokenizer, cfg), cfg)

    def stage_step(name: str) -> float:
        m, opt, stage, cfg = staged[name]
        t0 = time.perf_counter()
        train_step(m, opt, x, cfg, "fp32", stage=stage, batch_stamp=stamp)
        return time.perf_counter() - t0

    kinds = {False: lambda: step(False), True: lambda: step(True), "tokens": lambda: stage_step("tokens"),
             "joint": lambda: stage_step("joint")}
    for run in kinds.values():  # warm-up
        run()
    times = {kind: [] for kind in kinds}
    for _ in range(args.steps):
        for kind, run in kinds.items():
            times[kind].append(run())
    plain, with_head = statistics.median(times[False]), statistics.median(times[True])
    stage_tokens, stage_joint = statistics.median(times["tokens"]), statistics.median(times["joint"])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)
    out = {"plain_s_per_step": plain, "head_s_per_step": with_head, "ratio": with_head / plain,
           "stage_tokens_s_per_step": stage_tokens, "stage_joint_s_per_step": stage_joint,
           "stage_ratio": stage_joint / stage_tokens,
           "head_parameters": sum(p.numel() for p in head.parameters()),
           "predictor_parameters": sum(p.numel() for p in model.parameters()), "peak_rss_mib": rss,
           "batch": args.batch, "window": int(x.shape[1]), "steps": args.steps, "threads": torch.get_num_threads(),
           "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"plain predictor step: {plain:.3f} s (median of {args.steps}); with the return head: {with_head:.3f} s "
              f"(x{with_head / plain:.3f}); head {out['head_parameters']:,} parameters beside the predictor's "
              f"{out['predictor_parameters']:,}; peak RSS {rss:.0f} MiB ({out['machine']})")
        print(f"the stage's step, predictor_objective tokens: {stage_tokens:.3f} s; tokens+return: {stage_joint:.3f} s "
              f"(x{stage_joint / stage_tokens:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
