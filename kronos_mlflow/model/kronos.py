"""The Kronos predictor (:class:`Kronos`): an autoregressive Transformer over the tokenizer's two-part
tokens, computing what upstream's ``Kronos`` computes with its module names and construction order
(a published checkpoint's exact tensors; one seed, the same fresh weights). The contract:
``/work/shared/spec/kronos-predictor.md``; the user's page: docs/predictor.md.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from .io import HubCheckpoint
from .network import MultiHeadAttentionWithRoPE, RMSNorm, TransformerBlock
from ..config.model_spec import (
    DEP_LAYER_HEADS, PREDICTOR_CONFIGS, PREDICTOR_SCHEMA, TIME_FEATURE_SIZES, validate_predictor_config,
)


class HierarchicalEmbedding(nn.Module):
    """``fusion_proj(cat(emb_s1(s1) * sqrt(d), emb_s2(s2) * sqrt(d)))``."""

    def __init__(self, s1_bits: int, s2_bits: int, d_model: int = 256):
        super().__init__()
        self.s1_bits = s1_bits
        self.s2_bits = s2_bits
        self.d_model = d_model
        self.emb_s1 = nn.Embedding(2 ** s1_bits, d_model)
        self.emb_s2 = nn.Embedding(2 ** s2_bits, d_model)
        self.fusion_proj = nn.Linear(2 * d_model, d_model)
        nn.init.normal_(self.emb_s1.weight, mean=0, std=d_model ** -0.5)
        nn.init.normal_(self.emb_s2.weight, mean=0, std=d_model ** -0.5)

    def split_token(self, token_ids: torch.Tensor, s2_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A composite id as upstream packs it: s1 in the high bits, s2 in the low ``s2_bits``.

        (The tokenizer's own full index, ``encode(x)``, is the other way round: s1 low.)"""
        ids = token_ids.long()
        return ids >> s2_bits, ids & ((1 << s2_bits) - 1)

    def forward(self, token_ids) -> torch.Tensor:
        """``token_ids``: the pair ``[s1_ids, s2_ids]`` (B, T) each, or composite ids (B, T)."""
        if isinstance(token_ids, (list, tuple)):
            s1_ids, s2_ids = token_ids
        else:
            s1_ids, s2_ids = self.split_token(token_ids, self.s2_bits)
        scale = math.sqrt(self.d_model)
        return self.fusion_proj(torch.cat([self.emb_s1(s1_ids) * scale, self.emb_s2(s2_ids) * scale], dim=-1))


class FixedEmbedding(nn.Module):
    """A frozen sinusoidal table (``learn_te`` false), under upstream's name ``emb.weight``.

    As upstream, :meth:`Kronos._init_weights` later re-initialises it like any embedding (it is
    an ``nn.Embedding`` inside), so a fresh model's table is random, not sinusoidal; it stays
    frozen (``requires_grad`` false). Every published model has ``learn_te`` true."""

    def __init__(self, c_in: int, d_model: int):
        super().__init__()
        position = torch.arange(c_in, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
        table = torch.zeros(c_in, d_model)
        table[:, 0::2] = torch.sin(position * freq)
        table[:, 1::2] = torch.cos(position * freq)
        self.emb = nn.Embedding(c_in, d_model)
        self.emb.weight = nn.Parameter(table, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.emb(x).detach()


class TemporalEmbedding(nn.Module):
    """Sum of the minute, hour, weekday, day and month tables; ``x`` (B, T, 5) in that column order."""

    def __init__(self, d_model: int, learn_pe: bool):
        super().__init__()
        table = nn.Embedding if learn_pe else FixedEmbedding
        for name, size in TIME_FEATURE_SIZES.items():
            self.add_module(f"{name}_embed", table(size, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.long()
        minute, hour, weekday, day, month = (
            getattr(self, f"{name}_embed")(x[:, :, i]) for i, name in enumerate(TIME_FEATURE_SIZES))
        return hour + weekday + day + month + minute  # upstream's order of the float additions


class MultiHeadCrossAttentionWithRoPE(MultiHeadAttentionWithRoPE):
    """Attention of ``query`` positions over ``key``/``value`` positions, rotary on both.

    Two behaviours of upstream are kept, because the published checkpoints were trained and are
    scored with them (docs/predictor.md says what each changes):

    - causal only in training mode (``is_causal=self.training``): in eval mode every position
      attends to later ones as well;
    - the rotary table is sized by the *query's* length (:meth:`RotaryPositionalEmbedding.forward`):
      with a one-position query (forecasting) every key gets position 0's rotation, the identity.

    ``causal`` overrides the first: ``True`` makes eval mode causal too (a validation loss that
    does not read the targets), ``False`` never causal; ``None`` (the default) is upstream's.
    """

    causal: bool | None = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(key))
        v = self.split_heads(self.v_proj(value))
        q, k = self.rotary(q, k)
        causal = self.training if self.causal is None else self.causal
        return self.merge_heads(self.attend(q, k, v, causal=causal, key_padding_mask=key_padding_mask))


class DependencyAwareLayer(nn.Module):
    """``norm(h + cross_attn(query=s1 embedding, key=h, value=h))``: s2 conditioned on s1."""

    def __init__(self, d_model: int, n_heads: int = DEP_LAYER_HEADS, attn_dropout_p: float = 0.0,
                 resid_dropout: float = 0.0):
        super().__init__()
        self.cross_attn = MultiHeadCrossAttentionWithRoPE(d_model, n_heads, attn_dropout_p, resid_dropout)
        self.norm = RMSNorm(d_model)

    def forward(self, hidden_states: torch.Tensor, sibling_embed: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        attn_out = self.cross_attn(sibling_embed, hidden_states, hidden_states, key_padding_mask=key_padding_mask)
        return self.norm(hidden_states + attn_out)


class DualHead(nn.Module):
    """``proj_s1`` scores s1 from the context; ``proj_s2`` scores s2 from the dependency layer."""

    def __init__(self, s1_bits: int, s2_bits: int, d_model: int):
        super().__init__()
        self.vocab_s1 = 2 ** s1_bits
        self.vocab_s2 = 2 ** s2_bits
        self.proj_s1 = nn.Linear(d_model, self.vocab_s1)
        self.proj_s2 = nn.Linear(d_model, self.vocab_s2)

    def compute_loss(self, s1_logits, s2_logits, s1_targets, s2_targets, padding_mask=None):
        """``((CE_s1 + CE_s2) / 2, CE_s1, CE_s2)``, each a mean over the positions where
        ``padding_mask`` is 0 (all positions without one)."""
        if padding_mask is not None:
            valid = padding_mask == 0
            s1_logits, s2_logits = s1_logits[valid], s2_logits[valid]
            s1_targets, s2_targets = s1_targets[valid], s2_targets[valid]
        ce_s1 = F.cross_entropy(s1_logits.reshape(-1, self.vocab_s1), s1_targets.reshape(-1))
        ce_s2 = F.cross_entropy(s2_logits.reshape(-1, self.vocab_s2), s2_targets.reshape(-1))
        return (ce_s1 + ce_s2) / 2, ce_s1, ce_s2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_s1(x)

    def cond_forward(self, x2: torch.Tensor) -> torch.Tensor:
        return self.proj_s2(x2)


class Kronos(HubCheckpoint, nn.Module):
    """The Kronos predictor, upstream's constructor: all 11 arguments required (``config.json``).

    Checked up front by :func:`~kronos_mlflow.config.model_spec.validate_predictor_config`
    (``ConfigError`` on a bad value); ``self.config`` holds them, normalised, and is what
    ``save_pretrained`` writes. ``Kronos.published("Kronos-small")`` builds a fresh model of a
    published architecture; ``Kronos.from_pretrained(dir_or_hub_id)`` loads one strictly.

    In one breath: each step's token is the pair (s1, s2) of the tokenizer's coarse and fine
    halves. ``embedding`` looks both up (scaled by sqrt(d_model)) and fuses them; ``time_emb`` adds
    learnt minute/hour/weekday/day/month tables; token dropout; ``n_layers`` causal pre-norm blocks
    (the tokenizer's :class:`~kronos_mlflow.model.network.TransformerBlock`); a final RMSNorm gives
    the context ``h``. ``head.proj_s1(h)`` scores the next s1. The next s2 is scored *given* an s1:
    the dependency-aware layer lets the s1 token's (unscaled) embedding attend over ``h`` and
    ``head.proj_s2`` reads ``RMSNorm(h + attention)``.
    """

    CONFIG_SCHEMA = PREDICTOR_SCHEMA
    validate_config = staticmethod(validate_predictor_config)
    hub_example = "NeoQuasar/Kronos-small"  # what a missing checkpoint's message suggests

    def __init__(self, s1_bits, s2_bits, n_layers, d_model, n_heads, ff_dim, ffn_dropout_p, attn_dropout_p,
                 resid_dropout_p, token_dropout_p, learn_te):
        super().__init__()
        cfg = validate_predictor_config({
            "s1_bits": s1_bits, "s2_bits": s2_bits, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads,
            "ff_dim": ff_dim, "ffn_dropout_p": ffn_dropout_p, "attn_dropout_p": attn_dropout_p,
            "resid_dropout_p": resid_dropout_p, "token_dropout_p": token_dropout_p, "learn_te": learn_te,
        })
        self.config: dict[str, Any] = dict(cfg)
        for key, value in cfg.items():  # upstream's attribute names, for code written against it
            setattr(self, key, value)
        self.s1_vocab_size = 2 ** self.s1_bits
        # Registration order is upstream's: the fresh weights of one seed are the same tensors.
        self.token_drop = nn.Dropout(self.token_dropout_p)
        self.embedding = HierarchicalEmbedding(self.s1_bits, self.s2_bits, self.d_model)
        self.time_emb = TemporalEmbedding(self.d_model, self.learn_te)
        self.transformer = nn.ModuleList([
            TransformerBlock(self.d_model, self.n_heads, self.ff_dim, self.ffn_dropout_p, self.attn_dropout_p,
                             self.resid_dropout_p)
            for _ in range(self.n_layers)
        ])
        self.norm = RMSNorm(self.d_model)
        self.dep_layer = DependencyAwareLayer(self.d_model)
        self.head = DualHead(self.s1_bits, self.s2_bits, self.d_model)
        self.apply(self._init_weights)

    @classmethod
    def published(cls, name: str = "Kronos-small") -> "Kronos":
        """A freshly initialised model with a published architecture (``Kronos-mini``, ``-small``, ``-base``)."""
        if name not in PREDICTOR_CONFIGS:
            raise ConfigError(f"no published predictor {name!r}; expected one of {', '.join(PREDICTOR_CONFIGS)}")
        return cls(**PREDICTOR_CONFIGS[name])

    @staticmethod
    def fixed_buffers(config: dict[str, Any]) -> dict[str, tuple[torch.Tensor, str]]:
        """No buffer of the predictor has prescribed values (``rotary.inv_freq`` loads as saved)."""
        return {}

    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-normal linear weights, zero biases, N(0, d^-1/2) embeddings, unit RMSNorms."""
        if isinstance(module, nn.Linear):
            nn.init.xavier_normal_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0, std=self.d_model ** -0.5)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    # ---- computation ----

    def embed(self, s1_ids: torch.Tensor, s2_ids: torch.Tensor, stamp: torch.Tensor | None = None) -> torch.Tensor:
        """Token embedding plus the time embedding (when ``stamp``, (B, T, 5), is given), then token dropout."""
        x = self.embedding([s1_ids, s2_ids])
        if stamp is not None:
            x = x + self.time_emb(stamp)
        return self.token_drop(x)

    def context(self, s1_ids, s2_ids, stamp=None, padding_mask=None) -> torch.Tensor:
        """The normed output ``h`` (B, T, d_model) of the causal blocks: what both heads read."""
        x = self.embed(s1_ids, s2_ids, stamp)
        for layer in self.transformer:
            x = layer(x, key_padding_mask=padding_mask)
        return self.norm(x)

    def forward(self, s1_ids, s2_ids, stamp=None, padding_mask=None, use_teacher_forcing=False, s1_targets=None):
        """``(s1_logits, s2_logits)``, each (B, T, vocab), for next-token ids (B, T).

        The s2 branch is conditioned on ``s1_targets`` with ``use_teacher_forcing``; without it
        (how upstream trains and validates) on s1 ids *sampled* from ``softmax(s1_logits)``, so
        it draws from torch's generator and the loss is stochastic, as upstream's.
        ``padding_mask`` (B, T), nonzero at padded positions, keeps attention off them.
        """
        x = self.context(s1_ids, s2_ids, stamp, padding_mask)
        s1_logits = self.head(x)
        if use_teacher_forcing:
            if s1_targets is None:
                raise ValueError("use_teacher_forcing=True needs s1_targets, the s1 ids the s2 head is conditioned on")
            sibling_embed = self.embedding.emb_s1(s1_targets)
        else:
            probs = F.softmax(s1_logits.detach(), dim=-1)
            sampled = torch.multinomial(probs.view(-1, self.s1_vocab_size), 1).view(s1_ids.shape)
            sibling_embed = self.embedding.emb_s1(sampled)
        x2 = self.dep_layer(x, sibling_embed, key_padding_mask=padding_mask)
        return s1_logits, self.head.cond_forward(x2)

    def decode_s1(self, s1_ids, s2_ids, stamp=None, padding_mask=None):
        """``(s1_logits, context)``: the s1 scores and the context ``h`` that :meth:`decode_s2` reads."""
        x = self.context(s1_ids, s2_ids, stamp, padding_mask)
        return self.head(x), x

    def decode_s2(self, context, s1_ids, padding_mask=None):
        """s2 logits given the context from :meth:`decode_s1` and the s1 ids to condition on.

        With one s1 id per series (forecasting), upstream's broadcasting is kept: the attention
        output is added to every context position, so only the last position's logits mean
        anything (the forecasting loop reads ``[:, -1]``)."""
        x2 = self.dep_layer(context, self.embedding.emb_s1(s1_ids), key_padding_mask=padding_mask)
        return self.head.cond_forward(x2)
