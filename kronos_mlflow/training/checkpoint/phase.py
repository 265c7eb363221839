"""How far a run got after its last epoch: ``{save_dir}/checkpoints/phase.json``.

The training state saved after the last epoch says the training is done (its ``extra`` holds
``phase: trained``). Each later phase that completes is written here, with what it produced: the
run's result after the summary (``summarized``), after the held-out verdict (``verdict``), after
the scorecard or the calibrator fit (``scorecard`` / ``calibration``), once the model is logged
(``logged``) and when the run ends (``finished``, or ``pruned`` for a sweep's pruned trial). A run
stopped or failed after training is continued by the same command from the phase after the one
recorded, in the same run, with its best checkpoint, without training again
(docs/reliability.md#a-stop-after-the-last-epoch).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ...runtime.fsutil import read_json, write_atomic

FORMAT = "kronos-mlflow-run-phase"
FILE_NAME = "phase.json"
#: the marker a training state saved after the last epoch carries in its ``extra``
TRAINED = "trained"
#: phase -> its order; a phase is done when the recorded one's order is at least its own
ORDER = {TRAINED: 0, "summarized": 1, "verdict": 2, "scorecard": 3, "calibration": 3, "logged": 4,
         "finished": 5, "pruned": 5}
#: a run that reached one of these is not continued: the same command starts a new run
TERMINAL = ("finished", "pruned")
_MAX_BYTES = 16 << 20


def path_of(checkpoints: str | os.PathLike) -> Path:
    """``{save_dir}/checkpoints/phase.json``."""
    return Path(checkpoints) / FILE_NAME


def done(record: Mapping[str, Any] | None, phase: str) -> bool:
    """``phase`` was completed by the run ``record`` describes (None: only the training)."""
    reached = record["phase"] if record else TRAINED
    return ORDER[reached] >= ORDER[phase]


def _plain(value: Any) -> Any:
    """A result value as JSON holds it (numpy scalars as Python numbers)."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return str(value)


def write(checkpoints: str | os.PathLike, phase: str, *, state: Mapping[str, Any],
          result: Mapping[str, Any] | None = None) -> None:
    """Record that ``phase`` completed, with the run's ``result`` so far, for the training state
    ``state`` names (``run_id``, ``global_step``, ``config_digest``)."""
    if phase not in ORDER:
        raise ValueError(f"unknown phase {phase!r}")
    body = {"format": FORMAT, "phase": phase, "state": dict(state), "result": dict(result or {})}
    write_atomic(path_of(checkpoints), json.dumps(body, sort_keys=True, default=_plain))


def clear(checkpoints: str | os.PathLike) -> None:
    """A fresh run: no phase of an earlier run stays."""
    path_of(checkpoints).unlink(missing_ok=True)


def state_key(state: Mapping[str, Any]) -> dict[str, Any]:
    """What ties a phase record to the training state it follows."""
    return {"run_id": (state.get("run_ids") or {}).get("mlflow_run_id"), "global_step": int(state["global_step"]),
            "config_digest": str(state["config_digest"])}


def read(checkpoints: str | os.PathLike, state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The phase record that follows ``state`` (a training state saved after its last epoch, as
    :func:`~kronos_mlflow.training.checkpoint.read_training_state` returns it), or None when no
    phase after the training was recorded for it (a record of another run or state is not its).
    A damaged record is one line naming the file."""
    path = path_of(checkpoints)
    advice = "delete it: the same command then redoes what follows the training (it does not train again)"
    try:
        body = read_json(path, what="run phase file", max_bytes=_MAX_BYTES, advice=advice, error=CheckpointError)
    except FileNotFoundError:
        return None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CheckpointError(f"run phase file '{path}' is not a kronos-mlflow run phase; {advice}")
    phase, result = body.get("phase"), body.get("result")
    if phase not in ORDER or not isinstance(result, dict) or not isinstance(body.get("state"), dict):
        raise CheckpointError(f"run phase file '{path}': field 'phase', 'state' or 'result' is malformed; {advice}")
    if body["state"] != state_key(state):
        return None  # an earlier run's record in this directory: this state's run reached only its training
    return {"phase": phase, "result": result, "terminal": phase in TERMINAL}


def trained(state: Mapping[str, Any], epochs: int) -> bool:
    """``state`` was saved after the last of ``epochs`` by a training that records its phases."""
    extra = state.get("extra") or {}
    return int(state["next_epoch"]) >= int(epochs) and extra.get("phase") == TRAINED
