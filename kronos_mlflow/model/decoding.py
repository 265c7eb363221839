"""Incremental decoding of the predictor: a static key/value cache per attention layer.

Upstream's forecasting loop runs the whole window through every layer for each new bar. The
blocks are causal, so a position's keys and values never change once computed: gpt-fast's
shape (pytorch-labs/gpt-fast, ``KVCache.update(input_pos, k, v)``) keeps them. One *prefill*
runs the lookback window (for each series once, its sample paths then share the result), and
each *step* runs one new position per sample path against the cached keys.

The dependency-aware layer's keys and values are projections of the context ``h`` at each
position, so they are cached too; only its query (the sampled s1 token) is new at each step.

What the cache computes equals what recomputing the window computes, to float rounding: the
same projections, the rotary rows a window of that length uses (:meth:`rotate_at`), attention
over the same keys. It holds while positions do not move, that is while the window has not
rolled (``lookback + step <= max_context``); the forecasting loop then recomputes, as upstream.

``cross_rope`` says how the dependency-aware layer rotates at inference:

- ``"upstream"`` (default): as upstream's forecasting does, no rotation at all (its rotary table
  is sized by the one-position query, so every key gets position 0's rotation, the identity);
- ``"positions"``: the query at the last position, each key at its own position, the rotation
  training used.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ConfigError

CROSS_ROPE_CHOICES = ("upstream", "positions")


class KVCache:
    """Keys and values of one attention layer, ``(rows, heads, max_len, head_dim)`` each, written
    position by position (gpt-fast's static cache). ``update`` returns the filled prefix."""

    def __init__(self, rows: int, n_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        self.k = torch.zeros(rows, n_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor, repeats: int = 1):
        """Write positions ``start .. start+n-1``; with ``repeats`` each of the ``rows / repeats``
        given rows fills ``repeats`` consecutive cache rows (a series and its sample paths).
        Returns the keys and values of positions ``0 .. start+n-1`` (views)."""
        end = start + k.shape[-2]
        for cache, new in ((self.k, k), (self.v, v)):
            if repeats == 1:
                cache[:, :, start:end] = new
            else:
                cache.view(-1, repeats, *cache.shape[1:])[:, :, :, start:end] = new[:, None]
        return self.k[:, :, :end], self.v[:, :, :end]


def cross_keys(model: nn.Module, h: torch.Tensor, start: int, cross_rope: str):
    """The dependency-aware layer's head-major keys and values of context rows ``h`` (B, n, d)
    standing at positions ``start ..``; rotated only with ``cross_rope="positions"``."""
    cross = model.dep_layer.cross_attn
    k = cross.split_heads(cross.k_proj(h))
    if cross_rope == "positions":
        k = cross.rotary.rotate_at(k, start)
    return k, cross.split_heads(cross.v_proj(h))


def s2_logits_last(model: nn.Module, keys: torch.Tensor, values: torch.Tensor, h_last: torch.Tensor,
                   s1_ids: torch.Tensor, cross_rope: str) -> torch.Tensor:
    """s2 logits (B, V) of the window's last position given the sampled ``s1_ids`` (B, 1): the
    dependency-aware layer in eval mode with a one-position query over ``keys``/``values``
    (all at or before it), ``RMSNorm(h_last + attention)``, then ``proj_s2``. Upstream computes
    the same row (``decode_s2(context, s1)[:, -1]``) along with every other position's."""
    dep = model.dep_layer
    cross = dep.cross_attn
    q = cross.split_heads(cross.q_proj(model.embedding.emb_s1(s1_ids)))
    if cross_rope == "positions":
        q = cross.rotary.rotate_at(q, keys.shape[-2] - 1)
    out = cross.merge_heads(cross.attend(q, keys, values, causal=False))
    return model.head.cond_forward(dep.norm(h_last + out))[:, -1]


def s2_logits_from_context(model: nn.Module, context: torch.Tensor, s1_ids: torch.Tensor, cross_rope: str):
    """s2 logits (B, V) of the last position of a recomputed window's ``context`` (B, L, d).
    ``"upstream"``: exactly upstream's call, ``decode_s2(context, s1_ids)[:, -1]`` (in whatever
    mode the model is in); ``"positions"``: :func:`s2_logits_last` over the window's keys."""
    if cross_rope == "upstream":
        return model.decode_s2(context, s1_ids)[:, -1]
    keys, values = cross_keys(model, context, 0, cross_rope)
    return s2_logits_last(model, keys, values, context[:, -1:], s1_ids, cross_rope)


class IncrementalDecoder:
    """The predictor's s1 transformer and dependency-aware layer with a :class:`KVCache` each.

    ``prefill`` takes the lookback tokens of each series once (``repeats`` = sample paths per
    series, which share them); ``step`` one new position for every path; ``s2_logits`` the s2
    scores of the last position. The model must be in eval mode (no dropout, and the
    cross-attention's eval behaviour). Nothing is attached to the model.
    """

    def __init__(self, model: nn.Module, rows: int, max_len: int, cross_rope: str = "upstream"):
        if cross_rope not in CROSS_ROPE_CHOICES:
            raise ConfigError(f"cross_rope is {cross_rope!r}; expected one of {', '.join(CROSS_ROPE_CHOICES)}")
        weight = model.embedding.fusion_proj.weight
        self.model = model
        self.cross_rope = cross_rope
        self.length = 0  # positions filled
        self.caches = [KVCache(rows, b.self_attn.n_heads, max_len, b.self_attn.head_dim, weight.dtype, weight.device)
                       for b in model.transformer]
        cross = model.dep_layer.cross_attn
        self.cross_cache = KVCache(rows, cross.n_heads, max_len, cross.head_dim, weight.dtype, weight.device)

    def _block(self, block: nn.Module, cache: KVCache, x: torch.Tensor, start: int, repeats: int) -> torch.Tensor:
        attn = block.self_attn
        y = block.norm1(x)
        q, k, v = (attn.split_heads(proj(y)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        if start == 0:  # the prefill: the window's own causal attention, then keep its keys
            q, k = attn.rotary(q, k)
            out = attn.attend(q, k, v, causal=True)
            cache.update(0, k, v, repeats)
        else:  # one query, the newest position: every cached key is at or before it
            q, k = attn.rotary.rotate_at(q, start), attn.rotary.rotate_at(k, start)
            out = attn.attend(q, *cache.update(start, k, v), causal=False)
        x = x + attn.merge_heads(out)
        return x + block.ffn(block.norm2(x))

    def _run(self, s1_ids, s2_ids, stamp, repeats: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.length
        x = self.model.embed(s1_ids, s2_ids, stamp)
        for block, cache in zip(self.model.transformer, self.caches):
            x = self._block(block, cache, x, start, repeats)
        h = self.model.norm(x)
        self.cross_cache.update(start, *cross_keys(self.model, h, start, self.cross_rope), repeats)
        h_last = h[:, -1:]
        self.length = start + s1_ids.shape[1]
        s1_logits = self.model.head(h_last)[:, -1]
        if repeats > 1:
            s1_logits, h_last = s1_logits.repeat_interleave(repeats, 0), h_last.repeat_interleave(repeats, 0)
        return s1_logits, h_last

    def prefill(self, s1_ids, s2_ids, stamp=None, repeats: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the window (B, L) from position 0; returns the last position's s1 logits
        (B * repeats, V) and context row (B * repeats, 1, d), each series' repeated."""
        self.length = 0
        return self._run(s1_ids, s2_ids, stamp, repeats)

    def step(self, s1_ids, s2_ids, stamp=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one new position (rows, 1) for every row; returns its s1 logits and context row."""
        return self._run(s1_ids, s2_ids, stamp, 1)

    def s2_logits(self, h_last: torch.Tensor, s1_ids: torch.Tensor) -> torch.Tensor:
        """s2 logits (rows, V) of the newest position given its sampled s1 ids (rows, 1)."""
        keys = self.cross_cache.k[:, :, : self.length]
        values = self.cross_cache.v[:, :, : self.length]
        return s2_logits_last(self.model, keys, values, h_last, s1_ids, self.cross_rope)
