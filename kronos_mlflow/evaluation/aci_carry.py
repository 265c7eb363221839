"""ACI's levels carried from one test period to the next (a walk-forward's folds, in date order):
the small JSON file ``evaluation/aci_state.json`` an evaluation run writes (the levels its ACI
ended at, the last outcome they read, the run's own id and test range), and its checked reading.

A fold's evaluation (``kronos-mlflow evaluate --aci-start-run RUN_ID``) starts ACI from the levels
of the run ``RUN_ID`` wrote, once that run proves the file is its own: the run FINISHED, the file
names that very run and its recorded test range, and the outcomes it read end by this
scorecard's first origin (:func:`kronos_mlflow.evaluation.aci.run`). The walk-forward hands each
fold the previous fold's evaluation run, checked as the aggregate checks a fold
(docs/walk-forward.md#aci-across-folds). Never pickle: JSON, every field checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..config import names
from ..errors import UserError
from ..runtime.fsutil import write_atomic
from ..serving.forecasting.quantiles import INTERVALS, QLEVELS
from ..tracking import handover as hv
from .aci import Start

FILE = "aci_state.json"
ARTIFACT = hv.ACI_STATE_JSON
FORMAT, VERSION, METHOD = "kronos-mlflow-aci-state", 1, "aci"
KEYS = ("format", "version", "method", "run_id", "test_time_range", "aci_step", "start", "end_level",
        "start_level", "last_outcome")
TAG = "aci_start"  # the evaluation run's tag: where its aci's levels started
NOMINAL = "nominal"  # the tag aci_start of a period whose ACI started at the nominal levels
MAX_STEPS = 10_000
LEVEL_BOUND = 100.0  # a level far outside [0, 1] is no level ACI reaches in a test period
INTERVAL_80 = next(j for j, (lo, hi) in enumerate(INTERVALS) if abs(QLEVELS[hi] - QLEVELS[lo] - 0.8) < 1e-9)


def metrics(state: dict) -> dict[str, float]:
    """``aci_start_level_80`` and ``aci_end_level_80``: the 80% band's level (its miscoverage,
    nominal 0.2) where this period's ACI started and ended, averaged over the steps."""
    if not state:
        return {}
    return {"aci_start_level_80": float(np.mean(state["start"][INTERVAL_80])),
            "aci_end_level_80": float(np.mean(state["end"][INTERVAL_80]))}


def as_json(state: dict, *, run_id: str, test_time_range: str, step: float, start: str) -> dict[str, Any]:
    last = state.get("last_outcome")
    return {"format": FORMAT, "version": VERSION, "method": METHOD, "run_id": run_id,
            "test_time_range": test_time_range, "aci_step": float(step), "start": start,
            "end_level": np.asarray(state["end"], dtype=np.float64).tolist(),
            "start_level": np.asarray(state["start"], dtype=np.float64).tolist(),
            "last_outcome": "" if last is None else str(np.datetime64(last, "s"))}


def write(path: Path, state: dict, **fields) -> Path:
    """``state`` (:func:`kronos_mlflow.evaluation.aci.run`'s) as the JSON of :func:`as_json`."""
    import json

    write_atomic(Path(path), json.dumps(as_json(state, **fields), indent=1) + "\n")
    return Path(path)


def _levels(value: Any, source: str, where: str) -> np.ndarray:
    if not isinstance(value, list) or len(value) != len(INTERVALS):
        raise UserError(f"{source}: {where} is {hv.kind_of(value)}; expected {len(INTERVALS)} rows (one per central "
                        "interval) of one level per step")
    rows = [hv.numbers(row, source, f"{where}[{j}]", -LEVEL_BOUND, LEVEL_BOUND, MAX_STEPS) for j, row in
            enumerate(value)]
    if not rows[0] or any(len(row) != len(rows[0]) for row in rows):
        raise UserError(f"{source}: {where} has rows of {sorted({len(r) for r in rows})} steps; expected "
                        "rows of the same 1 or more steps")
    return np.array(rows, dtype=np.float64)


def from_json(data: Any, source: str) -> dict[str, Any]:
    """The checked fields of an ``aci_state.json``; one line naming ``source`` and the field."""
    data = hv.keys_of(data, KEYS, source, "the file")
    hv.format_and_version(data, source, FORMAT, VERSION, "aci state")
    out = {"run_id": hv.text(data["run_id"], source, "run_id"),
           "test_time_range": hv.text(data["test_time_range"], source, "test_time_range"),
           "aci_step": hv.number(data["aci_step"], source, "aci_step", 0.0, 1.0),
           "start": hv.text(data["start"], source, "start"),
           "end_level": _levels(data["end_level"], source, "end_level"),
           "start_level": _levels(data["start_level"], source, "start_level")}
    out["last_outcome"] = hv.date(data["last_outcome"], source, "last_outcome")
    return out


def read(path: Path, source: str) -> dict[str, Any]:
    return from_json(hv.json_value(Path(path), source, f"the JSON that a run's {ARTIFACT} holds"), source)


def start_from(client, run_id: str, scratch: str | Path, flag: str = "--aci-start-run") -> Start:
    """The levels the evaluation run ``run_id`` ended its ACI at, once the run proves the file is
    its own: FINISHED, and the file names that run and the test range the run recorded. A file
    naming a run is a claim; the run's own record is the proof."""
    run_id = names.run_id(run_id, flag)
    source = f"{flag} {run_id}"
    try:
        run = client.get_run(run_id)
    except Exception as exc:  # noqa: BLE001 - the store's own error, in one line
        raise UserError(f"{source}: no such run ({type(exc).__name__}); expected the evaluation run of the period "
                        "before this one") from None
    if run.info.status != "FINISHED":
        raise UserError(f"{source}: the run is {run.info.status}; expected a FINISHED evaluation run")
    local = hv.download(client, run_id, ARTIFACT, scratch, source)
    state = read(local, f"{source}: its {ARTIFACT}")
    if state["run_id"] != run_id:
        raise UserError(f"{source}: its {ARTIFACT} names the run '{state['run_id']}'; expected the file that run "
                        "wrote itself")
    recorded = run.data.params.get("test_time_range", "")
    if state["test_time_range"] != recorded:
        raise UserError(f"{source}: its {ARTIFACT} says test_time_range '{state['test_time_range']}' where the run "
                        f"recorded '{recorded}'; expected the file that run wrote itself")
    if not state["last_outcome"] or not np.isfinite(state["end_level"]).all():
        raise UserError(f"{source}: its {ARTIFACT} holds no outcome; expected a period whose ACI read its outcomes")
    return Start(level=state["end_level"], known_until=np.datetime64(state["last_outcome"]), source=source)


def describe(start: Start | None) -> str:
    """The tag ``aci_start``: ``nominal``, or the run the levels came from."""
    return NOMINAL if start is None else start.source.rsplit(" ", 1)[-1]
