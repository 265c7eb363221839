"""The config digest: which config keys decide the numbers a run produces, and their SHA-256.

Two users read it and must agree: the run directory's key (:func:`kronos_mlflow.config.layout.run_key`,
so another config never touches this run's files) and the training state (:mod:`kronos_mlflow.training.checkpoint`,
so a run resumes only with the config its state was made for).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from . import published
from .core import is_secret_key
from .keys import KEY, KEYS
from .stage_keys import registered, stage_of

__all__ = ["RESULT_NEUTRAL_KEYS", "digest_config", "config_digest"]

#: Config keys that do not change the numbers training produces (each says so where it is
#: declared, ``Key(..., neutral=True)`` in :mod:`kronos_mlflow.config.keys`): where things are
#: written, how they are named or tracked, how fast they are computed (threads, compile, kernel
#: choice, fused layers: same numbers up to float rounding), how often the console prints, the
#: resume switch itself, and what is measured after training or beside it (the test verdict, the
#: scorecard, the backtest, objective val_skill, which forecasts inside a forked random state).
#: Everything else (data, sizes, optimizer, schedule, epochs, seed, precision, world size) is in
#: the digest: resuming with another value would continue a schedule or data order the
#: checkpoint was not made for.
RESULT_NEUTRAL_KEYS = frozenset(key.name for key in KEYS if key.neutral)
#: Keys added after runs were made, left out of the digest at their default (which is what
#: those runs did): a run made before the key existed keeps its directory and resumes
#: (``Key(..., added_later=True)``).
DEFAULT_OMITTED = {key.name: key.default for key in KEYS if key.added_later}
#: Keys only one fine-tune mode reads: left out of the digest under the other modes
#: (``Key(..., read_when=("finetune_mode", mode))``).
MODE_KEYS = {key.name: key.read_when for key in KEYS if key.read_when}


def digest_config(config: Mapping[str, Any], *, world_size: int | None = None) -> dict[str, Any]:
    """The part of ``config`` that decides the numbers: :data:`RESULT_NEUTRAL_KEYS`, the keys
    the stage never reads, the keys at a default that leaves old digests unchanged and
    credential-looking keys removed, ``world_size`` added when given. JSON types only."""
    out: dict[str, Any] = {}
    # A stage leaves out the keys it never reads (a tokenizer run the predictor's: its digest is
    # the same as before they existed).
    keys = registered().get(stage_of(config))
    other_stage = keys.digest_excludes if keys is not None else ()
    for key in sorted(config):
        if key in RESULT_NEUTRAL_KEYS or key in other_stage or is_secret_key(str(key)):
            continue
        if key in DEFAULT_OMITTED and config[key] == DEFAULT_OMITTED[key]:
            continue
        if key in MODE_KEYS:
            switch, value = MODE_KEYS[key]
            if config.get(switch, KEY[switch].default) != value:
                continue
        # auto and fresh as what they chose: '' (fresh weights, what an empty value always meant) or
        # the published hub id, so a fresh start and a published one never share a digest
        out[str(key)] = _plain(published.source(config, key) if key in published.PUBLISHED else config[key])
    if world_size is not None:
        out["world_size"] = int(world_size)
    return out


def config_digest(config: Mapping[str, Any], *, world_size: int | None = None) -> str:
    """SHA-256 (hex) of the canonical JSON of :func:`digest_config`.

    Canonical: keys sorted, no whitespace, ASCII, floats as Python's shortest repr (so
    ``2e-4`` and ``0.0002`` in a YAML file give the same digest once the config is validated).
    """
    text = json.dumps(digest_config(config, world_size=world_size), sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
