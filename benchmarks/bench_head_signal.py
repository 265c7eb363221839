"""What the return head's served signal costs beside the paths, measured in one run.

    python benchmarks/bench_head_signal.py                  # default sizes, 5 timed repeats
    python benchmarks/bench_head_signal.py --series 64 --repeats 7 --json

A fresh predictor at the config's default sizes (its tokenizer, lookback 90, predict_window 10)
with a return head: for one batch of ``--series`` lookback windows, the forecaster's paths
(:func:`kronos_mlflow.serving.forecasting.forecast`: ``inference_sample_count`` 5 paths of
``predict_window`` bars, the scorecard's sampling) against the head's signal
(:func:`kronos_mlflow.serving.forecasting.head.signal`: one forward over the lookback's tokens).
The two alternate after a warm-up, so both see the same machine. Reported: the median seconds
per call of each and per series, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np
import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--series", type=int, default=32, help="lookback windows per call (default 32)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each (default 5)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import pandas as pd

    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosPredictor, KronosTokenizer
    from kronos_mlflow.model.return_head import ReturnHead
    from kronos_mlflow.serving.forecasting import forecast
    from kronos_mlflow.serving.forecasting.head import signal
    from kronos_mlflow.stages import build_registry
    from kronos_mlflow.stages.predictor.sources import build_predictor

    build_registry()
    config = load_config({})
    lookback, horizon = int(config["lookback_window"]), int(config["predict_window"])
    samples = int(config["inference_sample_count"])
    torch.manual_seed(0)
    tokenizer = KronosTokenizer(**model_kwargs(config)).eval()
    model = build_predictor({**config, "pretrained_predictor_path": ""}, tokenizer).eval()
    predictor = KronosPredictor(model, tokenizer, device="cpu", max_context=int(config["max_context"]),
                                clip=float(config["clip"]))
    head = ReturnHead(model.d_model).eval()
    rng = np.random.default_rng(0)
    close = 20 * np.exp(np.cumsum(rng.normal(0, 0.02, (args.series, lookback)), axis=1))
    vol = rng.uniform(1e4, 1e5, close.shape)
    bars = np.stack([close * 0.99, close * 1.01, close * 0.98, close, vol, vol * close], axis=-1).astype(np.float32)
    days = pd.bdate_range("2023-01-02", periods=lookback + horizon)
    stamps = np.tile(((days - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1)).to_numpy(), (args.series, 1))
    x = {"bars": bars, "timestamps": stamps.astype(np.int64)}

    def paths():
        forecast(predictor, x, horizon, T=float(config["inference_T"]), top_p=float(config["inference_top_p"]),
                 sample_count=samples, seed=0)

    def head_signal():
        signal(predictor, head, bars, x["timestamps"])

    kinds = {"paths": paths, "signal": head_signal}
    for run in kinds.values():  # warm-up
        run()
    seconds: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for name, run in kinds.items():
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    out = {"series": args.series, "lookback": lookback, "predict_window": horizon, "sample_count": samples,
           "d_model": int(model.d_model), "threads": torch.get_num_threads(), "machine": platform.machine(),
           "paths_s": med["paths"], "signal_s": med["signal"],
           "paths_ms_per_series": 1000 * med["paths"] / args.series,
           "signal_ms_per_series": 1000 * med["signal"] / args.series, "ratio": med["signal"] / med["paths"],
           "repeats": args.repeats}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.series} series, lookback {lookback}: paths ({samples} x {horizon} bars) {med['paths']:.3f} s, "
              f"the head's signal {med['signal']:.3f} s (median of {args.repeats}; ratio {out['ratio']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
