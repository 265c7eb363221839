"""Sampling the next token from logits, as upstream's forecasting loop does: divide by the
temperature, keep the top k (when ``top_k > 0``) or else the nucleus of probability ``top_p``
(when ``top_p < 1``), then draw one token per row with ``torch.multinomial``.

Every draw goes through torch's generator in the same calls upstream makes (one
``multinomial`` per sampled tensor, greedy ``top_k=1`` included), so the same seed gives the
same sample paths.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from ..errors import ConfigError


def top_k_top_p_filtering(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0,
                          filter_value: float = -float("inf"), min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Set the logits outside the top ``top_k`` (or, when ``top_k`` is 0, outside the smallest
    set whose probability reaches ``top_p``) to ``filter_value``, in place; returns ``logits``.

    Top-k keeps every logit tied with the k-th. The nucleus always keeps the most likely token
    and the one that crosses ``top_p``. At least ``min_tokens_to_keep`` tokens survive.
    """
    if top_k > 0:
        k = min(max(top_k, min_tokens_to_keep), logits.shape[-1])
        kth = torch.topk(logits, k)[0][..., -1:]
        logits[logits < kth] = filter_value
        return logits
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        beyond = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1) > top_p
        if min_tokens_to_keep > 1:
            beyond[..., :min_tokens_to_keep] = False
        drop = torch.zeros_like(beyond)
        drop[..., 1:] = beyond[..., :-1]  # the token that crosses top_p stays in
        logits[drop.scatter(-1, order, drop)] = filter_value
    return logits


def sample_from_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                       top_p: float | None = None, sample_logits: bool = True) -> torch.Tensor:
    """One token id per row of ``logits`` (N, V) -> (N, 1): drawn from the filtered softmax, or
    its most likely token when ``sample_logits`` is false. ``None`` means no filtering."""
    logits = logits / temperature
    top_k = 0 if top_k is None else top_k
    top_p = 1.0 if top_p is None else top_p
    if top_k > 0 or top_p < 1.0:
        logits = top_k_top_p_filtering(logits, top_k=top_k, top_p=top_p)
    probs = F.softmax(logits, dim=-1)
    if not sample_logits:
        return torch.topk(probs, k=1, dim=-1)[1]
    return torch.multinomial(probs, num_samples=1)


# The temperatures the loop samples with: below T_MIN, ``logits / T`` overflows float32 for
# large logits (1e-40 already gives inf, then NaN probabilities); above T_MAX every token is
# equally likely to float precision. ``top_k=1`` is the greedy forecast.
T_MIN, T_MAX = 1e-4, 1e6


def check_sampling(pred_len, T, top_k, top_p, sample_count) -> tuple[int, float, int, float, int]:
    """One-line :class:`ConfigError` for a sampling setting the loop cannot use; the settings as
    Python numbers ``(pred_len, T, top_k, top_p, sample_count)`` (numpy scalars converted, the
    same values)."""
    def whole(name, value, low):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ConfigError(f"{name} is {value!r}; expected a whole number of {low} or more")
        return int(value)

    pred_len, top_k, sample_count = whole("pred_len", pred_len, 1), whole("top_k", top_k, 0), \
        whole("sample_count", sample_count, 1)
    if isinstance(T, bool) or not isinstance(T, numbers.Real) or not math.isfinite(T) or not T_MIN <= T <= T_MAX:
        raise ConfigError(f"T is {T!r}; expected a temperature above 0, from {T_MIN:g} to {T_MAX:g} (1.0 samples the "
                          "model's own distribution; top_k=1 is the greedy forecast)")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
        raise ConfigError(f"top_p is {top_p!r}; expected a probability in (0, 1] (1 turns nucleus sampling off)")
    return pred_len, float(T), top_k, float(top_p), sample_count
