"""The training state of a run, saved every epoch so that a crash costs at most one epoch.

- :mod:`.state`: the format (``checkpoints/last/``: ``state.json`` plus two safetensors files),
  the atomic save, and the checked read and load;
- :mod:`.encoding`: state dicts as JSON, their tensors in a side table;
- :mod:`.rng`: every process's random-number-generator states;
- :mod:`.resume`: finding the state to resume from (same config digest, not finished);
- the config digest itself lives in :mod:`kronos_mlflow.config.digest` (the run directory's key too).

Typical use (rank 0 saves; every rank loads)::

    rng = gather_rng_states()                       # a collective: every rank calls it
    if is_main:
        save_training_state(state_dir(save_dir), model=raw_model, optimizer=opt, scheduler=sched,
                            epoch=epoch, global_step=step, best_val_loss=best,
                            run_ids={"mlflow_run_id": ..., "comet_experiment_key": ...},
                            config_digest=config_digest(config, world_size=world_size),
                            rng_states=rng)
    ...
    found = find_resumable(save_dir, config, world_size=world_size)    # None: start fresh
    if found:
        state = load_training_state(found["directory"], model=raw_model, optimizer=opt,
                                    scheduler=sched, map_location=device, rank=rank)
        start_epoch, global_step = state["next_epoch"], state["global_step"]

Every problem with a saved state is a one-line :class:`~kronos_mlflow.errors.CheckpointError`
(a :class:`~kronos_mlflow.errors.UserError`) naming the file and what to do.
"""

from __future__ import annotations

# Every name stays importable from kronos_mlflow.training.checkpoint, where callers have always found it.
from ...config.digest import RESULT_NEUTRAL_KEYS, config_digest, digest_config
from .resume import find_resumable, find_resumable_everywhere  # noqa: F401
from .rng import capture_rng_state, gather_rng_states, restore_rng_state
from .state import (FORMAT, FORMAT_VERSION, LAST_DIR, MODEL_NAME, OLD_SUFFIX, OPTIMIZER_NAME,  # noqa: F401
                    STATE_NAME, TMP_PREFIX, load_training_state, read_training_state, save_training_state, state_dir)

__all__ = [
    "STATE_NAME",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RESULT_NEUTRAL_KEYS",
    "state_dir",
    "config_digest",
    "digest_config",
    "save_training_state",
    "load_training_state",
    "read_training_state",
    "find_resumable",
    "capture_rng_state",
    "restore_rng_state",
    "gather_rng_states",
]
