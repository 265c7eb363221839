"""Read Qlib once and cache the train/val/test splits in safe formats (numpy + JSON, no pickle):
``kronos-mlflow prepare``, and the front door every command passes before it reads data
(:func:`prepare_splits`). What is read, the cache and its key: docs/data.md#the-prepared-cache.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config.core import HELP, load_config, time_bounds, validate
from ..config.keys import BACKTEST, DATA
from ..config.sections import as_section, section, sections
from ..errors import DataError, UserError
from ..config.features import FEATURES, TIME_FEATURES, amount_from_ohlcv, time_features
from ..config.timeranges import cut_by_span, data_span, span_text
from . import provider as pv
from .demo import default_demo_calendar, default_demo_path, ensure_demo_market
from .qlib_read import QLIB_FIELDS, merge_spans, read_qlib  # noqa: F401 (QLIB_FIELDS, merge_spans: the data's names)

log = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 2
SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"


class DataWarning(UserWarning):
    """A usable but suspicious data situation (e.g. an empty validation split)."""


# ----------------------------------------------------------------------------------------------
# Config, paths, digests
# ----------------------------------------------------------------------------------------------

def validated(config: Mapping[str, Any]) -> dict[str, Any]:
    """Accept a full or partial config; return a validated one (cheap)."""
    return validate(dict(config))


def data_sections(data: Any, backtest: Any = None) -> tuple[Any, Any]:
    """``(data, backtest)``: the config's ``data`` section and its ``backtest`` section, whose
    ``backtest_time_range`` widens the span read (:func:`~kronos_mlflow.config.timeranges.data_span`).
    ``data``: the data section (``backtest`` then the backtest section, or None for its declared
    defaults) or a whole config, full or partial (validated here, both sections taken from it)."""
    if isinstance(data, Mapping):
        cfg = validated(data)
        return section(cfg, DATA), section(cfg, BACKTEST)
    return as_section(data, DATA), as_section({} if backtest is None else backtest, BACKTEST)


def _span_keys(data: Any, backtest: Any) -> dict[str, Any]:
    """The keys :mod:`kronos_mlflow.config.timeranges` reads the span from: the data section's
    and the backtest range."""
    return {**dataclasses.asdict(data), "backtest_time_range": backtest.backtest_time_range}


def resolve_qlib_path(data: Any) -> Path:
    """The provider directory to read: ``qlib_data_path`` (``~`` expanded, made absolute, checked)
    or, when it is empty, the cached demo market. Nothing is written here: the demo market is
    made by :func:`provide_qlib_data`, the front door every command passes before it reads data
    (:func:`prepare_splits`); a demo market not made yet is a one-line refusal. ``data``: the
    config's data section, or the whole config (every data function here takes either)."""
    data = as_section(data, DATA)
    raw = str(data.qlib_data_path or "").strip()
    freq = str(data.freq or "day")
    if not raw:
        path = default_demo_path(freq)
        if not (path / pv.calendar_file(freq)).is_file():
            raise DataError(f"qlib_data_path is empty and the demo market ({freq}) is not made yet at {path}; it is "
                            "made by the commands that prepare data (kronos-mlflow prepare, train, evaluate, pipeline) "
                            "or by kronos-mlflow demo-data; or set qlib_data_path to a Qlib directory")
        return path
    return pv.check_provider(Path(raw).expanduser().resolve(), freq=freq)


def demo_market_made(data: Any) -> bool:
    """Whether ``data`` reads the demo market (an empty ``qlib_data_path``) and it is made already."""
    data = as_section(data, DATA)
    freq = str(data.freq or "day")
    return not str(data.qlib_data_path or "").strip() and (default_demo_path(freq) /
                                                           pv.calendar_file(freq)).is_file()


def market_calendar(data: Any) -> np.ndarray:
    """The bars of the market ``config`` reads (``datetime64[s]``, ascending): its provider's
    ``calendars/<freq>.txt``, or the demo market's, computed when it is not made yet. Nothing is
    written (a command plans on it before its checks: :mod:`kronos_mlflow.training.preflight`)."""
    data = as_section(data, DATA)
    freq = str(data.freq or "day")
    if not str(data.qlib_data_path or "").strip() and not demo_market_made(data):
        lines = default_demo_calendar(freq)
    else:
        text = (resolve_qlib_path(data) / pv.calendar_file(freq)).read_text()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
    return np.array(lines, dtype="datetime64[s]")


def provide_qlib_data(data: Any) -> Path:
    """:func:`resolve_qlib_path`, making the cached demo market first when ``qlib_data_path`` is
    empty (once; safe under concurrent ranks): the one place data is generated."""
    data = as_section(data, DATA)
    if not str(data.qlib_data_path or "").strip():
        return ensure_demo_market(freq=str(data.freq or "day"))
    return resolve_qlib_path(data)


def _feature_indices(data: Any) -> tuple[list[int], list[int]]:
    feats, tfeats = [], []
    for name in data.feature_list:
        if name not in FEATURES:
            raise DataError(f"feature_list: '{name}' is not a known feature; accepted: {', '.join(FEATURES)}")
        feats.append(FEATURES.index(name))
    for name in data.time_feature_list:
        if name not in TIME_FEATURES:
            raise DataError(f"time_feature_list: '{name}' is not a known time feature; accepted: {', '.join(TIME_FEATURES)}")
        tfeats.append(TIME_FEATURES.index(name))
    return feats, tfeats


def _cache_key(data: Any, backtest: Any, path: Path) -> dict[str, Any]:
    span = data_span(_span_keys(data, backtest))
    return {
        "format": CACHE_FORMAT_VERSION,
        "qlib_data_path": str(path),
        "provider_fingerprint": pv.provider_fingerprint(path, data.freq),
        "freq": data.freq,
        "membership_gaps": data.membership_gaps,
        "instrument": data.instrument,
        # what is read, resolved: auto and the dates it stands for name one cache
        "dataset_begin_time": span[0],
        "dataset_end_time": span[1],
        "train_time_range": list(data.train_time_range),
        "val_time_range": list(data.val_time_range),
        "test_time_range": list(data.test_time_range),
        "lookback_window": data.lookback_window,
        "predict_window": data.predict_window,
        "feature_list": list(data.feature_list),
        "time_feature_list": list(data.time_feature_list),
    }


def data_digest(data: Any, *, backtest: Any = None) -> str:
    """sha256 (hex) of everything that determines the prepared splits; names the cache.
    ``data``, ``backtest``: as :func:`data_sections` takes them."""
    data, backtest = data_sections(data, backtest)
    return pv.digest_of(_cache_key(data, backtest, resolve_qlib_path(data)))


def cache_dir_for(data: Any, digest: str | None = None, *, backtest: Any = None) -> Path:
    data, backtest = data_sections(data, backtest)
    digest = digest or data_digest(data, backtest=backtest)
    return Path(data.dataset_path).expanduser().absolute() / f"kronos-{digest[:20]}"


# ----------------------------------------------------------------------------------------------
# Bar sanity (docs/hostile-input.md, Data sanity)
# ----------------------------------------------------------------------------------------------

BAD_BAR_REASONS = {"infinite": "an infinite price, volume or amount", "high_below_low": "high below low"}
_MAX_DROP_LINES = 20


def bar_sanity(full: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """Rows of ``full`` (open, high, low, close, vol, amt) to keep, and the bad bars by reason.

    A NaN is Qlib's own "no bar" (a suspension day, a symbol not yet listed): dropped and counted
    (``rows_dropped_nonfinite``), never reported per symbol. An infinite value, or a high below
    the low, is a damaged bar: dropped and reported (:func:`report_dropped_bars`)."""
    nan = np.isnan(full).any(axis=1)
    inf = np.isinf(full).any(axis=1) & ~nan
    high_below_low = ~nan & ~inf & (full[:, 1] < full[:, 2])
    keep = ~(nan | inf | high_below_low)
    bad = {name: int(n) for name, n in (("infinite", inf.sum()), ("high_below_low", high_below_low.sum())) if n}
    return keep, bad


def report_dropped_bars(dropped: Mapping[str, Mapping[str, int]], where: Path) -> None:
    """One :class:`DataWarning` line per symbol whose damaged bars were dropped (at most 20 lines,
    then one line counting the rest)."""
    symbols = sorted(dropped)
    for sym in symbols[:_MAX_DROP_LINES]:
        reasons = dropped[sym]
        n = sum(reasons.values())
        why = ", ".join(f"{k} with {BAD_BAR_REASONS[r]}" for r, k in sorted(reasons.items()))
        warnings.warn(f"{sym} in '{where}': {n} bar{'s' if n > 1 else ''} dropped ({why})", DataWarning, stacklevel=3)
    if len(symbols) > _MAX_DROP_LINES:
        rest = symbols[_MAX_DROP_LINES:]
        n = sum(sum(dropped[s].values()) for s in rest)
        warnings.warn(f"{len(rest)} more symbols in '{where}' had damaged bars dropped ({n} bars); the cache's "
                      "manifest.json lists them (stats.bars_dropped_by_symbol)", DataWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------------
# Building the splits
# ----------------------------------------------------------------------------------------------

class _NpyWriter:
    """Append rows to a ``.npy`` file without holding them: the header (a fixed 128 bytes) is
    written last, once the row count is known. ``np.load(..., mmap_mode="r")`` opens the result."""

    HEADER = 128

    def __init__(self, path: Path, dtype, tail: tuple[int, ...] = ()):
        self.path, self.dtype, self.tail = Path(path), np.dtype(dtype), tuple(tail)
        self.n = 0
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._fh.write(b"\0" * self.HEADER)

    def append(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr.shape[1:] != self.tail:
            raise ValueError(f"rows of shape {arr.shape[1:]} appended to {self.path.name} of rows {self.tail}")
        self._fh.write(arr.tobytes())
        self.n += len(arr)

    def close(self) -> None:
        import struct

        header = repr({"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                       "shape": (self.n, *self.tail)}).encode("latin1")
        room = self.HEADER - 10 - 1
        if len(header) > room:  # pragma: no cover - a shape of 20+ digit dimensions
            raise ValueError(f"header of {self.path.name} too long")
        self._fh.seek(0)
        self._fh.write(np.lib.format.magic(1, 0) + struct.pack("<H", self.HEADER - 10) + header
                       + b" " * (room - len(header)) + b"\n")
        self._fh.close()


def _append_to_splits(sym: str, feats: np.ndarray, stamps: np.ndarray, dates: np.ndarray, ranges: Mapping[str, Any],
                      window: int, writers: Mapping[str, Any], series: Mapping[str, Any]) -> None:
    """One series' rows inside each split's time range, appended to that split's files when
    they hold at least one window, with the start row of every window."""
    seconds = dates.astype("datetime64[s]")
    for split, (a, b) in ranges.items():
        i0, i1 = np.searchsorted(seconds, a, side="left"), np.searchsorted(seconds, b, side="right")
        if i1 - i0 >= window:
            w = writers[split]
            first = w["x"].n
            w["x"].append(feats[i0:i1])
            w["stamp"].append(stamps[i0:i1])
            w["dates"].append(dates[i0:i1])
            w["starts"].append(np.arange(first, first + (i1 - i0) - window + 1, dtype=np.int64))
            series[split]["symbols"].append(sym)
            series[split]["lengths"].append(int(i1 - i0))


def _write_offsets(out: Path, data: Any, writers: Mapping[str, Any],
                   series: Mapping[str, Any]) -> dict[str, Any]:
    """Each split's ``offsets.npy`` (each series' first row) and its summary for the manifest."""
    splits_info = {}
    for split in SPLITS:
        lengths = np.asarray(series[split]["lengths"], dtype=np.int64)
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        np.save(out / f"{split}_offsets.npy", offsets, allow_pickle=False)
        splits_info[split] = {
            "time_range": list(getattr(data, f"{split}_time_range")),
            "symbols": series[split]["symbols"],
            "rows": int(offsets[-1]),
            "windows": int(writers[split]["starts"].n),
        }
    return splits_info


def _check_windows(splits_info: Mapping[str, Any], data: Any, backtest: Any, path: Path, window: int) -> None:
    """No training window is an error; no validation or test window, a :class:`DataWarning`."""
    lookback, predict, freq = data.lookback_window, data.predict_window, data.freq
    inst, where = data.instrument, path
    unit = "trading days" if freq == "day" else f"{freq} bars"
    cfg = _span_keys(data, backtest)
    if splits_info["train"]["windows"] == 0:
        a, b = data.train_time_range
        raise DataError(
            f"no training windows: train_time_range {a}:{b} with instrument '{inst}' in '{where}' has no symbol with "
            f"{window} consecutive valid {unit} (lookback_window {lookback} + predict_window {predict} + 1)"
            f"{cut_by_span(cfg, 'train_time_range')}; widen train_time_range, choose another instrument, or shorten "
            "the windows"
        )
    for split in ("val", "test"):
        if splits_info[split]["windows"] == 0:
            a, b = getattr(data, f"{split}_time_range")
            effect = "training runs without the val split" if split == "val" else "a run's test verdict is unavailable"
            warnings.warn(
                f"no {split} windows: {split}_time_range {a}:{b} with instrument '{inst}' in '{where}' has no symbol "
                f"with {window} consecutive valid {unit}{cut_by_span(cfg, f'{split}_time_range')}; {effect}",
                DataWarning, stacklevel=4,
            )


def warn_empty_splits(cache_dir: Path, data: Any, *, backtest: Any = None) -> None:
    """The :class:`DataWarning` of each empty validation or test split of the complete cache at
    ``cache_dir`` (from its manifest), as preparing it said them: what a check says of a cache
    prepared earlier."""
    data, backtest = data_sections(data, backtest)
    manifest = read_manifest(cache_dir)
    _check_windows(manifest["splits"], data, backtest, resolve_qlib_path(data), int(manifest["window"]))


def _build(path: Path, data: Any, backtest: Any, out: Path, key: Mapping[str, Any], digest: str,
           progress: bool) -> dict:
    """Stream series from Qlib into per-split ``.npy`` files: memory holds one chunk of symbols,
    never the market (upstream Kronos ``finetune/qlib_data_preprocess.py``, vectorised).

    Per symbol: ``vol = $volume``, ``amt = mean(open, high, low, close) * vol``
    (:func:`~kronos_mlflow.config.features.amount_from_ohlcv`); rows with a NaN feature dropped and
    counted, damaged bars dropped (:func:`bar_sanity`), symbols shorter than one window (lookback +
    predict + 1 rows) dropped, calendar features (:func:`~kronos_mlflow.config.features.time_features`).
    Per split: each series' rows whose times lie in the split's range (a date as a range end covers
    all its bars) and the start row of every window of consecutive rows inside them (the ranges may
    overlap, as upstream's do), appended to the split's files as they come. Rows: ``x`` float32 (features), ``stamp`` uint8 (time features), ``dates``
    (bar times); ``starts`` int64 (each window's first row); ``offsets`` (each series' first row)."""
    t0 = time.perf_counter()
    lookback, predict = data.lookback_window, data.predict_window
    window = lookback + predict + 1
    fidx, tidx = _feature_indices(data)
    freq = data.freq
    date_dtype = "datetime64[D]" if freq == "day" else "datetime64[s]"
    ranges = {s: time_bounds(*getattr(data, f"{s}_time_range")) for s in SPLITS}
    span_keys = _span_keys(data, backtest)
    writers = {s: {"x": _NpyWriter(out / f"{s}_x.npy", np.float32, (len(fidx),)),
                   "stamp": _NpyWriter(out / f"{s}_stamp.npy", np.uint8, (len(tidx),)),
                   "dates": _NpyWriter(out / f"{s}_dates.npy", date_dtype),
                   "starts": _NpyWriter(out / f"{s}_starts.npy", np.int64)} for s in SPLITS}
    series = {s: {"symbols": [], "lengths": []} for s in SPLITS}
    stats = {"symbols_read": 0, "symbols_kept": 0, "symbols_dropped_short": 0, "series_read": 0, "series_kept": 0,
             "series_dropped_short": 0, "rows_read": 0, "rows_dropped_nonfinite": 0, "rows_kept": 0}
    seen: dict[str, bool] = {}  # symbol -> kept (some series long enough)
    dropped: dict[str, dict[str, int]] = {}  # symbol -> reason -> bad bars dropped (see bar_sanity)
    try:
        for sym, dates, raw in read_qlib(path, data.instrument, *data_span(span_keys), lookback, predict, progress,
                                         freq=freq, membership_gaps=data.membership_gaps, span=span_text(span_keys)):
            stats["series_read"] += 1
            seen.setdefault(sym, False)
            stats["rows_read"] += len(dates)
            o, h, lo, c, v = (raw[:, j] for j in range(5))
            with np.errstate(all="ignore"):  # an overflowing amount is an infinite value, dropped below
                full = np.stack([o, h, lo, c, v, amount_from_ohlcv(o, h, lo, c, v)], axis=1).astype(np.float32,
                                                                                                  copy=False)
                ok, bad = bar_sanity(full)
            stats["rows_dropped_nonfinite"] += int((~ok).sum()) - bad.get("high_below_low", 0)
            for reason, n in bad.items():
                stats[f"rows_dropped_{reason}"] = stats.get(f"rows_dropped_{reason}", 0) + n
                dropped.setdefault(sym, {}).setdefault(reason, 0)
                dropped[sym][reason] += n
            feats, dates = np.ascontiguousarray(full[ok][:, fidx]), dates[ok]
            if len(dates) < window:
                stats["series_dropped_short"] += 1
                continue
            seen[sym] = True
            stats["series_kept"] += 1
            stats["rows_kept"] += len(dates)
            stamps = time_features(dates.astype("datetime64[ns]"))[:, tidx].astype(np.uint8)
            _append_to_splits(sym, feats, stamps, dates, ranges, window, writers, series)
    finally:
        for w in writers.values():
            for f in w.values():
                f.close()
    stats["symbols_read"] = len(seen)
    stats["symbols_kept"] = sum(seen.values())
    stats["symbols_dropped_short"] = stats["symbols_read"] - stats["symbols_kept"]

    splits_info = _write_offsets(out, data, writers, series)
    report_dropped_bars(dropped, path)
    stats["bars_dropped_by_symbol"] = dropped
    _check_windows(splits_info, data, backtest, path, window)

    manifest = {
        "format": CACHE_FORMAT_VERSION,
        "digest": digest,
        "key": dict(key),
        "freq": freq,
        "membership_gaps": data.membership_gaps,
        "window": window,
        "feature_list": list(data.feature_list),
        "time_feature_list": list(data.time_feature_list),
        "stats": stats,
        "splits": splits_info,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest


def prepare_splits(data: Any, progress: bool = True, force: bool = False, *, backtest: Any = None) -> Path:
    """The commands' front door: :func:`cached_splits` after :func:`provide_qlib_data` (the demo
    market made first when ``qlib_data_path`` is empty). A demo market not made yet is made with
    the splits in a scratch folder, and both are moved into place once the splits are prepared:
    a refusal of the data (no training window, an unknown instrument) writes neither.
    ``data``, ``backtest``: as :func:`data_sections` takes them."""
    data, backtest = data_sections(data, backtest)
    if str(data.qlib_data_path or "").strip() or demo_market_made(data):
        return cached_splits(data, progress, force, path=provide_qlib_data(data), backtest=backtest)
    freq = str(data.freq or "day")
    scratch = Path(tempfile.mkdtemp(prefix="kronos-prepare-"))
    try:
        market = ensure_demo_market(freq=freq, home=scratch / "home")
        with said_at_home(market, freq):
            built = cached_splits(dataclasses.replace(data, qlib_data_path=str(market),
                                                      dataset_path=str(scratch / "cache")),
                                  progress, path=market, backtest=backtest)
        ensure_demo_market(freq=freq, made=market)  # the market in its place, its files' times kept
        final = adopt_cache(built, data, backtest=backtest)
        if final is None:  # another process put its own market there first: prepare from that one
            return cached_splits(data, progress, force, path=resolve_qlib_path(data), backtest=backtest)

        publish_cache(built, final)
        return final
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def said_at_home(made: Path, freq: str):
    """While the demo market is read from ``made`` (a scratch folder's copy), what is said of it
    (a refusal's line, the data's warnings) names its own place under ``KRONOS_MLFLOW_HOME``."""
    home = str(default_demo_path(freq))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        except UserError as exc:
            exc.args = tuple(str(a).replace(str(made), home) for a in exc.args)
            raise
        finally:
            said = list(caught)
    for w in said:
        warnings.warn_explicit(str(w.message).replace(str(made), home), w.category, w.filename, w.lineno)


def cached_splits(data: Any, progress: bool = True, force: bool = False, *,
                  path: Path | None = None, backtest: Any = None) -> Path:
    """Make sure the prepared splits for ``data`` (as :func:`data_sections` takes it, with
    ``backtest``) exist; return their cache directory.

    Reads Qlib (``path``, else :func:`resolve_qlib_path`: no data is generated here) only when no
    complete cache with the same digest exists (or ``force``). Safe when several processes call
    it at once: one builds, the others wait and reuse it.
    """
    data, backtest = data_sections(data, backtest)
    path = resolve_qlib_path(data) if path is None else path
    pv.check_instrument(path, data.instrument, data.freq)
    _feature_indices(data)
    key = _cache_key(data, backtest, path)
    digest = pv.digest_of(key)
    final = cache_dir_for(data, digest, backtest=backtest)

    def build(tmp: Path) -> None:
        _build(path, data, backtest, tmp, key, digest, progress)

    try:
        pv.build_once(final, build, lambda p: (p / MANIFEST).is_file(), force=force)
    except OSError as exc:
        raise DataError(f"dataset_path '{final.parent}' is not writable ({exc.strerror or exc}); "
                        "choose a writable dataset_path") from None
    return final


def publish_cache(built: Path, final: Path) -> None:
    """Move the complete cache prepared in ``built`` to ``final`` at once (never over a complete
    one: another process's, published first, is kept)."""

    def move(tmp: Path) -> None:
        for entry in built.iterdir():
            shutil.move(str(entry), str(tmp / entry.name))

    try:
        pv.build_once(final, move, lambda p: (p / MANIFEST).is_file())
    except OSError as exc:
        raise DataError(f"dataset_path '{final.parent}' is not writable ({exc.strerror or exc}); "
                        "choose a writable dataset_path") from None


def adopt_cache(built: Path, data: Any, *, backtest: Any = None) -> Path | None:
    """Where the splits in ``built`` belong for ``data``, when they were prepared from the same
    market files at another place (the demo market a command's checks made in a scratch folder,
    moved into place since): its manifest renamed to ``data``'s key. None when the files now at
    ``data``'s market differ from those (its run prepares its own splits)."""
    data, backtest = data_sections(data, backtest)
    path = resolve_qlib_path(data)
    key = _cache_key(data, backtest, path)
    manifest = read_manifest(built)
    if {**manifest.get("key", {}), "qlib_data_path": str(path)} != json.loads(json.dumps(key)):
        return None
    digest = pv.digest_of(key)
    manifest.update(key=key, digest=digest)
    (Path(built) / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return cache_dir_for(data, digest, backtest=backtest)


def read_manifest(cache_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(cache_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise DataError(f"prepared splits at '{cache_dir}' are missing or damaged; delete that directory "
                        "and run `kronos-mlflow prepare` again") from None


# ----------------------------------------------------------------------------------------------
# kronos-mlflow prepare
# ----------------------------------------------------------------------------------------------

_FLAGS = ("qlib_data_path", "freq", "membership_gaps", "instrument", "dataset_begin_time", "dataset_end_time", "train_time_range",
          "val_time_range", "test_time_range", "lookback_window", "predict_window", "dataset_path")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML config file (flags override it)")
    for key in _FLAGS:
        parser.add_argument("--" + key.replace("_", "-"), dest=key, default=None, metavar="VALUE", help=HELP[key])
    parser.add_argument("--force", action="store_true", help="rebuild the cache even when an identical one exists")


def run(args: argparse.Namespace) -> int:
    overrides = {k: getattr(args, k) for k in _FLAGS if getattr(args, k, None) is not None}
    cfg = load_config(overrides, path=args.config)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataWarning)
        settings = sections(cfg)
        out = prepare_splits(settings.data, progress=True, force=args.force, backtest=settings.backtest)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    m = read_manifest(out)
    s = m["stats"]
    src = resolve_qlib_path(settings.data)  # the market the manifest's key names
    print(f"prepared {settings.data.freq} splits of '{settings.data.instrument}' from {src} in "
          f"{time.perf_counter() - t0:.1f}s")
    print(f"  cache: {out}")
    print(f"  symbols: {s['symbols_kept']} kept, {s['symbols_dropped_short']} dropped (shorter than {m['window']} rows)")
    damaged = s.get("rows_dropped_infinite", 0) + s.get("rows_dropped_high_below_low", 0)
    missing = s["rows_dropped_nonfinite"] - s.get("rows_dropped_infinite", 0)
    print(f"  rows: {s['rows_kept']} kept, {missing} missing (NaN) and {damaged} damaged (inf, high below low) "
          "dropped")
    for split in SPLITS:
        info = m["splits"][split]
        a, b = info["time_range"]
        print(f"  {split:5s} {a}:{b}  {len(set(info['symbols'])):5d} symbols  {len(info['symbols']):5d} series  "
              f"{info['windows']:9d} windows")
    return 0
