"""The scorecard's pictures (PNG, matplotlib's object API on the Agg canvas): ``scorecard.png``,
``horizons.png``, ``forecasts.png``, ``pit.png`` and ``reliability.png`` of
docs/forecast-evaluation.md#what-a-run-records (how to read the last two: docs/calibration.md#reading-the-two-pictures).
"""

from __future__ import annotations

import numpy as np

from .plots import new_figure
from .probabilistic import brier, ks_distance, reliability

SKILL_KINDS = ("skill_vs_", "wql_skill_vs_", "gm_skill_vs_")
COLORS = {"finetuned": "#1f77b4", "zeroshot": "#ff7f0e", "persistence": "#7f7f7f", "seasonal_naive": "#2ca02c",
          "histvol": "#9467bd", "finetuned_calibrated": "#17becf"}
PIT_BINS = 10


def scorecard_figure(card):
    """Each skill (1 - MASE ratio, 1 - WQL ratio, fev's geometric-mean skill) as a dot with its 95%
    interval, and the zero line (no better than the baseline)."""
    names = [k for k in card.metrics if k.startswith(SKILL_KINDS) and not k.endswith(("_ci_low", "_ci_high"))]
    fig = new_figure(6.4, 1.2 + 0.7 * max(1, len(names)))
    ax = fig.add_subplot(1, 1, 1)
    labels = []
    for i, name in enumerate(names):
        value = card.metrics[name]
        low, high = card.metrics.get(f"{name}_ci_low", value), card.metrics.get(f"{name}_ci_high", value)
        ax.errorbar([value], [i], xerr=[[max(0.0, value - low)], [max(0.0, high - value)]], fmt="o", capsize=5,
                    color=COLORS.get(name.rsplit("_vs_", 1)[1], "k"))
        labels.append(ax.annotate(f"{value:+.3f} [{low:+.3f}, {high:+.3f}]", (value, i), textcoords="offset points",
                                  xytext=(0, 8), ha="center", fontsize=8))
    ax.axvline(0.0, color="k", lw=0.8)
    spans = [card.metrics.get(f"{n}_ci_{side}", card.metrics[n]) for n in names for side in ("low", "high")] + [0.0]
    lo, hi = min(spans), max(spans)
    pad = 0.1 * (hi - lo or 1.0)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_yticks(range(len(names)), [n.replace("_skill_vs_", " vs ").replace("skill_vs_", "mase vs ") for n in names])
    ax.set_ylim(-0.7, len(names) - 0.3)
    ax.set_xlabel("skill = 1 - error(fine-tuned) / error(baseline); > 0: fine-tuned better")
    ax.set_title(f"scorecard: {card.description}", fontsize=9)
    labels_inside(fig, ax, labels)
    return fig


def labels_inside(fig, ax, labels, rounds: int = 4) -> None:
    """Widen ``ax``'s x range until every text in ``labels`` lies inside the axes, measured on
    the figure's own renderer (a label's width in data units depends on the range, so a few
    rounds; each widens by the largest overflow on either side)."""
    for _ in range(rounds):
        fig.draw_without_rendering()  # the constrained layout, then the texts' extents
        box = ax.get_window_extent()
        left = max([box.x0 - t.get_window_extent().x0 for t in labels] + [0.0])
        right = max([t.get_window_extent().x1 - box.x1 for t in labels] + [0.0])
        if left <= 0 and right <= 0:
            return
        x0, x1 = ax.get_xlim()
        per_pixel = (x1 - x0) / max(box.width, 1.0)
        ax.set_xlim(x0 - (left + 4) * per_pixel * 1.2, x1 + (right + 4) * per_pixel * 1.2)


def forecasts_figure(card):
    """A few origins: the lookback closes, the actual closes, the fine-tuned pair's median path with
    its 10-90% band, the zero-shot pair's median, persistence."""
    sample = card.sample
    n = len(sample["labels"])
    fig = new_figure(9.0, 2.4 * max(1, n))
    for i in range(n):
        ax = fig.add_subplot(max(1, n), 1, i + 1)
        hist, actual = sample["history"][i], sample["actual"][i]
        past = np.arange(-len(hist) + 1, 1)
        ahead = np.arange(0, len(actual) + 1)
        ax.plot(past, hist, color="k", lw=1.0, label="history")
        ax.plot(ahead, np.r_[hist[-1], actual], color="k", lw=1.0, ls="--", label="actual")
        for name, paths in sample["paths"].items():
            p = paths[i]
            median = np.r_[hist[-1], np.median(p, axis=0)]
            ax.plot(ahead, median, color=COLORS.get(name, "k"), lw=1.2, label=f"{name} median" if p.shape[0] > 1
                    else name)
            if name == "finetuned" and p.shape[0] > 1:
                lo, hi = np.percentile(p, [10, 90], axis=0)
                ax.fill_between(ahead, np.r_[hist[-1], lo], np.r_[hist[-1], hi], color=COLORS[name], alpha=0.25,
                                label="fine-tuned 10-90%")
        ax.set_title(sample["labels"][i], fontsize=9)
        ax.set_ylabel("close")
        if i == 0:
            ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.axes[-1].set_xlabel("bars from the origin")
    return fig


def horizons_figure(card):
    """MASE at each forecast step alone, per forecaster."""
    fig = new_figure(6.4, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    for name, values in card.horizon_mase.items():
        if values:
            ax.plot(np.arange(1, len(values) + 1), values, marker="o", ms=3, color=COLORS.get(name, "k"), label=name)
    ax.set_xlabel("forecast step (bars after the origin)")
    ax.set_ylabel("MASE of the step alone")
    ax.set_title(f"error by horizon: {card.description}", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def pit_figure(card):
    """Each forecaster's PIT histogram (ten bins; flat at 1 when calibrated; a U: too narrow; a
    hump: too wide; a slope: biased), with its KS distance."""
    names = [name for name, pit in card.pit.items() if np.isfinite(pit).any()]
    cols = min(3, max(1, len(names)))
    rows = max(1, -(-len(names) // cols))
    fig = new_figure(3.2 * cols, 2.6 * rows + 0.4)
    edges = np.linspace(0.0, 1.0, PIT_BINS + 1)
    for i, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, i + 1)
        values = card.pit[name][np.isfinite(card.pit[name])].reshape(-1)
        ax.hist(values, bins=edges, density=True, color=COLORS.get(name, "k"), alpha=0.75, edgecolor="white")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xlim(0.0, 1.0)
        ax.set_title(f"{name}: KS {ks_distance(values):.3f}", fontsize=8)
        ax.tick_params(labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("density", fontsize=8)
    fig.suptitle(f"PIT of the actual close (flat = calibrated; U = too narrow): {card.description}", fontsize=8)
    return fig


def reliability_figure(card):
    """The observed frequency of a rise against the forecast ``p_up`` (ten bins, the count beside
    each point), the diagonal (calibrated) and the base rate."""
    fig = new_figure(6.0, 5.0)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [0, 1], color="k", lw=0.8, ls="--", label="calibrated")
    base = card.metrics.get("base_rate_up")
    if base is not None:
        ax.axhline(base, color="#7f7f7f", lw=0.8, ls=":", label=f"base rate {base:.2f}")
    for name, (p, up) in card.p_up.items():
        rows = reliability(p, up)
        if not rows:
            continue
        x, y, n = (np.array(v) for v in zip(*rows))
        ax.plot(x, y, marker="o", ms=4, lw=1.0, color=COLORS.get(name, "k"), label=f"{name} (Brier {brier(p, up):.3f})")
        for xi, yi, ni in zip(x, y, n):
            ax.annotate(str(int(ni)), (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=6,
                        color=COLORS.get(name, "k"))
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("forecast p_up: P(close at the horizon > the origin's close)")
    ax.set_ylabel("observed frequency of a rise")
    ax.set_title(f"reliability (counts beside the points): {card.description}", fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    return fig

