"""Finding the training state to resume: the one in the run's directory, when it was made by
this config (same digest) and is not finished; the same answer on every rank."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from ...config.digest import config_digest, digest_config
from ...config.sections import as_section
from ...runtime.distributed import broadcast_object
from ...errors import CheckpointError, UserError
from . import phase
from .state import OLD_SUFFIX, read_training_state, state_dir


def find_resumable(
    save_dir: str | os.PathLike,
    config: Mapping[str, Any],
    *,
    world_size: int | None = None,
    mode: str = "auto",
) -> dict[str, Any] | None:
    """The saved state to resume from, or None to start fresh.

    ``mode``: ``never`` -> None without looking; ``auto`` -> the state when the save directory
    holds one whose config digest equals this config's, None when there is none or it was made
    by another config (a warning names the keys that differ); ``must`` -> as auto, but no state
    or another config is a :class:`CheckpointError`. A damaged state is a CheckpointError in
    ``auto`` and ``must``: it is never silently overwritten. The checksums of the tensor files are
    verified. The returned dict is :func:`read_training_state`'s (``directory``, ``epoch``,
    ``next_epoch``, ``global_step``, ``run_ids``...); a state saved after the last epoch of a run
    that did not finish is returned too, with ``phase``: the phase record it reached after its
    training (:func:`kronos_mlflow.training.checkpoint.phase.read`; None: the training only).
    ``config``: the whole config (its digest is compared), its training section's ``epochs`` read.
    """
    if mode not in ("auto", "never", "must"):
        raise CheckpointError(f"resume: '{mode}' is not one of auto, never, must")
    if mode == "never":
        return None
    directory = state_dir(save_dir)
    old = directory.with_name(directory.name + OLD_SUFFIX)
    if not directory.exists() and not old.exists():
        if mode == "must":
            raise CheckpointError(f"resume is must but '{directory}' holds no training state; "
                                  "check save_path and tokenizer_save_folder_name, or set resume to auto")
        return None
    state = read_training_state(directory)
    wanted = config_digest(config, world_size=world_size)
    if state["config_digest"] != wanted:
        changed = _changed_keys(state.get("config"), digest_config(config, world_size=world_size))
        detail = f" (changed: {', '.join(changed[:5])}{'...' if len(changed) > 5 else ''})" if changed else ""
        message = (f"the training state in '{state['directory']}' was saved with another config{detail}")
        if mode == "must":
            raise CheckpointError(f"resume is must but {message}; use the same config, or set resume to never "
                                  "to start over (it is then overwritten)")
        warnings.warn(f"{message}; starting a new run (its state will replace that one); "
                      "use another tokenizer_save_folder_name to keep it", stacklevel=2)
        return None
    epochs = as_section(config, "training").epochs
    if state["next_epoch"] >= int(epochs):
        # Every epoch is done. A run stopped or failed after its training continues from the
        # phase it reached (the verdict, the scorecard, the model's logging), without training
        # again; a run that finished is not resumed: the same command again trains anew.
        record = phase.read(directory.parent, state) if phase.trained(state, epochs) else None
        if phase.trained(state, epochs) and not (record and record["terminal"]):
            state["phase"] = record
            return state
        if mode == "must":
            raise CheckpointError(f"resume is must but the training state in '{state['directory']}' is complete "
                                  f"({epochs} epochs); raise epochs or set resume to auto")
        return None
    return state


def _changed_keys(saved: Any, now: Mapping[str, Any]) -> list[str]:
    if not isinstance(saved, dict):
        return []
    keys = sorted(set(saved) | set(now))
    return [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)]


def find_resumable_everywhere(save_dir, config: Mapping[str, Any], info, *, first=None) -> dict[str, Any] | None:
    """:func:`find_resumable` on every rank of ``info`` (a ``DistInfo``): rank 0 looks for a
    training state (recovering ``last.old``); every rank gets its answer, or the same one-line
    error (a rank that raised alone would leave the others waiting). ``first`` (rank 0, before
    it looks) claims the directory: its refusal is every rank's answer too."""
    answer = None
    if info.is_main:
        try:
            if first is not None:
                first()
            found = find_resumable(save_dir, config, world_size=info.world_size, mode=as_section(config, "job").resume)
            answer = ("ok", None if found is None else {k: found.get(k) for k in ("directory", "run_ids", "epoch",
                                                                                     "phase")})
        except UserError as exc:
            answer = ("error", str(exc))
    if info.distributed:
        answer = broadcast_object(answer)
    kind, value = answer
    if kind == "error":
        raise UserError(value)
    return value
