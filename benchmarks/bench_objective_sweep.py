"""Two small predictor sweeps on the planted demo market, as users type them: which trial each
objective picks and that trial's test rank IC (docs/objectives.md#proof-on-a-market-with-a-known-answer).

    python benchmarks/bench_objective_sweep.py [--signal 0.1] [--n-trials 4] [--predictor-objective tokens+return] [--json]

Writes ``kronos-mlflow demo-data --signal <signal>`` into a temporary directory, then runs
``mlflow run . -e sweep -P stage=predictor -P objective=<val_loss|val_ic> ...`` twice with the same
sampler seed, trial count and tiny sizes (fresh tokenizer and predictor, 2 epochs of 1,024
windows; each trial scores itself on the test split's origins: the scorecard). The trials of the
two sweeps draw the same hyperparameters and train the same way (val_ic scores in a forked random
state); only the pick differs. Prints every trial's value of each objective and its test rank IC
(the head's, ``finetuned_head_test_rank_ic``, with ``tokens+return``; else the paths' mean,
``test_rank_ic``) and the trial each sweep picked. Each store stays in the temporary directory
(``--keep`` prints where).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2, "s1_bits": 4, "s2_bits": 4,
         "n_layers": 2, "lookback_window": 20, "predict_window": 5, "log_interval": 100000, "n_eval_windows": 600,
         "inference_sample_count": 1, "ensemble_rounds": 0, "backtest_n_random": 0, "backtest_signal_stride": 0,
         "calibration": "off", "pretrained_tokenizer_path": "fresh"}
PARAMS = {"epochs": 2, "batch_size": 16, "n_train_iter": 1024, "n_val_iter": 128, "comet": "off",
          "stage": "predictor", "pretrained_predictor_path": "fresh", "sampler_seed": 3, "pruner": "none"}


def _env(root: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KRONOS_", "COMET_"))}
    env.update({"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "KRONOS_MLFLOW_HOME": str(root / "home"),
                "MLFLOW_DISABLE_TELEMETRY": "true", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
                "HF_HUB_CACHE": str(root / "hf")})  # an empty cache: fresh weights whatever this machine holds
    return env


def sweep(root: Path, market: Path, objective: str, args) -> dict:
    """One ``mlflow run . -e sweep``; every trial's figures and the pick."""
    from mlflow import MlflowClient

    root.mkdir(parents=True)
    (root / "tiny.yaml").write_text("".join(f"{k}: {v}\n" for k, v in {
        **SIZES, "save_path": root / "outputs", "dataset_path": root / "cache"}.items()))
    params = {**PARAMS, "config_file": root / "tiny.yaml", "qlib_data_path": market, "objective": objective,
              "n_trials": args.n_trials, "storage": f"sqlite:///{root / 'optuna.db'}",
              "predictor_objective": args.predictor_objective}
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "sweep",
           *[a for k, v in params.items() for a in ("-P", f"{k}={v}")]]
    started = time.time()
    proc = subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"sweep {objective} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    client = MlflowClient(_env(root)["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(["0"])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    ic = "finetuned_head_test_rank_ic" if args.predictor_objective == "tokens+return" else "test_rank_ic"
    trials = []
    for r in runs:
        if r.info.run_id == parent.info.run_id or "best_val_loss" not in r.data.metrics:
            continue
        m, p = r.data.metrics, r.data.params
        trials.append({"run_id": r.info.run_id, "learning_rate": p.get("predictor_learning_rate", p.get("learning_rate")),
                       "weight_decay": p.get("adam_weight_decay", p.get("weight_decay")),
                       "best_val_loss": m.get("best_val_loss"), "best_val_ic": m.get("best_val_ic"),
                       "test_rank_ic": m.get(ic), "test_rank_ic_ci_low": m.get(f"{ic}_ci_low"),
                       "test_rank_ic_ci_high": m.get(f"{ic}_ci_high"), "test_rank_ic_nw_t": m.get(f"{ic}_nw_t"),
                       "paths_test_rank_ic": m.get("test_rank_ic")})
    picked = parent.data.tags.get("best_run")
    return {"objective": objective, "signal": ic, "seconds": round(time.time() - started, 1), "picked": picked,
            "picked_trial": next((t for t in trials if t["run_id"] == picked), None),
            "trials": sorted(trials, key=lambda t: t["run_id"]), "command": " ".join(map(str, cmd))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--signal", type=float, default=0.1)
    parser.add_argument("--n-trials", type=int, default=4)
    parser.add_argument("--predictor-objective", default="tokens+return", choices=("tokens", "tokens+return"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-objective-sweep-"))
    market = tmp / "market"
    subprocess.run([sys.executable, "-m", "kronos_mlflow", "demo-data", "--signal", str(args.signal), "--out",
                    str(market)], check=True, env=_env(tmp), capture_output=True)
    out = {"signal": args.signal, "n_trials": args.n_trials, "predictor_objective": args.predictor_objective,
           "sweeps": [sweep(tmp / objective, market, objective, args) for objective in ("val_loss", "val_ic")]}
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    for s in out["sweeps"]:
        print(f"objective {s['objective']} ({s['seconds']} s): picked {s['picked']}")
        for t in s["trials"]:
            mark = "*" if t["run_id"] == s["picked"] else " "
            print(f" {mark} lr {t['learning_rate']} wd {t['weight_decay']}: best_val_loss {t['best_val_loss']:.4f} "
                  f"best_val_ic {t['best_val_ic'] if t['best_val_ic'] is None else round(t['best_val_ic'], 3)} "
                  f"test rank IC {t['test_rank_ic']:+.3f} ({t['test_rank_ic_ci_low']:+.3f} .. "
                  f"{t['test_rank_ic_ci_high']:+.3f}, NW t {t['test_rank_ic_nw_t']:.2f}); paths' mean "
                  f"{t['paths_test_rank_ic']:+.3f}")
    if args.keep:
        print(f"stores under {tmp}")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
