"""The Kronos tokenizer: ``network`` (the modules, bit for bit upstream's), ``spec`` (the
hyper-parameters and their checks, no torch) and ``io`` (the checkpoint directory).

``from kronos_mlflow.model import KronosTokenizer`` is the public name. The torch-backed names
load on first use, so code that only checks a config (``spec``) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .spec import BASE_CONFIG, CONFIG_KEYS, MAX_PARAMETERS, count_parameters, validate_model_config

_LAZY = {
    "KronosTokenizer": "network", "BSQuantizer": "network", "BinarySphericalQuantizer": "network",
    "TransformerBlock": "network", "MultiHeadAttentionWithRoPE": "network",
    "RotaryPositionalEmbedding": "network", "RMSNorm": "network", "FeedForward": "network",
    "bits_to_indices": "network", "indices_to_bits": "network",
    "CONFIG_NAME": "io", "WEIGHTS_NAME": "io", "save_checkpoint": "io", "load_checkpoint": "io",
}

__all__ = ["BASE_CONFIG", "CONFIG_KEYS", "MAX_PARAMETERS", "count_parameters", "validate_model_config", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
