"""When a run may stand in for work not done again: by evidence, never by tags alone (a tag can be
copied onto any run). :func:`reuse_problem` (a FINISHED step), :func:`continue_problem` (a stopped
one) and :func:`model_problem` (a champion's model) each return None when the run may be used, else
the reason in a few words; docs/pipeline.md#reuse-force-and-continuing-a-stopped-pipeline.
"""

from __future__ import annotations

import warnings

from ..errors import UserError
from ..tracking.ownership import evidence, owned_state
from ..stages import get

#: The artifact an evaluation run's scorecard is read from.
SCORECARD_ARTIFACT = "evaluation/scorecard.json"


def model_problem(uri: str, stage: str, tracking_uri: str | None = None) -> str | None:
    """Why the model at ``uri`` (``runs:/<id>/best_model`` in ``tracking_uri``'s store) cannot be
    what the next step loads, as the stage ``stage`` logs it (its spec says what must load)."""
    return get(stage).model_problem(uri, tracking_uri)


def _scorecard_problem(client, run) -> str | None:
    try:
        names = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    except Exception as exc:  # noqa: BLE001 - an artifact store that cannot be listed: not provable
        return f"its artifacts cannot be listed ({type(exc).__name__})"
    if SCORECARD_ARTIFACT not in names:
        return f"it holds no {SCORECARD_ARTIFACT}"
    return None


def reuse_problem(client, run, stage: str) -> str | None:
    """Why the FINISHED run ``run`` cannot be reused as a step of ``stage`` (tokenizer,
    predictor, evaluation); None when it can."""
    if run.info.status != "FINISHED":
        return f"it is {run.info.status}"
    why = evidence(client, run)
    if why is not None:
        return why
    if stage == "evaluation":
        return _scorecard_problem(client, run)
    uri = run.data.tags.get("best_model_uri")
    if not uri:
        return "it logged no model"
    return model_problem(f"runs:/{run.info.run_id}/best_model", stage, client.tracking_uri)


def continue_problem(client, run, config, world_size: int) -> str | None:
    """Why the stopped run ``run`` cannot be continued from its run directory's training state:
    that state must be the run's own (it names the run and holds its token) and one the step's
    ``config`` resumes (the same config, epochs left)."""
    from ..training.checkpoint import find_resumable  # lazy: torch, safetensors, numpy

    if run.info.status == "FINISHED":
        return "it is FINISHED"
    why = evidence(client, run)
    if why is not None:
        return why
    try:
        with warnings.catch_warnings():  # another config's state: said below, in this step's own line
            warnings.simplefilter("ignore")
            state = find_resumable(run.data.tags["run_directory"], config, world_size=world_size, mode="auto")
    except UserError as exc:
        return f"its training state cannot be read ({exc})"
    if state is None:
        return "its run directory holds no training state this config resumes"
    return owned_state(run, state)
