"""The ensemble forecaster as it is applied: the members the served model can compute from what
it is given (the fine-tuned pair's sample paths, the lookback's closes), their quantiles, means
and probabilities of a rise mixed with the weights that greedy selection chose on validation
origins, then conformalised by the ensemble's own :class:`~.quantiles.Calibrator`. Numpy only,
read by the pyfunc and by the scorecard (:mod:`kronos_mlflow.evaluation.ensemble`, where the
weights are fit); JSON, never pickle; docs/calibration.md#the-ensemble-forecaster-ensemble.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from ...errors import ConfigError, UserError
from ...tracking import handover as hv
from . import calibrator_file
from .quantiles import CLOSE, QLEVELS, Calibrator, histvol_sigma, path_quantiles, uncalibrated

ENSEMBLE = "ensemble"
#: the members, in the order greedy selection tries them (the first wins a tie): the fine-tuned
#: pair's raw paths, the volatility baseline and persistence, each computed from the context
MEMBERS = ("finetuned", "histvol", "persistence")
FORMAT = "kronos-mlflow ensemble"
VERSION = 1
FILE = "ensemble.json"
_Z = np.array([NormalDist().inv_cdf(float(level)) for level in QLEVELS])


def members(levels: np.ndarray, mean: np.ndarray, p_up: np.ndarray, history_close: np.ndarray,
            sigma: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Each member's ``levels`` ``(n, 13, H)``, ``mean`` ``(n, H)`` and ``p_up`` ``(n,)``: the
    fine-tuned pair's raw ones as given; histvol's log-normal around the origin's close,
    ``log(c_h / c_L) ~ N(0, sigma^2 h)`` (quantiles ``c_L exp(sigma sqrt(h) z)``, mean
    ``c_L exp(sigma^2 h / 2)``, ``p_up`` 1/2); persistence's the origin's close at every level
    and step (``p_up`` NaN: one path states no probability)."""
    levels = np.asarray(levels, dtype=np.float64)
    n, _, horizon = levels.shape
    last = np.asarray(history_close, dtype=np.float64)[:, -1]
    spread = np.asarray(sigma, dtype=np.float64)[:, None] * np.sqrt(np.arange(1, horizon + 1))[None, :]
    vol = {"levels": last[:, None, None] * np.exp(spread[:, None, :] * _Z[None, :, None]),
           "mean": last[:, None] * np.exp(spread ** 2 / 2), "p_up": np.where(np.isfinite(spread[:, 0]), 0.5, np.nan)}
    flat = {"levels": np.broadcast_to(last[:, None, None], levels.shape).copy(),
            "mean": np.broadcast_to(last[:, None], (n, horizon)).copy(), "p_up": np.full(n, np.nan)}
    return {"finetuned": {"levels": levels, "mean": np.asarray(mean, dtype=np.float64),
                          "p_up": np.asarray(p_up, dtype=np.float64)}, "histvol": vol, "persistence": flat}


def mix(parts: Mapping[str, Mapping[str, np.ndarray]], weights: Mapping[str, float]) -> dict[str, np.ndarray]:
    """The weighted mixture of the members' quantiles (quantile averaging: each level the weighted
    mean of the members' quantiles at it, so in order when theirs are) and means; ``p_up`` the
    weighted mean of the members that state one (NaN where none does). Members of weight 0 are
    left out."""
    used = [(name, float(w)) for name, w in weights.items() if w > 0]
    levels = sum(w * np.asarray(parts[name]["levels"], dtype=np.float64) for name, w in used)
    mean = sum(w * np.asarray(parts[name]["mean"], dtype=np.float64) for name, w in used)
    num = np.zeros(len(levels))
    den = np.zeros(len(levels))
    for name, w in used:
        p = np.asarray(parts[name]["p_up"], dtype=np.float64)
        ok = np.isfinite(p)
        num += np.where(ok, w * p, 0.0)
        den += np.where(ok, w, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_up = np.where(den > 0, num / den, np.nan)
    return {"levels": levels, "mean": mean, "p_up": p_up}


@dataclass
class Ensemble:
    """The fitted ensemble: each member's weight (summing to 1), the rounds of greedy selection
    that chose them, and the calibrator fit on the mixture's validation forecasts."""

    weights: dict[str, float]
    rounds: int
    calibrator: Calibrator
    #: the mixture's conformal scores on the validation origins ``(n, 6, H)`` (what ACI widens by,
    #: kept so that scoring the logged model can run ACI); None when not kept
    scores: np.ndarray | None = field(default=None, repr=False)

    def apply(self, levels: np.ndarray, mean: np.ndarray, p_up: np.ndarray, history_close: np.ndarray,
              sigma: np.ndarray) -> dict[str, np.ndarray]:
        """The ensemble's conformalised ``levels``, ``mean`` and ``p_up`` from the fine-tuned
        pair's raw ones and the lookback closes (``sigma``: their volatility, finite)."""
        mixed = mix(members(levels, mean, p_up, history_close, sigma), self.weights)
        last = np.asarray(history_close, dtype=np.float64)[:, -1]
        p = mixed["p_up"]
        return {"levels": self.calibrator.quantiles(mixed["levels"], last, sigma), "mean": mixed["mean"],
                "p_up": np.where(np.isnan(p), np.nan, self.calibrator.p_up(np.where(np.isnan(p), 0.5, p)))}

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION,
                "method": "greedy selection with replacement by validation WQL; quantile averaging; conformalised",
                "members": list(MEMBERS), "rounds": int(self.rounds),
                "weights": {name: float(self.weights.get(name, 0.0)) for name in MEMBERS},
                "calibrator": self.calibrator.to_json(),
                **({"validation_scores": self.scores.tolist()} if self.scores is not None else {})}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True, allow_nan=False)


MAX_ROUNDS = 10_000
#: the most validation scores an ensemble.json keeps (origins x intervals x steps); more are not kept
MAX_SCORES = 250_000
_KEYS = ("format", "version", "method", "members", "rounds", "weights", "calibrator")


def from_json(data: Any, source: str) -> Ensemble:
    """The :class:`Ensemble` of the JSON value ``data``, each field checked (its format and
    version, this version's members, rounds from 1 to :data:`MAX_ROUNDS`, a weight in [0, 1]
    per member summing to 1, the calibrator as a ``calibrator.json`` is checked); else one line
    naming ``source`` and the field."""
    data = dict(data) if isinstance(data, dict) else data
    scores = data.pop("validation_scores", None) if isinstance(data, dict) else None  # optional
    data = hv.keys_of(data, _KEYS, source, "the file")
    hv.format_and_version(data, source, FORMAT, VERSION, "ensemble")
    if data["members"] != list(MEMBERS):
        raise UserError(f"{source}: members is '{hv.names.shown(data['members'])}'; expected {list(MEMBERS)}")
    rounds = hv.integer(data["rounds"], source, "rounds", 1, MAX_ROUNDS)
    raw = hv.keys_of(data["weights"], MEMBERS, source, "weights")
    weights = {name: hv.number(raw[name], source, f"weights.{name}", 0.0, 1.0) for name in MEMBERS}
    if abs(sum(weights.values()) - 1.0) > 1e-6:
        raise UserError(f"{source}: weights sum to {sum(weights.values()):g}; expected weights summing to 1")
    calibrator = calibrator_file.from_json(data["calibrator"], f"{source} calibrator")
    return Ensemble(weights, rounds, calibrator, _scores(scores, calibrator.horizon, source))


def _scores(value: Any, horizon: int, source: str) -> np.ndarray | None:
    """The optional ``validation_scores``: rows of six lists of ``horizon`` finite numbers."""

    if value is None:
        return None
    shape = f"a list of at most {MAX_SCORES // (6 * horizon):,} rows of 6 lists of {horizon} numbers"
    if not isinstance(value, list) or not value or len(value) * 6 * horizon > MAX_SCORES:
        raise UserError(f"{source}: validation_scores is {hv.kind_of(value)}; expected {shape}")
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise UserError(f"{source}: validation_scores is not {shape}") from None
    if array.shape != (len(value), 6, horizon) or not np.isfinite(array).all() or np.abs(array).max() > 1e6:
        raise UserError(f"{source}: validation_scores of shape {array.shape} holds a value that is not a finite "
                        f"number within 1e6, or is not {shape}")
    return array


def read(path: str, source: str | None = None) -> Ensemble:
    """The ensemble of the file ``path`` (an ``ensemble.json``), read by the one bounded reader of
    handed-over files and checked (:func:`from_json`); else one line naming ``source``."""


    source = source or str(path)
    return from_json(hv.json_value(Path(path), source, "the JSON that a run's evaluation/ensemble.json holds",
                                   calibrator_file.MAX_CALIBRATOR_BYTES), source)


# ----------------------------------------------------------------------------- what the model serves

ARTIFACT = "ensemble"  # the logged model's directory holding FILE (absent in models logged without one)
#: the pyfunc's ``forecaster`` param: which forecaster answers ('' = the model's best: the
#: ensemble where it carries one, else the calibrated forecaster)
FORECASTERS = ("ensemble", "calibrated", "raw")


def check_forecaster(value: Any) -> str:
    """The ``forecaster`` param, checked: one of :data:`FORECASTERS` or '' (one line otherwise)."""

    if not isinstance(value, str) or value not in ("", *FORECASTERS):
        raise ConfigError(f"forecaster is {value!r}; expected one of {', '.join(FORECASTERS)} (ensemble: the "
                          "validation-fit ensemble where the model carries one; calibrated; raw: the paths' own)")
    return value


def loaded(path: str) -> tuple[Ensemble | None, str]:
    """``(ensemble, '')`` of the model's ensemble artifact ``path``, or, when it is malformed,
    ``(None, why)`` with a warning naming the file and the field: the model then answers as its
    calibrated forecaster, never a failed load."""
    import os
    import warnings


    file = os.path.join(path, FILE) if os.path.isdir(path) else path
    try:
        return read(file, f"the model's {ARTIFACT}/{FILE}"), ""
    except UserError as exc:
        warnings.warn(f"{exc}; the model answers as its calibrated forecaster", UserWarning, stacklevel=2)
        return None, f"{exc}: answered by the calibrated forecaster"


def close_distribution(paths: np.ndarray, bars: np.ndarray, ensemble: Ensemble) -> dict[str, np.ndarray]:
    """The close's distribution through ``ensemble`` of sample paths ``(B, S, pred_len, 6)`` from
    lookback ``bars`` ``(B, L, 6)``, with the keys of the pyfunc's calibrated answer and
    ``forecaster`` ``(B,)``: ``ensemble`` for each series whose lookback gives the volatility
    (histvol's and the conformal width's), ``raw`` with the reason for the others."""

    close = np.asarray(paths, dtype=np.float64)[..., CLOSE]
    history = np.asarray(bars, dtype=np.float64)[..., CLOSE]
    levels, p_up = path_quantiles(close, history[:, -1])
    note = uncalibrated(history)
    ok = note == ""
    if ok.any():
        out = ensemble.apply(levels[ok], close[ok].mean(axis=1), p_up[ok], history[ok], histvol_sigma(history[ok]))
        levels[ok], p_up[ok] = out["levels"], out["p_up"]
    return {"quantiles": levels, "quantile_levels": QLEVELS.astype(np.float64), "p_up": p_up,
            "calibration": np.where(ok, "calibrated", "raw"), "calibration_note": note,
            "forecaster": np.where(ok, ENSEMBLE, "raw")}
