"""The stage registry, the one table of the stages a process knows, and the config keys each
stage declares (which key plays which role, what its models load from, its published starting
points). The config imports no stage: the command builds the registry
(:func:`kronos_mlflow.stages.build_registry`: the package's stages, then the plugins of the
``kronos_mlflow.stages`` entry-point group) before it loads a config; docs/stages.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


#: MLproject parameter names -> config keys; a run logs both spellings as params.
MLPROJECT_PARAMS: dict[str, str] = {
    "epochs": "epochs",
    "learning_rate": "tokenizer_learning_rate",
    "weight_decay": "adam_weight_decay",
    "batch_size": "batch_size",
    "accumulation_steps": "accumulation_steps",
    "n_train_iter": "n_train_iter",
    "n_val_iter": "n_val_iter",
    "n_test_iter": "n_test_iter",
    "nproc_per_node": "nproc_per_node",
    "qlib_data_path": "qlib_data_path",
    "instrument": "instrument",
    "freq": "freq",
    "membership_gaps": "membership_gaps",
    "dataset_begin_time": "dataset_begin_time",
    "dataset_end_time": "dataset_end_time",
    "train_time_range": "train_time_range",
    "val_time_range": "val_time_range",
    "test_time_range": "test_time_range",
    "pretrained_tokenizer_path": "pretrained_tokenizer_path",
    "seed": "seed",
    "comet": "comet",
    "registered_model_name": "registered_model_name",
    "finetune_mode": "finetune_mode",
    "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "lora_targets": "lora_targets",
    "freeze_layers": "freeze_layers",
}

#: (The groups of keys, ``EVALUATION_KEYS``, ``DATA_WINDOW_KEYS`` and ``PLACES_TO_WRITE``, are read
#: from the key declarations: :mod:`kronos_mlflow.config.keys`.)


@dataclass(frozen=True)
class StageKeys:
    """The config keys of one stage, resolved when a config is loaded (``learning_rate`` names
    the stage's own); the stage's spec (:mod:`kronos_mlflow.stages`) reads them from here,
    because a config is loaded and checked before any stage code runs."""

    learning_rate: str  # its learning rate
    save_folder: str  # its run folder under save_path
    grad_clip: str  # its gradient clipping norm
    pretrained: str  # the checkpoint it starts from ('' : fresh weights)
    #: what each model the run builds is loaded from (the first key set wins; none: fresh weights)
    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    mlproject_params: tuple[str, ...] = ()  # its entry point's own MLproject parameters (besides main's)
    digest_excludes: tuple[str, ...] = ()  # keys it never reads: left out of its config digest
    #: the names of its model's Linear layers (what ``lora_targets`` may name)
    linear_layers: tuple[str, ...] = ()
    #: key -> the hub id of the published checkpoint ``auto`` looks for (upstream's starting points)
    published: Mapping[str, str] = field(default_factory=dict)


#: The default of the ``stage`` key: what a config that names no stage trains.
DEFAULT_STAGE = "tokenizer"
#: Aliases that name the running stage's own key (``learning_rate`` of a predictor run is
#: ``predictor_learning_rate``).
STAGE_ALIASES = {"learning_rate": "learning_rate", "lr": "learning_rate"}
#: The stage registry: each registered stage's spec by name, in registration order (what the
#: ``stage`` key accepts, and the order of its refusal). A spec is any object with a ``name`` and
#: ``config_keys`` (a :class:`StageKeys`): :class:`kronos_mlflow.stages.registry.StageSpec`, whose
#: ``register`` enters it here. This module reads the keys only.
STAGES: dict[str, Any] = {}
_BUILT: list[bool] = []  # [True] once the command's builder has entered every stage


def add(spec: Any) -> None:
    """Enter ``spec`` under its name (once per name)."""
    if spec.name in STAGES:
        raise ValueError(f"stage {spec.name!r} is registered twice")
    STAGES[spec.name] = spec


def mark_built() -> None:
    """Say the registry holds every stage of this process: the builder's last step."""
    _BUILT[:] = [True]


def built() -> bool:
    """Whether the command has built the registry."""
    return bool(_BUILT)


def registered() -> dict[str, StageKeys]:
    """Every registered stage's keys, in registration order. A config is loaded after the
    command built the registry; before that there is no stage to check a config against."""
    if not _BUILT:
        raise RuntimeError("no stage registry: a command builds it before it loads a config "
                           "(kronos_mlflow.stages.build_registry())")
    return {name: spec.config_keys for name, spec in STAGES.items()}


def stage_names() -> tuple[str, ...]:
    """The registered stages, in registration order (what the ``stage`` key accepts)."""
    return tuple(registered())


def stage_of(config: Mapping[str, Any]) -> str:
    """The name of the config's stage (the default one when the mapping names none)."""
    return str(config.get("stage") or DEFAULT_STAGE)


def stage_keys(config: Mapping[str, Any]) -> StageKeys:
    """The keys of the config's stage (a loaded config's ``stage`` is a registered one)."""
    return registered()[stage_of(config)]


class _PublishedIds(Mapping):
    """Key -> the hub id of its published checkpoint, over every registered stage's keys."""

    def _ids(self) -> dict[str, str]:
        return {k: v for keys in registered().values() for k, v in keys.published.items()}

    def __getitem__(self, key: str) -> str:
        return self._ids()[key]

    def __iter__(self):
        return iter(self._ids())

    def __len__(self) -> int:
        return len(self._ids())


#: The keys that may be ``auto``, and the published checkpoint ``auto`` looks for there.
PUBLISHED: Mapping[str, str] = _PublishedIds()
