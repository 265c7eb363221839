"""The tokenizer's hyper-parameters: the published base config and the checks every config
passes before a tensor is allocated (no torch here: :mod:`kronos_mlflow.config` uses it too)."""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, UserError

#: The published ``Kronos-Tokenizer-base`` hyper-parameters (about 3.96 M parameters).
BASE_CONFIG: dict[str, Any] = {
    "d_in": 6,
    "d_model": 256,
    "n_heads": 4,
    "ff_dim": 512,
    "n_enc_layers": 4,
    "n_dec_layers": 4,
    "ffn_dropout_p": 0.0,
    "attn_dropout_p": 0.0,
    "resid_dropout_p": 0.0,
    "s1_bits": 10,
    "s2_bits": 10,
    "beta": 0.05,
    "gamma0": 1.0,
    "gamma": 1.1,
    "zeta": 0.05,
    "group_size": 4,
}

#: The 16 keys of ``config.json``, sorted as the hub mixin writes them.
CONFIG_KEYS: tuple[str, ...] = tuple(sorted(BASE_CONFIG))

# Integer keys -> (smallest, largest) accepted. The upper bounds are far above any sensible
# tokenizer and far below sizes that would exhaust memory; the parameter estimate below is the
# real guard against combinations that are individually fine but huge together.
_INT_RANGES: dict[str, tuple[int, int]] = {
    "d_in": (1, 65536),
    "d_model": (1, 65536),
    "n_heads": (1, 1024),
    "ff_dim": (1, 262144),
    "n_enc_layers": (1, 256),
    "n_dec_layers": (1, 256),
    "s1_bits": (1, 31),
    "s2_bits": (1, 31),
    "group_size": (1, 62),
}
_PROBABILITIES = ("ffn_dropout_p", "attn_dropout_p", "resid_dropout_p")
_LOSS_WEIGHTS = ("beta", "gamma0", "gamma", "zeta")

#: A config whose parameter count exceeds this is refused before anything is allocated.
MAX_PARAMETERS = 2_000_000_000


def count_parameters(config: Mapping[str, Any]) -> int:
    """Number of trainable parameters a (validated) config gives, computed without building it."""
    d_in, d, f = config["d_in"], config["d_model"], config["ff_dim"]
    s1 = config["s1_bits"]
    c = s1 + config["s2_bits"]
    block = 2 * d + 4 * (d * d + d) + 3 * f * d  # two RMSNorms, q/k/v/out with bias, SwiGLU
    blocks = (config["n_enc_layers"] - 1) + (config["n_dec_layers"] - 1)
    return (
        (d * d_in + d) + (d_in * d + d_in)  # embed, head
        + blocks * block
        + (c * d + c)  # quant_embed
        + (s1 * d + d)  # post_quant_embed_pre
        + (c * d + d)  # post_quant_embed
    )


def validate_model_config(
    config: Mapping[str, Any], origin: str = "KronosTokenizer", error: type[UserError] = ConfigError
) -> dict[str, Any]:
    """Check the 16 constructor arguments and return them normalised (ints, floats).

    Everything is checked before a single tensor is allocated, so a config such as
    ``d_model = 10_000_000`` fails at once instead of exhausting memory. ``origin`` starts each
    message (a file name when the config came from a checkpoint); ``error`` is the exception
    class raised (``ConfigError`` for code, ``CheckpointError`` for files).
    """
    if not isinstance(config, Mapping):
        raise error(f"{origin}: the config is a {type(config).__name__}; expected a mapping of the 16 tokenizer arguments")
    unknown = [k for k in config if k not in BASE_CONFIG]
    if unknown:
        key = str(unknown[0])
        close = difflib.get_close_matches(key, CONFIG_KEYS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise error(f"{origin}: unknown key '{key}'{hint}; expected exactly the keys {', '.join(CONFIG_KEYS)}")
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise error(f"{origin}: key '{missing[0]}' is missing; expected exactly the keys {', '.join(CONFIG_KEYS)}")

    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        value = config[key]
        if key in _INT_RANGES:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise error(f"{origin}: {key} is {value!r} ({type(value).__name__}); expected an integer")
            value = int(value)
            low, high = _INT_RANGES[key]
            if not low <= value <= high:
                size = "too large" if value > high else "too small"
                raise error(f"{origin}: {key} is {value}, {size}; expected an integer from {low} to {high}")
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise error(f"{origin}: {key} is {value!r} ({type(value).__name__}); expected a number")
            value = float(value)
            if not math.isfinite(value):
                raise error(f"{origin}: {key} is {value!r}; expected a finite number")
            if key in _PROBABILITIES and not 0.0 <= value < 1.0:
                raise error(f"{origin}: {key} is {value!r}; expected a probability in [0, 1)")
            if key in _LOSS_WEIGHTS and value < 0.0:
                raise error(f"{origin}: {key} is {value!r}; expected a loss weight of 0 or more")
        out[key] = value

    d, h = out["d_model"], out["n_heads"]
    if d % h or (d // h) % 2:
        raise error(
            f"{origin}: d_model {d} must split into n_heads {h} heads of even size (rotary embeddings rotate pairs)"
        )
    c = out["s1_bits"] + out["s2_bits"]
    if c % out["group_size"]:
        raise error(
            f"{origin}: group_size {out['group_size']} must divide s1_bits + s2_bits = {c} "
            "(the upstream quantizer asserts it)"
        )
    n = count_parameters(out)
    if n > MAX_PARAMETERS:
        raise error(f"{origin}: this config gives {n:,} parameters, too many; expected at most {MAX_PARAMETERS:,}")
    return out
