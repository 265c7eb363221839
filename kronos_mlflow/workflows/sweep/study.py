"""The Optuna side of a sweep: RDB storage with heartbeats, the study, and the
guards that keep trials of one study distinct across invocations and workers."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from typing import Any

from ...errors import UserError
from ...config.secrets import redact

def default_storage() -> str:
    return f"sqlite:///{os.path.abspath('optuna.db')}"


def open_storage(url: str, heartbeat: bool = True, max_retry: int = 1):
    """Optuna RDB storage; with heartbeats, a dead worker's trial is failed and retried."""
    import warnings

    import optuna

    # Heartbeats are marked experimental in Optuna; they are what keeps dead trials from
    # staying RUNNING, so we use them and silence the notice.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    kwargs: dict[str, Any] = {}
    if heartbeat:
        kwargs = {
            "heartbeat_interval": 10,
            "grace_period": 60,
            "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
        }
    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors vary by backend
            text = str(exc)
            # Workers starting together on a fresh database race to create Optuna's tables;
            # the loser sees a duplicate-object error and simply opens what the winner made.
            racing = any(w in text.lower() for w in ("duplicate", "already exists", "uniqueviolation",
                                                     "unique constraint"))
            if racing and attempt < 5:
                time.sleep(0.5 * (attempt + 1))
                continue
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            raise UserError(f"storage '{redact_url(url)}' cannot be opened ({first}); "
                            "pass a writable sqlite:///PATH or a reachable SQLAlchemy URL") from None
    raise AssertionError("unreachable")


def redact_url(url: str) -> str:
    return redact(url)


def open_study(storage, study_name: str, pruner, sampler_seed: int | None, *, direction: str = "minimize",
               value_name: str = "best_val_loss"):
    """Create or resume the study; refuse one that exists with another direction (a study of
    the other objective: its values are another metric)."""
    import optuna

    names = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    existing = names.get(study_name)
    if existing is not None and existing.direction.name.lower() != direction:
        verb = "minimises" if direction == "minimize" else "maximises"
        raise UserError(
            f"study '{study_name}' exists with direction {existing.direction.name.lower()}; this sweep "
            f"{verb} {value_name}: choose another --study-name"
        )
    study = optuna.create_study(study_name=study_name, storage=storage, direction=direction,
                                pruner=pruner, load_if_exists=True)
    study.sampler_seed_used = seed_sampler(study, sampler_seed)
    return study




# --------------------------------------------------------------------------- distinct trials
#
# A seeded TPE sampler draws the same points in every process given the same seed and history:
# a resumed study or a second worker would repeat trials. Two guards, both per process:
# 1. the sampler seed is derived from --sampler-seed and the number of trials already in the
#    study (a fresh study uses the seed itself, so one fresh sweep stays reproducible);
# 2. before a trial trains, its (learning_rate, weight_decay) is checked against every other
#    trial of the study that is not FAIL; a repeat is not run: it ends FAIL with user attr
#    ``duplicate_of``, the sampler is reseeded from OS entropy, and the worker draws again
#    (Optuna has no cross-process uniqueness: optuna/optuna#1547, #2021 advise this check).


def derive_sampler_seed(seed: int | None, trials_in_study: int) -> int | None:
    """``seed`` for a fresh study; a stable mix of seed and trial count for a resumed one."""
    if seed is None:
        return None
    if trials_in_study == 0:
        return seed
    digest = hashlib.sha256(f"kronos-sweep:{seed}:{trials_in_study}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def seed_sampler(study, seed: int | None) -> int | None:
    """Give ``study`` this process's TPE sampler; returns the seed it got."""
    import optuna

    used = derive_sampler_seed(seed, len(study.get_trials(deepcopy=False)))
    study.sampler = optuna.samplers.TPESampler(seed=used)
    return used


def param_key(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """(learning_rate, weight_decay) as exact text, weight decay 0 when the zero switch is on."""
    if "learning_rate" not in params:
        return None
    wd = 0.0 if params.get("weight_decay_is_zero") else params.get("weight_decay")
    return repr(float(params["learning_rate"])), repr(None if wd is None else float(wd))


_CLAIMED = "params_claimed"


def repeated_trial(study, trial) -> int | None:
    """The number of a trial this one would repeat, or None once its params are claimed.

    Called after the params are drawn, before training. Two workers may draw the same point at
    the same moment, so the check runs twice around a ``params_claimed`` mark: a trial yields to
    a same-params trial that is finished, has a lower number, or has claimed the params. Two
    such trials can never both train (the later checker always sees the earlier one), and
    trials marked FAIL (crashed, or yielded) never block a retry.
    """
    import optuna

    live = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)

    def blocker() -> int | None:
        mine = param_key(trial.params)
        for other in study.get_trials(deepcopy=False, states=live):
            if other.number == trial.number or param_key(other.params) != mine:
                continue
            if (other.state != optuna.trial.TrialState.RUNNING or other.number < trial.number
                    or other.user_attrs.get(_CLAIMED)):
                return other.number
        return None

    first = blocker()
    if first is not None:
        return first
    trial.set_user_attr(_CLAIMED, True)
    again = blocker()
    if again is not None and again < trial.number:
        return again
    return None


class DuplicateTrial(Exception):
    """The trial's params repeat another trial's; it is not run (FAIL, user attr duplicate_of)."""


def optimize_distinct(study, objective, worker, n_trials: int, timeout: float | None, catch) -> None:
    """``study.optimize`` until this worker has run ``n_trials`` trials that are not repeats.

    Repeats are drawn again (each draw is a FAIL trial with ``duplicate_of``); after
    ``4 * n_trials`` repeats the search space is taken as exhausted and the worker stops.
    """
    started = time.monotonic()
    while worker.trials_run < n_trials and not worker.budget_spent():
        left = None
        if timeout:
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                return
        before = (worker.trials_run, worker.duplicates)
        study.optimize(objective, n_trials=n_trials - worker.trials_run, timeout=left,
                       catch=(*catch, DuplicateTrial), gc_after_trial=False, callbacks=[worker.stop_on_budget])
        if worker.stopped or (worker.trials_run, worker.duplicates) == before:
            return  # the budget stopped it, or nothing ran
        if worker.duplicates >= 4 * n_trials:
            print(f"[sweep] {worker.duplicates} draws repeated earlier trials; the search space looks exhausted",
                  flush=True)
            return
