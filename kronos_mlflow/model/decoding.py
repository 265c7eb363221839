"""Incremental decoding of the predictor: a static key/value cache per attention layer (gpt-fast's
``KVCache`` shape), the dependency-aware layer's included: one prefill over the lookback, then one
position per step, equal to recomputing the window to float rounding while it has not rolled
(docs/predictor.md#the-keyvalue-cache; ``cross_rope``: docs/predictor.md#upstreams-behaviours-kept-fixed).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..errors import ConfigError

CROSS_ROPE_CHOICES = ("upstream", "positions")


class KVCache:
    """Keys and values of one attention layer (gpt-fast's static cache), in two parts: the
    lookback's, once per series ``(series, heads, lookback, head_dim)`` and shared by that
    series' ``repeats`` sample paths, and each path's own positions after it
    ``(series * repeats, heads, max_new, head_dim)``, filled one position per step.

    Sharing the lookback keeps memory and the bytes each step reads to about one copy per
    series instead of one per path (with 8 paths of 400 bars and 20 new ones: 1/6).
    """

    def __init__(self, series: int, repeats: int, n_heads: int, lookback: int, max_new: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.series, self.repeats = series, repeats
        shape = (series, n_heads, lookback, head_dim)
        self.k_prefix = torch.zeros(shape, dtype=dtype, device=device)
        self.v_prefix = torch.zeros_like(self.k_prefix)
        self.k_new = torch.zeros(series * repeats, n_heads, max_new, head_dim, dtype=dtype, device=device)
        self.v_new = torch.zeros_like(self.k_new)
        self.new = 0  # positions filled after the lookback

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """``start == 0``: the lookback's keys and values (series, H, lookback, hd); otherwise one
        new position for every path (rows, H, 1, hd), the next after those filled."""
        if start == 0:
            self.k_prefix.copy_(k)
            self.v_prefix.copy_(v)
            self.new = 0
            return
        self.k_new[:, :, self.new:self.new + 1] = k
        self.v_new[:, :, self.new:self.new + 1] = v
        self.new += 1

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Attention of one query per path ``(rows, H, 1, hd)`` over every cached position (all at
        or before it): a path's ``repeats`` queries meet their series' lookback keys in one
        matmul, then its own new keys; one softmax over both."""
        n, s, g = self.series, self.repeats, self.new
        rows, heads, _, dim = q.shape
        lookback = self.k_prefix.shape[2]
        q = q * (1.0 / math.sqrt(dim))
        per_series = q.view(n, s, heads, dim).transpose(1, 2)  # (n, H, s, hd): a series' paths as rows
        scores = per_series @ self.k_prefix.transpose(-1, -2)  # (n, H, s, lookback)
        if g:
            own = (q @ self.k_new[:, :, :g].transpose(-1, -2)).view(n, s, heads, g).transpose(1, 2)
            scores = torch.cat([scores, own], dim=-1)
        weights = torch.softmax(scores, dim=-1)
        out = weights[..., :lookback] @ self.v_prefix  # (n, H, s, hd)
        if g:
            own = weights[..., lookback:].transpose(1, 2).reshape(rows, heads, 1, g) @ self.v_new[:, :, :g]
            out = out + own.view(n, s, heads, dim).transpose(1, 2)
        return out.transpose(1, 2).reshape(rows, heads, 1, dim)


def cross_keys(model: nn.Module, h: torch.Tensor, start: int, cross_rope: str):
    """The dependency-aware layer's head-major keys and values of context rows ``h`` (B, n, d)
    standing at positions ``start ..``; rotated only with ``cross_rope="positions"``."""
    cross = model.dep_layer.cross_attn
    k = cross.split_heads(cross.k_proj(h))
    if cross_rope == "positions":
        k = cross.rotary.rotate_at(k, start)
    return k, cross.split_heads(cross.v_proj(h))


def s2_logits_last(model: nn.Module, keys, values, h_last: torch.Tensor, s1_ids: torch.Tensor, cross_rope: str,
                   q_pos: int | None = None) -> torch.Tensor:
    """s2 logits (B, V) of the window's last position given the sampled ``s1_ids`` (B, 1): the
    dependency-aware layer in eval mode with a one-position query over ``keys``/``values``
    (all at or before it; ``keys`` may be a :class:`KVCache`, ``values`` then None),
    ``RMSNorm(h_last + attention)``, then ``proj_s2``. Upstream computes the same row
    (``decode_s2(context, s1)[:, -1]``) along with every other position's."""
    dep = model.dep_layer
    cross = dep.cross_attn
    q = cross.split_heads(cross.q_proj(model.embedding.emb_s1(s1_ids)))
    if cross_rope == "positions":
        q = cross.rotary.rotate_at(q, keys.shape[-2] - 1 if q_pos is None else q_pos)
    attended = keys.attend(q) if isinstance(keys, KVCache) else cross.attend(q, keys, values, causal=False)
    return model.head.cond_forward(dep.norm(h_last + cross.merge_heads(attended)))[:, -1]


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

    ``prefill`` takes the lookback tokens of each of ``series`` series once (its ``repeats``
    sample paths share them); ``step`` one new position for every path (``series * repeats``
    rows, a series' paths on consecutive rows), at most ``max_new`` times; ``s2_logits`` the s2
    scores of the newest position. The model must be in eval mode (no dropout, and the
    cross-attention's eval behaviour). Nothing is attached to the model.
    """

    def __init__(self, model: nn.Module, series: int, repeats: int, lookback: int, max_new: int,
                 cross_rope: str = "upstream"):
        if cross_rope not in CROSS_ROPE_CHOICES:
            raise ConfigError(f"cross_rope is {cross_rope!r}; expected one of {', '.join(CROSS_ROPE_CHOICES)}")
        weight = model.embedding.fusion_proj.weight
        self.model = model
        self.cross_rope = cross_rope
        self.repeats = repeats
        self.length = 0  # positions filled

        def cache(attn: nn.Module) -> KVCache:
            return KVCache(series, repeats, attn.n_heads, lookback, max_new, attn.head_dim, weight.dtype, weight.device)

        self.caches = [cache(b.self_attn) for b in model.transformer]
        self.cross_cache = cache(model.dep_layer.cross_attn)

    def _block(self, block: nn.Module, cache: KVCache, x: torch.Tensor, start: int) -> torch.Tensor:
        attn = block.self_attn
        y = block.norm1(x)
        q, k, v = (attn.split_heads(proj(y)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        if start == 0:  # the prefill: the window's own causal attention, then keep its keys
            q, k = attn.rotary(q, k)
            out = attn.attend(q, k, v, causal=True)
        else:  # one query, the newest position: every cached key is at or before it
            q, k = attn.rotary.rotate_at(q, start), attn.rotary.rotate_at(k, start)
        cache.update(start, k, v)
        if start:
            out = cache.attend(q)
        x = x + attn.merge_heads(out)
        return x + block.ffn(block.norm2(x))

    def _run(self, s1_ids, s2_ids, stamp) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.length
        x = self.model.embed(s1_ids, s2_ids, stamp)
        for block, cache in zip(self.model.transformer, self.caches):
            x = self._block(block, cache, x, start)
        h = self.model.norm(x)
        self.cross_cache.update(start, *cross_keys(self.model, h, start, self.cross_rope))
        self.length = start + s1_ids.shape[1]
        h_last = h[:, -1:]
        s1_logits = self.model.head(h_last)[:, -1]
        if start == 0 and self.repeats > 1:
            s1_logits, h_last = (t.repeat_interleave(self.repeats, 0) for t in (s1_logits, h_last))
        return s1_logits, h_last

    def prefill(self, s1_ids, s2_ids, stamp=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the lookback (series, lookback) from position 0; returns the last position's s1
        logits (rows, V) and context row (rows, 1, d), each series' repeated for its paths."""
        self.length = 0
        return self._run(s1_ids, s2_ids, stamp)

    def step(self, s1_ids, s2_ids, stamp=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one new position (rows, 1) for every path; returns its s1 logits and context row."""
        return self._run(s1_ids, s2_ids, stamp)

    def s2_logits(self, h_last: torch.Tensor, s1_ids: torch.Tensor) -> torch.Tensor:
        """s2 logits (rows, V) of the newest position given its sampled s1 ids (rows, 1)."""
        return s2_logits_last(self.model, self.cross_cache, None, h_last, s1_ids, self.cross_rope,
                              q_pos=self.length - 1)
