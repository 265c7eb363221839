"""``KronosPredictor``: forecasts K-lines from pandas DataFrames, upstream's class and calls (an
upstream script changes one import: ``from kronos_mlflow.model import Kronos, KronosTokenizer,
KronosPredictor``). What it computes, its one-line refusals and what differs from upstream:
docs/predictor.md#forecasting-kronospredictor.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch

from ..errors import ConfigError, DataError
from .forecast import (
    ForecastWarning,  # noqa: F401 - part of this module's interface
    check_cross_rope,
    check_horizon,
    check_max_context,
    check_models,
    decode_paths,
    generate_tokens,
)
from .sampling import check_sampling

PRICE_COLS = ["open", "high", "low", "close"]
VOL_COL, AMT_COL = "volume", "amount"
FEATURE_COLS = [*PRICE_COLS, VOL_COL, AMT_COL]
TIME_COLS = ["minute", "hour", "weekday", "day", "month"]
MIN_LOOKBACK = 2  # bars: each column is normalised by its standard deviation over the lookback


def as_datetimes(timestamps, what: str = "timestamps") -> pd.Series:
    """``timestamps`` (a Series, DatetimeIndex, list or array of datetimes, or ISO 8601 strings)
    as a Series of datetimes; numbers (epoch times) and other text are refused in one line."""
    if isinstance(timestamps, pd.Series):
        ts = timestamps
    elif isinstance(timestamps, (pd.Index, np.ndarray, list, tuple)):
        ts = pd.Series(timestamps)
    else:
        raise DataError(f"{what} is a {type(timestamps).__name__}; expected a pandas Series of datetimes (a "
                        "DatetimeIndex or a list of them works too)")
    if pd.api.types.is_datetime64_any_dtype(ts):
        return ts
    if pd.api.types.is_numeric_dtype(ts) or pd.api.types.is_bool_dtype(ts):
        raise DataError(f"{what} holds numbers ({ts.dtype}), not datetimes; expected a Series of datetimes "
                        "(pd.to_datetime(values, unit='s') reads epoch seconds)")
    expected = "expected a pandas Series of datetimes (or ISO 8601 strings such as 2024-03-01 09:30)"
    try:
        parsed = pd.to_datetime(ts, format="ISO8601", errors="coerce")
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. mixed time zones
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{what} cannot be read as datetimes ({first[:120]}); {expected}") from None
    unread = (parsed.isna() & ts.notna()).to_numpy()
    if unread.any():
        i = int(np.flatnonzero(unread)[0])
        raise DataError(f"{what} holds {str(ts.iloc[i])[:40]!r} at position {i}, which is not a datetime; {expected}")
    return parsed


def calc_time_stamps(x_timestamp) -> pd.DataFrame:
    """The five time features (minute, hour, weekday, day, month) of a Series of timestamps
    (a DatetimeIndex or a list of them works too)."""
    ts = as_datetimes(x_timestamp, "x_timestamp")
    return pd.DataFrame({
        "minute": ts.dt.minute, "hour": ts.dt.hour, "weekday": ts.dt.day_of_week, "day": ts.dt.day, "month": ts.dt.month,
    })


def _default_device() -> str:
    if torch.cuda.is_available():
        return "cuda:0"
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def check_device(device):
    """``device`` (None: ``cuda:0``, else ``mps``, else ``cpu``) when this machine has it; a
    one-line :class:`ConfigError` naming what it has otherwise (``cuda:7`` on a machine with one
    GPU or none, ``tpu``)."""
    if device is None:
        return _default_device()
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, numbers.Integral)):
        raise ConfigError(f"device is {device!r}; expected a device such as 'cpu', 'cuda', 'cuda:0' or 'mps'")
    try:
        dev = torch.device(device if not isinstance(device, numbers.Integral) else f"cuda:{int(device)}")
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"device {device!r} is not a device torch knows; expected 'cpu', 'cuda', 'cuda:N' or "
                          "'mps'") from None
    if dev.type == "cpu":
        return device
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "a CPU-only build of torch" if torch.version.cuda is None else "no CUDA GPU visible"
            raise ConfigError(f"device {device!r}: this machine has no CUDA GPU torch can use ({build}); expected "
                              "device 'cpu'")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device {device!r} does not exist: this machine has {count} CUDA GPU"
                              f"{'s' if count > 1 else ''} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}); "
                              "expected one of them or 'cpu'")
        return device
    if dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ConfigError(f"device {device!r}: this machine has no Apple GPU (MPS) torch can use; expected 'cpu'")
        return device
    raise ConfigError(f"device {device!r}: forecasting runs on 'cpu', 'cuda' or 'mps', not {dev.type}")


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
        check_models(model, tokenizer)
        max_context = check_max_context(max_context)
        if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not clip > 0:
            raise ConfigError(f"clip is {clip!r}; expected a positive number of standard deviations (upstream: 5)")
        check_cross_rope(cross_rope)
        device = check_device(device)
        self.max_context = max_context
        self.clip = clip
        self.price_cols = list(PRICE_COLS)
        self.vol_col = VOL_COL
        self.amt_vol = AMT_COL
        self.time_cols = list(TIME_COLS)
        self.kv_cache = bool(kv_cache)
        self.cross_rope = cross_rope
        self.eval_mode = bool(eval_mode)
        self.device = device
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
        wanted = [*self.price_cols, self.vol_col, self.amt_vol]
        twice = [c for c in wanted if (df.columns == c).sum() > 1]
        if twice:
            raise DataError(f"{where} has the column{'s' if len(twice) > 1 else ''} {', '.join(map(repr, twice))} more "
                            "than once; expected each of open, high, low, close, volume, amount at most once")
        missing = [c for c in self.price_cols if c not in df.columns]
        if missing:
            other = {str(c).strip().lower(): c for c in df.columns}
            near = [repr(other[c]) for c in missing if c in other]
            hint = f" (it has {', '.join(near)}: the names are lower-case, as upstream's)" if near else ""
            raise DataError(f"{where} has no column {', '.join(repr(c) for c in missing)}{hint}; expected the price "
                            f"columns {', '.join(self.price_cols)} (volume and amount are optional)")
        df = df.copy()
        for col in (c for c in wanted if c in df.columns):
            df[col] = _numbers(df[col], where, col)
        if self.vol_col not in df.columns:
            df[self.vol_col] = 0.0
            df[self.amt_vol] = 0.0
        if self.amt_vol not in df.columns:
            df[self.amt_vol] = df[self.vol_col] * df[self.price_cols].mean(axis=1)
        cols = wanted
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, refused below
                x = df[cols].to_numpy(dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: the columns {', '.join(cols)} must be numbers ({exc})") from None
        bad = ~np.isfinite(x)
        if bad.any():
            col = int(np.argmax(bad.any(axis=0)))
            row = int(np.argmax(bad[:, col]))
            raise DataError(
                f"{where} column {cols[col]!r} holds {int(bad[:, col].sum())} NaN or infinite values (the first at "
                f"row {row}); forecasting needs finite prices, volume and amount: fill or drop those rows (a number "
                "beyond float32, about 3.4e38, is infinite too)")
        if len(x) < MIN_LOOKBACK:
            raise DataError(f"{where} has {len(x)} row{'' if len(x) == 1 else 's'}; expected a lookback of at least "
                            f"{MIN_LOOKBACK} bars (each column is normalised by its standard deviation over the "
                            "lookback)")
        x_times = self._times(x_timestamp, len(x), f"x_timestamp of {where}", "one per row of the DataFrame")
        y_times = self._times(y_timestamp, pred_len, f"y_timestamp of {where}", "pred_len of them")
        _after(x_times, y_times, where)
        x_stamp, y_stamp = _stamps(x_times), _stamps(y_times)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused just below
            mean, std = np.mean(x, axis=0), np.std(x, axis=0)
        spread = ~(np.isfinite(mean) & np.isfinite(std))
        if spread.any():
            col = cols[int(np.argmax(spread))]
            raise DataError(f"{where} column {col!r} spans values too far apart for float32 statistics (its mean or "
                            "standard deviation over the lookback overflows); expected values within about 1e18 of "
                            "each other: rescale the column")
        x = np.clip((x - mean) / (std + 1e-5), -self.clip, self.clip)
        return x, x_stamp, y_stamp, mean, std

    @staticmethod
    def _times(timestamps, n: int, what: str, which: str) -> pd.Series:
        """The timestamps of one series as datetimes: ``n`` of them, none missing, increasing."""
        ts = as_datetimes(timestamps, what)
        if len(ts) != n:
            raise DataError(f"{what} has {len(ts)} timestamps; expected {n}, {which}")
        if ts.isna().any():
            raise DataError(f"{what} holds a missing timestamp (NaT); expected one datetime per bar")
        values = _instants(ts)
        step = np.diff(values)
        if (step <= np.timedelta64(0)).any():
            i = int(np.flatnonzero(step <= np.timedelta64(0))[0])
            a, b = ts.iloc[i], ts.iloc[i + 1]
            how = f"repeats {a}" if a == b else f"goes back from {a} to {b}"
            raise DataError(f"{what} {how} (positions {i} and {i + 1}); expected one timestamp per bar, in "
                            "increasing order")
        return ts

    def _batch(self, df_list, x_timestamp_list, y_timestamp_list, pred_len, T, top_k, top_p, sample_count):
        settings = check_sampling(pred_len, T, top_k, top_p, sample_count)
        check_horizon(settings[0], self.max_context)
        lists = (df_list, x_timestamp_list, y_timestamp_list)
        if not all(isinstance(v, (list, tuple)) for v in lists):
            raise DataError("df_list, x_timestamp_list and y_timestamp_list must be lists (or tuples)")
        if not len(df_list) == len(x_timestamp_list) == len(y_timestamp_list) or not df_list:
            raise DataError(f"df_list, x_timestamp_list and y_timestamp_list hold {len(df_list)}, "
                            f"{len(x_timestamp_list)} and {len(y_timestamp_list)} items; expected the same number, 1 or more")
        series = [self._prepare(df, xt, yt, settings[0], f"df_list[{i}]")
                  for i, (df, xt, yt) in enumerate(zip(*lists))]
        lengths = sorted({len(s[0]) for s in series})
        if len(lengths) > 1:
            raise DataError(f"the series have lookbacks of {lengths} rows; a batch needs one length (forecast "
                            "them in separate calls, or cut them to the shortest)")
        return series, settings

    def predict(self, df, x_timestamp, y_timestamp, pred_len, T=1.0, top_k=0, top_p=0.9, sample_count=1,
                verbose=True) -> pd.DataFrame:
        """The forecast of one series: a DataFrame of open, high, low, close, volume, amount with
        ``pred_len`` rows indexed by ``y_timestamp`` (the mean of ``sample_count`` paths)."""
        pred_len, T, top_k, top_p, sample_count = check_sampling(pred_len, T, top_k, top_p, sample_count)
        check_horizon(pred_len, self.max_context)
        x, x_stamp, y_stamp, mean, std = self._prepare(df, x_timestamp, y_timestamp, pred_len, "df")
        preds = self.generate(x[None], x_stamp[None], y_stamp[None], pred_len, T, top_k, top_p, sample_count, verbose)
        preds = preds[0] * (std + 1e-5) + mean
        return pd.DataFrame(preds, columns=[*self.price_cols, self.vol_col, self.amt_vol], index=y_timestamp)

    def predict_batch(self, df_list, x_timestamp_list, y_timestamp_list, pred_len, T=1.0, top_k=0, top_p=0.9,
                      sample_count=1, verbose=True) -> list[pd.DataFrame]:
        """:meth:`predict` for several series of one lookback length, in one batch; a list of
        DataFrames in the input's order."""
        series, (pred_len, T, top_k, top_p, sample_count) = self._batch(
            df_list, x_timestamp_list, y_timestamp_list, pred_len, T, top_k, top_p, sample_count)
        preds = self.generate(*(np.stack([s[i] for s in series]) for i in range(3)), pred_len, T, top_k, top_p,
                              sample_count, verbose)
        cols = [*self.price_cols, self.vol_col, self.amt_vol]
        return [pd.DataFrame(p * (s[4] + 1e-5) + s[3], columns=cols, index=y_ts)
                for p, s, y_ts in zip(preds, series, y_timestamp_list)]

    def predict_paths(self, df_list, x_timestamp_list, y_timestamp_list, pred_len, T=1.0, top_k=0, top_p=0.9,
                      sample_count=1, verbose=False) -> list[np.ndarray]:
        """Every sample path, not only their mean: per series an array (sample_count, pred_len, 6)
        of open, high, low, close, volume, amount in the input's units."""
        series, (pred_len, T, top_k, top_p, sample_count) = self._batch(
            df_list, x_timestamp_list, y_timestamp_list, pred_len, T, top_k, top_p, sample_count)
        z = self._sample(*(np.stack([s[i] for s in series]) for i in range(3)), pred_len, T, top_k, top_p,
                         sample_count, verbose)
        paths = z.cpu().numpy()[:, :, -pred_len:, :]
        return [p * (s[4] + 1e-5) + s[3] for p, s in zip(paths, series)]


def _numbers(column: pd.Series, where: str, name: str) -> pd.Series:
    """A price, volume or amount column as numbers it already holds: numeric dtypes as they are,
    an object column of real numbers through ``pd.to_numeric``, pandas' nullable numbers with
    their missing values as NaN; text, booleans, dates and complex numbers are refused."""
    dtype = column.dtype
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_complex_dtype(dtype):
        kind = "booleans" if pd.api.types.is_bool_dtype(dtype) else "complex numbers"
    elif pd.api.types.is_numeric_dtype(dtype):
        if isinstance(dtype, np.dtype):
            return column
        return pd.Series(column.to_numpy(dtype=np.float64, na_value=np.nan), index=column.index)
    elif dtype == object and pd.api.types.infer_dtype(column, skipna=True) in (
            "integer", "floating", "mixed-integer-float", "decimal", "empty"):
        return pd.to_numeric(column)
    else:
        kind = f"{pd.api.types.infer_dtype(column, skipna=True)} values" if dtype == object else f"{dtype} values"
    text = kind in ("string values", "str values") or pd.api.types.is_string_dtype(dtype)
    hint = f" (text converts with pd.to_numeric(df[{name!r}]))" if text else ""
    raise DataError(f"{where} column {name!r} holds {kind} (dtype {dtype}); expected numbers{hint}")


def _instants(ts: pd.Series) -> np.ndarray:
    """The instants of datetimes, for ordering: UTC for zone-aware ones."""
    if getattr(ts.dt, "tz", None) is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    return ts.to_numpy(dtype="datetime64[ns]")


def _after(x_times: pd.Series, y_times: pd.Series, where: str) -> None:
    """The forecast bars come after the lookback's, on one kind of clock."""
    zones = [getattr(t.dt, "tz", None) for t in (x_times, y_times)]
    if (zones[0] is None) != (zones[1] is None):
        raise DataError(f"x_timestamp of {where} is in time zone {zones[0] or 'none'} and y_timestamp in "
                        f"{zones[1] or 'none'}; expected both with a time zone or neither")
    if _instants(y_times)[0] <= _instants(x_times)[-1]:
        raise DataError(f"y_timestamp of {where} starts at {y_times.iloc[0]}, not after x_timestamp's last bar "
                        f"{x_times.iloc[-1]}; expected the forecast bars' times after the lookback's")


def _stamps(ts: pd.Series) -> np.ndarray:
    return calc_time_stamps(ts).to_numpy(dtype=np.float32)
