"""The Kronos K-line tokenizer, bit for bit, and its checkpoint format.

``KronosTokenizer`` computes what the published Kronos tokenizer (shiyu-coder/Kronos,
``model/kronos.py`` + ``model/module.py``) computes, with the same module names so that its
``state_dict`` holds exactly the tensors of a published checkpoint (96 for the base config)
and nothing else. ``/work/shared/spec/kronos-tokenizer.md`` is the contract.

Architecture, in one breath: ``embed`` (d_in -> d_model), ``n_enc_layers - 1`` pre-norm
Transformer blocks, ``quant_embed`` (d_model -> C = s1_bits + s2_bits), Binary Spherical
Quantization (L2-normalise, keep the sign, scale to +-1/sqrt(C)), then two reconstructions that
share the ``n_dec_layers - 1`` decoder blocks and the ``head``: ``z_pre`` from the first s1_bits
channels only (``post_quant_embed_pre``) and ``z`` from all C channels (``post_quant_embed``).
The coarse s1 code alone must already describe the K-line; that is what lets the Kronos
forecaster predict s1 first and s2 conditioned on it.

A fresh model with the published base hyper-parameters is ``KronosTokenizer(**BASE_CONFIG)``
(or ``KronosTokenizer.base()``). Checkpoints are Hugging Face "model hub mixin" directories:
``config.json`` (the 16 constructor arguments) and ``model.safetensors`` (float32 tensors).
``save_pretrained`` writes them atomically; ``from_pretrained`` reads a directory or a hub id
strictly and raises :class:`~kronos_mlflow.errors.CheckpointError` (one line naming the file)
for anything it cannot use. Nothing here unpickles: weights are read with safetensors only.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
import os
import re
import struct
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import CheckpointError, ConfigError, UserError
from .errors import short_reason
from .fsutil import fsync_dir, fsync_file

__all__ = [
    "BASE_CONFIG",
    "CONFIG_KEYS",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "MAX_PARAMETERS",
    "KronosTokenizer",
    "BSQuantizer",
    "BinarySphericalQuantizer",
    "TransformerBlock",
    "MultiHeadAttentionWithRoPE",
    "RotaryPositionalEmbedding",
    "RMSNorm",
    "FeedForward",
    "validate_model_config",
    "count_parameters",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

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

_MAX_CONFIG_BYTES = 1 << 20
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

def _download_hint(hub_id: str) -> str:
    return (
        f"download the checkpoint where there is network access, e.g. `hf download {hub_id} --local-dir DIR` "
        f"(`huggingface-cli download {hub_id} --local-dir DIR` with older huggingface_hub), and pass DIR"
    )


# --------------------------------------------------------------------------------------------
# Configuration checks
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Building blocks (names match upstream's module.py so that state_dict keys match)
# --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 then cast back (as upstream)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1(x)) * w3(x))``, no biases, then dropout."""

    def __init__(self, d_model: int, ff_dim: int, ffn_dropout_p: float = 0.0):
        super().__init__()
        self.w1 = nn.Linear(d_model, ff_dim, bias=False)
        self.w3 = nn.Linear(d_model, ff_dim, bias=False)
        self.w2 = nn.Linear(ff_dim, d_model, bias=False)
        self.ffn_dropout = nn.Dropout(ffn_dropout_p)

    #: Compute ``w1(x)`` and ``w3(x)`` as one matmul against the two weights stacked (each output
    #: column is the same dot product: equal to float rounding). ``KronosTokenizer.set_fused`` sets it.
    fused: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = F.linear(x, torch.cat((self.w1.weight, self.w3.weight))).chunk(2, dim=-1)
            return self.ffn_dropout(self.w2(F.silu(gate) * up))
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class RotaryPositionalEmbedding(nn.Module):
    """Rotary position embedding over a head of ``dim`` channels.

    ``inv_freq`` is a persistent buffer because the published checkpoint carries it; the cos/sin
    tables are derived from it and cached per (length, device, dtype), never saved. The cache is
    dropped whenever ``inv_freq`` is replaced or modified in place (``load_state_dict``), and is
    bypassed under ``torch.compile`` and for inference-mode tensors, which autograd cannot reuse.

    :meth:`forward` rotates head-major ``(B, H, T, head_dim)`` q and k as the spec writes it;
    :meth:`rotate` does the same for a time-major ``(B, T, n, head_dim)`` tensor (q and k heads side
    by side, as the fused attention path has them) in fewer passes, with the same numbers:
    ``rotate_half(x) * sin == swap_halves(x) * cat(-sin_half, sin_half)`` exactly, since negation
    is exact in floating point.
    """

    def __init__(self, dim: int):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq)
        self._cache_key: tuple | None = None
        self._cache: tuple[torch.Tensor, ...] | None = None

    def _compute(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        inv_freq = self.inv_freq.to(device)
        t = torch.arange(seq_len, device=device).type_as(inv_freq)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        half = freqs.shape[-1]
        sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        # (1, 1, T, dim) for head-major tensors; (T, 1, dim) for time-major (B, T, n, dim) ones.
        return cos[None, None], sin[None, None], cos[:, None], sin_signed[:, None]

    def _tables(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        if torch.compiler.is_compiling():
            return self._compute(seq_len, device)
        inv_freq = self.inv_freq
        key = (seq_len, device, inv_freq._version, torch.is_inference_mode_enabled())
        cached = self._cache_key
        # `is` on the buffer itself catches a replaced tensor (`.to()`, load with assign=True).
        if cached is None or cached[0] is not inv_freq or cached[1:] != key:
            self._cache = self._compute(seq_len, device)
            self._cache_key = (inv_freq, *key)
        assert self._cache is not None
        return self._cache

    def cos_sin(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables of shape (1, 1, seq_len, dim) for positions 0 .. seq_len-1."""
        cos, sin = self._tables(seq_len, device)[:2]
        return cos, sin

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate a time-major ``(B, T, n, dim)`` tensor (any strides), position t = index on dim 1.

        Equal, bit for bit, to :meth:`forward`'s ``x * cos + rotate_half(x) * sin`` per head.
        """
        cos, sin_signed = self._tables(x.shape[1], x.device)[2:]
        first, second = x.split(x.shape[-1] // 2, dim=-1)  # split, not slices: one cat in backward
        return x * cos + torch.cat((second, first), dim=-1) * sin_signed

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(q.shape[-2], q.device)
        return q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin


class MultiHeadAttentionWithRoPE(nn.Module):
    """Causal multi-head self-attention with rotary embeddings on q and k.

    Causal even in the tokenizer: the published model was trained that way, so position t is
    encoded from steps 0..t only. Heads are contiguous slices of d_model.
    """

    def __init__(self, d_model: int, n_heads: int, attn_dropout_p: float = 0.0, resid_dropout_p: float = 0.0):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.rotary = RotaryPositionalEmbedding(self.head_dim)
        self.attn_dropout_p = attn_dropout_p
        self.resid_dropout = nn.Dropout(resid_dropout_p)

    #: Project q, k and v with one matmul against the stacked weights and rotate q and k in one
    #: pass (equal to float rounding; see :meth:`RotaryPositionalEmbedding.rotate`). Set by
    #: ``KronosTokenizer.set_fused``.
    fused: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self._forward_fused(x)
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = self.rotary(q, k)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_dropout_p if self.training else 0.0, is_causal=True
        )
        out = out.transpose(1, 2).contiguous().view(b, t, self.d_model)
        return self.resid_dropout(self.out_proj(out))

    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.n_heads
        weight = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
        bias = torch.cat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias))
        # (b, t, 3h, head_dim): q heads, k heads, v heads. Split (not sliced) so that backward
        # concatenates the three gradients once instead of zero-filling a full tensor per slice.
        qk, v = F.linear(x, weight, bias).view(b, t, 3 * h, self.head_dim).split((2 * h, h), dim=2)
        q, k = self.rotary.rotate(qk).split(h, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            dropout_p=self.attn_dropout_p if self.training else 0.0, is_causal=True,
        )
        out = out.transpose(1, 2).reshape(b, t, self.d_model)
        return self.resid_dropout(self.out_proj(out))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(norm1(x))`` then ``x + ffn(norm2(x))``."""

    def __init__(self, d_model: int, n_heads: int, ff_dim: int, ffn_dropout_p: float = 0.0,
                 attn_dropout_p: float = 0.0, resid_dropout_p: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.self_attn = MultiHeadAttentionWithRoPE(d_model, n_heads, attn_dropout_p, resid_dropout_p)
        self.norm2 = RMSNorm(d_model)
        self.ffn = FeedForward(d_model, ff_dim, ffn_dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


# --------------------------------------------------------------------------------------------
# Binary Spherical Quantization
# --------------------------------------------------------------------------------------------


def _bit_weights(n_bits: int, device: torch.device) -> torch.Tensor:
    """2^0 .. 2^(n_bits-1) as int64: little-endian, computed on the fly (never saved)."""
    return torch.ones((), dtype=torch.long, device=device) << torch.arange(n_bits, dtype=torch.long, device=device)


def bits_to_indices(code: torch.Tensor) -> torch.Tensor:
    """Pack the signs of ``code`` (..., n) into int64 indices: channel c is bit c (little-endian).

    ``code >= 0`` gives bit 1, as upstream; a quantized code is never exactly zero.
    """
    bits = (code >= 0).to(torch.long)
    return (bits * _bit_weights(code.shape[-1], code.device)).sum(-1)


def indices_to_bits(indices: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Unpack the low ``n_bits`` of int indices into booleans (..., n_bits), bit c -> channel c."""
    return (indices.to(torch.long).unsqueeze(-1) & _bit_weights(n_bits, indices.device)) != 0


class BinarySphericalQuantizer(nn.Module):
    """BSQ (arXiv 2406.07548) as the published Kronos tokenizer computes it.

    The input ``u`` is already L2-normalised over its C channels (see :class:`BSQuantizer`).
    Each channel keeps only its sign: ``q = sign(u) / sqrt(C)``, a point of the unit sphere's
    inscribed hypercube, so the C signs are the token. ``sign`` has zero gradient almost
    everywhere, so the straight-through estimator ``u + (sign(u) - u).detach()`` passes the
    gradient of q back to u unchanged (times the 1/sqrt(C) scale) while the forward value is the
    exact code. ``u == 0`` maps to -1.

    ``basis`` / ``group_basis`` (big-endian powers of two) are persistent buffers only because
    the published checkpoint carries them; indices are packed little-endian elsewhere.
    """

    def __init__(self, embed_dim: int, beta: float, gamma0: float, gamma: float, zeta: float, group_size: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.beta = beta
        self.gamma0 = gamma0
        self.gamma = gamma
        self.zeta = zeta
        self.group_size = group_size
        self.register_buffer("basis", 2 ** torch.arange(embed_dim - 1, -1, -1, dtype=torch.long))
        self.register_buffer("group_basis", 2 ** torch.arange(group_size - 1, -1, -1, dtype=torch.long))
        # Upstream multiplies by the Python float 1/C**0.5, which torch applies as a float32
        # scalar; storing that float32 value makes every path (forward, decode) bit-identical.
        self.q_scale = struct.unpack("f", struct.pack("f", 1.0 / (embed_dim ** 0.5)))[0]
        self._sqrt_dim = embed_dim ** 0.5

    def quantize(self, u: torch.Tensor) -> torch.Tensor:
        """Scaled code ``+-1/sqrt(C)`` with a straight-through gradient ``dq/du = 1/sqrt(C)``."""
        one = torch.ones((), dtype=u.dtype, device=u.device)
        zhat = torch.where(u > 0, one, -one)
        return (u + (zhat - u).detach()) * self.q_scale

    def loss_parts(self, u: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``bsq_loss`` and its three parts for normalised ``u`` and scaled code ``q``.

        - commitment: ``beta * mean_(B,T) sum_C (q.detach() - u)^2`` pulls u onto its code;
        - per-sample entropy of the soft bits ``p = sigmoid(-4 u / sqrt(C))``, summed over
          channels: low means every sample is confidently coded;
        - codebook entropy of the bit probabilities averaged over the batch, summed over
          channels: high means every bit is used half of the time (C log 2 at most).

        ``loss = commitment + zeta * (gamma0 * per_sample - gamma * codebook)``; often negative.
        ``group_size`` does not enter: the published model computes this per-channel form.
        """
        commitment = self.beta * torch.mean(((q.detach() - u) ** 2).sum(dim=-1))
        p = torch.sigmoid(-4 * u / self._sqrt_dim)
        prob = torch.stack([p, 1 - p], dim=-1)  # (..., C, 2)
        per_sample_entropy = (-(prob * torch.log(prob + 1e-8)).sum(dim=-1)).sum(dim=-1).mean()
        avg_prob = prob.mean(dim=tuple(range(prob.dim() - 2)))  # (C, 2)
        codebook_entropy = (-(avg_prob * torch.log(avg_prob + 1e-8)).sum(dim=-1)).sum()
        entropy_penalty = self.gamma0 * per_sample_entropy - self.gamma * codebook_entropy
        loss = commitment + self.zeta * entropy_penalty
        return loss, {
            "commitment": commitment,
            "per_sample_entropy": per_sample_entropy,
            "codebook_entropy": codebook_entropy,
        }

    def forward(self, u: torch.Tensor, collect_metrics: bool = True):
        """Return ``(q, loss, parts)``; with ``collect_metrics=False`` the loss is a zero and parts empty."""
        if u.shape[-1] != self.embed_dim:
            raise ValueError(f"expected {self.embed_dim} channels to quantize, got {u.shape[-1]}")
        q = self.quantize(u)
        if not collect_metrics:
            return q, q.new_zeros(()), {}
        loss, parts = self.loss_parts(u, q)
        return q, loss, parts


class BSQuantizer(nn.Module):
    """L2-normalise over the C channels, quantize, and pack the signs into token indices."""

    def __init__(self, s1_bits: int, s2_bits: int, beta: float, gamma0: float, gamma: float, zeta: float,
                 group_size: int):
        super().__init__()
        self.codebook_dim = s1_bits + s2_bits
        self.s1_bits = s1_bits
        self.s2_bits = s2_bits
        self.bsq = BinarySphericalQuantizer(self.codebook_dim, beta, gamma0, gamma, zeta, group_size)

    def forward(self, z: torch.Tensor, half: bool = False, collect_metrics: bool = True):
        """Return ``(bsq_loss, quantized, indices)``; ``indices`` is ``[s1, s2]`` when ``half``."""
        u = F.normalize(z, dim=-1)
        quantized, bsq_loss, _ = self.bsq(u, collect_metrics=collect_metrics)
        if half:
            indices: Any = [
                bits_to_indices(quantized[..., : self.s1_bits]),
                bits_to_indices(quantized[..., self.s1_bits:]),
            ]
        else:
            indices = bits_to_indices(quantized)
        return bsq_loss, quantized, indices


# --------------------------------------------------------------------------------------------
# The tokenizer
# --------------------------------------------------------------------------------------------


class KronosTokenizer(nn.Module):
    """The Kronos K-line tokenizer: (B, T, d_in) windows <-> (B, T) tokens of C bits.

    Takes the 16 arguments of the published class (all required; see ``BASE_CONFIG``), checked
    up front by :func:`validate_model_config` (``ConfigError`` on a bad value). ``self.config``
    holds them, normalised, and is what ``save_pretrained`` writes to ``config.json``.

    Token indices are little-endian over the code channels: channel c contributes 2^c, so the
    s1 (coarse) token is the low ``s1_bits`` bits and the s2 token the high bits:
    ``s1 = idx & (2**s1_bits - 1)``, ``s2 = idx >> s1_bits``.
    """

    def __init__(self, d_in, d_model, n_heads, ff_dim, n_enc_layers, n_dec_layers, ffn_dropout_p, attn_dropout_p,
                 resid_dropout_p, s1_bits, s2_bits, beta, gamma0, gamma, zeta, group_size):
        super().__init__()
        cfg = validate_model_config({
            "d_in": d_in, "d_model": d_model, "n_heads": n_heads, "ff_dim": ff_dim,
            "n_enc_layers": n_enc_layers, "n_dec_layers": n_dec_layers, "ffn_dropout_p": ffn_dropout_p,
            "attn_dropout_p": attn_dropout_p, "resid_dropout_p": resid_dropout_p, "s1_bits": s1_bits,
            "s2_bits": s2_bits, "beta": beta, "gamma0": gamma0, "gamma": gamma, "zeta": zeta,
            "group_size": group_size,
        })
        self.config: dict[str, Any] = dict(cfg)
        # Upstream's attribute names, for code written against it.
        self.d_in = cfg["d_in"]
        self.d_model = cfg["d_model"]
        self.n_heads = cfg["n_heads"]
        self.ff_dim = cfg["ff_dim"]
        self.enc_layers = cfg["n_enc_layers"]
        self.dec_layers = cfg["n_dec_layers"]
        self.ffn_dropout_p = cfg["ffn_dropout_p"]
        self.attn_dropout_p = cfg["attn_dropout_p"]
        self.resid_dropout_p = cfg["resid_dropout_p"]
        self.s1_bits = cfg["s1_bits"]
        self.s2_bits = cfg["s2_bits"]
        self.codebook_dim = self.s1_bits + self.s2_bits

        def block() -> TransformerBlock:
            return TransformerBlock(self.d_model, self.n_heads, self.ff_dim, self.ffn_dropout_p,
                                    self.attn_dropout_p, self.resid_dropout_p)

        self.embed = nn.Linear(self.d_in, self.d_model)
        self.head = nn.Linear(self.d_model, self.d_in)
        # n - 1 blocks each, as upstream (the embed / head projections count as the n-th).
        self.encoder = nn.ModuleList([block() for _ in range(self.enc_layers - 1)])
        self.decoder = nn.ModuleList([block() for _ in range(self.dec_layers - 1)])
        self.quant_embed = nn.Linear(self.d_model, self.codebook_dim)
        self.post_quant_embed_pre = nn.Linear(self.s1_bits, self.d_model)
        self.post_quant_embed = nn.Linear(self.codebook_dim, self.d_model)
        self.tokenizer = BSQuantizer(self.s1_bits, self.s2_bits, cfg["beta"], cfg["gamma0"], cfg["gamma"],
                                     cfg["zeta"], cfg["group_size"])
        self._fused = False

    @classmethod
    def base(cls) -> "KronosTokenizer":
        """A freshly initialised model with the published base hyper-parameters."""
        return cls(**BASE_CONFIG)

    # ---- computation ----

    def _encode_to_code_space(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.encoder:
            h = layer(h)
        return self.quant_embed(h)

    def _decode_code(self, code: torch.Tensor, proj: nn.Module) -> torch.Tensor:
        h = proj(code)
        for layer in self.decoder:
            h = layer(h)
        return self.head(h)

    def forward(self, x: torch.Tensor):
        """Encode, quantize, and reconstruct ``x`` of shape (B, T, d_in).

        Returns ``((z_pre, z), bsq_loss, quantized, indices)``: ``z_pre`` is rebuilt from the s1
        bits only, ``z`` from all C bits (both (B, T, d_in)); ``quantized`` is the scaled code
        (B, T, C) with straight-through gradients; ``indices`` the int64 (B, T) full tokens.
        """
        h = self._encode_to_code_space(x)
        bsq_loss, quantized, indices = self.tokenizer(h)
        coarse = quantized[..., : self.s1_bits].contiguous()
        if self.fused:
            # One decoder pass over both inputs stacked on the batch dimension: every op of the
            # decoder and head works sample by sample, so this is the two passes' arithmetic in
            # half the calls (and one weight-gradient matmul per layer instead of two).
            h = torch.cat((self.post_quant_embed_pre(coarse), self.post_quant_embed(quantized)), dim=0)
            for layer in self.decoder:
                h = layer(h)
            z_pre, z = self.head(h).split(quantized.shape[0], dim=0)
            return (z_pre, z), bsq_loss, quantized, indices
        z_pre = self._decode_code(coarse, self.post_quant_embed_pre)
        z = self._decode_code(quantized, self.post_quant_embed)
        return (z_pre, z), bsq_loss, quantized, indices

    @property
    def fused(self) -> bool:
        """Whether the fused path is on: one batched decoder pass for ``z_pre`` and ``z``, stacked
        q/k/v and w1/w3 projections, one-pass rotary: the same outputs to float rounding (1e-6) in
        fewer, larger kernels (faster on GPUs; on CPUs it measured a few percent slower). ``False``
        (the default) is the plain path, the spec's computation op for op. Setting it sets every
        block too (see :meth:`set_fused`); training sets it from the ``fused_layers`` key. Never saved."""
        return self._fused

    @fused.setter
    def fused(self, enabled: bool) -> None:
        self.set_fused(enabled)

    def set_fused(self, enabled: bool = True) -> "KronosTokenizer":
        """Switch the fused path (see :attr:`fused`) on or off, for the model and its blocks."""
        enabled = bool(enabled)
        object.__setattr__(self, "_fused", enabled)
        for module in self.modules():
            if isinstance(module, (MultiHeadAttentionWithRoPE, FeedForward)):
                module.fused = enabled
        return self

    def encode(self, x: torch.Tensor, half: bool = False):
        """Token indices of ``x``: int64 (B, T) of C bits, or ``[s1, s2]`` with ``half=True``.

        The loss is not computed. Little-endian: channel c is bit c of the (half's) index.
        """
        _, _, indices = self.tokenizer(self._encode_to_code_space(x), half=half, collect_metrics=False)
        return indices

    def indices_to_bits(self, indices, half: bool = False) -> torch.Tensor:
        """Indices back to the scaled code +-1/sqrt(C) (B, T, C); only the low bits are read."""
        if half:
            if not isinstance(indices, Sequence) or len(indices) != 2:
                raise TypeError("decode(..., half=True) expects the pair [s1_indices, s2_indices] from encode(x, half=True)")
            bits = torch.cat([indices_to_bits(indices[0], self.s1_bits),
                              indices_to_bits(indices[1], self.s2_bits)], dim=-1)
        else:
            bits = indices_to_bits(indices, self.codebook_dim)
        dtype = self.post_quant_embed.weight.dtype
        return (bits.to(dtype) * 2 - 1) * self.tokenizer.bsq.q_scale

    def decode(self, indices, half: bool = False) -> torch.Tensor:
        """Reconstruct (B, T, d_in) from tokens through the full-code path (``post_quant_embed``).

        ``decode(encode(x))`` equals the forward's ``z``; with ``half=True`` it takes the pair from
        ``encode(x, half=True)`` and concatenates the s1 bits then the s2 bits.
        """
        return self._decode_code(self.indices_to_bits(indices, half), self.post_quant_embed)

    # ---- checkpoints ----

    def save_pretrained(self, save_directory: str | os.PathLike) -> str:
        """Write ``config.json`` and ``model.safetensors`` into ``save_directory`` (created).

        The layout is the Hugging Face hub mixin's, so upstream ``KronosTokenizer.from_pretrained``
        loads it. Each file is written to a temporary file in the same directory, flushed to disk,
        then renamed over the old one, so an interrupted save never leaves a half-written file.
        Returns the directory as a string.
        """
        directory = Path(os.path.expanduser(os.fspath(save_directory)))
        if directory.exists() and not directory.is_dir():
            raise CheckpointError(f"cannot save the checkpoint: '{directory}' is a file, not a directory")
        directory.mkdir(parents=True, exist_ok=True)

        tensors: dict[str, torch.Tensor] = {}
        for name, tensor in self.state_dict().items():
            t = tensor.detach().to("cpu")
            if t.is_floating_point():
                t = t.to(torch.float32)
            tensors[name] = t.contiguous().clone()
        config_text = json.dumps(self.config, sort_keys=True, indent=2)

        import safetensors.torch

        temps: list[str] = []
        try:
            weights_tmp = _temp_path(directory, WEIGHTS_NAME)
            temps.append(weights_tmp)
            safetensors.torch.save_file(tensors, weights_tmp, metadata={"format": "pt"})
            fsync_file(weights_tmp)
            config_tmp = _temp_path(directory, CONFIG_NAME)
            temps.append(config_tmp)
            with open(config_tmp, "w", encoding="utf-8") as fh:
                fh.write(config_text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(weights_tmp, directory / WEIGHTS_NAME)
            os.replace(config_tmp, directory / CONFIG_NAME)
            temps.clear()
            fsync_dir(directory)
        finally:
            for tmp in temps:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        return str(directory)

    @classmethod
    def from_pretrained(cls, path_or_hub_id: str | os.PathLike, *, map_location: str | torch.device = "cpu"
                        ) -> "KronosTokenizer":
        """Load a checkpoint directory, or a hub id (``owner/name``) through the local HF cache.

        Loading is strict (every tensor present, none extra, shapes as ``config.json`` implies,
        float tensors floating-point and converted to float32, int buffers int64) and the config is
        checked before anything is allocated. A hub id is resolved with
        ``huggingface_hub.snapshot_download`` (which honours ``HF_HUB_OFFLINE``). Every failure is
        a one-line :class:`CheckpointError` naming the path. The model is returned in eval mode,
        as upstream's mixin returns it.
        """
        directory = _resolve_checkpoint_dir(path_or_hub_id)
        config = _read_config(directory / CONFIG_NAME)
        weights_path = directory / WEIGHTS_NAME
        expected = _expected_tensors(cls, config)
        _check_weights_header(weights_path, expected)

        import safetensors.torch

        try:
            loaded = safetensors.torch.load_file(str(weights_path), device="cpu")
        except Exception as exc:  # noqa: BLE001 - any read failure is a bad file
            raise CheckpointError(
                f"weights file '{weights_path}' cannot be read ({short_reason(exc)}); it may be truncated or corrupt: "
                "save or download it again"
            ) from None
        for name, tensor in loaded.items():
            if tensor.is_floating_point():
                loaded[name] = tensor.to(torch.float32)
        bsq_basis = {
            "tokenizer.bsq.basis": 2 ** torch.arange(config["s1_bits"] + config["s2_bits"] - 1, -1, -1),
            "tokenizer.bsq.group_basis": 2 ** torch.arange(config["group_size"] - 1, -1, -1),
        }
        for name, want in bsq_basis.items():
            if not torch.equal(loaded[name], want):
                raise CheckpointError(
                    f"weights file '{weights_path}': buffer '{name}' does not hold the powers of two "
                    f"2^{want.numel() - 1} .. 2^0; the file is corrupt or from another model"
                )

        model = cls(**config)
        try:
            model.load_state_dict(loaded, strict=True)
        except RuntimeError as exc:  # names and shapes were checked; this is a safety net
            raise CheckpointError(f"weights file '{weights_path}' does not fit config.json ({short_reason(exc)})") from None
        model.eval()
        return model.to(map_location)


# --------------------------------------------------------------------------------------------
# Checkpoint helpers
# --------------------------------------------------------------------------------------------



def _temp_path(directory: Path, final_name: str) -> str:
    fd, path = tempfile.mkstemp(prefix=f".{final_name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    return path




def _resolve_checkpoint_dir(path_or_hub_id: str | os.PathLike) -> Path:
    raw = os.fspath(path_or_hub_id)
    if not isinstance(raw, str) or not raw.strip():
        raise CheckpointError("the checkpoint path is empty; pass a directory holding config.json and model.safetensors")
    path = Path(os.path.expanduser(raw))
    if path.is_dir():
        _require_files(path)
        return path
    if path.exists():
        raise CheckpointError(
            f"checkpoint path '{path}' is a file, not a directory; pass the directory holding "
            f"{CONFIG_NAME} and {WEIGHTS_NAME}"
        )
    if not _HUB_ID_RE.match(raw) or ".." in raw:
        raise CheckpointError(
            f"checkpoint directory '{path}' does not exist; pass a directory holding {CONFIG_NAME} and "
            f"{WEIGHTS_NAME}, or a Hugging Face hub id such as NeoQuasar/Kronos-Tokenizer-base"
        )
    try:
        import huggingface_hub

        snapshot = huggingface_hub.snapshot_download(
            repo_id=raw, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, "README.md"]
        )
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, network, bad id: all the same to the user
        raise CheckpointError(
            f"'{raw}' is not a local directory and the Hugging Face hub id could not be reached "
            f"({short_reason(exc, 120)}); {_download_hint(raw)}"
        ) from None
    resolved = Path(snapshot)
    if not resolved.is_dir():
        raise CheckpointError(f"hub id '{raw}' resolved to '{resolved}', which is not a directory; {_download_hint(raw)}")
    _require_files(resolved)
    return resolved


def _require_files(directory: Path) -> None:
    if not (directory / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"checkpoint directory '{directory}' has no {CONFIG_NAME}; expected the hub layout "
            f"{CONFIG_NAME} + {WEIGHTS_NAME} as save_pretrained writes it"
        )
    if not (directory / WEIGHTS_NAME).is_file():
        pickled = " (pickle files such as pytorch_model.bin are never loaded)" if (
            directory / "pytorch_model.bin").exists() else ""
        raise CheckpointError(
            f"checkpoint directory '{directory}' has no {WEIGHTS_NAME}{pickled}; expected the hub layout "
            f"{CONFIG_NAME} + {WEIGHTS_NAME} as save_pretrained writes it"
        )


def _read_config(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > _MAX_CONFIG_BYTES:
            raise CheckpointError(
                f"config file '{path}' is {size:,} bytes, too large; expected a small JSON object of 16 keys"
            )
        data = path.read_bytes()
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"config file '{path}' cannot be read ({short_reason(exc)})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"config file '{path}' is not UTF-8 text (bad byte at offset {exc.start}); expected a JSON object"
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"config file '{path}' is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise CheckpointError(f"config file '{path}' is not valid JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"config file '{path}' holds a JSON {type(obj).__name__}; expected an object of the 16 tokenizer arguments"
        )
    return validate_model_config(obj, origin=f"config file '{path}'", error=CheckpointError)


def _expected_tensors(cls: type[KronosTokenizer], config: Mapping[str, Any]) -> dict[str, tuple[list[int], torch.dtype]]:
    """Name -> (shape, dtype) of every persistent tensor, from a model built on the meta device."""
    with torch.device("meta"):
        model = cls(**config)
    return {name: (list(t.shape), t.dtype) for name, t in model.state_dict().items()}


_SAFETENSORS_FLOATS = {"F64", "F32", "F16", "BF16"}


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_weights_header(path: Path, expected: Mapping[str, tuple[list[int], torch.dtype]]) -> None:
    """Check names, shapes and dtypes from the safetensors header, before reading any data."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            header = {}
            for name in fh.keys():
                sl = fh.get_slice(name)
                header[name] = (list(sl.get_shape()), sl.get_dtype())
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError, ...: all a bad file
        raise CheckpointError(
            f"weights file '{path}' cannot be read ({short_reason(exc)}); it may be truncated or corrupt: "
            "save or download it again"
        ) from None
    missing = [n for n in expected if n not in header]
    unexpected = sorted(n for n in header if n not in expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensor{'s' if len(missing) > 1 else ''} {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected tensor{'s' if len(unexpected) > 1 else ''} {_names(unexpected)}")
        raise CheckpointError(
            f"weights file '{path}' does not match its config.json: {'; '.join(parts)}"
        )
    for name, (shape, dtype) in expected.items():
        found_shape, found_dtype = header[name]
        if found_shape != shape:
            raise CheckpointError(
                f"weights file '{path}': tensor '{name}' has shape {found_shape}, expected {shape} from config.json"
            )
        if dtype.is_floating_point:
            if found_dtype not in _SAFETENSORS_FLOATS:
                raise CheckpointError(
                    f"weights file '{path}': tensor '{name}' has dtype {found_dtype}; expected a floating-point "
                    "dtype (F32)"
                )
        elif found_dtype != "I64":
            raise CheckpointError(f"weights file '{path}': tensor '{name}' has dtype {found_dtype}; expected I64")
