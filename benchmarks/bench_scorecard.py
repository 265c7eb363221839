"""Where the scorecard's time goes, and what the backtest's daily signal and controls cost.

    python benchmarks/bench_scorecard.py                        # the quick start's sizes, the demo market
    python benchmarks/bench_scorecard.py --variants 0:0 1:20 5:20 --repeats 3 --json

One process, the cached demo market (made once), a fresh pair in the config's default
architecture (what `mlflow run . -e pipeline` trains from; forecasting costs the same with any
weights), both pairs the same weights (fine-tuned and zero-shot cost alike). Per variant
``STRIDE:RANDOMS`` (``backtest_signal_stride``, ``backtest_n_random``) it times, over
``--repeats`` rounds (medians):

- ``origins``: the test origins and the signal origins (the data read from the prepared cache);
- ``forecast``: the scorecard's forecasts and scores of the two pairs and the naive ones;
- ``signal``: the signal's own forecasts (0 when the stride is 0: the scorecard's origins);
- ``backtest``: Qlib's backtests of the two signals, the negated one and the random ones;
- ``artifacts``: scorecard.json, the PNGs and the parquet files;

and ``total``. ``0:0`` is what earlier versions did (the signal on origin dates, no controls).
Nothing is downloaded; the outputs go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kronos_mlflow.config import load_config  # noqa: E402
from kronos_mlflow.data import provide_qlib_data  # noqa: E402
from kronos_mlflow.evaluation import scorecard as sc_mod  # noqa: E402
from kronos_mlflow.evaluation.origins import forecast_origins, signal_origins  # noqa: E402
from kronos_mlflow.model import KronosPredictor  # noqa: E402
from kronos_mlflow.stages import get as get_stage  # noqa: E402


class _Null:
    """A logger that records nothing (the benchmark times the work, not the tracking)."""

    def log_artifact(self, *a, **k):
        pass

    def log_metrics(self, *a, **k):
        pass

    def set_tags(self, *a, **k):
        pass


def pair(config):
    torch.manual_seed(int(config["seed"]))
    tokenizer = get_stage("tokenizer").build_model(config).eval()
    model = get_stage("predictor").build_model(config, tokenizer=tokenizer).eval()
    return KronosPredictor(model, tokenizer, device="cpu", max_context=int(config["max_context"]),
                           clip=float(config["clip"]))


def one_round(base: dict, stride: int, randoms: int, out: Path) -> dict[str, float]:
    config = load_config({**base, "backtest_signal_stride": stride, "backtest_n_random": randoms})
    predictor = pair(config)
    times: dict[str, float] = {}
    t = time.perf_counter()
    origins = forecast_origins(config)
    daily = signal_origins(config) if stride else origins
    times["origins"] = time.perf_counter() - t
    t = time.perf_counter()
    card = sc_mod.score_forecasters(config, {"finetuned": predictor, "zeroshot": predictor}, origins=origins)
    both = time.perf_counter() - t
    times["signal"] = sum(card.signal_seconds.values())
    times["forecast"] = both - times["signal"]
    t = time.perf_counter()
    sc_mod.add_backtest(card, config, out, _Null())
    times["backtest"] = time.perf_counter() - t
    t = time.perf_counter()
    sc_mod.write_artifacts(card, out)
    times["artifacts"] = time.perf_counter() - t
    times["total"] = sum(times.values())
    times["origins_n"], times["signal_origins_n"] = len(origins), len(daily)
    times["excess_return_fine_tuned"] = card.metrics.get("backtest_fine_tuned_excess_return_with_cost", float("nan"))
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["0:0", "5:20", "1:20"],
                        help="STRIDE:RANDOMS pairs (backtest_signal_stride:backtest_n_random)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)
    base = dict(load_config({k: v for k, v in (item.split("=", 1) for item in args.set)}))
    base.update(comet="off")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("KRONOS_MLFLOW_HOME", str(Path(tmp) / "home"))
        base["dataset_path"] = str(Path(tmp) / "cache")
        provide_qlib_data(base)
        results = {}
        for variant in args.variants:
            stride, randoms = (int(v) for v in variant.split(":"))
            rounds = [one_round(base, stride, randoms, Path(tmp) / f"out-{variant}-{i}") for i in range(args.repeats)]
            results[variant] = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
              "threads": torch.get_num_threads(), "repeats": args.repeats, "variants": results}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['machine']}; medians of {args.repeats} round(s), seconds")
    keys = ("origins", "forecast", "signal", "backtest", "artifacts", "total")
    print(f"{'stride:randoms':>15} " + " ".join(f"{k:>9}" for k in keys) + "   origins  signal origins")
    for variant, r in results.items():
        print(f"{variant:>15} " + " ".join(f"{r[k]:9.1f}" for k in keys)
              + f"   {int(r['origins_n']):7,}  {int(r['signal_origins_n']):14,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
