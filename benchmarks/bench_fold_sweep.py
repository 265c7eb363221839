"""Judged on every fold: three sweeps at an equal budget of trial-folds, each champion scored on a
held-out final period no trial saw, on the demo market.

    nice -n 10 python benchmarks/bench_fold_sweep.py --json                 # defaults: 3 folds, 9 trial-folds

The held-out period is the market's last ``--fold-length`` bars; the folds end the bar before it
(``--walkforward-end``), so no trial of any sweep trains, validates or tests on it. The three sweeps
share the sampler seed, tiny architecture and data (one epoch a fold, so trial-epochs are trial-folds):

- ``wilcoxon``: ``--folds K`` with the paired Wilcoxon pruner, ``--trial-epochs-budget B``;
- ``folds, no pruning``: ``--folds K --pruner none``, ``B / K`` trials;
- ``one window``: today's sweep, ``B`` trials, on the latest fold's ranges (its train, validation
  and test periods), the default pruner.

Each sweep's champion (its best trial's learning rate and weight decay) is then fine-tuned once on
the held-out fold's ranges (training and validation before the held-out period, the embargo
between) and scored there: its ``test_tokenizer_loss`` on the held-out windows (lower is better),
next to the default settings' score on the same windows.
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


def _config(workdir: Path, args) -> Path:
    config = {"d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2, "s1_bits": 4,
              "s2_bits": 4, "lookback_window": 20, "predict_window": 5, "batch_size": 8,
              "n_train_iter": args.n_train_iter, "n_val_iter": args.n_val_iter, "n_test_iter": args.n_test_iter,
              "log_interval": 10_000, "evaluate": "off", "dataset_path": str(workdir / "cache")}
    path = workdir / "cfg.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in config.items()))
    return path


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{workdir}/mlflow.db", TQDM_DISABLE="1",
               MLFLOW_DISABLE_TELEMETRY="true", KRONOS_MLFLOW_HOME=str(workdir / "home"))
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(name, None)
    return env


def _registry() -> None:
    """The stage registry, built as every command builds it before it loads a config."""
    from kronos_mlflow import stages

    build = getattr(stages, "build_registry", None)
    if build is not None:
        build()


def plans(cfg_path: Path, args):
    """The sweep folds (ending before the held-out period) and the held-out fold."""
    _registry()
    from kronos_mlflow.config import core as cfg
    from kronos_mlflow.data.prepare import market_calendar
    from kronos_mlflow.workflows.walkforward import folds as fl

    config = cfg.load_config({}, path=str(cfg_path))
    calendar = market_calendar(config)
    held = fl.plan(config, fl.Settings(folds=1, fold_length=args.fold_length), calendar)[0]
    end = str(calendar[list(calendar.astype("datetime64[D]").astype(str)).index(held.test[0]) - 1])[:10]
    folds = fl.plan(config, fl.Settings(folds=args.folds, fold_length=args.fold_length, end=end), calendar)
    return folds, held, end


def sweep(workdir: Path, name: str, flags: list[str], args) -> dict:
    import optuna

    storage = f"sqlite:///{workdir}/optuna-{name}.db"
    cmd = [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--config", str(workdir / "cfg.yaml"),
           "--storage", storage, "--study-name", name, "--comet", "off", "--epochs", "1",
           "--sampler-seed", str(args.seed), "--output-dir", str(workdir / "out"), *flags]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(workdir), cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sweep {name} failed:\n{proc.stderr[-2000:]}")
    study = optuna.load_study(study_name=name, storage=storage)
    states = [t.state.name for t in study.trials if "duplicate_of" not in t.user_attrs]
    best = study.best_trial
    wd = 0.0 if best.params.get("weight_decay_is_zero") else best.params["weight_decay"]
    spent = sum(int(t.user_attrs.get("epochs_trained", 0)) for t in study.trials)
    return {"sweep": name, "trials": len(states), "complete": states.count("COMPLETE"),
            "pruned": states.count("PRUNED"), "trial_folds": spent, "best_trial": best.number,
            "learning_rate": best.params["learning_rate"], "weight_decay": wd, "selection_value": best.value,
            "wall_s": round(wall, 1)}


def held_out_score(workdir: Path, held, lr: float, wd: float, tag: str) -> float:
    """Fine-tune with ``lr``, ``wd`` on the held-out fold's ranges; its test loss on the held-out windows."""
    from mlflow import MlflowClient

    ranges = [a for key, (s, e) in held.ranges.items() for a in (f"--{key.replace('_', '-')}", f"{s}:{e}")]
    cmd = [sys.executable, "-m", "kronos_mlflow.train", "--config", str(workdir / "cfg.yaml"), "--comet", "off",
           "--epochs", "1", "--learning-rate", repr(lr), "--weight-decay", repr(wd), "--run-name", f"held-out {tag}",
           "--save-path", str(workdir / "held" / tag), *ranges]
    proc = subprocess.run(cmd, env=_env(workdir), cwd=workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"held-out training {tag} failed:\n{proc.stderr[-2000:]}")
    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    (run,) = client.search_runs(["0"], f"tags.mlflow.runName = 'held-out {tag}'")
    return float(run.data.metrics["test_tokenizer_loss"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folds", type=int, default=3)
    p.add_argument("--fold-length", default="20")
    p.add_argument("--budget", type=int, default=9, help="trial-folds per sweep")
    p.add_argument("--p-threshold", default="0.3")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-train-iter", type=int, default=64)
    p.add_argument("--n-val-iter", type=int, default=32)
    p.add_argument("--n-test-iter", type=int, default=400)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fold-sweep-") as tmp:
        workdir = Path(tmp)
        cfg_path = _config(workdir, args)
        folds, held, end = plans(cfg_path, args)
        latest = [a for key, (s, e) in folds[-1].ranges.items() for a in (f"--{key.replace('_', '-')}", f"{s}:{e}")]
        common = ["--fold-length", args.fold_length, "--walkforward-end", end]
        arms = [
            ("wilcoxon", ["--folds", str(args.folds), *common, "--p-threshold", args.p_threshold,
                          "--n-trials", str(args.budget), "--trial-epochs-budget", str(args.budget)]),
            ("folds-no-pruning", ["--folds", str(args.folds), *common, "--pruner", "none",
                                  "--n-trials", str(args.budget // args.folds)]),
            ("one-window", [*latest, "--n-trials", str(args.budget), "--trial-epochs-budget", str(args.budget)]),
        ]
        rows = []
        for name, flags in arms:
            row = sweep(workdir, name, flags, args)
            row["held_out_test_loss"] = held_out_score(workdir, held, row["learning_rate"], row["weight_decay"], name)
            rows.append(row)
            print(json.dumps(row), flush=True)
        from kronos_mlflow.config import core as cfg

        config = cfg.load_config({}, path=str(cfg_path))
        default = held_out_score(workdir, held, float(config["tokenizer_learning_rate"]),
                                 float(config["adam_weight_decay"]), "default")
    out = {"held_out": list(held.test), "folds": [list(f.test) for f in folds], "default_held_out_test_loss": default,
           "sweeps": rows}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"held-out {held.test[0]}..{held.test[1]}; default settings {default:.6f}")
        for r in rows:
            print(f"{r['sweep']:18} trials {r['trials']:2} (pruned {r['pruned']}) trial-folds {r['trial_folds']:2} "
                  f"best lr {r['learning_rate']:.2e} wd {r['weight_decay']:.3g}: held-out {r['held_out_test_loss']:.6f}")


if __name__ == "__main__":
    main()
