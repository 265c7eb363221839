"""The forecaster's computation: the tokenizer and predictor checkpoints in, sample paths and the
close's distribution out, usable without MLflow (:func:`load_forecaster`, :func:`forecast`); the
MLflow pyfunc (:class:`KronosForecasterPyfunc`, logged "from code" by ``forecaster_model.py``) is a
thin shell over them. Input, params, output, refusals: docs/serving.md#the-predictors-forecaster.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ...errors import ConfigError, DataError, UserError
from ..tokenizer_model import bad_input_as_invalid_parameter
from . import calibrator_file, head as return_head
from .ensemble import ARTIFACT as ENSEMBLE_ARTIFACT, check_forecaster
from .ensemble import close_distribution as ensemble_distribution, loaded as loaded_ensemble
from .quantiles import CLOSE, QLEVELS, Calibrator, histvol_sigma, path_quantiles, uncalibrated

TOKENIZER_ARTIFACT = "tokenizer"
PREDICTOR_ARTIFACT = "predictor"
CALIBRATOR_ARTIFACT = "calibrator"  # a directory holding CALIBRATOR_FILE (absent in older models)
CALIBRATOR_FILE = "calibrator.json"
COLUMNS = ("open", "high", "low", "close", "volume", "amount")
INPUT_KEYS = ("bars", "timestamps")
# The sampling settings and their defaults (pred_len's default is the config's predict_window).
SAMPLING_DEFAULTS: dict[str, Any] = {"T": 1.0, "top_k": 0, "top_p": 0.9, "sample_count": 1, "seed": 0}
# The pyfunc's own settings: calibrated quantiles and p_up (where the model holds a calibrator);
# which forecaster answers ('': the ensemble where the model holds one, else the calibrated one).
SERVING_DEFAULTS: dict[str, Any] = {"calibrated": True, "forecaster": ""}
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
    check_forecaster(merged["forecaster"])
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
    del settings["calibrated"], settings["forecaster"]  # the pyfunc's, not the sampler's
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


def read_calibrator(path: str, source: str | None = None) -> Calibrator:
    """The calibrator of ``path`` (a ``calibrator.json`` or a directory holding one), read and
    checked field by field by the one reader of handed-over files
    (:func:`kronos_mlflow.serving.forecasting.calibrator_file.read`); anything else is one line
    naming ``source`` (default: the file) and the field."""
    file = os.path.join(path, CALIBRATOR_FILE) if os.path.isdir(path) else path
    return calibrator_file.read(file, source or file)


NO_CALIBRATOR = "the model carries no calibrator (a run with calibration off, or an older model)"
NOT_ASKED = "calibrated: false asked for the paths' own quantiles and p_up"


def close_distribution(paths: np.ndarray, bars: np.ndarray, calibrator: Calibrator | None = None,
                       raw_reason: str = NO_CALIBRATOR) -> dict[str, np.ndarray]:
    """The close's distribution of sample paths ``(B, S, pred_len, 6)`` forecast from lookback
    ``bars`` ``(B, L, 6)``: ``quantiles`` ``(B, 13, pred_len)`` at ``quantile_levels``
    (:data:`~kronos_mlflow.serving.forecasting.quantiles.QLEVELS`, numpy's linear quantiles of the
    paths' closes), ``p_up`` ``(B,)`` (the share of paths whose last close is above the last
    bar's close; NaN with one path), ``calibration`` ``(B,)`` and ``calibration_note`` ``(B,)``.
    With ``calibrator``, a series whose lookback gives the volatility it scales by (the std of
    the last 20 log returns of the close, from at least
    :data:`~kronos_mlflow.serving.forecasting.quantiles.MIN_CALIBRATED_LOOKBACK` positive closes)
    goes through it (:meth:`Calibrator.quantiles`, :meth:`Calibrator.p_up`): ``calibration``
    ``"calibrated"``, note ''. Every other series is ``"raw"``, its note saying why (``raw_reason``
    without a calibrator)."""
    close = np.asarray(paths, dtype=np.float64)[..., CLOSE]  # (B, S, H)
    history = np.asarray(bars, dtype=np.float64)[..., CLOSE]  # (B, L)
    last = history[:, -1]
    levels, p_up = path_quantiles(close, last)
    note = np.full(len(levels), raw_reason if calibrator is None else "")
    if calibrator is not None:
        note = uncalibrated(history)
        ok = note == ""
        if ok.any():
            levels[ok] = calibrator.quantiles(levels[ok], last[ok], histvol_sigma(history[ok]))
            # one path states no probability
            p_up[ok] = np.where(np.isnan(p_up[ok]), np.nan, calibrator.p_up(p_up[ok]))
    state = np.where(note == "", "calibrated", "raw")
    return {"quantiles": levels, "quantile_levels": QLEVELS.astype(np.float64), "p_up": p_up,
            "calibration": state, "calibration_note": note}


#: the model_config keys the pyfunc reads from the model's MLmodel file, with their defaults
MODEL_CONFIG_DEFAULTS: dict[str, Any] = {"pred_len": 10, "max_context": 512, "clip": 5.0, "device": None}


def model_settings(model_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``model_config`` a logged forecaster's MLmodel file carries, checked (through the one
    reader's checks of handed-over values: :mod:`kronos_mlflow.tracking.handover`): ``pred_len``
    a whole number from 1 to 100,000 and ``max_context`` from 1 to 1,000,000, ``clip`` a number
    above 0 up to 1e30 (the config's bounds), ``device`` absent or text; else one line naming the
    field (other keys are left alone)."""
    from ...tracking import handover as hv  # lazy: the one reader of handed-over files

    source = "the model's MLmodel file"
    out = {**MODEL_CONFIG_DEFAULTS, **dict(model_config or {})}
    out["pred_len"] = hv.integer(out["pred_len"], source, "model_config.pred_len", 1, 100_000)
    out["max_context"] = hv.integer(out["max_context"], source, "model_config.max_context", 1, 1_000_000)
    out["clip"] = hv.number(out["clip"], source, "model_config.clip", 0.0, 1e30)
    if out["clip"] <= 0:
        raise UserError(f"{source}: model_config.clip is '{out['clip']}'; expected a number above 0")
    if out["device"] is not None:
        out["device"] = hv.text(out["device"], source, "model_config.device")
    return out


def loaded_calibrator(path: str) -> tuple[Calibrator | None, str]:
    """``(calibrator, '')`` of the model's calibrator artifact ``path``, or, when it is
    malformed, ``(None, why)``: a warning naming the file and the field, and the model answers
    raw (each answer's ``calibration_note`` says why), never a failed load."""
    try:
        return read_calibrator(path, f"the model's {CALIBRATOR_ARTIFACT}/{CALIBRATOR_FILE}"), ""
    except UserError as exc:
        why = f"{exc}: answered raw"
        warnings.warn(f"{exc}; the model answers raw quantiles and p_up", UserWarning, stacklevel=2)
        return None, why


try:  # the class needs mlflow; the functions above do not
    import mlflow.pyfunc

    class KronosForecasterPyfunc(mlflow.pyfunc.PythonModel):
        """Loads both checkpoint directories, and the calibrator where the model holds one,
        from the model's artifacts; ``predict`` is :func:`forecast` and :func:`close_distribution`
        (docs/serving.md#the-predictors-forecaster). ``model_config``: ``pred_len`` (the
        default horizon), ``max_context``, ``clip``, ``device`` (absent: KronosPredictor's choice)."""

        def load_context(self, context):
            settings = model_settings(getattr(context, "model_config", None))
            self.pred_len = settings["pred_len"]
            self.predictor = load_forecaster(
                context.artifacts[TOKENIZER_ARTIFACT], context.artifacts[PREDICTOR_ARTIFACT],
                max_context=settings["max_context"], clip=settings["clip"], device=settings["device"])
            calibrator = (getattr(context, "artifacts", None) or {}).get(CALIBRATOR_ARTIFACT)
            self.calibrator, self.raw_reason = None, NO_CALIBRATOR  # a model logged without one
            if calibrator:
                self.calibrator, self.raw_reason = loaded_calibrator(calibrator)
            ensemble = (getattr(context, "artifacts", None) or {}).get(ENSEMBLE_ARTIFACT)
            self.ensemble, self.ensemble_reason = loaded_ensemble(ensemble) if ensemble else (None, "")
            # the return head beside the backbone in predictor/ (a tokens+return run's): answers signal
            self.head, _ = return_head.load(context.artifacts[PREDICTOR_ARTIFACT], self.predictor.device)

        # np.ndarray: MLflow infers no schema from this hint (the logged signature is the
        # schema; its inputs are left open so that predict's own checks answer bad input).
        def predict(self, context, model_input: np.ndarray, params: dict[str, Any] | None = None
                    ) -> dict[str, np.ndarray]:
            with bad_input_as_invalid_parameter():
                settings = sampling_params(params, self.pred_len)
                calibrated = settings.pop("calibrated")
                which = settings.pop("forecaster") or ("ensemble" if self.ensemble is not None else "calibrated")
                if which == "ensemble" and self.ensemble is None and not self.ensemble_reason:
                    raise ConfigError("forecaster is 'ensemble' but the model carries no ensemble (a run with "
                                      "ensemble_rounds 0 or calibration off, or an older model); expected calibrated "
                                      "or raw")
                out = forecast(self.predictor, model_input, **settings)
                if getattr(self, "head", None) is not None:  # beside the paths: the head's signal
                    out["signal"] = return_head.signal(self.predictor, self.head, model_input["bars"],
                                                       model_input["timestamps"])
                # the bars as the model read them (float32); forecast has checked them
                bars = np.asarray(model_input["bars"]).astype(np.float32)
                if not calibrated or which == "raw":
                    dist = close_distribution(out["paths"], bars, None, NOT_ASKED if not calibrated else
                                              "forecaster: raw asked for the paths' own quantiles and p_up")
                elif which == "ensemble" and self.ensemble is not None:
                    return {**out, **ensemble_distribution(out["paths"], bars, self.ensemble)}
                else:  # calibrated, or an ensemble that did not load (its note says why)
                    dist = close_distribution(out["paths"], bars, self.calibrator,
                                              self.ensemble_reason if which == "ensemble" else self.raw_reason)
                    if which == "ensemble" and self.calibrator is None:
                        dist["calibration_note"] = np.full(len(bars), self.ensemble_reason)
                return {**out, **dist, "forecaster": dist["calibration"].copy()}

except ImportError:  # pragma: no cover - mlflow is a dependency
    KronosForecasterPyfunc = None  # type: ignore[assignment]
