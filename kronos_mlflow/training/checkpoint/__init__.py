"""The training state of a run, saved every epoch so that a crash costs at most one epoch: :mod:`.state`
(the format, the atomic save, the checked load), :mod:`.encoding` (state dicts as JSON plus tensors),
:mod:`.rng` (every rank's random states), :mod:`.resume` (the state to resume from; the config digest
is :mod:`kronos_mlflow.config.digest`'s). Every problem with a saved state is a one-line
:class:`~kronos_mlflow.errors.CheckpointError`; docs/reliability.md#training-state-every-epoch.
"""

from __future__ import annotations

# Every name stays importable from kronos_mlflow.training.checkpoint, where callers have always found it.
from ...config.digest import RESULT_NEUTRAL_KEYS, config_digest, digest_config
from . import phase  # noqa: F401
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
