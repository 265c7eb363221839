"""A handed-over ``calibrator.json`` read back: every field checked by the handed-over files'
reader (:mod:`kronos_mlflow.tracking.handover`), one line naming the file and the field for
anything else; docs/calibration.md, docs/reliability.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...config import names
from ...errors import UserError
from ...tracking import handover as hv
from .quantiles import FORMAT, HISTVOL_RETURNS, INTERVALS, QLEVELS, SIGMA_FLOOR, VERSION, Calibrator

#: a calibrator's most bytes (six rows of MAX_STEP score quantiles and an isotonic map of many
#: origins), the largest score quantile it may hold (a score is a close's deviation in units of
#: its last close times the floored volatility: 1e6 is a move of a hundred times the close) and
#: the most calibration origins
MAX_CALIBRATOR_BYTES = 16 << 20
MAX_SCORE = 1e6
MAX_ORIGINS = 10**8
CALIBRATOR_EXPECTED = "the JSON that a run's evaluation/calibrator.json holds"
_CALIBRATOR_KEYS = ("format", "version", "method", "levels", "intervals", "score_quantiles", "sigma_returns",
                    "sigma_floor", "p_up", "origins", "base_rate", "time_range")


def _same(value: Any, expected: list, source: str, where: str, meaning: str) -> None:
    if value != expected:
        raise UserError(f"{source}: {where} is '{names.shown(value)}'; expected {names.shown(expected, 120)} "
                        f"({meaning})")


def from_json(data: Any, source: str = "calibrator") -> Calibrator:
    """The :class:`~kronos_mlflow.serving.forecasting.quantiles.Calibrator` of the JSON value
    ``data``, each field checked: its format and version, the quantile levels and intervals of
    this version, score quantiles (six rows of 1 to :data:`~kronos_mlflow.tracking.handover.MAX_STEP` finite numbers within
    +-:data:`MAX_SCORE`), the volatility's returns and floor, the isotonic map of ``p_up``
    (thresholds and values in [0, 1], each increasing, equally many, at most ``origins``), a
    count of origins (1 to :data:`MAX_ORIGINS`), a base rate in [0, 1] and the time range of
    its forecast bars (two dates in order, or both empty); else one line naming ``source`` and
    the field."""
    data = hv.keys_of(data, _CALIBRATOR_KEYS, source, "the file")
    hv.format_and_version(data, source, FORMAT, VERSION, "calibrator")
    _same(data["levels"], [float(v) for v in QLEVELS], source, "levels", "this version's quantile levels")
    _same(data["intervals"], [[float(QLEVELS[lo]), float(QLEVELS[hi])] for lo, hi in INTERVALS], source,
          "intervals", "this version's central intervals")
    _same(data["sigma_returns"], HISTVOL_RETURNS, source, "sigma_returns", "the log returns the served volatility uses")
    _same(data["sigma_floor"], SIGMA_FLOOR, source, "sigma_floor", "the volatility's floor")
    rows = data["score_quantiles"]
    if not isinstance(rows, list) or len(rows) != len(INTERVALS):
        raise UserError(f"{source}: score_quantiles is {hv.kind_of(rows)}"
                        + (f" of {len(rows)} rows" if isinstance(rows, list) else "")
                        + f"; expected {len(INTERVALS)} rows, one per central interval")
    table = [hv.numbers(row, source, f"score_quantiles[{j}]", -MAX_SCORE, MAX_SCORE, hv.MAX_STEP)
             for j, row in enumerate(rows)]
    horizon = len(table[0])
    if not horizon or any(len(row) != horizon for row in table):
        raise UserError(f"{source}: score_quantiles has rows of {', '.join(str(len(r)) for r in table)} steps; "
                        f"expected {len(INTERVALS)} rows of the same 1 to {hv.MAX_STEP:,} steps")
    origins = hv.integer(data["origins"], source, "origins", 1, MAX_ORIGINS)
    up = hv.keys_of(data["p_up"], ("x", "y"), source, "p_up")
    x = hv.numbers(up["x"], source, "p_up.x", 0.0, 1.0, origins, ordered=True)
    y = hv.numbers(up["y"], source, "p_up.y", 0.0, 1.0, origins, ordered=True)
    if len(x) != len(y):
        raise UserError(f"{source}: p_up has {len(x)} thresholds x and {len(y)} values y; expected as many of each")
    base = hv.number(data["base_rate"], source, "base_rate", 0.0, 1.0)
    span = data["time_range"]
    if span == ["", ""]:
        span = ("", "")
    else:
        span = hv.period(span, source, "time_range")
    return Calibrator(np.asarray(table, dtype=np.float64), np.asarray(x, dtype=np.float64),
                      np.asarray(y, dtype=np.float64), origins, base, tuple(span))


def read(path: str | os.PathLike, source: str) -> Calibrator:
    """The calibrator of the file ``path`` (a ``calibrator.json``: :func:`from_json`),
    or one UserError line naming ``source`` and the field."""
    return from_json(hv.json_value(Path(path), source, CALIBRATOR_EXPECTED, MAX_CALIBRATOR_BYTES), source)
