"""The optimizer and its schedule, as upstream's ``train_tokenizer.py`` and ``train_predictor.py`` build
them (each stage with its own learning rate)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config.core import stage_keys
from ..config.sections import as_section
from ..runtime.perf import adamw_kwargs, resolve_adamw


def _stage_rate(config: Mapping[str, Any]) -> float:
    """The learning rate of the whole config's stage (its own key: ``tokenizer_learning_rate`` or
    ``predictor_learning_rate``)."""
    return config[stage_keys(config).learning_rate]


def build_optimizer(model, optimizer: Any, log: Callable[[str], None] | None = None, *,
                    learning_rate: float | None = None, performance: Any = None) -> torch.optim.AdamW:
    """AdamW as upstream: every parameter decayed by default (``weight_decay_scope: all``).

    ``matrices`` decays only tensors with 2+ dimensions (weights of linear layers), leaving
    biases and norm gains alone. Each group's size goes to ``log`` (e.g. ``Console.print``) so a
    sweep tunes what it claims to.

    ``optimizer``: the config's optimizer section, with the stage's ``learning_rate`` and the
    ``performance`` section (``adamw_impl``); or the whole config, which gives all three.
    """
    if isinstance(optimizer, Mapping):
        learning_rate = _stage_rate(optimizer) if learning_rate is None else learning_rate
        performance = optimizer if performance is None else performance
    settings = as_section(optimizer, "optimizer")
    performance = as_section(performance if performance is not None else {}, "performance")
    params = [p for p in model.parameters() if p.requires_grad]
    impl = resolve_adamw(performance.adamw_impl, params[0].device if params else torch.device("cpu"))
    wd = settings.adam_weight_decay
    if settings.weight_decay_scope == "matrices":
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": wd}]
    if log is not None:
        sizes = ", ".join(
            f"{sum(p.numel() for p in g['params']):,} params at weight_decay {g['weight_decay']:g}" for g in groups
        )
        log(f"AdamW ({impl}) groups: {sizes}")
    return torch.optim.AdamW(
        groups,
        lr=learning_rate,
        betas=(settings.adam_beta1, settings.adam_beta2),
        weight_decay=wd,
        **adamw_kwargs(impl),
    )


def build_scheduler(optimizer, schedule: Any, steps_per_epoch: int, *, learning_rate: float | None = None,
                    training: Any = None):
    """Upstream's one-cycle schedule: 3% warm-up from lr/10 to lr, then cosine annealing; with
    ``cycle_momentum`` on (upstream's), AdamW's beta1 cycles between 0.85 and 0.95.

    ``schedule``: the config's optimizer section (``cycle_momentum``), with the stage's
    ``learning_rate`` and the ``training`` section (``epochs``); or the whole config, which gives all three."""
    if isinstance(schedule, Mapping):
        learning_rate = _stage_rate(schedule) if learning_rate is None else learning_rate
        training = schedule if training is None else training
    settings = as_section(schedule, "optimizer")
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer=optimizer,
        max_lr=learning_rate,
        steps_per_epoch=steps_per_epoch,
        epochs=as_section(training, "training").epochs,
        pct_start=0.03,
        div_factor=10,
        cycle_momentum=settings.cycle_momentum == "on",
    )
