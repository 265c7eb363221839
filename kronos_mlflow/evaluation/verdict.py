"""Is a model better than its base on the same windows, by more than noise? Stage-neutral: everything
here takes per-window losses (two arrays that line up window for window) and metric dicts, never a
model, so any stage that can say what one window's loss is reuses it (docs/verdict.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..tracking.keys import BASE_PREFIX, TEST_PREFIX, VERDICT_BASE_TAG, VERDICT_TAG

N_RESAMPLES = 1000
BOOTSTRAP_SEED = 20240601
LEVEL = 0.95
_CHUNK_VALUES = 4_000_000  # indices drawn at once (32 MB): resamples x windows


def relative_change(test_losses, base_losses) -> float:
    """``(mean(test) - mean(base)) / mean(base)``; NaN when the base's mean is not positive."""
    t, b = float(np.mean(test_losses)), float(np.mean(base_losses))
    return (t - b) / b if b > 0 else float("nan")


def paired_bootstrap(test_losses, base_losses, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                     level: float = LEVEL) -> tuple[float, float, float]:
    """``(change, ci_low, ci_high)`` of the relative change of the mean loss, ``(test - base) / base``,
    from ``n_resamples`` paired resamples of the windows drawn with a fixed seed: the same losses
    always give the same interval. Paired: each resample draws windows, and both models' losses of
    those windows, so what the windows have in common cancels out of the change (docs/verdict.md#the-interval).

    The interval is the percentile interval of the resampled changes. Raises ValueError when
    the two arrays differ in length or are empty.
    """
    t = np.asarray(test_losses, dtype=np.float64).reshape(-1)
    b = np.asarray(base_losses, dtype=np.float64).reshape(-1)
    if t.shape != b.shape:
        raise ValueError(f"{t.size} test losses but {b.size} base losses: the windows must pair up")
    if t.size == 0:
        raise ValueError("no windows to resample")
    change = relative_change(t, b)
    n = t.size
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_resamples, _CHUNK_VALUES // n))
    changes = np.empty(n_resamples, dtype=np.float64)
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        idx = rng.integers(0, n, size=(size, n))
        tm, bm = t[idx].mean(axis=1), b[idx].mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            changes[start:start + size] = np.where(bm > 0, (tm - bm) / bm, np.nan)
    return change, *_interval(change, changes, level)


def _interval(change: float, changes: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of the resampled ``changes``; NaN when any is not finite. When
    every resample is the same sample (one window or one group), the interval is the point
    ``change`` itself: summed in another order, the resamples differ from it only by rounding,
    and an interval that misses its own point by one ulp would be read as a finding."""
    if not math.isfinite(change) or not np.isfinite(changes).all():
        return float("nan"), float("nan")
    if changes.max() - changes.min() <= 1e-12 * max(1.0, abs(change)):
        return change, change
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(changes, [tail, 100 - tail])
    return float(low), float(high)


def group_sums(values, groups) -> tuple[np.ndarray, np.ndarray]:
    """Per group (``groups`` labels each value): the sum of ``values`` and the count, groups in
    sorted order."""
    _, inverse = np.unique(np.asarray(groups), return_inverse=True)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    return (np.bincount(inverse, weights=values), np.bincount(inverse).astype(np.float64))


def resampled_groups(n_groups: int, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """Chunks of ``(size, n_groups)`` group indices, drawn with replacement: the same seed gives
    the same draws as :func:`paired_bootstrap` over as many windows."""
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_resamples, _CHUNK_VALUES // max(1, n_groups)))
    for start in range(0, n_resamples, chunk):
        yield start, rng.integers(0, n_groups, size=(min(chunk, n_resamples - start), n_groups))


def grouped_bootstrap(test_losses, base_losses, groups, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                      level: float = LEVEL) -> tuple[float, float, float]:
    """:func:`paired_bootstrap` resampling whole groups (all windows of a drawn group, both
    models' losses of them): ``(change, ci_low, ci_high)`` of ``sum(test) / sum(base) - 1``."""
    t = np.asarray(test_losses, dtype=np.float64).reshape(-1)
    b = np.asarray(base_losses, dtype=np.float64).reshape(-1)
    if t.shape != b.shape or t.size != np.asarray(groups).size:
        raise ValueError(f"{t.size} test losses, {b.size} base losses and {np.asarray(groups).size} groups must pair up")
    if t.size == 0:
        raise ValueError("no windows to resample")
    change = relative_change(t, b)
    (tg, _), (bg, _) = group_sums(t, groups), group_sums(b, groups)
    changes = np.empty(n_resamples, dtype=np.float64)
    for start, idx in resampled_groups(len(tg), n_resamples, seed):
        ts, bs = tg[idx].sum(axis=1), bg[idx].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            changes[start:start + len(idx)] = np.where(bs > 0, (ts - bs) / bs, np.nan)
    return change, *_interval(change, changes, level)


def decide(ci_low: float, ci_high: float, min_change: float) -> str:
    """``better`` when the whole interval lies below ``-min_change``, ``worse`` when it lies above
    ``+min_change``, else ``inconclusive`` (``unavailable``, for no window, is :func:`unavailable`'s)."""
    if not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return "inconclusive"
    if ci_high < -min_change:
        return "better"
    if ci_low > min_change:
        return "worse"
    return "inconclusive"


def percent(fraction: float) -> str:
    """A relative change as a percentage with sense-making digits: -18%, -2.3%, +0.41%."""
    if not math.isfinite(fraction):
        return "n/a"
    v = fraction * 100
    digits = 0 if abs(v) >= 10 else 1 if abs(v) >= 1 else 2
    text = f"{v:+.{digits}f}%"
    return f"{0:.{digits}f}%" if float(text[:-1]) == 0 else text


def start_words(base_label: str) -> str:
    """What a line calls the weights a run started from: ``fresh weights`` when they were fresh
    (a change against random weights says nothing about the published model), else ``the start``."""
    return "fresh weights" if str(base_label or "").strip() == "fresh" else "the start"


def inconclusive_why(ci_low: float, ci_high: float, min_change: float) -> str:
    """Why an interval that excludes 0 is still ``inconclusive`` ('' when it does not exclude 0):
    it does not lie wholly beyond ``verdict_min_change``."""
    if not (math.isfinite(ci_low) and math.isfinite(ci_high)) or ci_low <= 0 <= ci_high:
        return ""
    bound = f"verdict_min_change {100 * float(min_change):g}%"
    if max(abs(ci_low), abs(ci_high)) <= min_change:
        return f"the whole interval is smaller than {bound}"
    return f"part of the interval is smaller than {bound}"


def loss_text(value: float) -> str:
    """A loss with four decimals (0.0123, 1.5648); scientific below 0.001."""
    return f"{value:.4f}" if not math.isfinite(value) or abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"


@dataclass
class HeldOut:
    """One held-out comparison: a model against its base on the same windows.

    ``metrics`` / ``base_metrics`` are the stage's unprefixed names (``tokenizer_loss``,
    ``mse_open``, ...); ``loss`` names the one the change is computed on. What a run records
    is ``prefix + name`` for the model, ``base_prefix + prefix + name`` for the base, and
    ``{prefix}loss_change`` with ``_ci_low`` / ``_ci_high``.
    """

    verdict: str
    base_label: str  # what the base is: a path, a hub id, "fresh"
    windows: int = 0
    loss: str = "tokenizer_loss"
    metrics: dict[str, float] = field(default_factory=dict)
    base_metrics: dict[str, float] = field(default_factory=dict)
    change: float = float("nan")
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    min_change: float = 0.005
    reason: str = ""  # why the verdict is unavailable or inconclusive by construction
    split: str = "test"
    windows_digest: str = ""
    seconds: float = 0.0  # how long the comparison took
    prefix: str = TEST_PREFIX
    base_prefix: str = BASE_PREFIX

    @property
    def change_name(self) -> str:
        return f"{self.prefix}loss_change"

    def run_metrics(self) -> dict[str, float]:
        """Every metric name the run records, with its value (none when unavailable)."""
        if self.verdict == "unavailable":
            return {}
        out = {f"{self.prefix}{k}": v for k, v in self.metrics.items()}
        out.update({f"{self.base_prefix}{self.prefix}{k}": v for k, v in self.base_metrics.items()})
        out.update({self.change_name: self.change, f"{self.change_name}_ci_low": self.ci_low,
                    f"{self.change_name}_ci_high": self.ci_high})
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}

    def tags(self) -> dict[str, str]:
        return {VERDICT_TAG: self.verdict, VERDICT_BASE_TAG: self.base_label}

    def why(self) -> str:
        """Why the verdict is ``inconclusive`` though its interval excludes 0 ('' otherwise)."""
        if self.verdict != "inconclusive" or self.reason:
            return ""
        return inconclusive_why(self.ci_low, self.ci_high, self.min_change)

    def line(self, base_words: str = "") -> str:
        """The one console line, e.g. ``test, 2,000 windows: 0.0123 vs starting weights 0.0150:
        -18% (95% CI -20% .. -16%): better``; ``fresh weights`` instead of ``starting weights``
        when the run started fresh; an ``inconclusive`` whose interval excludes 0 says why
        (``inconclusive: the whole interval is smaller than verdict_min_change 0.5%``)."""
        if self.verdict == "unavailable":
            return f"{self.split}: verdict unavailable: {self.reason}"
        fresh = start_words(self.base_label) == "fresh weights"
        words = base_words or ("fresh weights" if fresh else "starting weights")
        model, base = self.metrics.get(self.loss, float("nan")), self.base_metrics.get(self.loss, float("nan"))
        text = (f"{self.split}, {self.windows:,} windows: {loss_text(model)} vs {words} {loss_text(base)}: "
                f"{percent(self.change)} (95% CI {percent(self.ci_low)} .. {percent(self.ci_high)}): {self.verdict}")
        return text + (f" ({self.reason})" if self.reason else f": {self.why()}" if self.why() else "")

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("change", "ci_low", "ci_high"):
            out[key] = out[key] if math.isfinite(out[key]) else None
        return out


def run_metrics_of(heldout: Mapping[str, Any] | None) -> dict[str, float]:
    """:meth:`HeldOut.run_metrics` of a recorded verdict (``HeldOut.as_json``); ``{}`` without one."""
    if not heldout or heldout.get("verdict") == "unavailable" or not heldout.get("windows_digest"):
        return {}
    return HeldOut(**heldout).run_metrics()


def judge(model_losses, base_losses, metrics: Mapping[str, float], base_metrics: Mapping[str, float], *,
          min_change: float, base_label: str, loss: str = "tokenizer_loss", split: str = "test",
          windows_digest: str = "", prefix: str = TEST_PREFIX) -> HeldOut:
    """The comparison of two models' per-window losses on the same windows (:func:`paired_bootstrap`,
    :func:`decide`), as a :class:`HeldOut`."""
    n = int(np.asarray(model_losses).size)
    common = dict(base_label=base_label, windows=n, loss=loss, metrics=dict(metrics),
                  base_metrics=dict(base_metrics), min_change=float(min_change), split=split,
                  windows_digest=windows_digest, prefix=prefix)
    if n == 0:
        return HeldOut("unavailable", **{**common, "metrics": {}, "base_metrics": {}},
                       reason=f"no {split} windows")
    change, low, high = paired_bootstrap(model_losses, base_losses)
    reason = ""
    if n < 2:
        verdict, reason = "inconclusive", "one window cannot tell a change from noise"
    elif not math.isfinite(change):
        verdict, reason = "inconclusive", "the base's loss is 0: no relative change"
    else:
        verdict = decide(low, high, min_change)
    return HeldOut(verdict, change=change, ci_low=low, ci_high=high, reason=reason, **common)


def unavailable(reason: str, *, base_label: str, split: str = "test", prefix: str = TEST_PREFIX) -> HeldOut:
    """No comparison could be made (no window, no starting weights); ``reason`` says why."""
    return HeldOut("unavailable", base_label=base_label, reason=reason, split=split, prefix=prefix)
