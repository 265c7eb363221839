"""The Kronos K-line tokenizer (:class:`KronosTokenizer`), bit for bit the published one with its
module names (a published checkpoint's exact tensors: 96 for the base config), and the Transformer
blocks the predictor shares. The contract: ``/work/shared/spec/kronos-tokenizer.md``; checkpoints
are read with safetensors only, strictly: docs/predictor.md#loading-the-published-checkpoints.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .io import HubCheckpoint
from ..config.model_spec import BASE_CONFIG, TOKENIZER_SCHEMA, validate_model_config


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
        if self.fused and type(self.w1) is type(self.w3) is nn.Linear:  # not through adapters (finetune.py)
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
        """Rotate head-major q and k at positions 0 .. Lq-1, Lq being the *query's* length (as
        upstream): in a cross-attention whose query is one position, every key gets position 0's
        rotation, the identity (see docs/predictor.md, "the RoPE cache length")."""
        cos, sin = self.cos_sin(q.shape[-2], q.device)
        return q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin

    def rotate_at(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Rotate a head-major ``(B, H, n, dim)`` tensor at positions ``start .. start+n-1``, read
        from the table of ``start + n`` positions: the rows a window of that length gets from
        :meth:`forward`, so one new position rotates exactly as it would in the whole window."""
        cos, sin = self.cos_sin(start + x.shape[-2], x.device)
        return x * cos[..., start:, :] + self.rotate_half(x) * sin[..., start:, :]


def padding_attention_mask(key_padding_mask: torch.Tensor, q_len: int, k_len: int, causal: bool) -> torch.Tensor:
    """Boolean SDPA mask ``(B, 1, q_len, k_len)``, True where a query may attend: keys not padded
    (``key_padding_mask`` nonzero marks padding), at or before the query when ``causal`` (aligned
    top-left, as SDPA's ``is_causal``), and, when queries and keys are the same positions, always
    the query's own (so a padded position's row is never empty)."""
    device = key_padding_mask.device
    keep = ~key_padding_mask.to(torch.bool)[:, None, None, :k_len]
    if causal:
        keep = keep & torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()
    if q_len == k_len:
        keep = keep | torch.eye(q_len, dtype=torch.bool, device=device)
    return keep


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

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_model)`` -> head-major ``(B, H, T, head_dim)`` (a view)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """Head-major attention output back to ``(B, T, d_model)``, then ``out_proj`` and dropout."""
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).contiguous().view(b, t, self.d_model)
        return self.resid_dropout(self.out_proj(out))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scaled dot-product attention of head-major tensors, with this layer's dropout in training.

        ``key_padding_mask`` (B, Tk), nonzero at padded positions (upstream's convention, see
        ``DualHead.compute_loss``), keeps every query off the padded keys; a position always sees
        itself, so no row is empty. (Upstream hands that mask to SDPA together with
        ``is_causal=True``, which SDPA refuses.)"""
        mask = None
        if key_padding_mask is not None:
            mask = padding_attention_mask(key_padding_mask, q.shape[-2], k.shape[-2], causal)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.attn_dropout_p if self.training else 0.0,
            is_causal=causal and mask is None,
        )

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.fused and key_padding_mask is None and all(
                type(p) is nn.Linear for p in (self.q_proj, self.k_proj, self.v_proj)):  # not through adapters
            return self._forward_fused(x)
        q = self.split_heads(self.q_proj(x))
        k = self.split_heads(self.k_proj(x))
        v = self.split_heads(self.v_proj(x))
        q, k = self.rotary(q, k)
        return self.merge_heads(self.attend(q, k, v, causal=True, key_padding_mask=key_padding_mask))

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

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x), key_padding_mask=key_padding_mask)
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


class KronosTokenizer(HubCheckpoint, nn.Module):
    """The Kronos K-line tokenizer: (B, T, d_in) windows <-> (B, T) tokens of C bits.

    Takes the 16 arguments of the published class (all required; see ``BASE_CONFIG``), checked
    up front by :func:`validate_model_config` (``ConfigError`` on a bad value). ``self.config``
    holds them, normalised, and is what ``save_pretrained`` writes to ``config.json``.

    Token indices are little-endian over the code channels: channel c contributes 2^c, so the
    s1 (coarse) token is the low ``s1_bits`` bits and the s2 token the high bits:
    ``s1 = idx & (2**s1_bits - 1)``, ``s2 = idx >> s1_bits``.

    Architecture, in one breath: ``embed`` (d_in -> d_model), ``n_enc_layers - 1`` pre-norm
    Transformer blocks, ``quant_embed`` (d_model -> C = s1_bits + s2_bits), Binary Spherical
    Quantization (L2-normalise, keep the sign, scale to +-1/sqrt(C)), then two reconstructions that
    share the ``n_dec_layers - 1`` decoder blocks and the ``head``: ``z_pre`` from the first s1_bits
    channels only (``post_quant_embed_pre``) and ``z`` from all C channels (``post_quant_embed``).
    The coarse s1 code alone must already describe the K-line; that is what lets the Kronos
    forecaster predict s1 first and s2 conditioned on it.
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
        arch = SimpleNamespace(**cfg)  # the checked constructor arguments, read by name
        # Upstream's attribute names, for code written against it.
        self.d_in = arch.d_in
        self.d_model = arch.d_model
        self.n_heads = arch.n_heads
        self.ff_dim = arch.ff_dim
        self.enc_layers = arch.n_enc_layers
        self.dec_layers = arch.n_dec_layers
        self.ffn_dropout_p = arch.ffn_dropout_p
        self.attn_dropout_p = arch.attn_dropout_p
        self.resid_dropout_p = arch.resid_dropout_p
        self.s1_bits = arch.s1_bits
        self.s2_bits = arch.s2_bits
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
        self.tokenizer = BSQuantizer(self.s1_bits, self.s2_bits, arch.beta, arch.gamma0, arch.gamma, arch.zeta,
                                     arch.group_size)
        self._fused = False

    #: What ``config.json`` holds, and its check (used by :func:`~kronos_mlflow.model.io.load_checkpoint`).
    CONFIG_SCHEMA = TOKENIZER_SCHEMA
    validate_config = staticmethod(validate_model_config)

    @staticmethod
    def fixed_buffers(config: dict[str, Any]) -> dict[str, tuple[torch.Tensor, str]]:
        """The buffers a checkpoint must hold with these values: the quantizer's powers of two."""
        out = {}
        arch = SimpleNamespace(**config)
        for name, n in (("tokenizer.bsq.basis", arch.s1_bits + arch.s2_bits),
                        ("tokenizer.bsq.group_basis", arch.group_size)):
            out[name] = (2 ** torch.arange(n - 1, -1, -1), f"the powers of two 2^{n - 1} .. 2^0")
        return out

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
