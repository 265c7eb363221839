"""``KronosPredictor``: forecasts K-lines from pandas DataFrames, upstream's class and calls.

A user's upstream script changes one import::

    from kronos_mlflow.model import Kronos, KronosTokenizer, KronosPredictor

Each series is normalised over its own lookback, per column (``(x - mean) / (std + 1e-5)``, the
population std), clipped to ``+-clip``, forecast by :mod:`~kronos_mlflow.model.forecast`, and
mapped back (``z * (std + 1e-5) + mean``); with several sample paths the mean is taken in
normalised space, as upstream. Missing ``volume``: volume and amount are 0; missing
``amount``: volume times the mean of open, high, low and close. Bad input (a missing column,
a NaN or infinite value, timestamps of the wrong length) is one line naming it, a
:class:`~kronos_mlflow.errors.DataError` (a ``ValueError``, as upstream raises).

What differs from upstream, and why, is in docs/predictor.md: the model and tokenizer are put
in eval mode for the forecast (upstream forecasts in whatever mode they are in;
``eval_mode=False`` keeps that), and the s1 transformer keeps a key/value cache
(``kv_cache=False`` recomputes the window every step, as upstream).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch

from ..errors import ConfigError, DataError
from .forecast import check_pair, decode_paths, generate_tokens
from .sampling import check_sampling

PRICE_COLS = ["open", "high", "low", "close"]
VOL_COL, AMT_COL = "volume", "amount"
FEATURE_COLS = [*PRICE_COLS, VOL_COL, AMT_COL]
TIME_COLS = ["minute", "hour", "weekday", "day", "month"]


def calc_time_stamps(x_timestamp) -> pd.DataFrame:
    """The five time features (minute, hour, weekday, day, month) of a Series of timestamps
    (a DatetimeIndex or a list of them works too)."""
    ts = x_timestamp if isinstance(x_timestamp, pd.Series) else pd.Series(x_timestamp)
    if not pd.api.types.is_datetime64_any_dtype(ts):
        ts = pd.to_datetime(ts)
    return pd.DataFrame({
        "minute": ts.dt.minute, "hour": ts.dt.hour, "weekday": ts.dt.weekday, "day": ts.dt.day, "month": ts.dt.month,
    })


def _default_device() -> str:
    if torch.cuda.is_available():
        return "cuda:0"
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


@contextmanager
def _eval_modes(modules: Sequence[torch.nn.Module], enabled: bool):
    """Every submodule in eval mode inside, each one's own mode restored after."""
    if not enabled:
        yield
        return
    saved = [(m, m.training) for module in modules for m in module.modules()]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for m, training in saved:
            m.training = training


class KronosPredictor:
    """Forecasts with a predictor (``Kronos``) and the tokenizer it was trained on.

    ``KronosPredictor(model, tokenizer, device=None, max_context=512, clip=5)`` as upstream
    (``device`` None: ``cuda:0``, else ``mps``, else ``cpu``; the models are moved there).
    Keyword-only extras: ``kv_cache`` (default on), ``cross_rope`` (``"upstream"``, the
    default, or ``"positions"``: see :mod:`~kronos_mlflow.model.decoding`) and ``eval_mode``
    (default on: forecast in eval mode, each module's mode restored after).
    """

    def __init__(self, model, tokenizer, device=None, max_context=512, clip=5, *, kv_cache: bool = True,
                 cross_rope: str = "upstream", eval_mode: bool = True):
        check_pair(model, tokenizer)
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
            raise ConfigError(f"max_context is {max_context!r}; expected a whole number of 1 or more (512 for Kronos-small)")
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0:
            raise ConfigError(f"clip is {clip!r}; expected a positive number of standard deviations (upstream: 5)")
        self.max_context = max_context
        self.clip = clip
        self.price_cols = list(PRICE_COLS)
        self.vol_col = VOL_COL
        self.amt_vol = AMT_COL
        self.time_cols = list(TIME_COLS)
        self.kv_cache = bool(kv_cache)
        self.cross_rope = cross_rope
        self.eval_mode = bool(eval_mode)
        self.device = _default_device() if device is None else device
        self.tokenizer = tokenizer.to(self.device)
        self.model = model.to(self.device)

    # ---- the arrays ----

    def _sample(self, x, x_stamp, y_stamp, pred_len, T, top_k, top_p, sample_count, verbose) -> torch.Tensor:
        """Decoded sample paths (B, sample_count, window, d_in) in normalised units."""
        def tensor(a):
            return torch.from_numpy(np.array(a, dtype=np.float32)).to(self.device)  # a copy: pandas may hand read-only arrays

        with _eval_modes([self.model, self.tokenizer], self.eval_mode):
            s1, s2 = generate_tokens(
                self.tokenizer, self.model, tensor(x), tensor(x_stamp), tensor(y_stamp), self.max_context, pred_len,
                self.clip, T, top_k, top_p, sample_count, verbose, use_cache=self.kv_cache, cross_rope=self.cross_rope)
            return decode_paths(self.tokenizer, s1, s2, self.max_context, sample_count)

    def generate(self, x, x_stamp, y_stamp, pred_len, T, top_k, top_p, sample_count, verbose) -> np.ndarray:
        """The mean forecast (B, pred_len, d_in) in normalised units, from normalised arrays
        ``x`` (B, lookback, d_in), ``x_stamp`` (B, lookback, 5), ``y_stamp`` (B, pred_len, 5)."""
        z = self._sample(x, x_stamp, y_stamp, pred_len, T, top_k, top_p, sample_count, verbose)
        return np.mean(z.cpu().numpy(), axis=1)[:, -pred_len:, :]

    # ---- DataFrames ----

    def _prepare(self, df, x_timestamp, y_timestamp, pred_len, where: str):
        """(normalised x, x_stamp, y_stamp, mean, std) of one series, its input checked."""
        if not isinstance(df, pd.DataFrame):
            raise DataError(f"{where} is a {type(df).__name__}; expected a pandas DataFrame with columns "
                            f"{', '.join(self.price_cols)} (and optionally volume, amount)")
        missing = [c for c in self.price_cols if c not in df.columns]
        if missing:
            raise DataError(f"{where} has no column {', '.join(repr(c) for c in missing)}; expected the price columns "
                            f"{', '.join(self.price_cols)} (volume and amount are optional)")
        df = df.copy()
        if self.vol_col not in df.columns:
            df[self.vol_col] = 0.0
            df[self.amt_vol] = 0.0
        if self.amt_vol not in df.columns:
            df[self.amt_vol] = df[self.vol_col] * df[self.price_cols].mean(axis=1)
        cols = [*self.price_cols, self.vol_col, self.amt_vol]
        try:
            x = df[cols].to_numpy(dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: the columns {', '.join(cols)} must be numbers ({exc})") from None
        bad = ~np.isfinite(x)
        if bad.any():
            col = int(np.argmax(bad.any(axis=0)))
            row = int(np.argmax(bad[:, col]))
            raise DataError(
                f"{where} column {cols[col]!r} holds {int(bad[:, col].sum())} NaN or infinite values (the first at "
                f"row {row}); forecasting needs finite prices, volume and amount: fill or drop those rows")
        if len(x) == 0:
            raise DataError(f"{where} has no rows; expected a lookback window of at least one bar")
        x_stamp = self._stamps(x_timestamp, len(x), f"x_timestamp of {where}", "one per row of the DataFrame")
        y_stamp = self._stamps(y_timestamp, pred_len, f"y_timestamp of {where}", "pred_len of them")
        mean, std = np.mean(x, axis=0), np.std(x, axis=0)
        x = np.clip((x - mean) / (std + 1e-5), -self.clip, self.clip)
        return x, x_stamp, y_stamp, mean, std

    @staticmethod
    def _stamps(timestamps, n: int, what: str, which: str) -> np.ndarray:
        try:
            stamps = calc_time_stamps(timestamps).to_numpy(dtype=np.float32)
        except (TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{what} cannot be read as timestamps ({type(exc).__name__}); expected a pandas Series "
                            "of datetimes") from None
        if len(stamps) != n:
            raise DataError(f"{what} has {len(stamps)} timestamps; expected {n}, {which}")
        if np.isnan(stamps).any():
            raise DataError(f"{what} holds a missing timestamp (NaT); expected one datetime per bar")
        return stamps

    def _batch(self, df_list, x_timestamp_list, y_timestamp_list, pred_len, T, top_k, top_p, sample_count):
        check_sampling(pred_len, T, top_k, top_p, sample_count)
        lists = (df_list, x_timestamp_list, y_timestamp_list)
        if not all(isinstance(v, (list, tuple)) for v in lists):
            raise DataError("df_list, x_timestamp_list and y_timestamp_list must be lists (or tuples)")
        if not len(df_list) == len(x_timestamp_list) == len(y_timestamp_list) or not df_list:
            raise DataError(f"df_list, x_timestamp_list and y_timestamp_list hold {len(df_list)}, "
                            f"{len(x_timestamp_list)} and {len(y_timestamp_list)} items; expected the same number, 1 or more")
        series = [self._prepare(df, xt, yt, pred_len, f"df_list[{i}]")
                  for i, (df, xt, yt) in enumerate(zip(*lists))]
        lengths = sorted({len(s[0]) for s in series})
        if len(lengths) > 1:
            raise DataError(f"the series have lookbacks of {lengths} rows; a batch needs one length (forecast "
                            "them in separate calls, or cut them to the shortest)")
        return series

    def predict(self, df, x_timestamp, y_timestamp, pred_len, T=1.0, top_k=0, top_p=0.9, sample_count=1,
                verbose=True) -> pd.DataFrame:
        """The forecast of one series: a DataFrame of open, high, low, close, volume, amount with
        ``pred_len`` rows indexed by ``y_timestamp`` (the mean of ``sample_count`` paths)."""
        check_sampling(pred_len, T, top_k, top_p, sample_count)
        x, x_stamp, y_stamp, mean, std = self._prepare(df, x_timestamp, y_timestamp, pred_len, "df")
        preds = self.generate(x[None], x_stamp[None], y_stamp[None], pred_len, T, top_k, top_p, sample_count, verbose)
        preds = preds[0] * (std + 1e-5) + mean
        return pd.DataFrame(preds, columns=[*self.price_cols, self.vol_col, self.amt_vol], index=y_timestamp)

    def predict_batch(self, df_list, x_timestamp_list, y_timestamp_list, pred_len, T=1.0, top_k=0, top_p=0.9,
                      sample_count=1, verbose=True) -> list[pd.DataFrame]:
        """:meth:`predict` for several series of one lookback length, in one batch; a list of
        DataFrames in the input's order."""
        series = self._batch(df_list, x_timestamp_list, y_timestamp_list, pred_len, T, top_k, top_p, sample_count)
        preds = self.generate(*(np.stack([s[i] for s in series]) for i in range(3)), pred_len, T, top_k, top_p,
                              sample_count, verbose)
        cols = [*self.price_cols, self.vol_col, self.amt_vol]
        return [pd.DataFrame(p * (s[4] + 1e-5) + s[3], columns=cols, index=y_ts)
                for p, s, y_ts in zip(preds, series, y_timestamp_list)]

    def predict_paths(self, df_list, x_timestamp_list, y_timestamp_list, pred_len, T=1.0, top_k=0, top_p=0.9,
                      sample_count=1, verbose=False) -> list[np.ndarray]:
        """Every sample path, not only their mean: per series an array (sample_count, pred_len, 6)
        of open, high, low, close, volume, amount in the input's units."""
        series = self._batch(df_list, x_timestamp_list, y_timestamp_list, pred_len, T, top_k, top_p, sample_count)
        z = self._sample(*(np.stack([s[i] for s in series]) for i in range(3)), pred_len, T, top_k, top_p,
                         sample_count, verbose)
        paths = z.cpu().numpy()[:, :, -pred_len:, :]
        return [p * (s[4] + 1e-5) + s[3] for p, s in zip(paths, series)]
