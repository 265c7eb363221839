"""A predictor sweep made once per test session and read, unchanged, by the tests of
docs/finetune-modes.md and of ``objective: val_skill`` (``tests/conftest.py``: ``predictor_sweep``).

``mlflow run . -e sweep -P stage=predictor -P objective=val_skill`` with a search space that also
draws ``finetune_mode`` (and ``lora_rank``, ``freeze_layers``), three trials, on a tokenizer
written here. A test that adds runs to its store (a refused sweep) counts only its own.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tiny_runs import TINY, create_sqlite_store, isolated_env, write_config

ROOT = Path(__file__).resolve().parents[1]
STUDY = "kronos-predictor-lr-wd-val-skill"
# learning rate and weight decay, and the fine-tune mode with each mode's own setting
SPACE = ("learning_rate: {low: 1.0e-3, high: 1.0e-2}\nweight_decay: {low: 1.0e-3, high: 0.1}\n"
         "finetune_mode: {choices: [full, lora, freeze]}\nlora_rank: {low: 2, high: 4}\n"
         "freeze_layers: {low: 0, high: 2}\n")


@dataclass
class PredictorSweep:
    """One finished ``mlflow run . -e sweep`` of predictor trials ranked by val_skill."""

    root: Path  # cwd of the command; holds the stores, the tokenizer, outputs, cache
    uri: str
    storage: str
    env: dict[str, str]
    command: list[str]
    stdout: str
    stderr: str
    n_trials: int
    tokenizer: Path
    study_name: str = STUDY

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.uri)

    def study(self):
        import optuna

        return optuna.load_study(study_name=self.study_name, storage=self.storage)

    def trials(self):
        """The trials' MLflow runs."""
        return [r for r in self.client().search_runs(["0"]) if "optuna.trial_number" in r.data.tags]

    def parent(self):
        """The sweep's parent run (the command's, not a later refused one's)."""
        parents = [r for r in self.client().search_runs(["0"], order_by=["attributes.start_time ASC"])
                   if r.data.tags.get("sweep.role") == "parent"]
        return parents[0]


def mlflow_run_predictor_sweep(root: Path, n_trials: int = 3) -> PredictorSweep:
    """``mlflow run . -e sweep`` of ``n_trials`` predictor trials (two epochs each, fresh
    predictor weights asked for by name: lora and freeze trials) on val_skill; asserts exit 0."""
    import torch

    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    root.mkdir(parents=True, exist_ok=True)
    sizes = {k: v for k, v in TINY.items() if k not in ("epochs", "batch_size", "n_train_iter", "n_val_iter")}
    write_config(root / "tiny.yaml", **{**sizes, "n_layers": 2, "log_interval": 100000, "evaluate": "off",
                                        "n_val_skill_windows": 60, "pretrained_predictor_path": "fresh"},
                 save_path=str(root / "outputs"), dataset_path=str(root / "cache"))
    (root / "space.yaml").write_text(SPACE)
    torch.manual_seed(0)
    KronosTokenizer(**model_kwargs(TINY)).save_pretrained(root / "tokenizer")
    env = isolated_env(root, create_sqlite_store(root))
    storage = f"sqlite:///{root}/optuna.db"
    params = {"config_file": root / "tiny.yaml", "storage": storage, "epochs": 2, "batch_size": 8,
              "n_train_iter": 64, "n_val_iter": 36, "comet": "off", "n_trials": n_trials, "stage": "predictor",
              "tokenizer": root / "tokenizer", "objective": "val_skill", "sampler_seed": 3,
              "search_space": root / "space.yaml", "pruner": "none", "pretrained_predictor_path": "fresh"}
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "sweep",
           *[a for k, v in params.items() for a in ("-P", f"{k}={v}")]]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return PredictorSweep(root=root, uri=env["MLFLOW_TRACKING_URI"], storage=storage, env=env, command=cmd,
                          stdout=proc.stdout, stderr=proc.stderr, n_trials=n_trials, tokenizer=root / "tokenizer")
