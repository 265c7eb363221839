"""Does training less of the model forget less? full, lora and freeze from one start, same budget.

    python benchmarks/bench_finetune_modes.py                     # about 15 minutes on 2 CPU cores
    python benchmarks/bench_finetune_modes.py --base-epochs 16 --workdir W --json out.json
    python benchmarks/bench_finetune_modes.py --workdir W --modes lora --learning-rate 1e-3   # W's base pair again

A small pair trained long on one market stands in for a published model: a tokenizer and a
predictor trained on the demo daily market (market A, ``--qlib-data-path ''``). Each mode then
fine-tunes that predictor, on the frozen tokenizer, on another market (market B: the demo market of
another seed, written with ``kronos-mlflow demo-data --seed``), from the same start with the same
steps and learning rate. Every step is the command a user types (``kronos-mlflow train``,
``train-predictor``, ``evaluate``), each its own MLflow run in a sqlite store under ``--workdir``.

Per mode the table gives: the held-out verdict of the predictor run (test loss against its start),
``skill_vs_zeroshot`` on market B with its 95% interval (the scorecard at the end of the run: the
start is the zero-shot pair), ``skill_vs_zeroshot`` on market A (``kronos-mlflow evaluate`` of
the fine-tune on the first market: below 0 is forgetting), the trained parameters, the
milliseconds per optimizer step (the median gap between the step metrics' timestamps), the
training wall time, and the sizes of the merged checkpoint and of the adapter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {"full": [], "lora": ["--lora-rank", "8"], "freeze": ["--freeze-layers", "2"]}


def run(cmd: list[str], env: dict[str, str], log: Path) -> float:
    """Run ``cmd`` (a user's command) with its output in ``log``; its wall time in seconds."""
    start = time.time()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=log.parent)
    if proc.returncode != 0:
        sys.exit(f"bench_finetune_modes: {' '.join(cmd[:4])} ... failed (exit {proc.returncode}); see {log}")
    return time.time() - start


def latest_run(client, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
    return run


def ms_per_step(client, run_id: str, metric: str) -> float:
    history = sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)
    gaps = [b.timestamp - a.timestamp for a, b in zip(history, history[1:]) if b.step == a.step + 1]
    return statistics.median(gaps) if gaps else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="", help="where the markets, runs and store go (default: a temporary one)")
    p.add_argument("--base-epochs", type=int, default=6, help="epochs of the base predictor on market A")
    p.add_argument("--epochs", type=int, default=2, help="epochs of each fine-tune on market B")
    p.add_argument("--n-train-iter", type=int, default=1000)
    p.add_argument("--n-val-iter", type=int, default=250)
    p.add_argument("--learning-rate", type=float, default=1e-4, help="every mode's peak learning rate")
    p.add_argument("--n-eval-windows", type=int, default=500)
    p.add_argument("--market-seed", type=int, default=7, help="seed of market B")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), help="the modes to fine-tune")
    p.add_argument("--json", default="", help="also write the results to this file")
    args = p.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="kronos-ft-modes-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}", "COMET_DISABLE_AUTO_LOGGING": "1"}
    env.pop("MLFLOW_RUN_ID", None)
    cli = [sys.executable, "-m", "kronos_mlflow"]
    common = ["--comet", "off", "--n-train-iter", str(args.n_train_iter), "--n-val-iter", str(args.n_val_iter),
              "--save-path", str(work / "outputs"), "--dataset-path", str(work / "cache"), "--log-interval", "100000"]
    scorecard = ["--n-eval-windows", str(args.n_eval_windows), "--backtest-signal-stride", "0",
                 "--backtest-n-random", "0"]
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    market_b = work / "market_b"
    if not (market_b / "calendars").is_dir():
        run([*cli, "demo-data", "--out", str(market_b), "--seed", str(args.market_seed)], env, work / "demo-data.log")

    if client.get_experiment_by_name("base-predictor") is None:  # a workdir that has the base pair keeps it
        print(f"[bench] base pair on market A ({args.base_epochs} predictor epochs), in {work}", flush=True)
        run([*cli, "train", *common, "--epochs", "2", "--qlib-data-path", ""],
            {**env, "MLFLOW_EXPERIMENT_NAME": "base-tokenizer"}, work / "base-tokenizer.log")
        tokenizer = Path(latest_run(client, "base-tokenizer").data.tags["run_directory"]) / "checkpoints" / "best_model"
        run([*cli, "train-predictor", *common, "--epochs", str(args.base_epochs), "--qlib-data-path", "",
             "--tokenizer", str(tokenizer), "--evaluate", "off"],
            {**env, "MLFLOW_EXPERIMENT_NAME": "base-predictor"}, work / "base-predictor.log")
    tokenizer = Path(latest_run(client, "base-tokenizer").data.tags["run_directory"]) / "checkpoints" / "best_model"
    base = Path(latest_run(client, "base-predictor").data.tags["run_directory"]) / "checkpoints" / "best_model"

    rows = []
    for mode in args.modes:
        extra = MODES[mode]
        print(f"[bench] {mode}: fine-tune on market B, scorecard on B, evaluate on A", flush=True)
        name = f"finetune-{mode}-lr{args.learning_rate:g}"
        wall = run([*cli, "train-predictor", *common, *scorecard, "--epochs", str(args.epochs),
                    "--qlib-data-path", str(market_b), "--tokenizer", str(tokenizer),
                    "--pretrained-predictor-path", str(base), "--learning-rate", str(args.learning_rate),
                    "--finetune-mode", mode, *extra], {**env, "MLFLOW_EXPERIMENT_NAME": name}, work / f"{name}.log")
        trained = latest_run(client, name)
        m, t = trained.data.metrics, trained.data.tags
        checkpoints = Path(t["run_directory"]) / "checkpoints"
        run([*cli, "evaluate", "--model", f"runs:/{trained.info.run_id}/best_model", "--zeroshot-tokenizer",
             str(tokenizer), "--zeroshot-predictor", str(base), "--qlib-data-path", "", *scorecard,
             "--dataset-path", str(work / "cache"), "--comet", "off"],
            {**env, "MLFLOW_EXPERIMENT_NAME": f"forgetting-{name}"}, work / f"forgetting-{name}.log")
        on_a = latest_run(client, f"forgetting-{name}").data.metrics
        adapter = checkpoints / "best_adapter" / "adapter_model.safetensors"
        rows.append({
            "mode": mode, "learning_rate": args.learning_rate, "trainable_params": int(trained.data.params["trainable_params"]),
            "trainable_fraction": float(trained.data.params["trainable_fraction"]),
            "verdict": t.get("verdict"), "test_loss_change": m.get("test_loss_change"),
            "skill_b": m.get("skill_vs_zeroshot"), "skill_b_ci": [m.get("skill_vs_zeroshot_ci_low"),
                                                                 m.get("skill_vs_zeroshot_ci_high")],
            "verdict_b": t.get("verdict_vs_zeroshot"),
            "skill_a": on_a.get("skill_vs_zeroshot"), "skill_a_ci": [on_a.get("skill_vs_zeroshot_ci_low"),
                                                                    on_a.get("skill_vs_zeroshot_ci_high")],
            "ms_per_step": ms_per_step(client, trained.info.run_id, "train_predictor_loss_batch"),
            "wall_s": round(wall, 1),
            "checkpoint_bytes": (checkpoints / "best_model" / "model.safetensors").stat().st_size,
            "adapter_bytes": adapter.stat().st_size if adapter.is_file() else None,
        })

    def ci(v, lohi):
        return f"{v:+.4f} [{lohi[0]:+.4f}, {lohi[1]:+.4f}]" if v is not None and None not in lohi else "-"

    print("\n| mode | trained params | held-out verdict (change) | skill_vs_zeroshot on B | skill_vs_zeroshot on A "
          "(forgetting) | ms / step | wall | best_model | adapter |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        change = f"{100 * r['test_loss_change']:+.2f}%" if r["test_loss_change"] is not None else "-"
        adapter = f"{r['adapter_bytes'] / 1024:.0f} KiB" if r["adapter_bytes"] else "-"
        print(f"| {r['mode']} | {r['trainable_params']:,} ({100 * r['trainable_fraction']:.1f}%) | {r['verdict']} "
              f"({change}) | {ci(r['skill_b'], r['skill_b_ci'])} {r['verdict_b']} | {ci(r['skill_a'], r['skill_a_ci'])} "
              f"| {r['ms_per_step']:.0f} | {r['wall_s']:.0f} s | {r['checkpoint_bytes'] / 2**20:.1f} MiB | {adapter} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
