"""The config keys of each stage (which key plays which role, what its models load from, its
published starting points), as the stage's own folder declares them; docs/code-map.md."""

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
#: Each registered stage's keys, in registration order. A stage's folder declares them on its
#: spec and :func:`kronos_mlflow.stages.registry.register` enters them here (:func:`register_keys`).
STAGE_CONFIG: dict[str, StageKeys] = {}


def register_keys(name: str, keys: StageKeys) -> None:
    """Enter stage ``name``'s keys (its spec's registration does: one stage, one folder)."""
    if name in STAGE_CONFIG:
        raise ValueError(f"stage {name!r} is registered twice")
    STAGE_CONFIG[name] = keys


def registered() -> dict[str, StageKeys]:
    """Every registered stage's keys. The first ask loads the stages (the package's own and the
    plugins of the ``kronos_mlflow.stages`` entry-point group): a config is read before anything
    else asks for them, and config sits below the stages (docs/code-map.md)."""
    if not STAGE_CONFIG:
        import importlib  # lazy: a plugin load, not an import of a layer above

        importlib.import_module("kronos_mlflow.stages")
    return STAGE_CONFIG


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
