"""The ensemble forecaster ``ensemble``, fit on the calibration (validation) origins only: greedy
ensemble selection with replacement (Caruana et al. 2004) over the members the served model can
compute (:data:`~kronos_mlflow.serving.forecasting.ensemble.MEMBERS`), a fixed number of rounds
(``ensemble_rounds``), each round adding the member whose addition gives the lowest validation
WQL; the mixture's quantiles are then conformalised as the calibrated forecaster's are
(:func:`~kronos_mlflow.evaluation.calibration.fit`). Nothing here reads a test bar: the fit takes
the calibration origins' arrays, the test origins only receive the result
(docs/calibration.md#the-ensemble-forecaster-ensemble).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config.sections import as_section
from ..runtime.fsutil import write_atomic
from ..serving.forecasting import ensemble as served_ensemble
from ..serving.forecasting.ensemble import ENSEMBLE, FILE, MEMBERS, Ensemble, members, mix, read
from ..serving.forecasting.quantiles import DECILES, histvol_sigma
from . import calibration as cb, probabilistic as pr, scores as sc
from .plots import new_figure
from .verdict import decide

__all__ = ["ENSEMBLE", "FILE", "Ensemble", "fit", "forecast", "model_ensemble", "record_metrics", "select", "wql"]

WQL_LEVELS = sc.LEVELS[None, :, None]


def wql(levels: np.ndarray, actual: np.ndarray) -> float:
    """The weighted quantile loss of quantiles ``(n, 13, H)`` at the nine deciles, as the scorecard's
    ``wql_close``: ``sum quantile_loss / sum |y|`` over the origins."""
    y = np.asarray(actual, dtype=np.float64)
    diff = y[:, None, :] - np.asarray(levels, dtype=np.float64)[:, DECILES]
    loss = (2.0 * np.maximum(WQL_LEVELS * diff, (WQL_LEVELS - 1.0) * diff)).mean(axis=1).sum(axis=1)
    return float(loss.sum() / np.abs(y).sum()) if np.abs(y).sum() > 0 else float("nan")


def select(levels: Mapping[str, np.ndarray], actual: np.ndarray, rounds: int) -> dict[str, float]:
    """Greedy ensemble selection with replacement: ``rounds`` times, add the member (of ``levels``,
    each ``(n, 13, H)`` on the same origins) whose addition to the mixture so far gives the lowest
    WQL against ``actual``; a member's weight is how often it was added over ``rounds``. A tie
    goes to the member first in ``levels``' order."""
    names = list(levels)
    counts = dict.fromkeys(names, 0)
    current = None
    for r in range(int(rounds)):
        best, best_loss, best_mix = None, math.inf, None
        for name in names:
            candidate = levels[name] if current is None else (current * r + levels[name]) / (r + 1)
            loss = wql(candidate, actual)
            if loss < best_loss - 1e-15:
                best, best_loss, best_mix = name, loss, candidate
        if best is None:  # no finite loss: the first member
            best, best_mix = names[0], levels[names[0]] if current is None else (current * r + levels[names[0]]) / (r + 1)
        counts[best] += 1
        current = best_mix
    return {name: counts[name] / max(int(rounds), 1) for name in names}


def fit(raw: Mapping[str, np.ndarray], history_close: np.ndarray, actual: np.ndarray, rounds: int,
        time_range: tuple[str, str] = ("", "")) -> tuple[Ensemble, dict[str, float]]:
    """The ensemble fit on the calibration origins: ``raw`` the fine-tuned pair's ``levels``,
    ``mean`` and ``p_up`` on them, their lookback closes and actual closes; the weights chosen on
    the origins every member forecasts (a finite volatility), the mixture conformalised on the same
    origins. Returns it and each member's validation WQL (``validation_wql_<member>``, the
    mixture's as ``validation_wql_ensemble``)."""
    c = np.asarray(history_close, dtype=np.float64)
    y = np.asarray(actual, dtype=np.float64)
    sigma = histvol_sigma(c)
    ok = np.isfinite(sigma) & np.isfinite(np.asarray(raw["levels"])).all(axis=(1, 2))
    parts = members(np.asarray(raw["levels"])[ok], np.asarray(raw["mean"])[ok], np.asarray(raw["p_up"])[ok], c[ok],
                    sigma[ok])
    weights = select({name: parts[name]["levels"] for name in MEMBERS}, y[ok], rounds)
    mixed = mix(parts, weights)
    calibrator = cb.fit(mixed["levels"], c[ok, -1], sigma[ok], y[ok], mixed["p_up"], time_range)
    losses = {f"validation_wql_{name}": wql(parts[name]["levels"], y[ok]) for name in MEMBERS}
    losses["validation_wql_ensemble"] = wql(mixed["levels"], y[ok])
    from .aci import scores as conformal_scores  # lazy: evaluation/aci.py reads this module's results

    kept = conformal_scores(mixed["levels"], c[ok, -1], sigma[ok], y[ok])
    fits = kept.size <= served_ensemble.MAX_SCORES and np.isfinite(kept).all()
    return Ensemble(weights, int(rounds), calibrator, kept if fits else None), losses


def forecast(ensemble: Ensemble, raw: Mapping[str, np.ndarray], history_close: np.ndarray, actual: np.ndarray,
             u: np.ndarray) -> dict[str, np.ndarray]:
    """The ensemble's distribution on the (test) origins, for
    :func:`~kronos_mlflow.evaluation.scores.distribution_scores`: its quantiles, mean and ``p_up``
    (NaN where the lookback gives no volatility), the PIT from its quantiles, no CRPS."""
    c = np.asarray(history_close, dtype=np.float64)
    y = np.asarray(actual, dtype=np.float64)
    sigma = histvol_sigma(c)
    ok = np.isfinite(sigma)
    levels = np.full(np.asarray(raw["levels"]).shape, np.nan)
    mean = np.full(y.shape, np.nan)
    p_up = np.full(len(y), np.nan)
    if ok.any():
        out = ensemble.apply(np.asarray(raw["levels"])[ok], np.asarray(raw["mean"])[ok], np.asarray(raw["p_up"])[ok],
                             c[ok], sigma[ok])
        levels[ok], mean[ok], p_up[ok] = out["levels"], out["mean"], out["p_up"]
    return {"levels": levels, "mean": mean, "crps_steps": np.full(y.shape, np.nan),
            "pit": pr.pit_from_quantiles(levels, y, u), "p_up": p_up}


def record_metrics(ensemble: Ensemble, per: Mapping[str, Mapping[str, np.ndarray]], groups, min_change: float,
                   prefixes: Mapping[str, str]) -> tuple[dict[str, float], dict[str, str]]:
    """``ensemble_weight_<member>``, and against every other forecaster scored on the test origins
    ``wql_skill_ensemble_vs_<forecaster>`` (``1 - WQL ratio``, with its 95% bootstrap interval)
    and the tag ``verdict_wql_ensemble_vs_<forecaster>`` (the scorecard's rule)."""
    metrics = {f"ensemble_weight_{name}": float(ensemble.weights.get(name, 0.0)) for name in MEMBERS}
    metrics["ensemble_rounds"] = float(ensemble.rounds)
    tags = {}
    if ENSEMBLE not in per:
        return metrics, tags
    mine = per[ENSEMBLE]["quantile_loss"]
    for name in prefixes:
        if name == ENSEMBLE or name not in per:
            continue
        value, low, high = sc.skill(mine, per[name]["quantile_loss"], groups)
        key = f"wql_skill_ensemble_vs_{name}"
        metrics.update({key: value, f"{key}_ci_low": low, f"{key}_ci_high": high})
        tags[f"verdict_wql_ensemble_vs_{name}"] = decide(-high, -low, min_change)
    return metrics, tags


def model_ensemble(predictor_dir: Path, what: str = "--model") -> Ensemble | None:
    """The ensemble a logged forecaster carries beside its checkpoints (``ensemble/ensemble.json``
    next to ``predictor/``), checked, or None (a model logged without one)."""
    import os

    path = Path(predictor_dir).parent / ENSEMBLE / FILE
    if not os.path.lexists(path):
        return None
    return read(str(path), f"{what}: its {ENSEMBLE}/{FILE}")


def weights_figure(weights: Mapping[str, float], losses: Mapping[str, float], description: str = ""):
    """The ensemble's weights (bars), each member's validation WQL and the mixture's beside them."""

    fig = new_figure(6.4, 3.2)
    ax = fig.add_subplot(1, 1, 1)
    names = list(weights)
    ax.barh(range(len(names)), [weights[n] for n in names], color="#17becf")
    for i, name in enumerate(names):
        loss = losses.get(f"validation_wql_{name}", float("nan"))
        ax.annotate(f"{weights[name]:.2f} (validation WQL {loss:.4f})", (weights[name], i), textcoords="offset points",
                    xytext=(4, -3), fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlim(0.0, 1.6)
    ax.set_xlabel("weight (share of greedy selection's rounds)")
    ax.set_title(f"ensemble weights, validation WQL {losses.get('validation_wql_ensemble', float('nan')):.4f}"
                 + (f": {description}" if description else ""), fontsize=8)
    return fig


def build_for(evaluation: Any, keep: Mapping[str, Any]) -> tuple[Ensemble | None, dict[str, float]]:
    """The ensemble of ``keep`` (what :func:`~kronos_mlflow.evaluation.scorecard.fit_calibrator`
    kept of the calibration origins: ``raw``, ``history``, ``actual``, ``time_range``), or None
    with ``ensemble_rounds`` 0 or nothing kept. ``evaluation``: the config's evaluation section
    (or the whole config)."""
    rounds = int(as_section(evaluation, "evaluation").ensemble_rounds or 0)
    if rounds <= 0 or not keep or "raw" not in keep:
        return None, {}
    return fit(keep["raw"], keep["history"], keep["actual"], rounds, keep.get("time_range", ("", "")))


def write_artifacts(ensemble: Ensemble, losses: Mapping[str, float], directory: Path, description: str = "") -> list[Path]:
    """``ensemble.json`` (what the logged model serves) and ``ensemble.png`` (its weights) in
    ``directory``, each written whole, then renamed."""

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / FILE, ensemble.dumps())
    tmp = directory / ".ensemble.png.tmp"
    weights_figure(ensemble.weights, losses, description).savefig(tmp, format="png", dpi=110)
    tmp.replace(directory / "ensemble.png")
    return [directory / FILE, directory / "ensemble.png"]
