"""A one-fold walk-forward parent, its fold run and the fold's evaluation run, logged into a real
MLflow store with the handed-over files a test chooses (``walkforward/folds.json``,
``evaluation/origins.parquet``, ``evaluation/forecasts.parquet``): what ``kronos-mlflow
walk-forward --aggregate`` reads of a colleague's parent. Good files by default; a test passes
bytes (or a dict, written as JSON) to replace one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kronos_mlflow.config.core import format_time_range
from kronos_mlflow.workflows.walkforward import folds as fl
from kronos_mlflow.workflows.walkforward.command import PLAN_TAG, ROLE_TAG

SETTINGS = fl.Settings(folds=1, fold_length="3M")
FOLD = fl.Fold(1, ("2020-01-01", "2020-06-30"), ("2020-07-01", "2020-08-31"), 10, ("2020-09-15", "2020-12-31"), 77, 44,
               125, {"train_time_range": ["2020-01-01", "2020-06-30"], "val_time_range": ["2020-05-01", "2020-08-31"],
                     "test_time_range": ["2020-07-15", "2020-12-31"]})


def folds_table() -> dict[str, Any]:
    """The good ``folds.json`` of the one-fold plan."""
    return fl.as_json([FOLD], SETTINGS)


def plan_digest(table: dict[str, Any]) -> str:
    """The ``walkforward.plan_digest`` tag of a folds.json table, as
    :func:`~kronos_mlflow.workflows.walkforward.folds.plan_digest` computes it."""
    text = json.dumps(table, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Good ``origins`` and ``forecasts`` tables of the fold (3 dates x 2 symbols, 2 steps)."""
    dates = np.repeat(pd.bdate_range("2020-09-15", periods=3).to_numpy(), 2)
    symbols = np.tile(["S0", "S1"], 3)
    origins = pd.DataFrame({"datetime": dates, "instrument": symbols, "position": np.arange(6),
                            "finetuned_mase": np.linspace(0.8, 1.2, 6), "persistence_mase": np.ones(6),
                            "finetuned_crps": np.ones(6)})
    rows = []
    for name in ("finetuned", "persistence"):
        for d, s in zip(dates, symbols):
            for step in (1, 2):
                rows.append({"datetime": d, "instrument": s, "forecaster": name, "step": step, "actual": 100.0 + step,
                             "mean": 100.0, "median": 100.0, **{f"q{q / 10:.1f}": 95.0 + q for q in range(1, 10)}})
    return origins, pd.DataFrame(rows)


def _payload(value: Any, folder: Path, name: str, good) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if value is None:
        good(path)
    elif isinstance(value, bytes):
        path.write_bytes(value)
    elif isinstance(value, pd.DataFrame):
        value.to_parquet(path, index=False)
    else:
        path.write_text(json.dumps(value))
    return path


def log_walkforward(client, experiment_id: str, staging: Path, name: str = "handover", *, folds_json: Any = None,
                    origins: Any = None, forecasts: Any = None) -> dict[str, str]:
    """The parent (``<name>_parent``), fold (``<name>_fold``) and evaluation (``<name>_evaluation``)
    runs, FINISHED, with the files given (None: the good one); their ids by role. ``staging`` is a
    folder the files are written in before they are logged."""
    staging = Path(staging) / name
    origins_good, forecasts_good = tables()
    files = {
        "folds": _payload(folds_json, staging / "walkforward", "folds.json",
                          lambda p: p.write_text(json.dumps(folds_table()))),
        "origins": _payload(origins, staging / "evaluation", "origins.parquet",
                            lambda p: origins_good.to_parquet(p, index=False)),
        "forecasts": _payload(forecasts, staging / "evaluation", "forecasts.parquet",
                              lambda p: forecasts_good.to_parquet(p, index=False)),
    }
    want = format_time_range(FOLD.ranges["test_time_range"])
    # a crafted table comes with the tag that matches it, as whoever crafted it would set
    plan = plan_digest(folds_json) if isinstance(folds_json, dict) else fl.plan_digest([FOLD], SETTINGS)
    parent = client.create_run(experiment_id, run_name=f"{name}_parent",
                               tags={ROLE_TAG: "parent", PLAN_TAG: plan}).info.run_id
    client.log_artifact(parent, str(files["folds"]), "walkforward")
    evaluation = client.create_run(experiment_id, run_name=f"{name}_evaluation").info.run_id
    client.log_param(evaluation, "test_time_range", want)
    client.log_artifact(evaluation, str(files["origins"]), "evaluation")
    client.log_artifact(evaluation, str(files["forecasts"]), "evaluation")
    client.set_terminated(evaluation, "FINISHED")
    fold = client.create_run(experiment_id, run_name=f"{name}_fold",
                             tags={"mlflow.parentRunId": parent, "pipeline.evaluation_run_id": evaluation}).info.run_id
    client.log_param(fold, "test_time_range", want)
    client.set_terminated(fold, "FINISHED")
    client.set_tag(parent, "walkforward.fold1_run_id", fold)
    return {"parent": parent, "fold": fold, "evaluation": evaluation}
