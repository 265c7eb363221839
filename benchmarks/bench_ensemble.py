"""The ensemble's, ACI's and the weather table's figures and cost on a finished predictor run.

    python benchmarks/bench_ensemble.py --run-dir <predictor run directory> --evaluation <dir> [--out result.json]

``--run-dir``: the predictor run's directory (``checkpoints/``, ``evaluation/calibrator.json``,
``evaluation/ensemble.json`` where its calibration step wrote them); ``--evaluation``: the folder
holding the scored run's ``forecasts.parquet`` and ``scorecard.json`` (the pipeline's evaluation
child run's ``evaluation/`` artifacts). The config is the defaults (the quick start's data keys),
with ``KEY=VALUE`` overrides after ``--set``.

It forecasts the calibration (validation) origins once with the run's fine-tuned pair (as the
scorecard does: the same seed, the same paths), then times what the ensemble adds on top of the
scorecard: greedy selection and the mixture's conformal fit (``ensemble_fit``), the ensemble on
the test origins (``ensemble_test``), ACI over the test origins (``aci``) and the weather table
(``weather``); against the scorecard's own seconds (``scorecard.json``: each forecaster's
forecasts and the calibration). It checks that the weights it fits are the run's
(``ensemble.json``), then prints, per forecaster: WQL, coverage 50/80/90, PIT KS, and by
volatility tercile the 80% coverage and WQL; the weights; each conformalised forecaster's
recovery after the largest change of realised volatility; the cost.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _per_from_forecasts(frame, origins, history, actual):
    """Per forecaster: its scores recomputed from forecasts.parquet, in the origins' order."""
    import numpy as np

    from kronos_mlflow.evaluation import probabilistic as pr, scores as sc

    horizon = actual.shape[1]
    key = {(str(d)[:19], s): i for i, (d, s) in enumerate(zip(np.asarray(origins.dates).astype("datetime64[s]"),
                                                             origins.instruments))}
    per = {}
    for name, rows in frame.groupby("forecaster", sort=False):
        rows = rows.sort_values(["datetime", "instrument", "step"], kind="stable")
        first = rows[rows["step"] == 1]
        index = np.array([key[(str(np.datetime64(d, "s"))[:19], s)] for d, s in zip(first["datetime"].to_numpy(),
                                                                                     first["instrument"])])
        levels = np.full((len(origins), len(pr.QUANTILE_COLUMNS), horizon), np.nan)
        levels[index] = np.moveaxis(rows[pr.QUANTILE_COLUMNS].to_numpy().reshape(-1, horizon, len(pr.QUANTILE_COLUMNS)),
                                    2, 1)
        mean = np.full(actual.shape, np.nan)
        mean[index] = rows["mean"].to_numpy().reshape(-1, horizon)
        pit = np.full(actual.shape, np.nan)
        pit[index] = rows["pit"].to_numpy().reshape(-1, horizon)
        p_up = np.full(len(origins), np.nan)
        p_up[index] = first["p_up"].to_numpy()
        per[name] = sc.distribution_scores({"levels": levels, "mean": mean, "pit": pit, "p_up": p_up,
                                            "crps_steps": np.full(actual.shape, np.nan)}, history, actual)
    return per


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--evaluation", required=True, type=Path)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--wait", type=float, default=0.0, help="seconds to wait for --evaluation's files")
    parser.add_argument("--repeat", type=int, default=5, help="times each added piece is timed (the median is quoted)")
    args = parser.parse_args(argv)

    import numpy as np
    import pandas as pd
    import torch

    from kronos_mlflow.config import core as cfg
    from kronos_mlflow.config.layout import RunLayout
    from kronos_mlflow.evaluation import aci, calibration as cb, ensemble as en, probabilistic as pr, scores as sc
    from kronos_mlflow.evaluation import weather as wx
    from kronos_mlflow.evaluation.forecast_run import pair
    from kronos_mlflow.evaluation.origins import CLOSE, forecast_origins
    from kronos_mlflow.evaluation.scorecard import PREFIXES, fit_calibrator
    from kronos_mlflow.model import KronosTokenizer
    from kronos_mlflow.serving.forecasting import ensemble as served

    from kronos_mlflow.stages import build_registry

    build_registry()
    config = cfg.load_config(dict(item.split("=", 1) for item in args.set))
    layout = RunLayout(args.run_dir)
    test = forecast_origins(config)
    every = np.arange(len(test))
    history, actual = test.history(every)[..., CLOSE], test.future(every)[..., CLOSE]
    u = pr.uniforms(int(config["seed"]), actual.shape)

    device = torch.device("cpu")
    tokenizer = KronosTokenizer.from_pretrained(str(layout.tokenizer), map_location=device).eval()
    cal_origins = cb.origins_for(config, test)
    keep: dict = {}
    started = time.time()
    fit_calibrator(pair(tokenizer, layout.best_model, config, device), cal_origins, config, keep=keep)
    seconds = {"validation_forecasts_and_calibrator": time.time() - started}

    timings: dict[str, list[float]] = {}

    def timed(name, work):
        """``work()``'s result; its seconds ``--repeat`` times, the median in ``seconds[name]``."""
        for _ in range(max(1, args.repeat)):
            started = time.perf_counter()
            out = work()
            timings.setdefault(name, []).append(time.perf_counter() - started)
        seconds[name] = float(np.median(timings[name]))
        return out

    ensemble, losses = timed("ensemble_fit", lambda: en.build_for(config, keep))
    logged = Path(layout.root) / "evaluation" / served.FILE
    same = None
    if logged.is_file():
        same = served.read(str(logged)).weights == ensemble.weights
    waited = time.time()
    while not (args.evaluation / "forecasts.parquet").is_file() and time.time() - waited < args.wait:
        time.sleep(5)  # the scored run still scoring
    card = json.loads((args.evaluation / "scorecard.json").read_text())
    frame = pd.read_parquet(args.evaluation / "forecasts.parquet")
    per = _per_from_forecasts(frame, test, history, actual)
    raw = per["finetuned"]
    per[en.ENSEMBLE] = timed("ensemble_test", lambda: sc.distribution_scores(
        en.forecast(ensemble, raw, history, actual, u), history, actual))
    per[aci.ACI] = timed("aci", lambda: sc.distribution_scores(
        aci.scored_from(keep, ensemble, raw, per[en.ENSEMBLE], history, actual, test, float(config["aci_step"]), u),
        history, actual))
    metrics, tags, weather = timed("weather", lambda: wx.measure(per, test.dates, history, actual, PREFIXES))

    scorecard_seconds = float(sum(v for v in card.get("seconds", {}).values()))
    added = seconds["ensemble_fit"] + seconds["ensemble_test"] + seconds["aci"] + seconds["weather"]
    rows = []
    for name, scores in per.items():
        prefix = PREFIXES.get(name)
        if prefix is None:
            continue
        kept = sc.summary(scores, test.dates, direction=False)
        row = {"forecaster": name, "wql": kept.get("wql_close", math.nan), "pit_ks": kept.get("pit_ks", math.nan)}
        row.update({f"cov{c}": kept.get(f"coverage_{c}", math.nan) for c in (50, 80, 90)})
        for k in (1, 2, 3):
            row[f"cov80_vol{k}"] = metrics.get(f"{prefix}coverage_80_vol{k}", math.nan)
            row[f"wql_vol{k}"] = metrics.get(f"{prefix}wql_close_vol{k}", math.nan)
        row["recovery_dates"] = metrics.get(f"{prefix}recovery_dates", math.nan)
        rows.append(row)
    table = pd.DataFrame(rows)
    quarters = {k: v for k, v in metrics.items() if "coverage_80_20" in k}
    result = {"table": rows, "weights": ensemble.weights, "validation_wql": losses, "weights_match_the_run": same,
              "vol_change_date": tags.get("vol_change_date"), "quarters": quarters, "seconds": seconds,
              "scorecard_seconds": card.get("seconds", {}), "timings": timings, "repeat": args.repeat, "scorecard_total": scorecard_seconds,
              "cost_ratio": (scorecard_seconds + added) / scorecard_seconds if scorecard_seconds else math.nan,
              "test_origins": len(test), "calibration_origins": len(cal_origins), "aci_step": float(config["aci_step"])}
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.precision", 3):
        print(table.to_string(index=False))
    print("weights:", {k: round(v, 3) for k, v in ensemble.weights.items()}, "same as the run's:", same)
    print("validation WQL:", {k: round(v, 4) for k, v in losses.items()})
    print("largest change of realised volatility:", result["vol_change_date"])
    print("coverage 80 by quarter:", {k: round(v, 3) for k, v in quarters.items()})
    print(f"cost (median of {args.repeat}): ensemble fit {seconds['ensemble_fit']:.3f}s, on test "
          f"{seconds['ensemble_test']:.3f}s, aci "
          f"{seconds['aci']:.3f}s, weather {seconds['weather']:.3f}s; scorecard {scorecard_seconds:.1f}s; ratio "
          f"{result['cost_ratio']:.4f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
