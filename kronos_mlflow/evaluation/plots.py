"""Pictures of what the tokenizer does, logged as PNG artifacts under ``plots/`` of each run:
``reconstruction.png`` and ``token_usage.png`` (docs/comparing-runs.md#quality-metrics), drawn
with matplotlib's object API on the Agg canvas (no pyplot, no display, no global backend change).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config.features import FEATURES, NORM_EPS
from ..config.keys import DATA, TRACKING
from ..config.sections import as_section
from ..config.layout import RunLayout

log = logging.getLogger(__name__)

RECONSTRUCTION_PNG = "reconstruction.png"
TOKEN_USAGE_PNG = "token_usage.png"
ARTIFACT_DIR = "plots"

_UP, _DOWN = "#26a69a", "#ef5350"  # close >= open, close < open
_IDX = {name: i for i, name in enumerate(FEATURES)}


def new_figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def candlestick(ax, ohlc: np.ndarray, width: float = 0.6) -> None:
    """Draw ``ohlc`` (T, 4: open, high, low, close) on ``ax``: wick low-high, body open-close.

    A reconstruction may put the body outside the wick (high below the close, say): it is drawn
    as it is, which is part of what the picture shows.
    """
    o, h, lo, c = (np.asarray(ohlc[:, i], dtype=np.float64) for i in range(4))
    t = np.arange(len(o))
    colors = np.where(c >= o, _UP, _DOWN)
    ax.vlines(t, lo, h, colors=colors, linewidth=0.8, zorder=2)
    body = np.abs(c - o)
    body = np.where(body > 0, body, np.nanmax(np.abs(h - lo)) * 0.002 + 1e-12)  # doji stays visible
    ax.bar(t, body, width, bottom=np.minimum(o, c), color=colors, edgecolor=colors, linewidth=0.5, zorder=3)


def denormalize(z: np.ndarray, raw: np.ndarray, lookback: int, eps: float = NORM_EPS) -> np.ndarray:
    """Undo the training normalisation of a window: ``z * (std + eps) + mean`` of ``raw``'s lookback."""
    lookback = max(1, min(int(lookback), raw.shape[-2]))
    past = np.asarray(raw, dtype=np.float64)[..., :lookback, :]
    std, mean = past.std(axis=-2, keepdims=True), past.mean(axis=-2, keepdims=True)
    return np.asarray(z, dtype=np.float64) * (std + eps) + mean


def time_ticks(stamps) -> tuple[list[int], list[str]]:
    """About six tick positions over a window's bars and their labels: dates for daily bars,
    ``MM-DD HH:MM`` for intraday ones (bars sit at integer positions, so lunch breaks and nights
    leave no holes)."""
    text = [str(t).replace("T", " ") for t in stamps]
    intraday = any(len(t) > 10 and t[11:16] != "00:00" for t in text)
    n = len(text)
    pos = sorted(set(np.linspace(0, n - 1, min(n, 6)).round().astype(int).tolist())) if n else []
    return pos, [text[i][5:16] if intraday else text[i][:10] for i in pos]


def plot_reconstruction(raw: np.ndarray, x_norm: np.ndarray, z_pre: np.ndarray, z: np.ndarray, lookback: int,
                        out_path: str, title: str = "", stamps=None) -> str:
    """Input window beside its s1-only (``z_pre``: the coarse code alone) and full (``z``)
    reconstructions, as candlesticks with volume. Reconstructions are de-normalised with the
    window's lookback mean and std, so all three panels are in the data's price and volume units;
    the titles give each reconstruction's MSE in normalised units (the training loss's).

    ``raw`` (T, 6) in data units; ``x_norm``, ``z_pre``, ``z`` (T, 6) normalised (what the model
    saw and gave back); ``stamps`` (T) the bars' timestamps, which label the time axis. Returns
    ``out_path``.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    raw = np.asarray(raw, dtype=np.float64)
    x_norm, z_pre, z = (np.asarray(a, dtype=np.float64) for a in (x_norm, z_pre, z))
    panels = [
        ("Input window", raw, None),
        ("s1-only reconstruction (coarse code)", denormalize(z_pre, raw, lookback),
         float(np.mean((z_pre - x_norm) ** 2))),
        ("Full reconstruction (s1 + s2 codes)", denormalize(z, raw, lookback), float(np.mean((z - x_norm) ** 2))),
    ]
    price_cols = [_IDX[k] for k in ("open", "high", "low", "close")]
    vol = _IDX["vol"]
    t = np.arange(raw.shape[0])

    fig = new_figure(16, 7.2)
    grid = fig.add_gridspec(2, 3, height_ratios=[3, 1])
    price_axes, vol_axes = [], []
    for col, (name, values, mse) in enumerate(panels):
        ax = fig.add_subplot(grid[0, col], sharey=price_axes[0] if price_axes else None)
        vax = fig.add_subplot(grid[1, col], sharex=ax, sharey=vol_axes[0] if vol_axes else None)
        candlestick(ax, values[:, price_cols])
        if col:
            ax.plot(t, raw[:, _IDX["close"]], color="0.35", linewidth=1.0, linestyle=":", zorder=4)
        colors = np.where(values[:, _IDX["close"]] >= values[:, _IDX["open"]], _UP, _DOWN)
        vax.bar(t, values[:, vol], 0.6, color=colors, alpha=0.7)
        if col:
            vax.plot(t, raw[:, vol], color="0.35", linewidth=0.9, linestyle=":")
        for a in (ax, vax):
            a.axvline(lookback - 0.5, color="0.5", linestyle="--", linewidth=0.8)
            a.grid(True, color="0.92", linewidth=0.6)
        ax.set_title(name if mse is None else f"{name}\nMSE {mse:.4f} (normalised units)", fontsize=11)
        ax.tick_params(labelbottom=False)
        if stamps is not None and len(stamps) == len(t):
            ticks, labels = time_ticks(stamps)
            vax.set_xticks(ticks, labels, rotation=30, ha="right", fontsize=8)
            vax.set_xlabel("bar time (dashed: end of lookback)")
        else:
            vax.set_xlabel("time step in window (dashed: end of lookback)")
        if col == 0:
            ax.set_ylabel("price (data units)")
            vax.set_ylabel("volume (data units)")
        else:
            ax.tick_params(labelleft=False)
            vax.tick_params(labelleft=False)
        price_axes.append(ax)
        vol_axes.append(vax)
    fig.legend(
        handles=[Patch(color=_UP, label="candle: close >= open"), Patch(color=_DOWN, label="candle: close < open"),
                 Line2D([], [], color="0.35", linestyle=":", label="input close / volume (on reconstructions)"),
                 Line2D([], [], color="0.5", linestyle="--", label="end of lookback (normalisation statistics)")],
        loc="outside lower center", ncols=4, fontsize=9, frameon=False,
    )
    fig.suptitle(title or "Tokenizer reconstruction of a validation window", fontsize=12)
    fig.savefig(out_path, format="png")
    return out_path


def plot_token_usage(s1_ids: np.ndarray, s1_counts: np.ndarray, full_ids: np.ndarray, full_counts: np.ndarray,
                     s1_bits: int, s2_bits: int, out_path: str, title: str = "") -> str:
    """Token usage on validation: counts per s1 code, and rank-frequency of s1 and full codes."""
    from .quality import perplexity  # lazy: torch

    s1_counts = np.asarray(s1_counts, dtype=np.int64)
    full_counts = np.asarray(full_counts, dtype=np.int64)
    n_s1, c_bits = 1 << int(s1_bits), int(s1_bits) + int(s2_bits)
    total = max(1, int(s1_counts.sum()))

    fig = new_figure(15, 5.4)
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    s1_text = f"{len(s1_counts):,} of {n_s1:,} s1 codes used, perplexity {perplexity(s1_counts):.1f}"
    full_text = (f"{len(full_counts):,} of 2^{c_bits} = {1 << c_bits:,} full codes used, "
                 f"perplexity {perplexity(full_counts):.1f}")
    if n_s1 <= 4096:
        values = np.zeros(n_s1, dtype=np.int64)
        values[np.asarray(s1_ids, dtype=np.int64)] = s1_counts
        left.set_xlabel(f"s1 code id (0 .. {n_s1 - 1})")
    else:
        values = np.sort(s1_counts)[::-1]
        left.set_xlabel("s1 code rank (most frequent first; too many codes to show by id)")
    if len(values) <= 256:
        left.bar(np.arange(len(values)), values, width=0.85, color="#3f51b5", edgecolor="none")
    else:  # one filled outline: thin bars would drop out of the raster
        left.stairs(values, np.arange(len(values) + 1) - 0.5, fill=True, color="#3f51b5")
    left.set_xlim(-0.5, max(len(values), 1) - 0.5)
    if n_s1 > 4096:
        left.set_yscale("log")
    left.axhline(total / n_s1, color="#ff9800", linestyle="--", linewidth=1.0,
                 label=f"uniform use of all {n_s1:,} s1 codes ({total / n_s1:,.1f} each)")
    left.legend(fontsize=9, loc="upper right")
    left.set_ylabel(f"validation tokens (of {total:,})")
    left.set_title(f"s1 code counts: {s1_text}", fontsize=10)
    left.grid(True, axis="y", color="0.92")

    for counts, label, color in ((s1_counts, f"s1 ({s1_bits} bits)", "#3f51b5"),
                                 (full_counts, f"full ({c_bits} bits)", "#ff9800")):
        if len(counts):
            share = np.sort(counts)[::-1] / max(1, counts.sum())
            right.loglog(np.arange(1, len(share) + 1), share, marker=".", markersize=3, linewidth=1.2,
                         color=color, label=f"{label}: {len(counts):,} used")
    right.set_xlabel("code rank (most frequent first)")
    right.set_ylabel("share of validation tokens")
    right.set_title(f"Rank-frequency\n{full_text}", fontsize=10)
    right.grid(True, which="both", color="0.92")
    right.legend(fontsize=9)
    fig.suptitle(title or "Token usage on validation", fontsize=12)
    fig.savefig(out_path, format="png")
    return out_path


def reconstruction_inputs(model, val_ds, index: int = 0, epoch_seed: int = 0) -> dict[str, Any]:
    """What :func:`plot_reconstruction` needs for the validation window ``index`` of ``epoch_seed``."""
    import torch

    previous = val_ds.epoch_seed
    val_ds.set_epoch_seed(epoch_seed)
    try:
        x_norm = val_ds[index][0]
        raw = np.asarray(val_ds.raw_windows([index])[0], dtype=np.float64)
        info = val_ds.window_info(index) if hasattr(val_ds, "window_info") else {}
        stamps = val_ds.window_times(index) if hasattr(val_ds, "window_times") else None
    finally:
        val_ds.set_epoch_seed(previous)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad():
        (z_pre, z), _, _, _ = model(x_norm[None].to(device))
    model.train(was_training)
    return {"raw": raw, "x_norm": x_norm.numpy(), "z_pre": z_pre[0].float().cpu().numpy(),
            "z": z[0].float().cpu().numpy(), "info": info, "stamps": stamps}


def write_validation_plots(out_dir: str, model, val_ds, stats, config: Mapping[str, Any],
                           best_epoch: int | None = None) -> list[str]:
    """Write both PNGs into ``out_dir``; returns their paths (the usage plot needs ``stats``)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    at = f"best epoch {best_epoch}" if best_epoch is not None and best_epoch >= 0 else "final weights"
    data = as_section(config, DATA)
    run = str(as_section(config, TRACKING).run_name or "")
    if val_ds is not None and len(val_ds):
        inputs = reconstruction_inputs(model, val_ds)
        info = inputs["info"]
        cut = 10 if str(data.freq) == "day" else 16
        where = (f"{info.get('symbol', '?')} {info.get('first', '')[:cut].replace('T', ' ')} .. "
                 f"{info.get('last', '')[:cut].replace('T', ' ')}") if info else ""
        title = (f"Validation window 0 (epoch seed 0): {where} | {at}" + (f" | run {run}" if run else "")).strip()
        paths.append(plot_reconstruction(inputs["raw"], inputs["x_norm"], inputs["z_pre"], inputs["z"],
                                         int(data.lookback_window), os.path.join(out_dir, RECONSTRUCTION_PNG),
                                         title=title, stamps=inputs.get("stamps")))
    if stats is not None and stats.rows:
        s1_ids, s1_counts = stats.s1.ids_and_counts()
        full_ids, full_counts = stats.full.ids_and_counts()
        title = f"Token usage on validation ({stats.s1.total:,} tokens) | {at}" + (f" | run {run}" if run else "")
        paths.append(plot_token_usage(s1_ids, s1_counts, full_ids, full_counts, stats.s1_bits, stats.s2_bits,
                                      os.path.join(out_dir, TOKEN_USAGE_PNG), title=title))
    return paths


def log_validation_plots(logger, config: Mapping[str, Any], save_dir: str, val_ds, stats,
                         best_epoch: int | None = None) -> list[str]:
    """Draw the plots from the best checkpoint in ``save_dir`` and log them under ``plots/``.

    Rank 0 calls this once after training. Plots are a convenience: any failure is logged as a
    warning and an empty list returned; the run goes on.
    """
    try:
        from ..model import KronosTokenizer  # lazy: torch

        best_dir = RunLayout(Path(save_dir)).best_model
        if not os.path.isdir(best_dir):
            return []
        model = KronosTokenizer.from_pretrained(best_dir)
        out_dir = os.fspath(RunLayout(Path(save_dir)).plots)
        paths = write_validation_plots(out_dir, model, val_ds, stats, config, best_epoch)
        if logger is not None:
            for path in paths:
                logger.log_artifact(path, ARTIFACT_DIR)
        return paths
    except Exception as exc:  # noqa: BLE001 - plots must never fail a finished training
        log.warning("could not draw or log the validation plots (%s: %s); the run is unaffected",
                    type(exc).__name__, exc)
        return []
