"""The forecasting loop: normalised lookback windows in, sampled token paths and their decoded
K-lines out (upstream's ``auto_regressive_inference``, with a key/value cache).

Per series: clip the normalised window, tokenize it (``encode(half=True)``), then for each of
``pred_len`` steps score the next s1 from the last position, sample it, score s2 given it,
sample it, append the pair; ``sample_count`` paths per series run side by side in one batch.
At the end the tokenizer decodes the last ``<= max_context`` tokens of every path.

Upstream recomputes the whole window at every step. Here, while the window has not rolled
(``lookback + step <= max_context``), one prefill over the lookback and one position per step
go through :class:`~kronos_mlflow.model.decoding.IncrementalDecoder`; once it rolls (every
position moves), each step recomputes the window exactly as upstream. ``use_cache=False``
recomputes every step, upstream's loop call for call. The sampling draws from torch's
generator in upstream's order, so one seed gives one set of paths either way (to float
rounding of the logits), and greedy ``top_k=1`` paths are the same.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from ..errors import ConfigError
from .decoding import CROSS_ROPE_CHOICES, IncrementalDecoder, s2_logits_from_context
from .sampling import check_sampling, sample_from_logits


def check_pair(model: nn.Module, tokenizer: nn.Module) -> None:
    """The predictor reads the tokenizer's tokens: their s1/s2 bits must match (one-line error)."""
    for name in ("s1_bits", "s2_bits"):
        mine, theirs = getattr(model, name, None), getattr(tokenizer, name, None)
        if mine != theirs:
            raise ConfigError(
                f"the tokenizer has {name} {theirs} but the predictor {name} {mine}; pair a predictor with the "
                "tokenizer it was trained on (Kronos-small/-base: Kronos-Tokenizer-base, Kronos-mini: "
                "Kronos-Tokenizer-2k)")


def generate_tokens(tokenizer, model, x, x_stamp, y_stamp, max_context, pred_len, clip=5, T=1.0, top_k=0,
                    top_p=0.99, sample_count=5, verbose=False, *, use_cache=True, cross_rope="upstream"):
    """Token paths ``(s1, s2)``, each (B * sample_count, lookback + pred_len) int64, the
    sample paths of a series on consecutive rows: the lookback's tokens then the generated ones.

    ``x`` (B, lookback, d_in) is the normalised window, ``x_stamp`` (B, lookback, 5) and
    ``y_stamp`` (B, pred_len, 5) the time features (minute, hour, weekday, day, month). The
    model's mode is used as it is (the predictor puts it in eval mode); the cache is used only
    in eval mode, and only when ``use_cache``.
    """
    check_sampling(pred_len, T, top_k, top_p, sample_count)
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
        raise ConfigError(f"max_context is {max_context!r}; expected a whole number of 1 or more (512 for Kronos-small)")
    if cross_rope not in CROSS_ROPE_CHOICES:
        raise ConfigError(f"cross_rope is {cross_rope!r}; expected one of {', '.join(CROSS_ROPE_CHOICES)}")
    if cross_rope != "upstream" and model.training:
        raise ConfigError("cross_rope='positions' forecasts in eval mode only; leave eval_mode on")
    check_pair(model, tokenizer)
    with torch.inference_mode():
        x = torch.clip(x, -clip, clip)
        n, lookback = x.shape[:2]
        rows, total = n * sample_count, lookback + pred_len
        s1_hist, s2_hist = tokenizer.encode(x, half=True)  # once per series: its paths share it
        s1 = s1_hist.new_zeros(rows, total)
        s2 = s2_hist.new_zeros(rows, total)
        s1[:, :lookback] = s1_hist.repeat_interleave(sample_count, 0)
        s2[:, :lookback] = s2_hist.repeat_interleave(sample_count, 0)
        stamps = torch.cat([x_stamp, y_stamp], dim=1).repeat_interleave(sample_count, 0)
        decoder = None
        if use_cache and not model.training and lookback <= max_context:
            decoder = IncrementalDecoder(model, n, sample_count, lookback, min(total, max_context) - lookback, cross_rope)
        steps = range(pred_len)
        if verbose:
            from tqdm import trange

            steps = trange(pred_len)
        for i in steps:
            cur = lookback + i  # tokens known; the window is the last <= max_context of them
            if decoder is not None and cur <= max_context:
                if i == 0:
                    s1_logits, h_last = decoder.prefill(s1_hist, s2_hist, x_stamp)
                else:
                    s1_logits, h_last = decoder.step(s1[:, cur - 1:cur], s2[:, cur - 1:cur], stamps[:, cur - 1:cur])
                next_s1 = sample_from_logits(s1_logits, temperature=T, top_k=top_k, top_p=top_p)
                s2_logits = decoder.s2_logits(h_last, next_s1)
            else:
                decoder = None  # the window rolls from here on: positions move, the cache is stale
                start = max(0, cur - max_context)
                s1_logits, context = model.decode_s1(s1[:, start:cur], s2[:, start:cur], stamps[:, start:cur])
                next_s1 = sample_from_logits(s1_logits[:, -1], temperature=T, top_k=top_k, top_p=top_p)
                s2_logits = s2_logits_from_context(model, context, next_s1, cross_rope)
            next_s2 = sample_from_logits(s2_logits, temperature=T, top_k=top_k, top_p=top_p)
            s1[:, cur] = next_s1[:, 0]
            s2[:, cur] = next_s2[:, 0]
    return s1, s2


def decode_paths(tokenizer, s1: torch.Tensor, s2: torch.Tensor, max_context: int, sample_count: int) -> torch.Tensor:
    """The tokenizer's reconstruction of the last ``<= max_context`` tokens of every path, as
    (B, sample_count, window, d_in), in normalised units."""
    start = max(0, s1.shape[1] - max_context)
    with torch.inference_mode():
        z = tokenizer.decode([s1[:, start:].contiguous(), s2[:, start:].contiguous()], half=True)
    return z.reshape(-1, sample_count, z.shape[1], z.shape[2])


def auto_regressive_inference(tokenizer, model, x, x_stamp, y_stamp, max_context, pred_len, clip=5, T=1.0,
                              top_k=0, top_p=0.99, sample_count=5, verbose=False, *, use_cache=True,
                              cross_rope="upstream"):
    """Upstream's function of this name: the mean over sample paths, in normalised space, of the
    decoded last ``<= max_context`` positions, a numpy array (B, window, d_in); the forecast is
    its last ``pred_len`` rows. See :func:`generate_tokens` for the arguments."""
    s1, s2 = generate_tokens(tokenizer, model, x, x_stamp, y_stamp, max_context, pred_len, clip, T, top_k, top_p,
                             sample_count, verbose, use_cache=use_cache, cross_rope=cross_rope)
    z = decode_paths(tokenizer, s1, s2, max_context, sample_count)
    return np.mean(z.cpu().numpy(), axis=1)
