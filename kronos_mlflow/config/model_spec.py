"""The hyper-parameters of the two models, the tokenizer's and the predictor's (``Kronos``): the
published configs and the checks every config passes before a tensor is allocated (no torch
here: :mod:`kronos_mlflow.config.core` uses it too)."""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Schema:
    """What a model's ``config.json`` holds: its keys, which are integers (with ranges), which
    probabilities, which non-negative weights and which booleans (the rest: finite numbers)."""

    noun: str
    keys: tuple[str, ...]
    ints: Mapping[str, tuple[int, int]]
    probabilities: tuple[str, ...] = ()
    non_negative: tuple[str, ...] = ()
    bools: tuple[str, ...] = ()

    @property
    def expected(self) -> str:
        """``the 16 tokenizer arguments``: what a config file of this model should hold."""
        return f"the {len(self.keys)} {self.noun} arguments"


TOKENIZER_SCHEMA = Schema("tokenizer", CONFIG_KEYS, _INT_RANGES, _PROBABILITIES, _LOSS_WEIGHTS)


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
    out = _check_keys_and_values(config, TOKENIZER_SCHEMA, origin, error)
    _check_heads(out, out["n_heads"], origin, error, "rotary embeddings rotate pairs")
    c = out["s1_bits"] + out["s2_bits"]
    if c % out["group_size"]:
        raise error(
            f"{origin}: group_size {out['group_size']} must divide s1_bits + s2_bits = {c} "
            "(the upstream quantizer asserts it)"
        )
    _check_size(count_parameters(out), origin, error)
    return out


# --------------------------------------------------------------------------------------------
# The predictor (Kronos): the 11 keys of its config.json and the published architectures
# --------------------------------------------------------------------------------------------

#: The published predictors (hub ids ``NeoQuasar/<name>``). Kronos-mini pairs with
#: Kronos-Tokenizer-2k (context 2048), -small and -base with Kronos-Tokenizer-base (context 512).
PREDICTOR_CONFIGS: dict[str, dict[str, Any]] = {
    name: {
        "s1_bits": 10, "s2_bits": 10, "n_layers": layers, "d_model": d, "n_heads": heads, "ff_dim": ff,
        "ffn_dropout_p": ffn, "attn_dropout_p": attn, "resid_dropout_p": resid, "token_dropout_p": token,
        "learn_te": True,
    }
    for name, (d, layers, heads, ff, ffn, resid, attn, token) in {
        "Kronos-mini": (256, 4, 4, 512, 0.2, 0.2, 0.0, 0.0),
        "Kronos-small": (512, 8, 8, 1024, 0.25, 0.25, 0.1, 0.1),
        "Kronos-base": (832, 12, 16, 2048, 0.2, 0.2, 0.0, 0.0),
    }.items()
}

#: The 11 keys of a predictor's ``config.json``, sorted as the hub mixin writes them.
PREDICTOR_KEYS: tuple[str, ...] = tuple(sorted(PREDICTOR_CONFIGS["Kronos-small"]))

#: Heads of the dependency-aware layer's cross-attention: fixed, not in config.json.
DEP_LAYER_HEADS = 4

#: Sizes of the temporal embedding tables (minute, hour, weekday, day, month).
TIME_FEATURE_SIZES: dict[str, int] = {"minute": 60, "hour": 24, "weekday": 7, "day": 32, "month": 13}

PREDICTOR_SCHEMA = Schema(
    "predictor", PREDICTOR_KEYS,
    {"s1_bits": (1, 31), "s2_bits": (1, 31), "n_layers": (1, 256), "d_model": (1, 65536), "n_heads": (1, 1024),
     "ff_dim": (1, 262144)},
    probabilities=("ffn_dropout_p", "attn_dropout_p", "resid_dropout_p", "token_dropout_p"),
    bools=("learn_te",),
)


def count_predictor_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of a (validated) predictor config, computed without building it: every
    parameter, the fixed (``learn_te`` false) time tables included. Kronos-small: 24,741,376."""
    d, f = config["d_model"], config["ff_dim"]
    v1, v2 = 2 ** config["s1_bits"], 2 ** config["s2_bits"]
    attention = 4 * (d * d + d)  # q/k/v/out with bias
    block = 2 * d + attention + 3 * f * d  # two RMSNorms, attention, SwiGLU
    return (
        (v1 + v2) * d + (2 * d * d + d)  # emb_s1, emb_s2, fusion_proj
        + sum(TIME_FEATURE_SIZES.values()) * d
        + config["n_layers"] * block + d  # blocks, final norm
        + attention + d  # dependency-aware layer: cross-attention, norm
        + (d * v1 + v1) + (d * v2 + v2)  # proj_s1, proj_s2
    )


def validate_predictor_config(
    config: Mapping[str, Any], origin: str = "Kronos", error: type[UserError] = ConfigError
) -> dict[str, Any]:
    """Check the 11 constructor arguments of ``Kronos`` and return them normalised, before any
    tensor is allocated (as :func:`validate_model_config` does for the tokenizer)."""
    out = _check_keys_and_values(config, PREDICTOR_SCHEMA, origin, error)
    _check_heads(out, out["n_heads"], origin, error, "rotary embeddings rotate pairs")
    _check_heads(out, DEP_LAYER_HEADS, origin, error, "the dependency-aware layer always has 4", what="its")
    _check_size(count_predictor_parameters(out), origin, error)
    return out


# --------------------------------------------------------------------------------------------
# Shared checks: one schema per model class
# --------------------------------------------------------------------------------------------


def _check_keys_and_values(config: Any, schema: Schema, origin: str, error: type[UserError]) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise error(f"{origin}: the config is a {type(config).__name__}; expected a mapping of {schema.expected}")
    keys = schema.keys
    unknown = [k for k in config if k not in keys]
    if unknown:
        other = next((s for s in (TOKENIZER_SCHEMA, PREDICTOR_SCHEMA) if s is not schema and set(config) == set(s.keys)),
                     None)
        if other is not None:  # the other model's config: say which kind it holds
            raise error(f"{origin} holds a {other.noun}'s config ({other.expected}), not a {schema.noun}'s; expected a "
                        f"{schema.noun} checkpoint")
        key = str(unknown[0])
        close = difflib.get_close_matches(key, keys, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise error(f"{origin}: unknown key '{key}'{hint}; expected exactly the keys {', '.join(keys)}")
    missing = [k for k in keys if k not in config]
    if missing:
        raise error(f"{origin}: key '{missing[0]}' is missing; expected exactly the keys {', '.join(keys)}")
    return {key: _check_value(key, config[key], schema, origin, error) for key in keys}


def _check_value(key: str, value: Any, schema: Schema, origin: str, error: type[UserError]) -> Any:
    if key in schema.bools:
        if not isinstance(value, bool):
            raise error(f"{origin}: {key} is {value!r} ({type(value).__name__}); expected true or false")
        return value
    if key in schema.ints:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise error(f"{origin}: {key} is {value!r} ({type(value).__name__}); expected an integer")
        value = int(value)
        low, high = schema.ints[key]
        if not low <= value <= high:
            size = "too large" if value > high else "too small"
            raise error(f"{origin}: {key} is {value}, {size}; expected an integer from {low} to {high}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{origin}: {key} is {value!r} ({type(value).__name__}); expected a number")
    value = float(value)
    if not math.isfinite(value):
        raise error(f"{origin}: {key} is {value!r}; expected a finite number")
    if key in schema.probabilities and not 0.0 <= value < 1.0:
        raise error(f"{origin}: {key} is {value!r}; expected a probability in [0, 1)")
    if key in schema.non_negative and value < 0.0:
        raise error(f"{origin}: {key} is {value!r}; expected a loss weight of 0 or more")
    return value


def _check_heads(config: Mapping[str, Any], n_heads: int, origin: str, error: type[UserError], why: str,
                 what: str = "n_heads") -> None:
    d = config["d_model"]
    if d % n_heads or (d // n_heads) % 2:
        raise error(f"{origin}: d_model {d} must split into {what} {n_heads} heads of even size ({why})")


def _check_size(n: int, origin: str, error: type[UserError]) -> None:
    if n > MAX_PARAMETERS:
        raise error(f"{origin}: this config gives {n:,} parameters, too many; expected at most {MAX_PARAMETERS:,}")
