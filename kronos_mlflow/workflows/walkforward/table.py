"""The walk-forward's table of forecasters: for each forecaster the folds scored (the fine-tuned
pair raw and calibrated, the ensemble, aci, histvol, persistence, the zero-shot pair), over every
fold's ``forecasts.parquet`` pooled: WQL, coverage 50/80/90, PIT KS and the 80% coverage by
volatility tercile of the origin. Written as ``walkforward/forecasters.csv``, ``.json`` and
``.md`` (a markdown table), put in ``summary.json`` and logged as ``pooled_<prefix>wql_close``,
``pooled_<prefix>coverage_80_vol<k>`` (docs/walk-forward.md#the-forecasters-table).

The volatility of an origin is histvol's sigma (the std of the last 20 log returns of the close
ending at the origin), read back from histvol's own quantiles at step 1 (``q0.9 = c exp(sigma
z_0.9)``, ``q0.5 = c``); the terciles are those of every fold's origins together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from ...evaluation import probabilistic as pr
from ...evaluation import scores as sc
from ...evaluation.calibration import CALIBRATED
from ...evaluation.scorecard import PREFIXES, QUANTILE_COLUMNS
from ...evaluation.weather import terciles
from ...runtime.fsutil import write_atomic

#: the table's rows, in its order (a forecaster no fold scored has none)
FORECASTERS = ("finetuned", CALIBRATED, "ensemble", "aci", "histvol", "persistence", "zeroshot")
LABELS = {"finetuned": "finetuned (raw)", CALIBRATED: "finetuned_calibrated", "ensemble": "ensemble (served)"}
COLUMNS = ("forecaster", "folds", "origins", "wql", "coverage_50", "coverage_80", "coverage_90", "pit_ks",
           "coverage_80_vol1", "coverage_80_vol2", "coverage_80_vol3")
FILES = ("forecasters.csv", "forecasters.json", "forecasters.md")
KEYS = ["datetime", "instrument"]
Z90 = NormalDist().inv_cdf(0.9)


def times(values) -> pd.DatetimeIndex:
    """Origin times at one resolution, so tables read from different files join on them."""
    return pd.DatetimeIndex(pd.to_datetime(values)).as_unit("ns")


def origin_wql(forecasts: pd.DataFrame) -> pd.DataFrame:
    """Per (datetime, instrument, forecaster): ``quantile_loss`` = the sum over the steps of the
    mean over the nine levels of ``2 max(l (y - q_l), (l - 1) (y - q_l))`` and ``abs_actual`` =
    the sum over the steps of ``|y|`` (NaN for an origin with a missing value at any step)."""
    rows = forecasts.sort_values(["datetime", "instrument", "forecaster", "step"], kind="stable")
    y = rows["actual"].to_numpy(dtype=np.float64)
    diff = y[:, None] - rows[QUANTILE_COLUMNS].to_numpy(dtype=np.float64)
    levels = sc.LEVELS[None, :]
    loss = (2.0 * np.maximum(levels * diff, (levels - 1.0) * diff)).mean(axis=1)
    table = pd.DataFrame({"datetime": times(rows["datetime"]), "instrument": rows["instrument"].to_numpy(),
                          "forecaster": rows["forecaster"].to_numpy(), "quantile_loss": loss,
                          "abs_actual": np.abs(y), "missing": (~np.isfinite(loss) | ~np.isfinite(y)).astype(np.int64)})
    out = table.groupby(["datetime", "instrument", "forecaster"], sort=True).sum().reset_index()
    out.loc[out["missing"] > 0, ["quantile_loss", "abs_actual"]] = np.nan
    return out.drop(columns="missing")


def origin_sigma(forecasts: pd.DataFrame) -> pd.DataFrame:
    """``datetime``, ``instrument``, ``sigma``: histvol's sigma of each origin it forecast."""
    rows = forecasts[(forecasts["forecaster"] == "histvol") & (forecasts["step"] == 1)]
    if not len(rows) or not {"q0.5", "q0.9"} <= set(rows.columns):
        return pd.DataFrame(columns=[*KEYS, "sigma"])
    with np.errstate(divide="ignore", invalid="ignore"):
        sigma = np.log(rows["q0.9"].to_numpy(np.float64) / rows["q0.5"].to_numpy(np.float64)) / Z90
    return pd.DataFrame({"datetime": pd.to_datetime(rows["datetime"]).to_numpy(),
                         "instrument": rows["instrument"].to_numpy(), "sigma": sigma})


def _wql(rows: pd.DataFrame) -> float:
    per = origin_wql(rows)
    ok = np.isfinite(per["quantile_loss"]) & np.isfinite(per["abs_actual"])
    scale = per.loc[ok, "abs_actual"].sum()
    return float(per.loc[ok, "quantile_loss"].sum() / scale) if ok.any() and scale > 0 else math.nan


def _coverage(rows: pd.DataFrame, nominal: int) -> float:
    lo, hi = (pr.QUANTILE_COLUMNS[i] for i in pr.COVERAGES[nominal])
    if lo not in rows.columns or hi not in rows.columns:
        return math.nan
    y, low, high = (rows[c].to_numpy(dtype=np.float64) for c in ("actual", lo, hi))
    ok = np.isfinite(y) & np.isfinite(low) & np.isfinite(high)
    return float(((y >= low) & (y <= high))[ok].mean()) if ok.any() else math.nan


def forecaster_table(results: Sequence[Any]) -> pd.DataFrame:
    """One row per forecaster some fold of ``results`` (:class:`~.aggregate.FoldResult`) forecast."""
    frames = [r.forecasts.assign(fold=r.fold) for r in results if len(r.forecasts) and "forecaster" in
              r.forecasts.columns]
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    every = pd.concat(frames, ignore_index=True)
    every["datetime"] = pd.to_datetime(every["datetime"])
    sigma = origin_sigma(every)
    if len(sigma):
        sigma["tercile"] = terciles(sigma["sigma"].to_numpy(np.float64))
        every = every.merge(sigma[[*KEYS, "tercile"]], on=KEYS, how="left")
    else:
        every["tercile"] = 0
    out = []
    for name in FORECASTERS:
        rows = every[every["forecaster"] == name]
        if not len(rows):
            continue
        pit = rows["pit"].to_numpy(np.float64) if "pit" in rows.columns else np.array([])
        row = {"forecaster": LABELS.get(name, name), "folds": int(rows["fold"].nunique()),
               "origins": int(len(rows.drop_duplicates(KEYS))), "wql": _wql(rows.drop(columns=["fold", "tercile"])),
               **{f"coverage_{c}": _coverage(rows, c) for c in (50, 80, 90)},
               "pit_ks": pr.ks_distance(pit) if np.isfinite(pit).any() else math.nan}
        for k in (1, 2, 3):
            row[f"coverage_80_vol{k}"] = _coverage(rows[rows["tercile"] == k], 80)
        out.append(row)
    return pd.DataFrame(out, columns=list(COLUMNS))


def metrics(table: pd.DataFrame) -> dict[str, float]:
    """``pooled_<prefix>wql_close``, ``pooled_<prefix>coverage_<c>``, ``pooled_<prefix>pit_ks`` and
    ``pooled_<prefix>coverage_80_vol<k>`` of every row (finite values only)."""
    names = {LABELS.get(n, n): n for n in FORECASTERS}
    out: dict[str, float] = {}
    for row in table.to_dict("records"):
        prefix = f"pooled_{PREFIXES[names[row['forecaster']]]}"
        for column, metric in (("wql", "wql_close"), ("coverage_50", "coverage_50"), ("coverage_80", "coverage_80"),
                               ("coverage_90", "coverage_90"), ("pit_ks", "pit_ks"),
                               *((f"coverage_80_vol{k}",) * 2 for k in (1, 2, 3))):
            value = float(row[column])
            if math.isfinite(value):
                out[f"{prefix}{metric}"] = value
    return out


def records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as plain JSON values (NaN as None)."""
    def plain(v):
        v = v.item() if isinstance(v, np.generic) else v
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return [{k: plain(v) for k, v in row.items()} for row in table.to_dict("records")]


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The table in markdown: WQL, coverage 50/80/90, PIT KS, 80% coverage by volatility tercile."""

    def shown(value, digits=3):
        return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else \
            f"{value:.{digits}f}"

    lines = ["| forecaster | folds | origins | WQL | coverage 50/80/90 | PIT KS | 80% coverage by volatility tercile |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['forecaster']} | {r['folds']} | {r['origins']:,} | {shown(r['wql'], 4)} | "
                     + "/".join(shown(r[f"coverage_{c}"]) for c in (50, 80, 90)) + f" | {shown(r['pit_ks'])} | "
                     + "/".join(shown(r[f"coverage_80_vol{k}"]) for k in (1, 2, 3)) + " |")
    return "\n".join(lines) + "\n"


def write(rows: Sequence[dict[str, Any]], directory: str | Path) -> list[Path]:
    """``forecasters.csv``, ``forecasters.json`` and ``forecasters.md`` in ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    csv, js, md = (directory / name for name in FILES)
    write_atomic(csv, pd.DataFrame(list(rows), columns=list(COLUMNS)).to_csv(index=False))
    write_atomic(js, json.dumps(list(rows), indent=2, allow_nan=False) + "\n")
    write_atomic(md, markdown(rows))
    return [csv, js, md]
