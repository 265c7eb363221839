"""What differs per model stage in a held-out comparison: how a model is loaded, what one
window's loss is, and which metrics a run records. The windows (:mod:`.windows`), the
bootstrap and verdict (:mod:`.verdict`) and the run-end wiring (:mod:`.heldout`) are shared."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from . import tokenizer


@dataclass(frozen=True)
class Stage:
    name: str
    loss: str  # the metric (unprefixed) the change and verdict are computed on
    metric_names: tuple[str, ...]  # unprefixed, as ``score`` returns them
    score: Callable  # (model, windows, device, *, batch_size, rank, world_size, progress, desc) -> (losses, metrics)
    load: Callable  # (checkpoint directory or hub id, device) -> model in eval mode


def _load_tokenizer(path, device):
    from ..model import KronosTokenizer

    return KronosTokenizer.from_pretrained(path, map_location=device).eval()


TOKENIZER = Stage("tokenizer", tokenizer.LOSS, tokenizer.METRIC_NAMES, tokenizer.score, _load_tokenizer)


def _load_predictor(path, device):
    from ..model import Kronos

    return Kronos.from_pretrained(path, map_location=device).eval()


def predictor_stage(tokenizer_model) -> Stage:
    """The predictor's part, scoring on the tokens of ``tokenizer_model`` (frozen, on the device)."""
    from . import predictor

    return Stage("predictor", predictor.LOSS, predictor.METRIC_NAMES,
                 functools.partial(predictor.score, tokenizer=tokenizer_model), _load_predictor)
