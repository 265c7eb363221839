"""Pruning pays: the same sweep with the default pruner and without pruning, on the demo market.

    nice -n 10 python benchmarks/bench_sweep.py --n-trials 6 --epochs 6

Both sweeps use the same sampler seed, tiny architecture and data, each in its own study and
MLflow store under a temporary directory. The sweep without pruning runs N_TRIALS trials of
EPOCHS epochs: its budget is N_TRIALS x EPOCHS trial-epochs. The sweep with the default pruner
gets the same budget (``--trial-epochs-budget``), so it runs more, mostly shorter trials.

Reported per sweep: trials (complete / pruned), trial-epochs spent, wall time, the best
validation loss at the end, the best at half the budget, and the trial-epochs it took to reach
the no-pruning sweep's final best (the best of complete trials, in trial order, counting every
trial's epochs up to and including the one that reached it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kronos_mlflow.training.trial import DEFAULT_PRUNER  # noqa: E402


def run_sweep(workdir: Path, pruner: str, n_trials: int, budget: int, args) -> dict:
    import optuna

    config = {
        "d_model": args.d_model, "n_heads": 2, "ff_dim": 2 * args.d_model, "n_enc_layers": 2, "n_dec_layers": 2,
        "s1_bits": 4, "s2_bits": 4, "lookback_window": 20, "predict_window": 5, "batch_size": args.batch_size,
        "n_train_iter": args.n_train_iter, "n_val_iter": args.n_val_iter, "log_interval": 10_000,
        "dataset_path": str(workdir.parent / "cache"),
    }
    (workdir / "cfg.yaml").write_text("".join(f"{k}: {v}\n" for k, v in config.items()))
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{workdir}/mlflow.db", TQDM_DISABLE="1",
               MLFLOW_DISABLE_TELEMETRY="true")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(name, None)
    storage = f"sqlite:///{workdir}/optuna.db"
    cmd = [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--config", str(workdir / "cfg.yaml"),
           "--storage", storage, "--study-name", "bench", "--qlib-data-path", "", "--comet", "off",
           "--epochs", str(args.epochs), "--n-trials", str(n_trials), "--sampler-seed", str(args.seed),
           "--pruner", pruner, "--output-dir", str(workdir / "out"), "--trial-epochs-budget", str(budget)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sweep with pruner {pruner} failed:\n{proc.stderr[-2000:]}")
    study = optuna.load_study(study_name="bench", storage=storage)
    trials = sorted(study.trials, key=lambda t: t.number)
    # the anytime curve: (trial-epochs spent so far, best complete value so far), in trial order
    curve, spent, best = [], 0, float("inf")
    for t in trials:
        spent += int(t.user_attrs.get("epochs_trained", 0))
        if t.state == optuna.trial.TrialState.COMPLETE:
            best = min(best, t.value)
        curve.append((spent, best))
    states = [t.state.name for t in trials]
    return {
        "pruner": pruner,
        "trials": len(trials),
        "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "trial_epochs": spent,
        "best_val_loss": study.best_value,
        "wall_s": round(wall, 1),
        "curve": curve,
    }


def best_within(curve, budget: int) -> float:
    """Best complete value among the trials finished within ``budget`` trial-epochs."""
    values = [b for spent, b in curve if spent <= budget]
    return min(values) if values else float("inf")


def epochs_to_reach(curve, target: float) -> int | None:
    for spent, best in curve:
        if best <= target:
            return spent
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-trials", type=int, default=6, help="trials of the sweep without pruning")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--pruner", default=DEFAULT_PRUNER, help="the pruner compared with none (default: the sweep's)")
    p.add_argument("--d-model", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-train-iter", type=int, default=256)
    p.add_argument("--n-val-iter", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = p.parse_args()
    budget = args.n_trials * args.epochs
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        os.environ.setdefault("KRONOS_MLFLOW_HOME", str(Path(tmp) / "home"))
        results = []
        for pruner, n_trials in (("none", args.n_trials), (args.pruner, 4 * args.n_trials)):
            workdir = Path(tmp) / pruner.replace(":", "_")
            workdir.mkdir()
            results.append(run_sweep(workdir, pruner, n_trials, budget, args))
    base, pruned = results
    for r in results:
        r["best_at_half_budget"] = best_within(r["curve"], budget // 2)
        r["best_at_budget"] = best_within(r["curve"], budget)
        r["epochs_to_reach_no_pruning_best"] = epochs_to_reach(r["curve"], base["best_val_loss"])
    cols = ("pruner", "trials", "complete", "pruned", "trial_epochs", "best_at_half_budget", "best_at_budget",
            "epochs_to_reach_no_pruning_best", "wall_s")
    print(f"budget {budget} trial-epochs ({args.n_trials} trials x {args.epochs} epochs without pruning), "
          f"sampler seed {args.seed}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        cells = [f"{r[c]:.6f}" if c.startswith("best") else ("not reached" if r[c] is None else str(r[c]))
                 for c in cols]
        print("| " + " | ".join(cells) + " |")
    reach = pruned["epochs_to_reach_no_pruning_best"]
    as_good = pruned["best_at_budget"] <= base["best_at_budget"]
    print(f"at an equal budget of {budget} trial-epochs: {pruned['best_at_budget']:.6f} with {args.pruner} vs "
          f"{base['best_at_budget']:.6f} without pruning ({'as good or better' if as_good else 'WORSE'})")
    if reach is None:
        print(f"{args.pruner} did NOT reach the no-pruning best {base['best_val_loss']:.6f} within the budget")
    else:
        print(f"{args.pruner} reached the no-pruning best {base['best_val_loss']:.6f} after {reach} trial-epochs, "
              f"{reach / budget:.0%} of the no-pruning sweep's {base['trial_epochs']}")
    if args.json:
        print(json.dumps({"budget": budget, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
