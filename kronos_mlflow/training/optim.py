"""The optimizer and its schedule, as upstream's ``train_tokenizer.py`` and ``train_predictor.py`` build
them (each stage with its own learning rate)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config.core import stage_keys
from ..runtime.perf import adamw_kwargs, resolve_adamw


def build_optimizer(model, config: Mapping[str, Any], log: Callable[[str], None] | None = None
                    ) -> torch.optim.AdamW:
    """AdamW as upstream: every parameter decayed by default (``weight_decay_scope: all``).

    ``matrices`` decays only tensors with 2+ dimensions (weights of linear layers), leaving
    biases and norm gains alone. Each group's size goes to ``log`` (e.g. ``Console.print``) so a
    sweep tunes what it claims to.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    impl = resolve_adamw(config["adamw_impl"], params[0].device if params else torch.device("cpu"))
    wd = config["adam_weight_decay"]
    if config["weight_decay_scope"] == "matrices":
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
        lr=config[stage_keys(config).learning_rate],
        betas=(config["adam_beta1"], config["adam_beta2"]),
        weight_decay=wd,
        **adamw_kwargs(impl),
    )


def build_scheduler(optimizer, config: Mapping[str, Any], steps_per_epoch: int):
    """Upstream's one-cycle schedule: 3% warm-up from lr/10 to lr, then cosine annealing; with
    ``cycle_momentum`` on (upstream's), AdamW's beta1 cycles between 0.85 and 0.95."""
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer=optimizer,
        max_lr=config[stage_keys(config).learning_rate],
        steps_per_epoch=steps_per_epoch,
        epochs=config["epochs"],
        pct_start=0.03,
        div_factor=10,
        cycle_momentum=config.get("cycle_momentum", "on") == "on",
    )
