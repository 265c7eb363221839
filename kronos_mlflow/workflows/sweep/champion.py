"""The sweep's champion: the registered model version the alias ``champion`` names, and the rule that
moves it (:func:`promotion`): with ``--promote better`` (the default) only to a best trial whose test
verdict is ``better`` and that beats a champion trained on the same data on the same test windows,
else the parent's tag ``champion_unchanged`` says why (docs/sweeps.md#the-champion).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from ...tracking.keys import TEST_WINDOWS_DIGEST_TAG, TOKENIZER_URI_TAG, VERDICT_TAG
from ...errors import UserError
from ...config.names import RUN_ID, shown
from ...config.stage_keys import stage_of
from ..reuse import model_problem
from ...stages import get, names, spec_of

PROMOTE = ("better", "always")
ALIAS = "champion"


def test_loss_key(config: Mapping[str, Any]) -> str:
    """The test loss the rule compares: ``test_tokenizer_loss``, or ``test_predictor_loss`` in a
    predictor sweep."""
    return spec_of(config).test_loss


class Decision(NamedTuple):
    move: bool
    reason: str  # why the alias stays (empty when it moves)


def current_champion(client, registered_model_name: str):
    """The model version the alias names, or None (no registered model, no alias yet)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(registered_model_name, ALIAS)
    except MlflowException:
        return None


def promotion(client, registered_model_name: str, run, config: Mapping[str, Any], promote: str = "better",
              verdict_tag: str = VERDICT_TAG) -> Decision:
    """May the alias move to ``run``'s model (a trial's or a pipeline step's MLflow run)? By the rule
    of docs/sweeps.md#the-champion; ``verdict_tag`` is the verdict that must be ``better`` (a
    predictor step's: ``verdict_vs_zeroshot``). A model whose files are missing or do not load never
    moves it."""
    tags, metrics = run.data.tags, run.data.metrics
    number = tags.get("optuna.trial_number")
    who = f"best trial {number}" if number is not None else f"run {run.info.run_id}"
    broken = model_problem(f"runs:/{run.info.run_id}/best_model", stage_of(run.data.params),
                           client.tracking_uri)
    if broken is not None:  # never a champion whose files are missing: checked whatever --promote says
        return Decision(False, f"{who} cannot be the champion: {broken}")
    if promote == "always":
        return Decision(True, "")
    verdict, what = tags.get(verdict_tag), "test verdict" if verdict_tag == VERDICT_TAG else verdict_tag
    if verdict != "better":
        return Decision(False, f"{who}'s {what} is {verdict or 'missing'}, not better; "
                               "--promote always moves the champion regardless")
    key = test_loss_key(config)
    loss = metrics.get(key)
    current = current_champion(client, registered_model_name)
    if current is None or current.run_id == run.info.run_id:
        return Decision(True, "")
    champion_run = client.get_run(current.run_id)
    if champion_run.data.tags.get("data_digest") != tags.get("data_digest"):
        return Decision(True, "")  # trained on other data: the verdict alone decides
    if champion_run.data.tags.get(TOKENIZER_URI_TAG) != tags.get(TOKENIZER_URI_TAG):
        return Decision(True, "")  # a predictor on other tokens: its token loss is not comparable
    theirs = champion_test_loss(client, registered_model_name, current, champion_run, run, config)
    if theirs is None or loss is None:
        return Decision(False, f"the champion (version {current.version}) and {who} cannot be compared "
                               "on the same test windows")
    if loss < theirs:
        return Decision(True, "")
    return Decision(False, f"{who}'s {key} {loss:.6f} does not beat the champion's "
                           f"(version {current.version}) {theirs:.6f} on the same test windows")


def champion_test_loss(client, registered_model_name: str, version, champion_run, run,
                       config: Mapping[str, Any]) -> float | None:
    """The champion's test loss on ``run``'s test windows: its own metric when it was judged on
    them, else the champion's model scored on them (None when the windows cannot be rebuilt)."""
    windows_digest, key = run.data.tags.get(TEST_WINDOWS_DIGEST_TAG), test_loss_key(config)
    if windows_digest and champion_run.data.tags.get(TEST_WINDOWS_DIGEST_TAG) == windows_digest \
            and key in champion_run.data.metrics:
        return float(champion_run.data.metrics[key])
    # scored anew on these windows by the stage (a predictor champion: only on the windows it was judged on)
    return spec_of(config).champion_test_loss(client, registered_model_name, version, config, windows_digest)


def set_champion(client, study, registered_model_name: str, *, config: Mapping[str, Any], promote: str = "better",
                 attempts: int = 8) -> tuple[str | None, str]:
    """Register the best trial's model (once) and move the alias to it when :func:`promotion`
    allows. Returns ``(version, "")`` when it moved, ``(None, reason)`` when it stays.

    Several sweep workers finish at about the same time on a shared study: two may register
    the same run, or set the alias at the same moment (the tracking store then refuses one with
    a unique-constraint error). So the alias always goes to the run's lowest version, a refused
    call is retried after a short random pause, and the study's best is read again afterwards:
    if another worker's trial has become the best in the meantime, the alias follows it.
    """
    from mlflow.exceptions import MlflowException

    version = None
    for attempt in range(attempts):
        best = study.best_trial  # read from the storage each time
        run_id = best.user_attrs.get("mlflow_run_id")
        if not run_id:
            return None, f"best trial {best.number} has no MLflow run"
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):  # the study's storage is input too
            return None, f"best trial {best.number}'s MLflow run '{shown(run_id)}' is not an MLflow run id"
        run = client.get_run(run_id)
        uri = run.data.tags.get("best_model_uri")
        if not uri:
            return None, f"best trial {best.number} logged no model"
        from ...tracking.gate import own_model_uri  # lazy: numpy, urllib/http

        try:  # a tag is a claim: only the run's own model moves the alias
            uri = own_model_uri(client, run, f"best trial {best.number}'s tag best_model_uri")
        except UserError as exc:
            return None, str(exc)
        decision = promotion(client, registered_model_name, run, config, promote)
        if not decision.move:
            return None, decision.reason
        try:
            version = register_as_champion(client, registered_model_name, run_id, uri)
        except MlflowException as exc:
            if attempt == attempts - 1:
                raise
            print(f"[sweep] setting the champion alias was refused ({str(exc).splitlines()[0][:160]}); retrying",
                  flush=True)
            time.sleep(random.uniform(0.2, 1.0) * (attempt + 1))
            continue
        if study.best_trial.number == best.number:
            return str(version), ""
    return (str(version), "") if version is not None else (None, "the champion alias could not be set")


def register_as_champion(client, registered_model_name: str, run_id: str, model_uri: str) -> str:
    """Register ``model_uri`` (once per run: the run's lowest version) and point the alias at it."""
    version = model_version_of(client, registered_model_name, run_id)
    if version is None:
        import mlflow

        mlflow.register_model(model_uri, registered_model_name)
        version = model_version_of(client, registered_model_name, run_id)
    client.set_registered_model_alias(registered_model_name, ALIAS, version)
    return str(version)


def model_version_of(client, registered_model_name: str, run_id: str) -> str | None:
    """The lowest version of ``registered_model_name`` made from ``run_id``, if any."""
    try:
        versions = [int(mv.version) for mv in client.search_model_versions(f"name='{registered_model_name}'")
                    if mv.run_id == run_id]
    except Exception:  # noqa: BLE001 - the registered model may not exist yet
        return None
    return str(min(versions)) if versions else None


def best_trial_record(run) -> tuple[dict[str, float], dict[str, str]]:
    """The best trial's test metrics and verdict as the parent run shows them."""
    losses = [f"{prefix}{get(stage).test_loss}" for prefix in ("", "base_") for stage in names()]
    metrics = {f"best_trial_{k}": float(v) for k, v in run.data.metrics.items()
               if k in (*losses, "test_loss_change", "test_loss_change_ci_low", "test_loss_change_ci_high")}
    return metrics, {"best_trial_verdict": run.data.tags.get(VERDICT_TAG, "missing")}
