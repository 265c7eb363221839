"""Where the scorecard's time goes, and what the backtest's daily signal, its controls and
calibration cost.

    python benchmarks/bench_scorecard.py                        # the quick start's sizes, the demo market
    python benchmarks/bench_scorecard.py --variants 0:0 1:20 5:20 --repeats 3 --json
    python benchmarks/bench_scorecard.py --variants 10:20:off 10:20:on --figures docs/images

One process, the cached demo market (made once), a fresh pair in the config's default
architecture (what `mlflow run . -e pipeline` trains from; forecasting costs the same with any
weights), both pairs the same weights (fine-tuned and zero-shot cost alike). Per variant
``STRIDE:RANDOMS[:CALIBRATION]`` (``backtest_signal_stride``, ``backtest_n_random``,
``calibration`` on by default) it times, over ``--repeats`` rounds (medians):

- ``origins``: the test origins and the signal origins (the data read from the prepared cache);
- ``forecast``: the scorecard's forecasts and scores of the two pairs and the naive ones;
- ``signal``: the signal's own forecasts (0 when the stride is 0: the scorecard's origins);
- ``calibration``: the fine-tuned pair's forecasts of the calibration origins and the fit;
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

from kronos_mlflow.config.core import load_config  # noqa: E402
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


def one_round(base: dict, stride: int, randoms: int, out: Path, calibration: str = "on") -> dict[str, float]:
    config = load_config({**base, "backtest_signal_stride": stride, "backtest_n_random": randoms,
                          "calibration": calibration})
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
    times["calibration"] = card.seconds.get("calibration", 0.0)
    times["forecast"] = both - times["signal"] - times["calibration"]
    t = time.perf_counter()
    sc_mod.add_backtest(card, config, out, _Null())
    times["backtest"] = time.perf_counter() - t
    t = time.perf_counter()
    sc_mod.write_artifacts(card, out)
    times["artifacts"] = time.perf_counter() - t
    times["total"] = sum(times.values())
    times["origins_n"], times["signal_origins_n"] = len(origins), len(daily)
    times["excess_return_fine_tuned"] = card.metrics.get("backtest_fine_tuned_excess_return_with_cost", float("nan"))
    times["calibration_origins_n"] = card.metrics.get("calibration_origins", 0.0)
    times["card"] = card
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["0:0", "5:20", "1:20"],
                        help="STRIDE:RANDOMS pairs (backtest_signal_stride:backtest_n_random)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    parser.add_argument("--figures", default="", metavar="DIR",
                        help="write the last round's pit.png and reliability.png here (as calibration-pit.png, "
                             "calibration-reliability.png) and print its calibration numbers")
    args = parser.parse_args(argv)
    from kronos_mlflow.stages import build_registry

    build_registry()  # as every command does before it loads a config
    base = dict(load_config({k: v for k, v in (item.split("=", 1) for item in args.set)}))
    base.update(comet="off")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("KRONOS_MLFLOW_HOME", str(Path(tmp) / "home"))
        base["dataset_path"] = str(Path(tmp) / "cache")
        provide_qlib_data(base)
        results = {}
        card = None
        for variant in args.variants:
            stride, randoms, *cal = variant.split(":")
            rounds = [one_round(base, int(stride), int(randoms), Path(tmp) / f"out-{variant}-{i}", *cal)
                      for i in range(args.repeats)]
            card = rounds[-1].pop("card")
            for r in rounds[:-1]:
                r.pop("card")
            results[variant] = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
        if args.figures and card is not None:
            figures(card, Path(args.figures))
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
              "threads": torch.get_num_threads(), "repeats": args.repeats, "variants": results}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['machine']}; medians of {args.repeats} round(s), seconds")
    keys = ("origins", "forecast", "signal", "calibration", "backtest", "artifacts", "total")
    print(f"{'variant':>15} " + " ".join(f"{k[:11]:>11}" for k in keys)
          + "   origins  signal origins  calibration origins")
    for variant, r in results.items():
        print(f"{variant:>15} " + " ".join(f"{r[k]:11.1f}" for k in keys)
              + f"   {int(r['origins_n']):7,}  {int(r['signal_origins_n']):14,}  {int(r['calibration_origins_n']):19,}")
    return 0


def figures(card, directory: Path) -> None:
    """The card's PIT histogram and reliability diagram for the docs, and its numbers."""
    from kronos_mlflow.evaluation.figures import pit_figure, reliability_figure

    directory.mkdir(parents=True, exist_ok=True)
    for name, draw in (("calibration-pit.png", pit_figure), ("calibration-reliability.png", reliability_figure)):
        draw(card).savefig(directory / name, format="png", dpi=90)
    print(card.calibration_line())
    shown = ("coverage_50", "coverage_80", "coverage_90", "pit_ks", "brier_up", "brier_skill_up", "wql_close",
             "crps_close")
    for name, prefix in sc_mod.PREFIXES.items():
        values = [f"{k} {card.metrics[prefix + k]:.3f}" for k in shown if prefix + k in card.metrics]
        if values:
            print(f"  {name}: " + ", ".join(values))
    for tag in ("verdict_vs_histvol", "verdict_wql_vs_histvol", "verdict_calibrated_vs_raw"):
        print(f"  {tag}: {card.tags.get(tag)}")
    print(f"  base rate {card.metrics.get('base_rate_up', float('nan')):.3f}, its Brier "
          f"{card.metrics.get('base_rate_test_brier_up', float('nan')):.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
