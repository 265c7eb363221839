"""A fold sweep's summary on its parent run and its champion, from the pooled fold scores
(docs/sweeps.md#sweeps-judged-on-every-fold).

- the best trial's pooled score: the mean of its fold scores with a 95% bootstrap interval over
  folds (``pooled_<metric>``, ``_ci_low`` / ``_ci_high``);
- the best trial against the default settings' trial (the study's first, the config's learning
  rate and weight decay), paired fold by fold, by the scorecard's verdict rule
  (:func:`kronos_mlflow.evaluation.verdict.decide` with ``verdict_min_change``): on a loss, the
  relative change of the mean with a paired bootstrap interval over folds; on a skill, the mean
  difference of skill. Tag ``best_vs_default_verdict``: better, worse or inconclusive;
- what each trial paid for: ``trial_folds`` (this worker's fold trainings), ``study_trial_folds``,
  ``trial_folds_paid`` at step = trial number, and ``folds.txt`` (every trial's fold scores);
- the champion: the best trial's latest fold's model (trained on the most recent data), moved by
  ``--promote better`` only when ``best_vs_default_verdict`` is ``better``.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...config.keys import VERDICT
from ...config.sections import as_section
from ...errors import UserError
from ...evaluation.verdict import BOOTSTRAP_SEED, LEVEL, N_RESAMPLES, decide, paired_bootstrap
from .champion import best_trial_record, register_as_champion


def fold_scores(trial) -> dict[int, float]:
    """A trial's fold scores by fold number (its intermediate values: step = fold)."""
    return {int(k): float(v) for k, v in sorted(trial.intermediate_values.items())}


def pooled_interval(scores: Sequence[float], n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                    level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)``: the mean over folds, the percentile interval of resampled folds
    (NaN bounds for one fold)."""
    x = np.asarray(list(scores), dtype=np.float64)
    if x.size < 2:
        return float(x.mean()) if x.size else math.nan, math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_resamples, x.size))
    means = x[idx].mean(axis=1)
    tail = (1 - level) / 2
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def versus_default(best: Mapping[int, float], default: Mapping[int, float], direction: str,
                   min_change: float) -> dict[str, Any]:
    """The best trial against the default trial on the folds both scored, paired; the verdict by
    the scorecard's rule. A loss (``minimize``): relative change of the mean, below 0 is better;
    a skill (``maximize``): mean difference, above 0 is better."""
    common = sorted(set(best) & set(default))
    if len(common) < 2:
        return {"verdict": "inconclusive", "folds": len(common),
                "why": f"{len(common)} fold(s) scored by both trials; a paired interval needs two or more"}
    b, d = [best[k] for k in common], [default[k] for k in common]
    if direction == "minimize":
        change, low, high = paired_bootstrap(b, d)
        verdict, kind = decide(low, high, min_change), "relative change of the mean"
    else:
        change, low, high = pooled_interval([x - y for x, y in zip(b, d, strict=True)])
        verdict, kind = decide(-high, -low, min_change), "mean difference"
    why = (f"{kind} {change:+.4g} (95% CI {low:+.4g} .. {high:+.4g}) over {len(common)} folds, paired; "
           f"verdict_min_change {min_change:g}")
    return {"verdict": verdict, "change": change, "ci_low": low, "ci_high": high, "folds": len(common), "why": why}


def default_trial(study):
    """The default settings' trial (user attr ``default_settings``), when it completed."""
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get("default_settings") and trial.value is not None:
            return trial
    return None


def folds_table(study, metric: str, total: int) -> str:
    """Every trial: its state, the folds it paid for, its fold scores and their mean."""
    head = ["trial", "state", "folds_paid", *[f"fold{k}" for k in range(1, total + 1)], f"mean {metric}"]
    rows = [head]
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if "duplicate_of" in t.user_attrs:
            continue
        scores = fold_scores(t)
        mean = sum(scores.values()) / len(scores) if scores else math.nan
        rows.append([str(t.number) + (" (default)" if t.user_attrs.get("default_settings") else ""), t.state.name,
                     str(t.user_attrs.get("folds_run", len(scores))),
                     *[f"{scores[k]:.6f}" if k in scores else "-" for k in range(1, total + 1)],
                     f"{mean:.6f}" if scores else "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def record(client, parent_id: str, study, worker, args, config: Mapping[str, Any]) -> None:
    """The fold sweep's numbers, tags and ``folds.txt`` on the parent; the champion when asked
    (nothing for a sweep without ``--folds``)."""
    if not worker.fold_plan:
        return
    metric, total = worker.value_metric, len(worker.fold_plan)
    trials = study.get_trials(deepcopy=False)
    client.log_metric(parent_id, "trial_folds", getattr(worker, "trial_folds", 0))
    client.log_metric(parent_id, "study_trial_folds", sum(int(t.user_attrs.get("folds_run", 0)) - int(
        t.user_attrs.get("folds_reused", 0)) for t in trials))
    for t in trials:
        if "folds_run" in t.user_attrs:
            client.log_metric(parent_id, "trial_folds_paid", int(t.user_attrs["folds_run"]), step=t.number)
    table = folds_table(study, metric, total)
    print(table, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "folds.txt").write_text(table + "\n")
        client.log_artifact(parent_id, str(Path(tmp) / "folds.txt"))
    if not any(t.value is not None for t in trials):
        return
    best = study.best_trial
    mean, low, high = pooled_interval(list(fold_scores(best).values()))
    for key, value in ((f"pooled_{metric}", mean), (f"pooled_{metric}_ci_low", low),
                       (f"pooled_{metric}_ci_high", high)):
        if math.isfinite(value):
            client.log_metric(parent_id, key, value)
    print(f"[sweep] best trial {best.number}: pooled {metric} {mean:.6f} (95% CI over {len(fold_scores(best))} "
          f"folds {low:.6f} .. {high:.6f})", flush=True)
    judged = _versus_default(client, parent_id, study, best, config)
    trial_run = best.user_attrs.get("mlflow_run_id")
    model_run = client.get_run(trial_run).data.tags.get(f"sweep.fold{total}_run_id") if trial_run else None
    if model_run:
        _show_model_run(client, parent_id, model_run)
    if args.registered_model_name:
        _move_champion(client, parent_id, best, model_run, judged, args)


def _versus_default(client, parent_id: str, study, best, config: Mapping[str, Any]) -> dict[str, Any]:
    default = default_trial(study)
    if default is None:
        judged = {"verdict": "inconclusive", "why": "the default settings' trial has not completed"}
    elif default.number == best.number:
        judged = {"verdict": "inconclusive", "why": "the best trial is the default settings' trial"}
    else:
        judged = versus_default(fold_scores(best), fold_scores(default), study.direction.name.lower(),
                                float(as_section(config, VERDICT).verdict_min_change))
        client.set_tag(parent_id, "default_trial_number", str(default.number))
    for key, name in (("change", "best_vs_default_change"), ("ci_low", "best_vs_default_change_ci_low"),
                      ("ci_high", "best_vs_default_change_ci_high")):
        value = judged.get(key, math.nan)
        if math.isfinite(value):
            client.log_metric(parent_id, name, value)
    client.set_tag(parent_id, "best_vs_default_verdict", judged["verdict"])
    client.set_tag(parent_id, "best_vs_default_why", judged["why"][:4000])
    print(f"[sweep] best trial {best.number} against the default settings: {judged['verdict']} ({judged['why']})",
          flush=True)
    return judged


def _show_model_run(client, parent_id: str, run_id: str) -> None:
    """The best trial's latest fold run: its test verdict on the parent, as a single-window sweep shows its best
    trial's (tag ``best_model_run``: the run whose model the champion would be)."""
    client.set_tag(parent_id, "best_model_run", run_id)
    metrics, tags = best_trial_record(client.get_run(run_id))
    for key, value in metrics.items():
        client.log_metric(parent_id, key, value)
    for key, value in tags.items():
        client.set_tag(parent_id, key, value)


def _move_champion(client, parent_id: str, best, model_run: str | None, judged: Mapping[str, Any], args) -> None:
    from ...tracking.gate import own_model_uri  # lazy: numpy, urllib/http

    name, why = args.registered_model_name, ""
    run = client.get_run(model_run) if model_run else None
    if run is None or not run.data.tags.get("best_model_uri"):
        why = f"best trial {best.number}'s latest fold logged no model"
    elif args.promote != "always" and judged["verdict"] != "better":
        why = (f"best trial {best.number} against the default settings over the folds is {judged['verdict']}, "
               f"not better ({judged['why']}); --promote always moves the champion regardless")
    if not why:
        try:
            uri = own_model_uri(client, run, f"best trial {best.number}'s latest fold's tag best_model_uri")
            version = register_as_champion(client, name, model_run, uri)
        except UserError as exc:
            why = str(exc)
        else:
            client.set_tag(parent_id, "champion", f"{name}/{version}")
            return
    client.set_tag(parent_id, "champion_unchanged", why[:4000])
    print(f"[sweep] champion unchanged: {why}", flush=True)


__all__ = ["default_trial", "fold_scores", "folds_table", "pooled_interval", "record", "versus_default"]
