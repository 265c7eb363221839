"""The stage registry: a stage's name maps to its spec, the one place that says what differs
for it. Everything outside ``kronos_mlflow/stages/`` asks the spec (``stages.get(name)`` or
``stages.spec_of(config)``) instead of comparing stage names.

A stage is one folder whose ``__init__`` defines a :class:`StageSpec` subclass (its ``SPEC``):
the command registers the package's own and then loads the plugins, whose folders register
theirs (:func:`kronos_mlflow.stages.build_registry`; docs/stages.md). The table is the config's
(:data:`kronos_mlflow.config.stage_keys.STAGES`): one registry, read by the config for the keys
and by everything above for the specs. Specs import no torch at module level; their methods
import the stage's pieces when called.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ..config.core import DEFAULTS
from ..config import stage_keys as _registry
from ..config.sections import as_section
from ..config.stage_keys import StageKeys, stage_of
from ..errors import ConfigError


class StageSpec:
    """What a stage gives the loop, the sweep, the pipeline, the verdict and model logging.

    Names are class attributes (the metric and tag names users see); behaviour is methods.
    """

    name: str = ""
    #: its config keys (learning rate, run folder, what its models load from, ...)
    config_keys: StageKeys | None = None
    #: metric names: the per-step loss and learning rate, the epoch's validation loss, the
    #: starting weights' validation loss; the held-out loss (unprefixed: ``test_<name>``)
    train_loss: str = ""
    learning_rate: str = ""
    val_metric: str = ""
    initial_val_metric: str = ""
    heldout_loss: str = ""
    #: the validation metrics besides the loss that the logged model carries
    val_metrics: tuple[str, ...] = ()
    #: a sweep's study when --study-name is left at its default
    default_study: str = ""
    #: the champion rule of a pipeline step: its registered model is NAME + champion_suffix,
    #: and its alias moves only when this verdict tag says ``better``
    champion_suffix: str = ""
    pipeline_verdict_tag: str = "verdict"
    #: where the stage trains in a pipeline (ascending; each step is handed the model of the one
    #: before it) and the pipeline's flags that go to it only: flag -> (help, config key)
    pipeline_position: float = 0.0
    pipeline_flags: Mapping[str, tuple[str, str]] = {}
    #: whether a walk-forward fold trains it on the fold's own ranges under the default
    #: ``walkforward_retrain: predictor`` (else it trains once, on the first fold's)
    retrained_every_fold: bool = False

    @property
    def keys(self) -> StageKeys:
        """The config keys of the stage (its learning rate, run folder, ...)."""
        assert self.config_keys is not None, f"stage {self.name!r} declares no config_keys"
        return self.config_keys

    @property
    def test_loss(self) -> str:
        """The test metric a champion rule compares (``test_tokenizer_loss``, ...)."""
        return f"test_{self.heldout_loss}"

    # ---- what a training run builds
    def training(self, config: Mapping[str, Any], layout, info):
        """The loop's piece (a :class:`~kronos_mlflow.stages.base.TrainingStage`) for a run
        of ``config`` writing into ``layout`` on the process ``info`` describes (every rank)."""
        raise NotImplementedError

    def build_model(self, config: Mapping[str, Any], training=None, *, tokenizer=None):
        """The model the run trains (its starting weights), for the piece ``training`` when
        given; ``tokenizer``: the tokenizer a predictor would train on (a pipeline's checks)."""
        raise NotImplementedError

    def layers(self, model) -> tuple[list, list]:
        """``(inputs, blocks)`` of ``model``: its input embeddings, and its transformer blocks
        from the bottom (what ``finetune_mode: freeze`` freezes; :mod:`kronos_mlflow.model.finetune`)."""
        raise NotImplementedError

    def extend_model(self, model, config):
        """``model`` with what trains beside it in every ``finetune_mode`` (after the mode's own
        changes: it always trains); ``model`` itself by default."""
        return model

    def heldout(self, training=None):
        """The held-out comparison's piece (:class:`~kronos_mlflow.stages.base.HeldOutPiece`)."""
        raise NotImplementedError

    def run_tags(self, config: Mapping[str, Any]) -> dict[str, str]:
        """Tags only this stage's runs carry (a predictor's tokenizer)."""
        return {}

    def log_model(self, mlflow_logger, layout, config: Mapping[str, Any], result: Mapping[str, Any], heldout,
                  dataset) -> None:
        """Log the run's best checkpoint as its MLflow model ``best_model``."""
        raise NotImplementedError

    def model_problem(self, uri: str, tracking_uri: str | None) -> str | None:
        """Why the logged model at ``uri`` cannot be what the next step loads (None: it loads)."""
        raise NotImplementedError

    def champion_test_loss(self, client, registered_model_name: str, version, config: Mapping[str, Any],
                           windows_digest: str | None) -> float | None:
        """A champion's test loss on other test windows, scored anew (None: not comparable)."""
        return None

    def check_objective(self, config: Mapping[str, Any], model) -> None:
        """What ``objective: val_skill`` needs besides the run's model (a partner), checked."""

    # ---- preflight
    def forecasts(self, config: Mapping[str, Any]) -> bool:
        """Whether a run of ``config`` forecasts (its logged model, its scorecard, val_skill)."""
        return as_section(config, "training").objective in ("val_skill", "val_ic")

    def loads_checkpoints(self, config: Mapping[str, Any]) -> bool:
        """Whether building the model reads a checkpoint (a preflight loads it then)."""
        return any(str(config.get(key) or "").strip() for keys in self.keys.models.values() for key in keys)

    def scores_at_end(self, config: Mapping[str, Any]) -> bool:
        """Whether the run ends with a forecast scorecard (its backtest is checked before)."""
        return False

    def handed_over(self, model_uri: str) -> dict[str, Any]:
        """A pipeline step's overrides for the model the step before it logged (``model_uri``)."""
        return {}


#: The registry: the config's one table of stages (:data:`kronos_mlflow.config.stage_keys.STAGES`),
#: which the command fills (:func:`kronos_mlflow.stages.build_registry`).
REGISTRY: dict[str, StageSpec] = _registry.STAGES
NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def register(spec: StageSpec) -> StageSpec:
    """Add a stage, and so its config keys (once per name)."""
    if spec.name in REGISTRY:
        raise ValueError(f"stage {spec.name!r} is registered twice")
    if not NAME.fullmatch(spec.name) or not isinstance(spec.config_keys, StageKeys):
        raise ValueError(f"stage {spec.name!r}: a stage needs a lower-case name and its config_keys (a StageKeys)")
    _check_pipeline_attributes(spec)
    _registry.add(spec)
    return spec


def _check_pipeline_attributes(spec: StageSpec) -> None:
    """What every pipeline command reads of a spec has its shape: ``pipeline_position`` a finite
    number, ``pipeline_flags`` lower-case flag names, each to (help text, a config key)."""
    position = spec.pipeline_position
    flags = spec.pipeline_flags
    if isinstance(position, bool) or not isinstance(position, (int, float)) or not math.isfinite(position):
        raise ValueError(f"stage {spec.name!r}: pipeline_position {position!r} is not a finite number")
    if not isinstance(flags, Mapping):
        raise ValueError(f"stage {spec.name!r}: pipeline_flags is not a mapping of flag -> (help, config key)")
    for flag, value in flags.items():
        if (not isinstance(flag, str) or not NAME.fullmatch(flag) or not isinstance(value, tuple) or len(value) != 2
                or not isinstance(value[0], str) or value[1] not in DEFAULTS):
            raise ValueError(f"stage {spec.name!r}: pipeline_flags[{flag!r}] is not a lower-case flag name -> "
                             "(help, config key)")


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """The stages a block registers stay only when the block ends without an error: a plugin
    that registers its spec, then fails (an import, a second spec), leaves no stage, no config
    keys and so no flag or pipeline step behind."""
    kept = dict(REGISTRY)
    try:
        yield
    except BaseException:
        REGISTRY.clear()
        REGISTRY.update(kept)
        raise


def names() -> tuple[str, ...]:
    """The registered stages, in pipeline order (:attr:`StageSpec.pipeline_position`)."""
    return tuple(sorted(REGISTRY, key=lambda name: REGISTRY[name].pipeline_position))


def get(name: str) -> StageSpec:
    """The spec of stage ``name``; an unknown name is one line naming the accepted ones."""
    try:
        return REGISTRY[str(name)]
    except KeyError:
        raise ConfigError(f"stage: '{name}' is not one of {', '.join(names())}") from None


def spec_of(config: Mapping[str, Any]) -> StageSpec:
    """The spec of the config's stage."""
    return get(stage_of(config))
