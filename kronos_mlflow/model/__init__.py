"""The two Kronos networks (tokenizer and predictor, bit for bit upstream's), their checkpoints, forecasting, fine-tune modes.
May import ``config``, ``runtime`` and ``errors`` (docs/code-map.md); the torch-backed names load on first use.

``from kronos_mlflow.model import Kronos, KronosTokenizer, KronosPredictor`` are upstream's names.
"""

from __future__ import annotations

from ..config.model_spec import (
    BASE_CONFIG, CONFIG_KEYS, MAX_PARAMETERS, PREDICTOR_CONFIGS, PREDICTOR_KEYS, count_parameters,
    count_predictor_parameters, validate_model_config, validate_predictor_config,
)
from ..runtime.lazy import lazy_exports

_LAZY = {
    "KronosTokenizer": "network", "BSQuantizer": "network", "BinarySphericalQuantizer": "network",
    "TransformerBlock": "network", "MultiHeadAttentionWithRoPE": "network",
    "RotaryPositionalEmbedding": "network", "RMSNorm": "network", "FeedForward": "network",
    "bits_to_indices": "network", "indices_to_bits": "network",
    "Kronos": "kronos", "HierarchicalEmbedding": "kronos", "TemporalEmbedding": "kronos",
    "DependencyAwareLayer": "kronos", "MultiHeadCrossAttentionWithRoPE": "kronos", "DualHead": "kronos",
    "KronosPredictor": "predictor", "calc_time_stamps": "predictor",
    "auto_regressive_inference": "forecast", "generate_tokens": "forecast", "ForecastWarning": "forecast",
    "forecast_bytes": "forecast",
    "sample_from_logits": "sampling", "top_k_top_p_filtering": "sampling",
    "KVCache": "decoding", "IncrementalDecoder": "decoding",
    "CONFIG_NAME": "io", "WEIGHTS_NAME": "io", "save_checkpoint": "io", "load_checkpoint": "io",
}

__all__ = [
    "BASE_CONFIG", "CONFIG_KEYS", "MAX_PARAMETERS", "PREDICTOR_CONFIGS", "PREDICTOR_KEYS", "count_parameters",
    "count_predictor_parameters", "validate_model_config", "validate_predictor_config", *_LAZY,
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
