"""Pruning pays: the same sweep with and without the median pruner, on the demo market.

    python benchmarks/bench_sweep.py --n-trials 8 --epochs 4

Both sweeps use the same sampler seed, model size and data, each in its own study and MLflow
store under a temporary directory. Reported per sweep: trial-epochs spent (the work), pruned
trials, wall time, and the best validation loss reached.
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


def run_sweep(workdir: Path, pruner: str, args) -> dict:
    import optuna
    from mlflow import MlflowClient

    config = {
        "d_model": args.d_model, "n_heads": 2, "ff_dim": 2 * args.d_model, "n_enc_layers": 2, "n_dec_layers": 2,
        "s1_bits": 6, "s2_bits": 6, "lookback_window": 40, "predict_window": 10, "batch_size": 25,
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
           "--epochs", str(args.epochs), "--n-trials", str(args.n_trials), "--sampler-seed", str(args.seed),
           "--pruner", pruner, "--output-dir", str(workdir / "out")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sweep with pruner {pruner} failed:\n{proc.stderr[-2000:]}")
    study = optuna.load_study(study_name="bench", storage=storage)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = next(r for r in client.search_runs(["0"]) if r.data.tags.get("sweep.role") == "parent")
    states = [t.state.name for t in study.trials]
    return {
        "pruner": pruner,
        "trials": len(study.trials),
        "pruned": states.count("PRUNED"),
        "trial_epochs": int(parent.data.metrics["trial_epochs"]),
        "max_trial_epochs": len(study.trials) * args.epochs,
        "best_val_loss": study.best_value,
        "wall_s": round(wall, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-trials", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--n-train-iter", type=int, default=1000)
    p.add_argument("--n-val-iter", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        os.environ.setdefault("KRONOS_MLFLOW_HOME", str(Path(tmp) / "home"))
        results = []
        for pruner in ("none", "median"):
            workdir = Path(tmp) / pruner
            workdir.mkdir()
            results.append(run_sweep(workdir, pruner, args))
    cols = ("pruner", "trials", "pruned", "trial_epochs", "max_trial_epochs", "best_val_loss", "wall_s")
    print(" | ".join(f"{c:>16}" for c in cols))
    for r in results:
        print(" | ".join(f"{(f'{r[c]:.6f}' if isinstance(r[c], float) and c == 'best_val_loss' else r[c])!s:>16}"
                         for c in cols))
    saved = 1 - results[1]["trial_epochs"] / max(results[0]["trial_epochs"], 1)
    print(f"median pruning spent {saved:.0%} fewer trial-epochs; best_val_loss "
          f"{results[1]['best_val_loss']:.6f} vs {results[0]['best_val_loss']:.6f} without pruning")
    if args.json:
        print(json.dumps({"results": results, "trial_epochs_saved": saved}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
