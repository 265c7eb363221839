"""Does the predictor's context carry a cross-sectional signal? The return head trained on a
fine-tuned predictor's frozen context, scored by rank IC beside the sampled paths' mean.

    python benchmarks/head_probe.py --run-dir outputs/models/finetune_predictor_demo/cfg-<digest> \\
        --config tiny.yaml --qlib-data-path ./demo_signal [--json]

``--run-dir``: a predictor run's directory (its ``checkpoints/best_model`` and
``checkpoints/tokenizer``); ``--config`` and ``--qlib-data-path``: what the run trained with. The
head (model/return_head.py) reads the predictor's context at each origin (the lookback's bars
z-scored with their own statistics, tokenized, their time features), the backbone frozen (no
gradient reaches it: the freeze mode's head), and trains on every validation origin of the run's
validation split (daily origins, forecast bars after training's end) with the correlation loss,
full batch, AdamW, ``--steps`` steps. It is scored on the test origins the scorecard scores
(``eval_stride``, ``n_eval_windows``): mean per-date rank IC against the actual return at the
horizon, its 95% bootstrap interval over dates and Newey-West t (evaluation/ic_stats.py); beside
it the same numbers of the paths' mean (the scorecard's ``test_rank_ic``, drawn here with the
run's inference settings) and of the validation origins the head was fit on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch


def _contexts(tokenizer, model, origins, config, batch: int = 512) -> np.ndarray:
    """(n, d_model): the predictor's context at each origin, from the lookback alone."""
    from kronos_mlflow.config.features import normalize_windows
    import pandas as pd
    from kronos_mlflow.model.return_head import ContextTap

    every = np.arange(len(origins))
    history = origins.history(every).astype(np.float32)
    past_times, _ = origins.times(every)
    t = pd.DatetimeIndex(past_times.reshape(-1))
    stamps_all = np.stack([t.minute, t.hour, t.day_of_week, t.day, t.month], axis=-1).reshape(*past_times.shape, 5)
    out = []
    with torch.no_grad(), ContextTap(model) as tap:
        for start in range(0, len(every), batch):
            part = slice(start, start + batch)
            x = torch.from_numpy(normalize_windows(history[part], history.shape[1], float(config["clip"])))
            stamps = stamps_all[part]
            s1, s2 = tokenizer.encode(x, half=True)
            model(s1, s2, torch.from_numpy(stamps).long(), use_teacher_forcing=True, s1_targets=s1)
            out.append(tap.context[:, -1].float().numpy())
    return np.concatenate(out)


def _targets(origins, config) -> np.ndarray:
    """The normalised return at the horizon: the close's move from the origin in the lookback's z units."""
    from kronos_mlflow.config.features import NORM_EPS
    from kronos_mlflow.evaluation.origins import CLOSE

    every = np.arange(len(origins))
    close = origins.history(every)[..., CLOSE]
    future = origins.future(every)[:, -1, CLOSE]
    return (future - close[:, -1]) / (close.std(axis=1) + NORM_EPS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--config", default="")
    p.add_argument("--qlib-data-path", default="")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-stride", type=int, default=1, help="bars between validation origins (default 1)")
    p.add_argument("--paths", action="store_true", help="also draw the paths on the test origins and score "
                   "their mean (the scorecard's test_rank_ic on the same origins)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from pathlib import Path

    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.config.yamlfile import read_mapping
    from kronos_mlflow.evaluation import forecasters as fc
    from kronos_mlflow.evaluation.ic_stats import rank_ic_summary
    from kronos_mlflow.evaluation.origins import CLOSE, forecast_origins
    from kronos_mlflow.model import Kronos, KronosPredictor, KronosTokenizer
    from kronos_mlflow.model.return_head import ReturnHead, correlation_loss
    from kronos_mlflow.stages import build_registry

    build_registry()
    values = read_mapping(args.config, "--config", "a YAML mapping of config keys") if args.config else {}
    config = load_config({**values, "qlib_data_path": args.qlib_data_path})
    run = Path(args.run_dir)
    tokenizer = KronosTokenizer.from_pretrained(str(run / "checkpoints" / "tokenizer")).eval()
    model = Kronos.from_pretrained(str(run / "checkpoints" / "best_model")).eval()
    t0 = time.perf_counter()
    val = forecast_origins(config, "val", stride=args.val_stride, limit=10**9)
    test = forecast_origins(config, "test")
    horizon = int(config["predict_window"])
    fit_x, fit_y = _contexts(tokenizer, model, val, config), _targets(val, config)
    test_x = _contexts(tokenizer, model, test, config)
    torch.manual_seed(args.seed)
    head = ReturnHead(model.d_model)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3, weight_decay=0.01)
    xs, ys = torch.from_numpy(fit_x)[:, None, :], torch.from_numpy(fit_y).float()
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = correlation_loss(head(xs, 0), ys)
        loss.backward()
        optimizer.step()
    head.eval()
    with torch.no_grad():
        val_signal = head(xs, 0).numpy()
        test_signal = head(torch.from_numpy(test_x)[:, None, :], 0).numpy()

    def actual_return(origins):
        every = np.arange(len(origins))
        return origins.future(every)[:, -1, CLOSE] / origins.history(every)[:, -1, CLOSE] - 1.0

    out = {}
    if args.paths:
        predictor = KronosPredictor(model, tokenizer, device="cpu", max_context=int(config["max_context"]),
                                    clip=float(config["clip"]))
        paths = fc.kronos_paths(predictor, test, config)
        every = np.arange(len(test))
        paths_signal = paths.mean(axis=1)[:, -1] / test.history(every)[:, -1, CLOSE] - 1.0
        out["paths_test"] = rank_ic_summary(test.dates, paths_signal, actual_return(test), horizon)
    out.update({"head_val": rank_ic_summary(val.dates, val_signal, actual_return(val), horizon),
           "head_test": rank_ic_summary(test.dates, test_signal, actual_return(test), horizon),
           "val_origins": len(val), "test_origins": len(test), "fit_loss": float(loss.detach()),
           "seconds": time.perf_counter() - t0, "head_parameters": sum(q.numel() for q in head.parameters())})
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for name in [k for k in ("head_val", "head_test", "paths_test") if k in out]:
            s = out[name]
            print(f"{name}: rank IC {s.get('rank_ic', float('nan')):+.4f} (95% CI {s.get('rank_ic_ci_low', float('nan')):+.4f}"
                  f" .. {s.get('rank_ic_ci_high', float('nan')):+.4f}), NW t {s.get('rank_ic_nw_t', float('nan')):.2f}, "
                  f"{int(s.get('ic_dates', 0))} dates")
        print(f"{len(val):,} validation origins, {len(test):,} test origins, {out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
