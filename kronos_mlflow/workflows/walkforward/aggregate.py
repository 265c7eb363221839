"""The walk-forward folds' scorecards pooled into one verdict, its picture and ``summary.json``: per-fold
and pooled skills, pooled calibration, fold counts and the walk-forward verdict, from each fold's
``evaluation/origins.parquet`` and ``forecasts.parquet`` and its run's metrics and tags (a
:class:`FoldResult` per fold), never MLflow. What each number is: docs/walk-forward.md#the-runs.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...errors import UserError
from ...evaluation import probabilistic as pr
from ...evaluation import scores as sc
from ...evaluation.calibration import CALIBRATED
from ...evaluation.figures import COLORS, labels_inside
from ...evaluation.scorecard import CALIBRATION_TAG, PREFIXES, QUANTILE_COLUMNS, VERDICT_TAGS, WQL_VERDICT_TAGS
from ...evaluation.verdict import decide
from ...runtime.fsutil import write_atomic
from ...evaluation.plots import new_figure
from . import table as forecasters_table
from .table import origin_wql, times as _times  # noqa: F401 - origin_wql: this module's, as before

BASES = ("zeroshot", "persistence")
#: bases pooled, counted and drawn only where some fold scored them
EXTRA_BASES = ("histvol",)
KEYS = ["datetime", "instrument"]
#: the fold runs' skills the walk-forward reads, each with ``_ci_low`` / ``_ci_high``
FOLD_SKILLS = tuple(f"{kind}_vs_{base}" for kind in ("skill", "wql_skill") for base in BASES)
#: the calibrated forecaster's quantile-loss skill over the fine-tuned pair's (a fold run's metric)
CALIBRATION_SKILL = "wql_skill_calibrated_vs_raw"
#: skills a fold's run has only when it scored them: read, shown and stepped only where present
OPTIONAL_SKILLS = tuple(f"{kind}_vs_{base}" for kind in ("skill", "wql_skill") for base in EXTRA_BASES) + (
    CALIBRATION_SKILL,)
#: verdict tags a fold's run has only when it scored them
OPTIONAL_TAGS = tuple(tags[base] for tags in (VERDICT_TAGS, WQL_VERDICT_TAGS) for base in EXTRA_BASES) + (
    CALIBRATION_TAG,)
#: the forecasters whose pooled coverage and PIT KS the walk-forward computes
CALIBRATION_FORECASTERS = ("finetuned", CALIBRATED, "histvol", "zeroshot")
INTERVAL = ("", "_ci_low", "_ci_high")
SUMMARY_NAME = "summary.json"
FIGURE_NAME = "skill_by_fold.png"
BOOTSTRAP_UNITS = ("date", "origin")


class FoldsError(UserError, ValueError):
    """The folds' runs cannot be pooled (none, a repeated fold, a fold without origins,
    overlapping folds): their tables came from runs, so this is one line for the user."""


@dataclass
class FoldResult:
    """One fold's evaluation run: its metrics and tags and its two scorecard tables."""

    fold: int
    run_id: str
    test_period: tuple[str, str]  # first and last forecast date, ISO
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    origins: pd.DataFrame = field(default_factory=pd.DataFrame)  # evaluation/origins.parquet
    forecasts: pd.DataFrame = field(default_factory=pd.DataFrame)  # evaluation/forecasts.parquet


def check_folds(results: Sequence[FoldResult]) -> list[FoldResult]:
    """The folds in fold order; FoldsError for none, a repeated fold number, a fold without
    origins, or folds whose origin periods overlap (or run against the fold order): pooling would
    count those dates twice."""
    if not results:
        raise FoldsError("no folds to aggregate: a walk-forward summary needs at least one fold's evaluation run")
    ordered = sorted(results, key=lambda r: r.fold)
    numbers = [r.fold for r in ordered]
    if len(set(numbers)) != len(numbers):
        raise FoldsError(f"fold numbers repeat ({numbers}): each fold is one test period")
    for r in ordered:
        missing = [c for c in ("datetime", "instrument", "finetuned_mase") if c not in r.origins.columns]
        if missing or not len(r.origins):
            raise FoldsError(f"fold {r.fold} (run {r.run_id}) has no scored origins"
                             + (f" (origins.parquet lacks {missing})" if missing else ""))
    for before, after in itertools.pairwise(ordered):
        last, first = _times(before.origins["datetime"]).max(), _times(after.origins["datetime"]).min()
        if not last < first:
            raise FoldsError(f"folds {before.fold} and {after.fold} overlap: fold {before.fold}'s origins run to "
                             f"{last}, fold {after.fold}'s start at {first}; walk-forward test periods must be "
                             "disjoint and in fold order")
    return ordered


def fold_metrics(results: Sequence[FoldResult]) -> list[tuple[str, float, int | None]]:
    """``(name, value, step)`` per fold ``k``: ``fold<k>_<skill>`` with ``_ci_low`` /
    ``_ci_high`` (step None) and ``fold_<skill>`` at step ``k``, for each of ``FOLD_SKILLS`` and
    ``OPTIONAL_SKILLS`` the fold's run recorded (a finite value)."""
    out: list[tuple[str, float, int | None]] = []
    for r in sorted(results, key=lambda r: r.fold):
        for name in FOLD_SKILLS + OPTIONAL_SKILLS:
            for suffix in INTERVAL:
                value = _finite(r.metrics.get(name + suffix))
                if value is not None:
                    out.append((f"fold{r.fold}_{name}{suffix}", value, None))
            value = _finite(r.metrics.get(name))
            if value is not None:
                out.append((f"fold_{name}", value, r.fold))
    return out


def _finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


def _quantile_losses(results: Sequence[FoldResult], origins: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``origins``: each forecaster's quantile loss (a column per forecaster; NaN
    where forecasts.parquet has no row for the origin)."""
    frames = [r.forecasts for r in results if len(r.forecasts)]
    if not frames:
        return pd.DataFrame(index=origins.index)
    per = origin_wql(pd.concat(frames, ignore_index=True))
    wide = per.pivot(index=KEYS, columns="forecaster", values="quantile_loss")
    wide.columns = [str(c) for c in wide.columns]
    keys = pd.DataFrame({"datetime": _times(origins["datetime"]), "instrument": origins["instrument"].to_numpy()})
    return keys.merge(wide.reset_index(), on=KEYS, how="left").drop(columns=KEYS)


def pooled(results: Sequence[FoldResult], min_change: float,
           bootstrap_unit: str = "date") -> tuple[dict[str, float], dict[str, str]]:
    """Metrics and tags over every fold's origins together: ``pooled_skill_vs_<base>`` = 1 - the
    ratio of the mean MASE, ``pooled_wql_skill_vs_<base>`` = 1 - the ratio of the mean quantile loss,
    each with its 95% interval (whole origin dates resampled with ``bootstrap_unit: date``, else each
    origin alone) and the tags ``pooled_verdict_vs_<base>`` / ``pooled_verdict_wql_vs_<base>`` (the
    scorecard's rule: :func:`~kronos_mlflow.evaluation.verdict.decide` on the negated interval);
    ``pooled_wql_skill_calibrated_vs_raw`` likewise, when the folds calibrated
    (docs/walk-forward.md#the-runs)."""
    if bootstrap_unit not in BOOTSTRAP_UNITS:
        raise FoldsError(f"bootstrap_unit: {bootstrap_unit!r} must be one of {BOOTSTRAP_UNITS}")
    ordered = check_folds(results)
    origins = pd.concat([r.origins for r in ordered], ignore_index=True)
    losses = _quantile_losses(ordered, origins)
    groups = _times(origins["datetime"]).to_numpy() if bootstrap_unit == "date" else None
    metrics = {"pooled_origins": float(len(origins)), "folds": float(len(ordered))}
    tags: dict[str, str] = {}
    for base in BASES + EXTRA_BASES:
        kinds = []
        if f"{base}_mase" in origins.columns:
            kinds.append(("skill", "", origins["finetuned_mase"], origins[f"{base}_mase"]))
        if "finetuned" in losses.columns and base in losses.columns:
            kinds.append(("wql_skill", "wql_", losses["finetuned"], losses[base]))
        for kind, verdict_kind, model, other in kinds:
            value, low, high = sc.skill(model.to_numpy(dtype=np.float64), other.to_numpy(dtype=np.float64), groups)
            name = f"pooled_{kind}_vs_{base}"
            metrics.update({name: value, f"{name}_ci_low": low, f"{name}_ci_high": high})
            # decide() reads a change of the loss (negative = better): the skill's interval, negated
            tags[f"pooled_verdict_{verdict_kind}vs_{base}"] = decide(-high, -low, float(min_change))
    if "finetuned" in losses.columns and CALIBRATED in losses.columns:
        value, low, high = sc.skill(losses[CALIBRATED].to_numpy(dtype=np.float64),
                                    losses["finetuned"].to_numpy(dtype=np.float64), groups)
        if math.isfinite(value):
            name = f"pooled_{CALIBRATION_SKILL}"
            metrics.update({name: value, f"{name}_ci_low": low, f"{name}_ci_high": high})
            tags[f"pooled_{CALIBRATION_TAG}"] = decide(-high, -low, float(min_change))
    metrics.update(pooled_calibration(ordered))
    return metrics, tags


def _inside(rows: pd.DataFrame, low: str, high: str) -> tuple[int, int]:
    """(rows whose actual close lies in ``[low, high]``, rows where all three are finite)."""
    y, lo, hi = (rows[c].to_numpy(dtype=np.float64) for c in ("actual", low, high))
    ok = np.isfinite(y) & np.isfinite(lo) & np.isfinite(hi)
    return int(((y >= lo) & (y <= hi) & ok).sum()), int(ok.sum())


def pooled_calibration(results: Sequence[FoldResult]) -> dict[str, float]:
    """``pooled_<prefix>coverage_<c>`` (the share of every fold's (origin, step) rows whose actual
    close lies in the central ``c``% interval) and ``pooled_<prefix>pit_ks`` (the KS distance to
    U(0, 1) of every fold's ``pit``) over every fold's forecasts, per forecaster of
    :data:`CALIBRATION_FORECASTERS` (``<prefix>`` the scorecard's: ``test_``, ``calibrated_test_``,
    ...); a forecaster no fold forecast, or a column some fold's table of it lacks, gives no metric."""
    out: dict[str, float] = {}
    for name in CALIBRATION_FORECASTERS:
        tables = [r.forecasts[r.forecasts["forecaster"] == name] for r in results
                  if "forecaster" in r.forecasts.columns]
        tables = [t for t in tables if len(t)]
        if not tables:
            continue
        prefix = f"pooled_{PREFIXES[name]}"
        for nominal, (lo, hi) in pr.COVERAGES.items():
            low, high = pr.QUANTILE_COLUMNS[lo], pr.QUANTILE_COLUMNS[hi]
            if all(low in t.columns and high in t.columns for t in tables):
                hits, rows = np.sum([_inside(t, low, high) for t in tables], axis=0)
                if rows:
                    out[f"{prefix}coverage_{nominal}"] = float(hits / rows)
        if all("pit" in t.columns for t in tables):
            ks = pr.ks_distance(np.concatenate([t["pit"].to_numpy(dtype=np.float64) for t in tables]))
            if math.isfinite(ks):
                out[f"{prefix}pit_ks"] = ks
    return out


def fold_counts(results: Sequence[FoldResult]) -> dict[str, float]:
    """``folds_better_vs_<base>``, ``folds_worse_vs_<base>`` and ``win_rate_vs_<base>`` for each of
    ``BASES`` and each of ``EXTRA_BASES`` some fold has a verdict or skill against: the folds whose
    ``verdict_vs_<base>`` tag says so, and the share of the folds with a ``skill_vs_<base>`` whose
    skill is positive (NaN when none has one)."""
    out: dict[str, float] = {}
    for base in BASES + _scored(results):
        verdicts = [r.tags.get(VERDICT_TAGS[base]) for r in results]
        out[f"folds_better_vs_{base}"] = float(sum(v == "better" for v in verdicts))
        out[f"folds_worse_vs_{base}"] = float(sum(v == "worse" for v in verdicts))
        skills = [s for s in (_finite(r.metrics.get(f"skill_vs_{base}")) for r in results) if s is not None]
        out[f"win_rate_vs_{base}"] = float(np.mean([s > 0 for s in skills])) if skills else float("nan")
    return out


def _scored(results: Sequence[FoldResult]) -> tuple[str, ...]:
    """The ``EXTRA_BASES`` some fold's run has a verdict or a skill against."""
    return tuple(b for b in EXTRA_BASES if any(r.tags.get(VERDICT_TAGS[b]) or _finite(r.metrics.get(f"skill_vs_{b}"))
                                               is not None for r in results))


def walkforward_verdict(pooled_verdict: str, fold_verdicts: list[str]) -> str:
    """``better`` when the pooled verdict is better and no fold says worse; ``worse`` when the
    pooled verdict is worse; else ``inconclusive``."""
    if pooled_verdict == "better" and "worse" not in fold_verdicts:
        return "better"
    if pooled_verdict == "worse":
        return "worse"
    return "inconclusive"


def _folds_text(numbers: list[int]) -> str:
    return f"fold {numbers[0]} says" if len(numbers) == 1 else f"folds {', '.join(map(str, numbers))} say"


def verdict_why(base: str, pooled_verdict: str, results: Sequence[FoldResult], min_change: float) -> str:
    """One sentence: why the walk-forward verdict against ``base`` is what it is."""
    verdicts = [(r.fold, r.tags.get(VERDICT_TAGS[base])) for r in results]
    worse = [k for k, v in verdicts if v == "worse"]
    better = [k for k, v in verdicts if v == "better"]
    head = f"vs {base}: pooled interval {pooled_verdict}"
    if pooled_verdict == "better":
        if worse:
            return f"{head}, but {_folds_text(worse)} worse"
        return f"{head} and no fold says worse ({len(better)} of {len(verdicts)} folds better)"
    if pooled_verdict == "worse":
        return f"{head} ({len(worse)} of {len(verdicts)} folds worse)"
    return (f"{head}: it does not lie wholly beyond a {min_change * 100:g}% change "
            f"({len(better)} of {len(verdicts)} folds better, {len(worse)} worse)")


def _fold_entry(r: FoldResult) -> dict[str, Any]:
    entry: dict[str, Any] = {"fold": int(r.fold), "run_id": r.run_id, "test_period": [str(t) for t in r.test_period],
                             "origins": len(r.origins)}
    for name in FOLD_SKILLS:
        for suffix in INTERVAL:
            entry[name + suffix] = _finite(r.metrics.get(name + suffix))
    for tags in (VERDICT_TAGS, WQL_VERDICT_TAGS):
        for base in BASES:
            entry[tags[base]] = r.tags.get(tags[base])
    for name in OPTIONAL_SKILLS:  # only what the fold's run has: an older run's entry is as it was
        if _finite(r.metrics.get(name)) is not None:
            for suffix in INTERVAL:
                entry[name + suffix] = _finite(r.metrics.get(name + suffix))
    for tag in OPTIONAL_TAGS:
        if r.tags.get(tag):
            entry[tag] = r.tags[tag]
    return entry


def summarize(results: Sequence[FoldResult], min_change: float, bootstrap_unit: str = "date") -> dict[str, Any]:
    """The walk-forward's record: ``metrics`` (pooled skills, counts over folds), ``tags``
    (pooled and walk-forward verdicts, ``walkforward_verdict_why``), ``steps`` (:func:`fold_metrics`),
    ``folds`` (per fold: run, test period, skills with intervals, verdicts) and ``forecasters``
    (the table of :mod:`~kronos_mlflow.workflows.walkforward.table`)."""
    ordered = check_folds(results)
    metrics, tags = pooled(ordered, min_change, bootstrap_unit)
    metrics.update(fold_counts(ordered))
    table = forecasters_table.forecaster_table(ordered)  # each forecaster over every fold (walkforward/forecasters.*)
    metrics.update(forecasters_table.metrics(table))
    for base in BASES + EXTRA_BASES:
        for kind, fold_tags in (("", VERDICT_TAGS), ("wql_", WQL_VERDICT_TAGS)):
            pooled_tag = f"pooled_verdict_{kind}vs_{base}"
            if pooled_tag in tags:
                tags[f"walkforward_verdict_{kind}vs_{base}"] = walkforward_verdict(
                    tags[pooled_tag], [r.tags.get(fold_tags[base], "") for r in ordered])
    shown = [t[b] for t in (VERDICT_TAGS, WQL_VERDICT_TAGS) for b in BASES] + list(OPTIONAL_TAGS)
    for r in ordered:  # each fold's own verdicts beside its skills: fold<k>_verdict_vs_zeroshot, ...
        for tag in shown:
            if r.tags.get(tag):
                tags[f"fold{int(r.fold)}_{tag}"] = r.tags[tag]
    explained = next((b for b in BASES if f"pooled_verdict_vs_{b}" in tags), None)
    if explained is not None:
        tags["walkforward_verdict_why"] = verdict_why(explained, tags[f"pooled_verdict_vs_{explained}"], ordered,
                                                      float(min_change))
    return {"metrics": metrics, "tags": tags, "steps": fold_metrics(ordered),
            "folds": [_fold_entry(r) for r in ordered], "min_change": float(min_change),
            "bootstrap_unit": bootstrap_unit, "forecasters": forecasters_table.records(table)}


def _plain(value: Any) -> Any:
    """``value`` as plain JSON: non-finite floats as None, tuples as lists, numpy scalars unwrapped."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_summary(summary: dict[str, Any], directory: str | Path) -> Path:
    """``summary.json`` in ``directory`` (written whole, then renamed); NaN written as null."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SUMMARY_NAME
    write_atomic(path, json.dumps(_plain(summary), indent=2, sort_keys=True, allow_nan=False))
    return path


def _figure_title(tags: dict[str, str], n_folds: int) -> str:
    parts = []
    for kind, label in (("", "MASE"), ("wql_", "WQL")):
        said = [f"vs {b} {tags[f'walkforward_verdict_{kind}vs_{b}']}" for b in BASES + EXTRA_BASES
                if f"walkforward_verdict_{kind}vs_{b}" in tags]
        if said:
            parts.append(f"{label}: {', '.join(said)}")
    if f"pooled_{CALIBRATION_TAG}" in tags:
        parts.append(f"calibrated vs raw (WQL, pooled): {tags[f'pooled_{CALIBRATION_TAG}']}")
    return f"walk-forward over {n_folds} folds\n" + "\n".join(parts or ["no verdict"])


def _draw_skill(ax, folds: list[dict[str, Any]], metrics: dict[str, float], name: str, color: str,
                label: str) -> tuple[list, list]:
    """The folds' skill ``name`` (dots with their 95% intervals) and its pooled value
    ``pooled_<name>`` (a dashed line in its band); the value labels drawn and the y values the
    axes must show."""
    labels, spans = [], []
    shown = [(i, f[name], f.get(name + "_ci_low"), f.get(name + "_ci_high")) for i, f in enumerate(folds)
             if f.get(name) is not None]
    if shown:
        x, v = np.array([s[0] for s in shown], dtype=np.float64), np.array([s[1] for s in shown])
        low = np.array([s[2] if s[2] is not None else s[1] for s in shown])
        high = np.array([s[3] if s[3] is not None else s[1] for s in shown])
        ax.errorbar(x, v, yerr=[np.maximum(0.0, v - low), np.maximum(0.0, high - v)], fmt="o", capsize=4,
                    color=color, label=f"fold skill {label} (95% CI)")
        labels += [ax.annotate(f"{value:+.3f}", (xi, value), textcoords="offset points", xytext=(6, 0),
                               ha="left", va="center", fontsize=7) for xi, value in zip(x, v)]
        spans += list(low) + list(high)
    value = _finite(metrics.get(f"pooled_{name}"))
    if value is not None:
        low, high = (_finite(metrics.get(f"pooled_{name}{side}")) for side in ("_ci_low", "_ci_high"))
        low, high = value if low is None else low, value if high is None else high
        ax.axhspan(low, high, color=color, alpha=0.12, lw=0)
        ax.axhline(value, color=color, ls="--", lw=1.0,
                   label=f"pooled {label} {value:+.3f} [{low:+.3f}, {high:+.3f}]")
        spans += [low, high]
    return labels, spans


def skill_figure(summary: dict[str, Any], path: str | Path) -> Path:
    """``skill_by_fold.png`` (at ``path``, or in it when it is a directory): one panel per base
    (zero-shot, persistence, histvol where scored) and, when a fold calibrated, one for the
    calibrated forecaster's WQL skill over the fine-tuned pair's, each on its own scale, with each
    fold's skill and its 95% interval in fold order, the pooled value and interval, the zero
    line; the title gives the verdicts."""
    path = Path(path)
    path = path / FIGURE_NAME if path.is_dir() else path
    folds, metrics = summary["folds"], summary["metrics"]
    bases = [b for b in BASES + EXTRA_BASES if any(f.get(f"skill_vs_{b}") is not None for f in folds)]
    bases = bases or list(BASES[:1])
    panels = [(f"skill_vs_{b}", COLORS.get(b, "k"), f"vs {b}", f"skill vs {b}") for b in bases]
    calibrated = (any(f.get(CALIBRATION_SKILL) is not None for f in folds)
                  or _finite(metrics.get(f"pooled_{CALIBRATION_SKILL}")) is not None)
    if calibrated:
        panels.append((CALIBRATION_SKILL, COLORS.get(CALIBRATED, "k"), "calibrated vs raw",
                       "WQL skill\ncalibrated vs raw"))
    fig = new_figure(max(6.4, 2.0 + 1.6 * len(folds)), 1.0 + 2.9 * len(panels))
    ticks = [f"fold {f['fold']}\n{f['test_period'][0]}..{f['test_period'][1]}" for f in folds]
    for j, (name, color, label, ylabel) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, j + 1)
        labels, spans = _draw_skill(ax, folds, metrics, name, color, label)
        ax.axhline(0.0, color="k", lw=0.8)
        lo, hi = min(spans + [0.0]), max(spans + [0.0])
        pad = 0.15 * (hi - lo or 1.0)
        ax.set_ylim(lo - pad, hi + 2.5 * pad)  # room above for the legend
        ax.set_xlim(-0.6, len(folds) - 0.4)
        ax.set_xticks(range(len(folds)), ticks if j == len(panels) - 1 else [""] * len(folds), fontsize=7)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        labels_inside(fig, ax, labels)
    note = "skill = 1 - MASE(fine-tuned) / MASE(baseline)"
    if calibrated:
        note += "; calibrated vs raw = 1 - WQL(calibrated) / WQL(fine-tuned)"
    fig.suptitle(_figure_title(summary["tags"], len(folds)) + "\n" + note, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    tmp.replace(path)
    return path
