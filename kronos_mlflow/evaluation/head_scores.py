"""The return head scored as its own forecaster, ``finetuned_head``, beside the fine-tuned pair's
paths (docs/forecast-evaluation.md#the-return-head-finetuned_head): its signal on the scorecard's
test origins (the served :func:`kronos_mlflow.serving.forecasting.head.signal`, lookback only)
read by IC and rank IC against the actual return at the head's horizon, with 95% intervals over
dates and the rank IC's Newey-West t; and its signal as a backtest strategy. Only a model whose
predictor checkpoint holds ``return_head.safetensors`` has it; nothing changes for the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
import torch

from ..config.sections import as_section
from ..runtime.distributed import all_reduce_sum_
from ..serving.forecasting.head import signal
from . import scores as sc
from .ic_stats import newey_west_t, nw_lag
from .origins import CLOSE, Origins

HEAD = "finetuned_head"
PREFIX = "finetuned_head_test_"
#: its backtest strategy's name (metrics ``backtest_fine_tuned_head_...``)
BACKTEST_NAME = "fine-tuned head"


def signals(predictor, head, origins: Origins, config: Mapping[str, Any], *, rank: int = 0,
            world_size: int = 1) -> np.ndarray:
    """``(len(origins),)`` float64: the head's signal at every origin, from its lookback alone,
    over every rank (a collective when ``world_size > 1``: each rank reads its block of origins), in
    batches of ``batch_size * inference_sample_count`` origins."""
    table = torch.zeros(len(origins), dtype=torch.float64)
    positions = origins.shard(rank, world_size)
    # the rows the paths' forecast prefills per batch (batch_size series x their sample paths): one forward each
    batch = max(1, int(as_section(config, "training").batch_size)
                * int(as_section(config, "evaluation").inference_sample_count))
    for start in range(0, len(positions), batch):
        chunk = positions[start:start + batch]
        past, _ = origins.times(chunk)
        stamps = np.asarray(past).astype("datetime64[s]").astype(np.int64)
        table[torch.from_numpy(chunk)] = torch.from_numpy(signal(predictor, head, origins.history(chunk), stamps))
    all_reduce_sum_(table)
    return table.numpy()


def score(predictor, head, origins: Origins, config: Mapping[str, Any], metrics_: MutableMapping[str, float], table,
          seconds: MutableMapping[str, float], *, rank: int = 0, world_size: int = 1) -> np.ndarray | None:
    """The scorecard's part: with ``head`` (the fine-tuned pair's return head and its window, as
    :func:`kronos_mlflow.serving.forecasting.head.load` gives them; None or ``(None, {})``: no
    head, nothing done) and ``predictor`` the fine-tuned pair, its signal at the test ``origins``
    (returned; a column ``finetuned_head_signal`` of the origins' ``table``), its :func:`metrics`
    into ``metrics_`` (against the return at the head's horizon, at most the scorecard's) and its
    wall time into ``seconds``; None without a head."""
    if head is None or head[0] is None or predictor is None:
        return None
    started, horizon = time.time(), min(int(head[1].get("horizon", origins.horizon)), origins.horizon)
    out = signals(predictor, head[0], origins, config, rank=rank, world_size=world_size)
    metrics_.update(metrics(origins.dates, out, actual_returns(origins, horizon), horizon))
    table[f"{HEAD}_signal"] = out
    seconds[HEAD] = round(time.time() - started, 3)
    return out


def actual_returns(origins: Origins, horizon: int) -> np.ndarray:
    """The close's return from each origin to ``horizon`` bars later (the scorecard's horizon
    when the head's is longer)."""
    every = np.arange(len(origins))
    step = max(1, min(int(horizon), origins.horizon))
    last = origins.history(every)[:, -1, CLOSE].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return origins.future(every)[:, step - 1, CLOSE].astype(np.float64) / last - 1.0


def metrics(dates, head_signal: np.ndarray, actual_return: np.ndarray, horizon: int) -> dict[str, float]:
    """``finetuned_head_test_`` ``ic``, ``rank_ic``, ``icir``, ``rank_icir``, ``ic_ci_low`` /
    ``_high``, ``rank_ic_ci_low`` / ``_high`` (95% bootstrap over dates) and ``rank_ic_nw_t`` (lag
    from ``horizon``): the per-date cross-sectional correlations of the signal with the actual
    return (finite values only; none with under two symbols a date)."""
    daily = sc.daily_ic(dates, head_signal, actual_return)
    if not len(daily):
        return {}
    out: dict[str, float] = {}
    for name in ("ic", "rank_ic"):
        values = daily[name].to_numpy(dtype=np.float64)
        out[name] = float(values.mean())
        std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        if math.isfinite(std) and std > 0:
            out[f"{name}ir"] = out[name] / std
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = sc.mean_interval(values)
    out["rank_ic_nw_t"] = newey_west_t(daily["rank_ic"], nw_lag(horizon))
    return {f"{PREFIX}{k}": float(v) for k, v in out.items() if math.isfinite(float(v))}


def line(metrics_: Mapping[str, float]) -> str:
    """``finetuned_head: rank IC <mean> (95% CI <low> .. <high>), NW t <t>, IC <mean>`` ('' without it)."""
    m = metrics_
    if f"{PREFIX}rank_ic" not in m:
        return ""
    return (f"{HEAD}: rank IC {m[PREFIX + 'rank_ic']:+.3f} (95% CI {m.get(PREFIX + 'rank_ic_ci_low', math.nan):+.3f} .. "
            f"{m.get(PREFIX + 'rank_ic_ci_high', math.nan):+.3f}), NW t {m.get(PREFIX + 'rank_ic_nw_t', math.nan):.2f}, "
            f"IC {m.get(PREFIX + 'ic', math.nan):+.3f}")
