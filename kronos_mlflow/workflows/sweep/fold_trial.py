"""One trial of a sweep with ``--folds``: its folds as child runs of the trial's run, in
:func:`~kronos_mlflow.workflows.sweep.folds.fold_order`, each score reported as step ``k`` and the
pruner asked after each (docs/sweeps.md#sweeps-judged-on-every-fold).

The trial's run is not a training run: it holds the fold scores (``fold_score`` at step ``k``,
``fold<k>_<objective metric>``), ``folds_run`` (the folds this trial paid for), ``folds_reused``
and the trial's value under the objective's metric (the mean over its folds). A pruned trial's run
ends KILLED with ``optuna.trial_state=PRUNED`` and a ``stop_reason`` naming the folds it ran; its
fold runs, FINISHED training runs, are tagged ``optuna.trial_state=PRUNED`` too.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ...tracking.child_runs import as_flags, child_env, create_child
from ...runtime.stopping import TrainingStopped
from ...tracking.command_runs import run_child
from ..walkforward import folds as fl
from .folds import FOLD_DIGEST_TAG, FOLD_TAG, finished_fold, fold_digest, fold_order

#: flags a fold sets itself (not part of what the trial's settings are)
_OWN = ("--run-name", "--save-path")


class FoldFailed(Exception):
    """A fold's training failed: the trial is FAIL with this reason."""


def judged_on_folds(worker, trial, values: Mapping[str, Any], run_id: str, run_name: str, flags: Sequence[str],
                    failed: type[Exception]) -> float:
    """:func:`run_fold_trial` with the trial's run ended as the trial ends: FINISHED (COMPLETE),
    KILLED (PRUNED), FAILED (FAIL, raising ``failed``), or, on a stop, FAIL and queued again."""
    import optuna

    try:
        value = run_fold_trial(worker, trial, values, run_id, run_name, flags)
    except TrainingStopped:
        worker._stopped(trial, run_id)
        raise
    except optuna.TrialPruned:
        worker._end(run_id, "KILLED", "PRUNED")
        raise
    except FoldFailed as exc:
        worker._end(run_id, "FAILED", "FAIL", reason=str(exc))
        raise failed(str(exc)) from None
    worker._end(run_id, "FINISHED", "COMPLETE")
    return value


def run_fold_trial(worker, trial, values: Mapping[str, Any], run_id: str, run_name: str,
                   flags: Sequence[str]) -> float:
    """The trial's folds; returns the mean fold score, raises ``optuna.TrialPruned`` when pruned and
    :class:`FoldFailed` when a fold's training failed (its run ended FAILED)."""
    import optuna

    folds: list[fl.Fold] = worker.fold_plan
    by_number = {f.fold: f for f in folds}
    client, total = worker.client, len(folds)
    base = _without_own(flags, worker.folder_key)
    scores: dict[int, float] = {}
    fold_runs: dict[int, str] = {}
    reused = 0
    for key, value in values.items():  # what the trial's fold runs train with, on the trial's run too
        client.log_param(run_id, key, repr(value) if isinstance(value, float) else str(value))
    for position, k in enumerate(fold_order(total), start=1):
        fold = by_number[k]
        digest = fold_digest(base, values, fold, worker.study.study_name)
        found = finished_fold(client, worker.experiment_id, digest, worker.value_metric)
        if found is not None:
            fold_runs[k], score = found.info.run_id, float(found.data.metrics[worker.value_metric])
            reused += 1
            print(f"[sweep] trial {trial.number} fold {k}/{total}: reused run {fold_runs[k]} "
                  f"({worker.value_metric} {score:.6f})", flush=True)
        else:
            fold_runs[k] = create_child(client, worker.experiment_id, run_id, f"{run_name} fold {k}/{total}",
                                        {**_trial_tags(worker, trial), FOLD_TAG: str(k), FOLD_DIGEST_TAG: digest})
            score = _train_fold(worker, trial, fold, fold_runs[k], run_name, flags, total)
        scores[k] = score
        _record_fold(client, run_id, trial, k, score, fold_runs[k], worker.value_metric, position, reused)
        trial.report(score, k)
        if position < total and trial.should_prune():
            _pruned(worker, trial, run_id, scores, fold_runs, total)
            raise optuna.TrialPruned(f"pruned after {position} of {total} folds")
    value = sum(scores.values()) / len(scores)
    client.log_metric(run_id, worker.value_metric, value)
    trial.set_user_attr("fold_scores", {str(k): v for k, v in sorted(scores.items())})
    return value


def _trial_tags(worker, trial) -> dict[str, str]:
    return {"optuna.study_name": worker.study.study_name, "optuna.trial_number": str(trial.number),
            "optuna.trial_state": "RUNNING"}


def _without_own(flags: Sequence[str], folder_key: str) -> list[str]:
    """``flags`` less those naming where and under which name the trial runs (not its settings)."""
    own = (*_OWN, f"--{folder_key.replace('_', '-')}")
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
            continue
        if flag in own:
            skip = True
            continue
        out.append(flag)
    return out


def _train_fold(worker, trial, fold: fl.Fold, fold_run: str, run_name: str, flags: Sequence[str], total: int) -> float:
    """Fold ``fold``'s training run (its process ends it); its score, or :class:`FoldFailed`."""
    from ...tracking.project_run import end_failed  # lazy: numpy, urllib/http

    client, k = worker.client, fold.fold
    fold_flags = [*flags, *as_flags({
        "run_name": f"{run_name} fold {k}/{total}",
        worker.folder_key: f"trial-{trial.number:04d}-fold-{k}",
        **{key: f"{a}:{b}" for key, (a, b) in fold.ranges.items()},
    })]
    env = child_env(fold_run, worker.experiment_id, client.tracking_uri)  # no study: the sweep reports per fold
    print(f"[sweep] trial {trial.number} fold {k}/{total}: train ..{fold.train[1]}, val {fold.val[0]}..{fold.val[1]}, "
          f"test {fold.test[0]}..{fold.test[1]}", flush=True)
    cmd = worker.args.commands.train(worker.args.nproc_per_node, fold_flags)
    try:
        returncode = run_child(cmd, env)  # a stop: raised here, the trial's runs end KILLED with the sweep's
    except TrainingStopped:
        client.set_tag(fold_run, "optuna.trial_state", "FAIL")  # its trial is FAIL, queued again
        raise
    run = client.get_run(fold_run)
    epochs = len(client.get_metric_history(fold_run, worker.val_metric))
    worker.trial_epochs += epochs
    worker.trial_folds = getattr(worker, "trial_folds", 0) + 1  # the folds this worker trained (the parent's trial_folds)
    trial.set_user_attr("epochs_trained", int(trial.user_attrs.get("epochs_trained", 0)) + epochs)
    score = run.data.metrics.get(worker.value_metric)
    if returncode != 0 or score is None:
        why = (f"fold {k}'s training exited with code {returncode} ({shlex.join(cmd[:4])} ...)" if returncode
               else f"fold {k}'s run has no {worker.value_metric}")
        if run.info.status in ("RUNNING", "SCHEDULED"):
            end_failed(client, fold_run, why)
        client.set_tag(fold_run, "optuna.trial_state", "FAIL")
        raise FoldFailed(f"trial {trial.number}: {why}")
    client.set_tag(fold_run, "optuna.trial_state", "COMPLETE")
    return float(score)


def _record_fold(client, run_id: str, trial, k: int, score: float, fold_run: str, metric: str, position: int,
                 reused: int) -> None:
    client.log_metric(run_id, "fold_score", score, step=k)
    client.log_metric(run_id, f"fold{k}_{metric}", score)
    client.log_metric(run_id, "folds_run", position)
    client.log_metric(run_id, "folds_reused", reused)
    client.set_tag(run_id, f"sweep.fold{k}_run_id", fold_run)
    trial.set_user_attr("folds_run", position)
    trial.set_user_attr("folds_reused", reused)


def _pruned(worker, trial, run_id: str, scores: Mapping[int, float], fold_runs: Mapping[int, str], total: int) -> None:
    """The trial's run ends KILLED (its fold runs stay FINISHED, tagged PRUNED), saying which folds it ran."""
    client = worker.client
    ran = ", ".join(f"fold {k} {v:.6f}" for k, v in scores.items())
    reason = (f"pruned after {len(scores)} of {total} folds ({ran}): worse than the best trial by the paired "
              f"Wilcoxon test at p < {worker.args.p_threshold:g}" if worker.args.pruner == "wilcoxon"
              else f"pruned after {len(scores)} of {total} folds ({ran})")
    trial.set_user_attr("fold_scores", {str(k): v for k, v in sorted(scores.items())})
    for fold_run in fold_runs.values():
        if client.get_run(fold_run).data.tags.get("mlflow.parentRunId") == run_id:
            client.set_tag(fold_run, "optuna.trial_state", "PRUNED")
    client.set_tag(run_id, "stop_reason", reason)
    print(f"[sweep] trial {trial.number}: {reason}", flush=True)


__all__ = ["FoldFailed", "judged_on_folds", "run_fold_trial"]
