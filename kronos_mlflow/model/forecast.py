"""The forecasting loop: normalised lookback windows in, sampled token paths and their decoded
K-lines out (upstream's ``auto_regressive_inference``, with a key/value cache through
:class:`~kronos_mlflow.model.decoding.IncrementalDecoder` while the window has not rolled;
``use_cache=False`` is upstream's loop call for call): docs/predictor.md#forecasting-kronospredictor.
"""

from __future__ import annotations

import numbers
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn

from ..errors import ArgumentTypeError, ConfigError, DataError, MemoryBudgetError
from .decoding import CROSS_ROPE_CHOICES, IncrementalDecoder, s2_logits_from_context
from .kronos import Kronos
from .network import KronosTokenizer
from .sampling import check_sampling, sample_from_logits
from ..config.model_spec import TIME_FEATURE_SIZES

_MODEL_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class ForecastWarning(UserWarning):
    """A forecast that reads less than it was given, as upstream's does (a lookback longer than
    ``max_context``): the numbers are upstream's, the warning says what was left out."""


def _loaded(value, name: str, cls: str, example: str) -> None:
    """``value`` is a path or hub id where a loaded model is needed: say how to load it."""
    if isinstance(value, (str, bytes, os.PathLike)):
        text = os.fsdecode(value) if not isinstance(value, str) else value
        raise ArgumentTypeError(f"{name} is the path or hub id {text!r}, not a loaded model; load it first: "
                                f"{name} = {cls}.from_pretrained({text!r}) (from kronos_mlflow.model import {cls}), "
                                f"e.g. {cls}.from_pretrained({example!r})")


def check_models(model, tokenizer) -> None:
    """``model`` a loaded :class:`~kronos_mlflow.model.Kronos` and ``tokenizer`` a loaded
    :class:`~kronos_mlflow.model.KronosTokenizer`, in that order, with float32 weights (what the
    loop computes in); then :func:`check_pair`. One-line :class:`ArgumentTypeError` otherwise."""
    _loaded(model, "model", "Kronos", "NeoQuasar/Kronos-small")
    _loaded(tokenizer, "tokenizer", "KronosTokenizer", "NeoQuasar/Kronos-Tokenizer-base")
    if isinstance(model, KronosTokenizer) and isinstance(tokenizer, Kronos):
        raise ArgumentTypeError("the model and the tokenizer are swapped: model is a KronosTokenizer and tokenizer a "
                                "Kronos; pass the predictor first: KronosPredictor(model, tokenizer) with model a "
                                "Kronos and tokenizer a KronosTokenizer")
    for value, name, cls, example in ((model, "model", Kronos, "NeoQuasar/Kronos-small"),
                                      (tokenizer, "tokenizer", KronosTokenizer, "NeoQuasar/Kronos-Tokenizer-base")):
        if not isinstance(value, cls):
            inner = getattr(value, "_orig_mod", None) or getattr(value, "module", None)
            hint = (f"; pass the module inside the wrapper ({name}.{'_orig_mod' if hasattr(value, '_orig_mod') else 'module'})"
                    if isinstance(inner, cls) else f"; load one with {cls.__name__}.from_pretrained({example!r})")
            raise ArgumentTypeError(f"{name} is a {type(value).__module__}.{type(value).__qualname__}, not a "
                                    f"kronos_mlflow.model.{cls.__name__}{hint}")
        dtypes = sorted({str(t.dtype).replace("torch.", "") for t in value.parameters()} - {"float32"})
        if dtypes:
            raise ArgumentTypeError(f"{name} has {', '.join(dtypes)} weights; forecasting computes in float32, as "
                                    f"upstream: pass {name}.float()")
    check_pair(model, tokenizer)


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
    pred_len, T, top_k, top_p, sample_count = check_sampling(pred_len, T, top_k, top_p, sample_count)
    max_context = check_max_context(max_context)
    check_cross_rope(cross_rope)
    if cross_rope != "upstream" and model.training:
        raise ConfigError("cross_rope='positions' forecasts in eval mode only; leave eval_mode on")
    check_models(model, tokenizer)
    check_horizon(pred_len, max_context)
    check_arrays(tokenizer, model, x, x_stamp, y_stamp, pred_len)
    n, lookback = x.shape[:2]
    use_cache = bool(use_cache) and not model.training
    check_memory(model, tokenizer, n, lookback, pred_len, sample_count, max_context, use_cache)
    warn_long_lookback(lookback, max_context)
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
        if use_cache and lookback <= max_context:
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


def check_max_context(max_context) -> int:
    if isinstance(max_context, bool) or not isinstance(max_context, numbers.Integral) or max_context < 1:
        raise ConfigError(f"max_context is {max_context!r}; expected a whole number of 1 or more (512 for Kronos-small "
                          "and -base, 2048 for Kronos-mini)")
    return int(max_context)


def check_cross_rope(cross_rope) -> None:
    if not isinstance(cross_rope, str) or cross_rope not in CROSS_ROPE_CHOICES:
        raise ConfigError(f"cross_rope is {cross_rope!r}; expected one of {', '.join(CROSS_ROPE_CHOICES)}")


def check_horizon(pred_len: int, max_context: int) -> None:
    """The forecast is decoded from the last ``max_context`` tokens: a longer one cannot be had
    (upstream returns ``max_context`` rows, silently, or fails building its DataFrame)."""
    if pred_len > max_context:
        raise ConfigError(f"pred_len {pred_len} is beyond max_context {max_context}: a forecast is decoded from the "
                          f"last max_context tokens, so one call forecasts at most {max_context} bars; expected "
                          f"pred_len of at most {max_context} (forecast further from this forecast)")


def _is_tensor(value, name: str, shape: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"{name} is a {type(value).__name__}; expected a torch tensor {shape} "
                                "(torch.from_numpy(array).float())")


def check_arrays(tokenizer, model, x, x_stamp, y_stamp, pred_len: int) -> None:
    """The normalised window ``x`` (B, L, d_in) and the time features ``x_stamp`` (B, L, 5),
    ``y_stamp`` (B, pred_len, 5): tensors of the models' dtype and device, finite, whole time
    features inside the embedding tables (minute 0-59, hour 0-23, weekday 0-6, day 0-31,
    month 0-12)."""
    d_in = tokenizer.d_in
    _is_tensor(x, "x", f"(series, lookback, {d_in})")
    _is_tensor(x_stamp, "x_stamp", "(series, lookback, 5)")
    _is_tensor(y_stamp, "y_stamp", "(series, pred_len, 5)")
    weight = tokenizer.embed.weight
    where = model.embedding.fusion_proj.weight.device
    if where != weight.device:
        raise ArgumentTypeError(f"the model is on {where} and the tokenizer on {weight.device}; expected both on one "
                                "device (model.to(device), tokenizer.to(device))")
    if x.dim() != 3 or x.shape[0] < 1 or x.shape[1] < 1 or x.shape[2] != d_in:
        raise DataError(f"x of shape {tuple(x.shape)} is not lookback windows (series, lookback, {d_in}) with series, "
                        f"lookback >= 1: the tokenizer reads {d_in} features per bar")
    n, lookback = x.shape[:2]
    for name, stamp, length in (("x_stamp", x_stamp, lookback), ("y_stamp", y_stamp, pred_len)):
        want = (n, length, len(TIME_FEATURE_SIZES))
        if tuple(stamp.shape) != want:
            which = "the lookback's" if name == "x_stamp" else "the pred_len forecast bars'"
            raise DataError(f"{name} of shape {tuple(stamp.shape)} does not fit x {tuple(x.shape)} and pred_len "
                            f"{pred_len}; expected {want}: {which} minute, hour, weekday, day, month")
    for name, value in (("x", x), ("x_stamp", x_stamp), ("y_stamp", y_stamp)):
        if value.dtype != weight.dtype or value.device != weight.device:
            raise ArgumentTypeError(f"{name} is a {str(value.dtype).replace('torch.', '')} tensor on {value.device}; "
                                    f"expected {str(weight.dtype).replace('torch.', '')} on {weight.device}, as the "
                                    "models' weights")
    if not bool(torch.isfinite(x).all()):
        raise DataError("x holds NaN or infinite values; expected a finite normalised window")
    for name, stamp in (("x_stamp", x_stamp), ("y_stamp", y_stamp)):
        for i, (feature, size) in enumerate(TIME_FEATURE_SIZES.items()):
            column = stamp[..., i]
            bad = ~torch.isfinite(column) | (column != torch.round(column)) | (column < 0) | (column >= size)
            if bool(bad.any()):
                value = column[bad][0].item()
                raise DataError(f"{name} holds {feature} {value:g}; expected whole numbers from 0 to {size - 1} (the "
                                "columns minute, hour, weekday, day, month of calc_time_stamps)")


def forecast_bytes(model, tokenizer, series: int, lookback: int, pred_len: int, sample_count: int,
                   max_context: int, use_cache: bool = True) -> int:
    """About the most memory (bytes) a forecast holds at once, before anything is allocated:
    the token paths and time features, the key/value cache, and the largest of the
    transient activations (the tokenizer's encode of the lookback, the prefill, one cached
    step, a recomputed window with its logits, the tokenizer's decode of every path)."""
    f = 4  # float32
    rows, total = series * sample_count, lookback + pred_len
    window = min(total, max_context)
    d, ff, heads, layers = model.d_model, model.ff_dim, model.n_heads, model.n_layers
    vocab = 2 ** model.s1_bits + 2 ** model.s2_bits

    def block(batch: int, length: int, width: int, ffd: int, h: int) -> int:
        """One Transformer block's activations (residual, norms, q/k/v, attention, feed-forward)."""
        return f * batch * length * (10 * width + 3 * ffd) + f * batch * h * length * length

    held = rows * total * (2 * 8 + len(TIME_FEATURE_SIZES) * f)  # s1, s2 paths (int64), stamps
    transient = [block(series, lookback, tokenizer.d_model, tokenizer.ff_dim, tokenizer.n_heads),  # encode
                 block(rows, window, tokenizer.d_model, tokenizer.ff_dim, tokenizer.n_heads)
                 + 3 * f * rows * window * tokenizer.d_in]  # decode, and its output's copies
    cached = use_cache and lookback <= max_context
    if cached:
        held += 2 * f * (layers + 1) * d * (series * lookback + rows * (window - lookback))
        transient += [block(series, lookback, d, ff, heads),  # the prefill
                      f * rows * (10 * d + 3 * ff + (heads + 4) * window + vocab)]  # one step
    if not cached or total > max_context:  # steps that recompute the window (it rolled, or no cache)
        span = min(total - 1, max_context)
        transient.append(block(rows, span, d, ff, heads) + f * rows * span * (vocab + 4 * d))
    return held + max(transient)


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a forecast on ``device``: the GPU's free memory plus what torch's caching
    allocator holds unused; the machine's available memory for the CPU (and MPS, which shares
    it). None when it cannot be told."""
    try:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no estimate of free memory: nothing is refused on it
        return None


def _size(n: int) -> str:
    for unit, scale in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.1f} kB"


def check_memory(model, tokenizer, series: int, lookback: int, pred_len: int, sample_count: int, max_context: int,
                 use_cache: bool = True) -> None:
    """:class:`MemoryBudgetError` when :func:`forecast_bytes` is more than the device has free."""
    device = model.embedding.fusion_proj.weight.device
    need = forecast_bytes(model, tokenizer, series, lookback, pred_len, sample_count, max_context, use_cache)
    free = available_bytes(device)
    if free is None or need <= free:
        return

    def fits(count: int) -> bool:
        return forecast_bytes(model, tokenizer, series, lookback, pred_len, count, max_context, use_cache) <= free

    low, high = 0, sample_count  # the largest count that fits, by bisection (the estimate grows with it)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    advice = (f"a sample_count of {low} or less for these series, or fewer series per call" if low else
              "fewer series per call (one path of these series does not fit either)")
    raise MemoryBudgetError(
        f"sample_count {sample_count} for {series} series ({series * sample_count} paths of {lookback} + {pred_len} "
        f"bars) needs about {_size(need)} on {device}, and {_size(free)} is free; expected {advice}")


def warn_long_lookback(lookback: int, max_context: int) -> None:
    """A :class:`ForecastWarning` (shown once per message, at the caller's line) when the
    predictor reads only the last ``max_context`` bars of the lookback, as upstream's does."""
    if lookback <= max_context:
        return
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_MODEL_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"the lookback has {lookback} bars but max_context is {max_context}: the predictor reads only the "
                  f"last {max_context} bars' tokens (upstream's behaviour; all {lookback} are normalised and "
                  f"tokenized); pass at most {max_context} bars to silence this", ForecastWarning,
                  stacklevel=level)


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
