"""The forecaster's computation: the tokenizer and predictor checkpoints in, sample paths and the
close's distribution out, usable without MLflow (:func:`load_forecaster`, :func:`forecast`); the
MLflow pyfunc (:class:`KronosForecasterPyfunc`, logged "from code" by ``forecaster_model.py``) is a
thin shell over them. Input, params, output, refusals: docs/serving.md#the-predictors-forecaster.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ...errors import ConfigError, DataError, UserError
from ..tokenizer_model import bad_input_as_invalid_parameter
from .quantiles import CLOSE, QLEVELS, Calibrator, histvol_sigma, path_quantiles

TOKENIZER_ARTIFACT = "tokenizer"
PREDICTOR_ARTIFACT = "predictor"
CALIBRATOR_ARTIFACT = "calibrator"  # a directory holding CALIBRATOR_FILE (absent in older models)
CALIBRATOR_FILE = "calibrator.json"
COLUMNS = ("open", "high", "low", "close", "volume", "amount")
INPUT_KEYS = ("bars", "timestamps")
# The sampling settings and their defaults (pred_len's default is the config's predict_window).
SAMPLING_DEFAULTS: dict[str, Any] = {"T": 1.0, "top_k": 0, "top_p": 0.9, "sample_count": 1, "seed": 0}
# The pyfunc's own setting: calibrated quantiles and p_up (where the model holds a calibrator).
SERVING_DEFAULTS: dict[str, Any] = {"calibrated": True}
PARAM_NAMES = ("pred_len", *SAMPLING_DEFAULTS, *SERVING_DEFAULTS)
_INPUT_SHAPE = '{"bars": (B, L, 6), "timestamps": (B, L + pred_len)}'


def load_forecaster(tokenizer_dir: str, predictor_dir: str, *, max_context: int = 512, clip: float = 5.0,
                    device: str | None = None):
    """A ``KronosPredictor`` over the two checkpoint directories (``config.json`` +
    ``model.safetensors`` each, loaded strictly); ``device`` None: KronosPredictor's choice."""
    from ...model import Kronos, KronosPredictor, KronosTokenizer  # lazy: torch, pandas

    tokenizer = KronosTokenizer.from_pretrained(tokenizer_dir)
    model = Kronos.from_pretrained(predictor_dir)
    return KronosPredictor(model, tokenizer, device=device, max_context=int(max_context), clip=float(clip))


def forecast_inputs(model_input: Any, pred_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bars float32 (B, L, 6), timestamps int64 (B, L + pred_len))`` of the input, checked."""
    if not isinstance(model_input, Mapping) or sorted(model_input) != sorted(INPUT_KEYS):
        got = sorted(model_input) if isinstance(model_input, Mapping) else type(model_input).__name__
        raise DataError(f"input is {got}; expected a dict {_INPUT_SHAPE}")
    from ...model.predictor import MIN_LOOKBACK  # lazy: torch, pandas

    bars = _numbers(model_input["bars"], "bars")
    if bars.ndim != 3 or bars.shape[-1] != len(COLUMNS) or bars.shape[0] < 1 or bars.shape[1] < MIN_LOOKBACK:
        raise DataError(f"bars of shape {bars.shape} are not lookback windows (B, L, 6) with B >= 1 and "
                        f"L >= {MIN_LOOKBACK}: {', '.join(COLUMNS)} per bar")
    with np.errstate(over="ignore", invalid="ignore"):
        bars32 = bars.astype(np.float32)
    bad = ~np.isfinite(bars32)
    if bad.any():
        series, bar, col = (int(i[0]) for i in np.nonzero(bad))
        raise DataError(f"bars hold {int(bad.sum())} NaN or infinite values (the first: series {series}, bar {bar}, "
                        f"{COLUMNS[col]}); forecasting needs finite prices, volume and amount (a number beyond "
                        "float32, about 3.4e38, is infinite too)")
    with np.errstate(over="ignore", invalid="ignore"):
        spread = ~(np.isfinite(bars32.mean(axis=1)) & np.isfinite(bars32.std(axis=1)))
    if spread.any():
        series, col = (int(i[0]) for i in np.nonzero(spread))
        raise DataError(f"bars of series {series}: {COLUMNS[col]} spans values too far apart for float32 statistics "
                        "(its mean or standard deviation over the lookback overflows); expected values within about "
                        "1e18 of each other: rescale that column")
    stamps = _numbers(model_input["timestamps"], "timestamps")
    batch, lookback = bars.shape[:2]
    want = (batch, lookback + pred_len)
    if stamps.shape != want:
        raise DataError(f"timestamps of shape {stamps.shape} do not fit bars {bars.shape} and pred_len {pred_len}; "
                        f"expected {want}: the {lookback} lookback bars' then the {pred_len} forecast bars' times")
    if not (np.isfinite(stamps).all() and np.array_equal(stamps, np.round(stamps))):
        raise DataError("timestamps hold a value that is not a whole number of seconds; expected seconds since "
                        "the epoch (UTC), e.g. 1704153600 for 2024-01-02")
    if np.abs(stamps).max() >= 2**62:
        raise DataError(f"timestamps from {stamps.min():.0f} to {stamps.max():.0f} are outside the datetimes pandas reads "
                        "(1677 to 2262); expected seconds since the epoch (UTC)")
    stamps = stamps.astype(np.int64)
    back = np.diff(stamps, axis=1) <= 0
    if back.any():
        series, i = (int(v[0]) for v in np.nonzero(back))
        what = "repeat" if stamps[series, i] == stamps[series, i + 1] else "go back"
        raise DataError(f"timestamps of series {series} {what} at positions {i} and {i + 1} ({stamps[series, i]}, "
                        f"{stamps[series, i + 1]}); expected each series' lookback then forecast bars' times in "
                        "increasing order, one per bar")
    return bars32, stamps


def _numbers(value: Any, name: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError:  # ragged nested lists
        array = None
    if array is None or array.dtype.kind not in "iuf":
        raise DataError(f"{name} is not a numeric array (ragged or not numbers); expected {_INPUT_SHAPE}")
    return array


def sampling_params(params: Mapping[str, Any] | None, pred_len_default: int) -> dict[str, Any]:
    """The sampling settings and ``calibrated``: ``params`` over the defaults, each checked
    (one-line errors)."""
    from ...model.sampling import check_sampling  # lazy: torch

    merged = {"pred_len": int(pred_len_default), **SAMPLING_DEFAULTS, **SERVING_DEFAULTS}
    for key, value in (params or {}).items():
        if key not in merged:
            raise ConfigError(f"unknown parameter {key!r}; the forecaster takes {', '.join(PARAM_NAMES)}")
        merged[key] = value.item() if isinstance(value, np.generic) else value
    check_sampling(merged["pred_len"], merged["T"], merged["top_k"], merged["top_p"], merged["sample_count"])
    seed = merged["seed"]
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**63:
        raise ConfigError(f"seed is {seed!r}; expected a whole number from 0 to 2**63 - 1 (one seed, one set of paths)")
    if not isinstance(merged["calibrated"], bool):
        raise ConfigError(f"calibrated is {merged['calibrated']!r}; expected true or false (false: the raw quantiles "
                          "and p_up of the sample paths)")
    return merged


@contextlib.contextmanager
def seeded(seed: int, device) -> Iterator[None]:
    """torch's generators seeded with ``seed`` inside, the caller's states restored after."""
    import torch

    kind = torch.device(device).type
    devices = list(range(torch.cuda.device_count())) if kind == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


def forecast(predictor, model_input: Any, pred_len: int, T: float = 1.0, top_k: int = 0, top_p: float = 0.9,
             sample_count: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Every sample path of each series and their mean, with ``predictor`` a ``KronosPredictor``;
    the settings are checked first. ``model_input``: ``bars`` ``(B, L, 6)`` raw open, high, low,
    close, volume, amount (any real dtype; float32 is what the model computes in) and
    ``timestamps`` ``(B, L + pred_len)`` whole seconds since the epoch (UTC). Returns ``paths``
    ``(B, sample_count, pred_len, 6)`` and ``mean`` ``(B, pred_len, 6)``, float32, in the input's
    units. The paths are drawn from torch's generator seeded with ``seed`` (the caller's generator
    state is restored afterwards): those of ``torch.manual_seed(seed)`` then
    ``KronosPredictor.predict_paths`` (docs/serving.md#the-predictors-forecaster)."""
    import pandas as pd

    settings = sampling_params({"T": T, "top_k": top_k, "top_p": top_p, "sample_count": sample_count,
                                "seed": seed}, pred_len)
    del settings["calibrated"]  # the pyfunc's, not the sampler's
    bars, stamps = forecast_inputs(model_input, settings["pred_len"])
    lookback = bars.shape[1]
    try:
        times = pd.to_datetime(stamps.ravel(), unit="s").to_numpy().reshape(stamps.shape)
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime):
        raise DataError(f"timestamps from {stamps.min()} to {stamps.max()} are outside the datetimes pandas reads "
                        "(1677 to 2262); expected seconds since the epoch (UTC)") from None
    frames = [pd.DataFrame(b, columns=list(COLUMNS)) for b in bars]
    with seeded(settings["seed"], predictor.device):
        paths = predictor.predict_paths(frames, [pd.Series(t[:lookback]) for t in times],
                                        [pd.Series(t[lookback:]) for t in times], settings["pred_len"],
                                        T=settings["T"], top_k=settings["top_k"], top_p=settings["top_p"],
                                        sample_count=settings["sample_count"], verbose=False)
    paths = np.stack(paths).astype(np.float32)
    return {"paths": paths, "mean": paths.mean(axis=1)}


def read_calibrator(path: str) -> Calibrator:
    """The calibrator of ``path`` (a ``calibrator.json`` or a directory holding one); anything
    else is a one-line :class:`UserError`."""
    file = os.path.join(path, CALIBRATOR_FILE) if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UserError(f"{file}: cannot read a calibrator ({exc}); expected the JSON that "
                        "evaluation/calibrator.json holds") from None
    if not isinstance(data, Mapping):
        raise UserError(f"{file}: holds {type(data).__name__}, not a calibrator; expected the JSON that "
                        "evaluation/calibrator.json holds")
    return Calibrator.from_json(data, source=file)


def close_distribution(paths: np.ndarray, bars: np.ndarray, calibrator: Calibrator | None = None
                       ) -> dict[str, np.ndarray]:
    """The close's distribution of sample paths ``(B, S, pred_len, 6)`` forecast from lookback
    ``bars`` ``(B, L, 6)``: ``quantiles`` ``(B, 13, pred_len)`` at ``quantile_levels``
    (:data:`~kronos_mlflow.serving.forecasting.quantiles.QLEVELS`, numpy's linear quantiles of the
    paths' closes), ``p_up`` ``(B,)`` (the share of paths whose last close is above the last
    bar's close; NaN with one path) and ``calibration`` ``(B,)``. With ``calibrator``, both go
    through it (:meth:`Calibrator.quantiles`, its sigma the std of the lookback's last 20 log
    returns of the close; :meth:`Calibrator.p_up`) and ``calibration`` is ``"calibrated"``;
    without, ``"raw"``."""
    close = np.asarray(paths, dtype=np.float64)[..., CLOSE]  # (B, S, H)
    history = np.asarray(bars, dtype=np.float64)[..., CLOSE]  # (B, L)
    last = history[:, -1]
    levels, p_up = path_quantiles(close, last)
    if calibrator is not None:
        levels = calibrator.quantiles(levels, last, histvol_sigma(history))
        p_up = np.where(np.isnan(p_up), np.nan, calibrator.p_up(p_up))  # one path states no probability
    state = "raw" if calibrator is None else "calibrated"
    return {"quantiles": levels, "quantile_levels": QLEVELS.astype(np.float64), "p_up": p_up,
            "calibration": np.full(len(levels), state)}


try:  # the class needs mlflow; the functions above do not
    import mlflow.pyfunc

    class KronosForecasterPyfunc(mlflow.pyfunc.PythonModel):
        """Loads both checkpoint directories, and the calibrator where the model holds one,
        from the model's artifacts; ``predict`` is :func:`forecast` and :func:`close_distribution`
        (docs/serving.md#the-predictors-forecaster). ``model_config``: ``pred_len`` (the
        default horizon), ``max_context``, ``clip``, ``device`` (absent: KronosPredictor's choice)."""

        def load_context(self, context):
            model_config = dict(getattr(context, "model_config", None) or {})
            self.pred_len = int(model_config.get("pred_len", 10))
            self.predictor = load_forecaster(
                context.artifacts[TOKENIZER_ARTIFACT], context.artifacts[PREDICTOR_ARTIFACT],
                max_context=int(model_config.get("max_context", 512)), clip=float(model_config.get("clip", 5.0)),
                device=model_config.get("device"))
            calibrator = (getattr(context, "artifacts", None) or {}).get(CALIBRATOR_ARTIFACT)
            self.calibrator = read_calibrator(calibrator) if calibrator else None  # None: a model logged without one

        # np.ndarray: MLflow infers no schema from this hint (the logged signature is the
        # schema; its inputs are left open so that predict's own checks answer bad input).
        def predict(self, context, model_input: np.ndarray, params: dict[str, Any] | None = None
                    ) -> dict[str, np.ndarray]:
            with bad_input_as_invalid_parameter():
                settings = sampling_params(params, self.pred_len)
                calibrated = settings.pop("calibrated")
                out = forecast(self.predictor, model_input, **settings)
                # the bars as the model read them (float32); forecast has checked them
                bars = np.asarray(model_input["bars"]).astype(np.float32)
                return {**out, **close_distribution(out["paths"], bars, self.calibrator if calibrated else None)}

except ImportError:  # pragma: no cover - mlflow is a dependency
    KronosForecasterPyfunc = None  # type: ignore[assignment]
