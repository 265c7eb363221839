"""The built-in demo market: deterministic synthetic daily K-lines as a real Qlib directory
(``kronos-mlflow demo-data``, and the market a run reads when ``qlib_data_path`` is empty),
generated once into ``$KRONOS_MLFLOW_HOME/demo_market/`` (docs/data.md#the-demo-market).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..config.settings import home
from ..config.checks import integer, number, seed as check_seed
from . import provider as pv

GENERATOR_VERSION = 1
DEFAULT_SYMBOLS = 80
DEFAULT_SEED = 0
DEFAULT_START = "2010-01-04"
DEFAULT_END = "2025-06-30"
MAX_SYMBOLS = 5000
MAX_SIGNAL = 1.0  # --signal's largest strength
SIGNAL_LOOKBACK = 30  # days of the planted signal's feature (the trailing return it ranks)
FIELDS = ("open", "high", "low", "close", "volume", "amount", "vwap", "factor")
UNIVERSE = "csi300"
BENCHMARK = "SH000300"  # upstream's benchmark of csi300


@dataclass
class DemoMarket:
    calendar: list[str]  # YYYY-MM-DD
    series: list[pv.SymbolSeries]  # each over [start, end] of the calendar, NaN on suspension days
    universes: dict[str, list[str]]  # name -> symbols
    benchmark: pv.SymbolSeries | None = None  # an index of the UNIVERSE members (daily markets)

    def spans(self, name: str) -> list[tuple[str, str, str]]:
        members = set(self.universes[name])
        return [(s.symbol, self.calendar[s.start], self.calendar[s.end]) for s in self.series if s.symbol in members]


def kronos_home() -> Path:
    """``$KRONOS_MLFLOW_HOME`` or ``~/.cache/kronos_mlflow`` (a malformed value is refused:
    :mod:`kronos_mlflow.config.settings`)."""
    return home()


def _business_days(start: str, end: str) -> list[str]:
    import pandas as pd

    try:
        a, b = pd.Timestamp(start), pd.Timestamp(end)
    except (ValueError, TypeError):
        raise DataError(f"demo market dates '{start}'..'{end}' are not dates; expected YYYY-MM-DD") from None
    if a > b:
        raise DataError(f"demo market start {start} is after end {end}; expected START <= END")
    days = pd.bdate_range(a, b)
    return [d.strftime("%Y-%m-%d") for d in days]


def _garch(rng: np.random.Generator, n_days: int, n: int, sigma: np.ndarray, alpha: np.ndarray,
           beta: np.ndarray, dof: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GARCH(1,1) returns with unit-variance Student-t shocks: (returns, conditional vols), (T, n)."""
    shocks = rng.standard_t(dof, size=(n_days, n)) / np.sqrt(dof / (dof - 2.0))
    omega = sigma**2 * (1.0 - alpha - beta)
    var = sigma**2 * np.ones(n)
    ret = np.empty((n_days, n))
    vol = np.empty((n_days, n))
    for t in range(n_days):
        s = np.sqrt(var)
        vol[t] = s
        ret[t] = s * shocks[t]
        var = omega + alpha * ret[t] ** 2 + beta * var
    return ret, vol


def _check_size(n_symbols: int, seed: int) -> None:
    integer("--symbols", n_symbols, 1, MAX_SYMBOLS, error=DataError)
    check_seed("--seed", seed, error=DataError)


def _listing_spans(rng: np.random.Generator, T: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each symbol's first and last calendar index: late listings, delistings; symbol 1 is
    always late, 2 always delisted, so even a tiny market has both (and both are in csi300)."""
    starts = np.zeros(n, dtype=int)
    ends = np.full(n, T - 1, dtype=int)
    late = rng.random(n) < 0.25
    dead = rng.random(n) < 0.12
    if n > 1:
        late[1] = True
    if n > 2:
        dead[2] = True
    starts[late] = (rng.uniform(0.05, 0.6, late.sum()) * T).astype(int)
    dead_end = (rng.uniform(0.55, 0.95, n) * T).astype(int)
    ends[dead] = np.maximum(dead_end[dead], np.minimum(starts[dead] + T // 4, T - 1))
    ends = np.minimum(ends, T - 1)
    if n > 3:  # a recent listing: shorter than a default window (101 days), so prepare drops it
        starts[3], ends[3] = max(0, T - 60), T - 1
    return starts, ends


def _symbol_series(rng: np.random.Generator, name: str, i: int, a: int, b: int,
                   fields_all: dict[str, np.ndarray]) -> pv.SymbolSeries:
    """Symbol ``i``'s columns over calendar days ``a..b``, float32, with suspension spells:
    interior days with no trade (NaN in every field), at least one for symbol 0."""
    length = b - a + 1
    suspended = np.zeros(length, dtype=bool)
    k = rng.poisson(length / 500.0) + (1 if i == 0 else 0)
    for _ in range(k):
        if length < 10:
            break
        d0 = int(rng.integers(1, length - 2))
        d1 = min(length - 1, d0 + int(rng.geometric(0.25)))
        suspended[d0:d1] = True
    fields = {}
    for field_name, arr in fields_all.items():
        col = arr[a : b + 1, i].astype(np.float32)
        col[suspended] = np.nan
        fields[field_name] = col
    factor = np.ones(length, dtype=np.float32)
    factor[suspended] = np.nan
    fields["factor"] = factor
    return pv.SymbolSeries(name, a, fields)


def generate_demo_market(n_symbols: int = DEFAULT_SYMBOLS, seed: int = DEFAULT_SEED,
                         start: str = DEFAULT_START, end: str = DEFAULT_END, signal: float = 0.0) -> DemoMarket:
    """The market as arrays (deterministic in its arguments), built to look like daily A-share
    data to a model, not to be tradeable:

    - log returns = beta x market factor + idiosyncratic part, each a GARCH(1,1) process driven by
      unit-variance Student-t shocks (volatility clustering, fat tails);
    - opens gap from the previous close; highs/lows extend beyond max/min(open, close);
    - volume rises with the day's absolute return (plus an AR(1) liquidity factor);
    - amount = vwap x volume with vwap inside [low, high]; factor = 1.0 (prices are "adjusted");
    - about a quarter of the symbols list late (one only 60 days before the end), about one in
      eight is delisted before the end, and suspension spells leave NaN days inside a series
      (as Qlib stores them);
    - ``csi300`` is a fixed three-quarter subset of ``all`` (same listing spans);
    - :data:`BENCHMARK` (upstream's benchmark for csi300, in no instrument file) is an index of
      the csi300 members (:func:`benchmark_series`); only its ``close`` is stored;
    - ``signal`` > 0 plants a cross-sectional signal (:func:`plant_signal`); at 0 the market is
      the plain one, byte for byte (the signal draws no random numbers).
    """
    _check_size(n_symbols, seed)
    signal = check_signal(signal)
    n = int(n_symbols)
    calendar = _business_days(start, end)
    T = len(calendar)
    if T < 30:
        raise DataError(f"demo market {start}..{end} has {T} business days; expected at least 30")
    rng = np.random.default_rng([GENERATOR_VERSION, int(seed), n])

    # Market factor and idiosyncratic parts: GARCH(1,1) with Student-t shocks.
    m_ret, _ = _garch(rng, T, 1, np.array([0.011]), np.array([0.08]), np.array([0.90]), np.array([5.0]))
    sigma = rng.uniform(0.012, 0.026, n)
    alpha = rng.uniform(0.05, 0.11, n)
    beta_g = rng.uniform(0.85, 0.93, n).clip(max=0.985 - alpha)
    dof = rng.uniform(3.5, 7.0, n)
    i_ret, i_vol = _garch(rng, T, n, sigma, alpha, beta_g, dof)
    mkt_beta = rng.uniform(0.6, 1.3, n)
    drift = rng.normal(0.0002, 0.0003, n)
    ret = drift + mkt_beta * m_ret + i_ret  # (T, n) close-to-close log return
    cond_vol = np.sqrt((mkt_beta * 0.011) ** 2 + i_vol**2)
    if signal > 0:
        ret = plant_signal(ret, cond_vol, signal)

    # Prices: open gaps from the previous close, the rest of the day moves to the close.
    close = np.exp(np.log(rng.lognormal(np.log(15.0), 0.7, n)) + np.cumsum(ret, axis=0))
    prev_close = np.vstack([close[:1] / np.exp(ret[:1]), close[:-1]])
    gap = 0.3 * cond_vol * rng.standard_t(5, size=(T, n)) / np.sqrt(5 / 3)
    open_ = prev_close * np.exp(gap)
    wick = cond_vol * 0.5
    high = np.maximum(open_, close) * np.exp(wick * np.abs(rng.standard_normal((T, n))))
    low = np.minimum(open_, close) * np.exp(-wick * np.abs(rng.standard_normal((T, n))))
    w = rng.uniform(0.2, 0.8, (T, n))
    vwap = np.clip(w * (high + low) / 2 + (1 - w) * (open_ + close) / 2, low, high)

    # Volume: a per-symbol base, an AR(1) liquidity factor, and a response to |return|.
    liq = np.empty((T, n))
    noise = rng.normal(0.0, 0.2, (T, n))
    liq[0] = noise[0]
    for t in range(1, T):
        liq[t] = 0.8 * liq[t - 1] + noise[t]
    base = rng.lognormal(np.log(2e6), 1.0, n)
    volume = np.round(base * np.exp(liq + 0.45 * np.abs(ret - drift) / sigma)).clip(min=100.0)
    amount = vwap * volume

    starts, ends = _listing_spans(rng, T, n)
    fields_all = {"open": open_, "high": high, "low": low, "close": close, "volume": volume,
                  "amount": amount, "vwap": vwap}
    width = max(3, len(str(n)))
    names = [f"DEMO{i:0{width}d}" for i in range(n)]
    series = [_symbol_series(rng, names[i], i, int(starts[i]), int(ends[i]), fields_all) for i in range(n)]
    k = max(1, round(0.75 * n)) if n > 1 else 1
    members = sorted(names[:k])
    return DemoMarket(calendar=calendar, series=series, universes={"all": names, UNIVERSE: members},
                      benchmark=benchmark_series([s for s in series if s.symbol in set(members)], T))


def check_signal(signal) -> float:
    """``--signal`` as a float in [0, :data:`MAX_SIGNAL`]; else one line (DataError, exit 2)."""
    return number("--signal", signal, 0.0, MAX_SIGNAL, error=DataError)


def signal_feature(ret: np.ndarray, t: int) -> np.ndarray:
    """The planted signal's feature on day ``t`` (n,): each symbol's cross-sectional rank of its
    log return over the :data:`SIGNAL_LOOKBACK` days ending at day ``t - 1``'s close, scaled to
    zero mean and unit variance across symbols (``+sqrt(3)`` the best, ``-sqrt(3)`` the worst)."""
    past = ret[max(0, t - SIGNAL_LOOKBACK) : t].sum(axis=0)
    n = past.shape[0]
    if n < 2:
        return np.zeros(n)
    ranks = np.argsort(np.argsort(past, kind="stable"), kind="stable").astype(np.float64)
    return (ranks / (n - 1) - 0.5) * np.sqrt(12.0)


def plant_signal(ret: np.ndarray, cond_vol: np.ndarray, strength: float) -> np.ndarray:
    """``ret`` (T, n) with a momentum signal planted, day by day: from day :data:`SIGNAL_LOOKBACK`
    on, day ``t``'s log return gains ``strength x cond_vol[t] x feature[t]``, the feature
    (:func:`signal_feature`) read from the (already tilted) returns up to day ``t - 1``: what a
    trader knows at the previous close. A day's tilt is ``strength`` of the symbol's own
    volatility, so its one-day rank IC is about ``strength`` and a horizon's sums it over the days.
    Symbols before their listing count in the ranks (their returns exist, unstored)."""
    out = np.array(ret, dtype=np.float64, copy=True)
    for t in range(SIGNAL_LOOKBACK, out.shape[0]):
        out[t] += strength * cond_vol[t] * signal_feature(out, t)
    return out


def benchmark_series(members: list[pv.SymbolSeries], n_days: int) -> pv.SymbolSeries:
    """:data:`BENCHMARK` over the whole calendar: the equal-weight mean of the members'
    close-to-close returns on each day (a member counts on a day it and the day before
    traded), compounded from 1000; 0 on a day no member has a return. Computed from the
    stored float32 closes, so it draws no random numbers."""
    total = np.zeros(n_days)
    count = np.zeros(n_days)
    for s in members:
        c = s.fields["close"].astype(np.float64)
        r = c[1:] / c[:-1] - 1.0
        ok = np.isfinite(r)
        total[s.start + 1 : s.end + 1][ok] += r[ok]
        count[s.start + 1 : s.end + 1][ok] += 1
    mean = np.divide(total, count, out=np.zeros(n_days), where=count > 0)
    level = (1000.0 * np.cumprod(1.0 + mean)).astype(np.float32)
    return pv.SymbolSeries(BENCHMARK, 0, {"close": level})


def _write_market(root: Path, market: DemoMarket, progress: bool = False) -> None:
    pv.write_calendar(root, market.calendar)
    for name in market.universes:
        pv.write_instruments(root, name, market.spans(name))
    items = market.series
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="demo market", unit="symbol", leave=False, disable=None)
    for s in items:
        pv.write_series(root, s)
    if market.benchmark is not None:
        pv.write_series(root, market.benchmark)


def write_demo_market(out, n_symbols: int | None = None, seed: int = DEFAULT_SEED, *,
                      start: str | None = None, end: str = DEFAULT_END, force: bool = False,
                      progress: bool = False, freq: str = "day", signal: float = 0.0) -> Path:
    """Write the demo market as a Qlib directory at ``out`` (atomically); return its path.

    ``out`` must be missing or empty unless ``force``. ``freq`` other than ``day`` writes an
    intraday market (:func:`generate_intraday_market`); ``signal``: a daily market's planted
    signal's strength (:func:`plant_signal`).
    """
    if freq == "day":
        market = generate_demo_market(DEFAULT_SYMBOLS if n_symbols is None else n_symbols, seed, start or DEFAULT_START,
                                      end, signal)
    else:
        market = generate_intraday_market(freq, INTRADAY_DEFAULT_SYMBOLS if n_symbols is None else n_symbols, seed,
                                          start or INTRADAY_DEFAULT_START, end)
    final = Path(out).expanduser().absolute()
    with pv.atomic_output_dir(final, force=force) as tmp:
        (_write_market if freq == "day" else _write_intraday)(tmp, market, progress)
    return final


def demo_market_path(n_symbols: int = DEFAULT_SYMBOLS, seed: int = DEFAULT_SEED, freq: str = "day", *,
                     home: Path | None = None, signal: float = 0.0) -> Path:
    """Where the demo market of these arguments is kept under ``home`` (default :func:`kronos_home`);
    a planted signal's market in a folder of its own (``...-signal0.05``)."""
    tail = "" if freq == "day" else f"-{freq}"
    if signal:
        tail += f"-signal{float(signal):g}"
    root = kronos_home() if home is None else Path(home)
    return root / "demo_market" / f"v{GENERATOR_VERSION}-n{int(n_symbols)}-seed{int(seed)}{tail}"


def default_demo_path(freq: str = "day", *, home: Path | None = None) -> Path:
    """Where :func:`ensure_demo_market` keeps the default demo market of ``freq`` (made or not)."""
    return demo_market_path(DEFAULT_SYMBOLS if freq == "day" else INTRADAY_DEFAULT_SYMBOLS, DEFAULT_SEED, freq,
                            home=home)


def default_demo_calendar(freq: str = "day") -> list[str]:
    """The calendar of the default demo market of ``freq`` (its ``calendars/<freq>.txt`` lines),
    computed without generating or writing the market."""
    if freq == "day":
        return _business_days(DEFAULT_START, DEFAULT_END)
    if freq not in INTRADAY_FREQS:
        raise DataError(f"--freq '{freq}' is not a demo frequency; expected day, {', '.join(INTRADAY_FREQS)}")
    minutes = session_minutes(freq)
    return [f"{d} {m}:00" for d in _business_days(INTRADAY_DEFAULT_START, DEFAULT_END) for m in minutes]


def ensure_demo_market(n_symbols: int | None = None, seed: int = DEFAULT_SEED, progress: bool = False,
                       freq: str = "day", *, home: Path | None = None, made: Path | None = None,
                       signal: float = 0.0) -> Path:
    """The cached default demo market, generated on first use (safe under concurrent ranks), under
    ``home`` (default :func:`kronos_home`). ``made``: the same market made elsewhere (in a scratch
    folder, while a command's checks ran), moved into place instead of generated again (its
    files keep their times, so data prepared from it keeps its fingerprint)."""
    if n_symbols is None:
        n_symbols = DEFAULT_SYMBOLS if freq == "day" else INTRADAY_DEFAULT_SYMBOLS
    _check_size(n_symbols, seed)
    signal = check_signal(signal)
    if signal and freq != "day":
        raise DataError(f"--signal {signal:g} plants a signal in a daily market only; expected --freq day or --signal 0")
    final = demo_market_path(n_symbols, seed, freq, home=home, signal=signal)

    def build(tmp: Path) -> None:
        if made is not None:
            import shutil

            for entry in Path(made).iterdir():
                shutil.move(str(entry), str(tmp / entry.name))
        elif freq == "day":
            _write_market(tmp, generate_demo_market(n_symbols, seed, signal=signal), progress)
        else:
            _write_intraday(tmp, generate_intraday_market(freq, n_symbols, seed), progress)

    try:
        pv.build_once(final, build, lambda p: (p / pv.calendar_file(freq)).is_file())
        if freq == "day":
            _add_benchmark(final)
    except OSError as exc:
        raise DataError(
            f"cannot write the demo market under '{final.parent}' ({exc.strerror or exc}); "
            "set KRONOS_MLFLOW_HOME to a writable directory"
        ) from None
    return final


def _add_benchmark(root: Path) -> None:
    """Write :data:`BENCHMARK` into a cached market made before it had one, from the stored
    closes (the same file a fresh generation writes); the other files stay as they are.
    The folder is written aside and renamed into place, so concurrent ranks are safe."""
    import shutil
    import uuid

    target = root / pv.FEATURES_DIR / BENCHMARK.lower()
    if target.is_dir():
        return
    members = []
    for symbol in sorted(pv.read_instrument_file(root, UNIVERSE)):
        start, close = pv.read_series(root, symbol, "close")
        members.append(pv.SymbolSeries(symbol, start, {"close": close}))
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    try:
        pv.write_series(tmp, benchmark_series(members, pv.calendar_length(root)))
        try:
            os.rename(tmp / pv.FEATURES_DIR / BENCHMARK.lower(), target)
        except OSError:
            if not target.is_dir():  # another process won the race: its copy is the same
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# kronos-mlflow demo-data
# ----------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None,
                        help="directory to write (must be missing or empty); default: the shared cache "
                             "used when qlib_data_path is empty")
    parser.add_argument("--freq", default="day", choices=("day", *INTRADAY_FREQS),
                        help="bar frequency: day, or intraday bars in two sessions a day (default day)")
    parser.add_argument("--symbols", default=None,
                        help=f"number of symbols (default {DEFAULT_SYMBOLS}; intraday {INTRADAY_DEFAULT_SYMBOLS})")
    parser.add_argument("--seed", default=DEFAULT_SEED, help=f"random seed, 0 to 2^32-1 (default {DEFAULT_SEED})")
    parser.add_argument("--start", default=None,
                        help=f"first calendar day (default {DEFAULT_START}; intraday {INTRADAY_DEFAULT_START})")
    parser.add_argument("--end", default=DEFAULT_END, help=f"last calendar day (default {DEFAULT_END})")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    parser.add_argument("--signal", default=0.0,
                        help=f"plant a cross-sectional momentum signal of this strength, 0 to {MAX_SIGNAL:g} "
                             "(daily bars; each day's return tilted by strength x its volatility x the rank "
                             f"of its past {SIGNAL_LOOKBACK} days' return; default 0: the plain market)")


def run(args: argparse.Namespace) -> int:
    import time

    t0 = time.perf_counter()
    symbols = args.symbols if args.symbols is not None else (
        DEFAULT_SYMBOLS if args.freq == "day" else INTRADAY_DEFAULT_SYMBOLS)
    symbols = integer("--symbols", symbols, 1, MAX_SYMBOLS, error=DataError)
    args.seed = check_seed("--seed", args.seed, error=DataError)
    signal = check_signal(args.signal)
    if signal and args.freq != "day":
        raise DataError(f"--signal {signal:g} plants a signal in a daily market only; expected --freq day or --signal 0")
    if args.out is None:
        if (args.start, args.end) != (None, DEFAULT_END):
            raise DataError("--start/--end need --out; the shared demo cache always uses the default dates")
        _check_size(symbols, args.seed)
        path = ensure_demo_market(symbols, args.seed, progress=True, freq=args.freq, signal=signal)
    else:
        path = write_demo_market(args.out, symbols, args.seed, start=args.start, end=args.end,
                                 force=args.force, progress=True, freq=args.freq, signal=signal)
    planted = f", signal {signal:g}" if signal else ""
    print(f"demo market ({symbols} symbols, {args.freq} bars, seed {args.seed}{planted}) at {path} "
          f"[{time.perf_counter() - t0:.1f}s]; instruments: all, {UNIVERSE}")
    return 0


# ----------------------------------------------------------------------------------------------
# Intraday demo markets (1- to 60-minute bars)
# ----------------------------------------------------------------------------------------------

INTRADAY_FREQS = {"1min": 1, "5min": 5, "15min": 15, "30min": 30, "60min": 60}
INTRADAY_DEFAULT_SYMBOLS = 12
INTRADAY_DEFAULT_START = "2022-07-01"
# Two trading sessions (A-share hours); a bar is stamped with its closing minute, as Qlib's
# minute data is, so the lunch break and the night lie between two consecutive bars.
SESSIONS = (("09:30", "11:30"), ("13:00", "15:00"))


def session_minutes(freq: str) -> list[str]:
    """``HH:MM`` stamps of one day's bars at ``freq`` (``09:35 .. 11:30, 13:05 .. 15:00`` at 5min)."""
    step = INTRADAY_FREQS[freq]
    out = []
    for a, b in SESSIONS:
        t0 = int(a[:2]) * 60 + int(a[3:])
        t1 = int(b[:2]) * 60 + int(b[3:])
        out.extend(f"{m // 60:02d}:{m % 60:02d}" for m in range(t0 + step, t1 + 1, step))
    return out


def generate_intraday_market(freq: str, n_symbols: int = INTRADAY_DEFAULT_SYMBOLS, seed: int = DEFAULT_SEED,
                             start: str = INTRADAY_DEFAULT_START, end: str = DEFAULT_END) -> DemoMarket:
    """A demo market of ``freq`` bars over the business days ``start..end``, two sessions a day.

    Per bar: log returns with a U-shaped intraday volatility (busy open and close), Student-t
    shocks and an overnight gap at each day's first bar; high/low beyond max/min(open, close);
    volume following the same U shape and the bar's absolute return. Symbol 1 lists late, symbol
    2 is delisted, and symbol 0 leaves ``csi300`` for a third of the period and comes back (two
    membership spans).
    """
    if freq not in INTRADAY_FREQS:
        raise DataError(f"--freq '{freq}' is not a demo frequency; expected day, {', '.join(INTRADAY_FREQS)}")
    _check_size(n_symbols, seed)
    n = int(n_symbols)
    days = _business_days(start, end)
    minutes = session_minutes(freq)
    per_day = len(minutes)
    if len(days) < 5:
        raise DataError(f"demo market {start}..{end} has {len(days)} business days; expected at least 5")
    calendar = [f"{d} {m}:00" for d in days for m in minutes]
    T = len(calendar)
    rng = np.random.default_rng([GENERATOR_VERSION, int(seed), n, INTRADAY_FREQS[freq]])
    pos = np.tile(np.linspace(-1.0, 1.0, per_day), len(days))
    shape = 0.7 + 0.8 * pos**2  # U-shaped activity over the day
    daily_vol = rng.uniform(0.012, 0.026, n)
    bar_vol = daily_vol / np.sqrt(per_day)
    shocks = rng.standard_t(5.0, size=(T, n)) / np.sqrt(5.0 / 3.0)
    ret = shocks * bar_vol * shape[:, None]
    ret[::per_day] += 0.3 * daily_vol * rng.standard_normal((len(days), n))  # overnight gaps
    close = rng.lognormal(np.log(15.0), 0.7, n) * np.exp(np.cumsum(ret, axis=0))
    open_ = np.vstack([close[:1] / np.exp(ret[:1]), close[:-1]])
    wick = bar_vol * shape[:, None] * 0.6
    high = np.maximum(open_, close) * np.exp(wick * np.abs(rng.standard_normal((T, n))))
    low = np.minimum(open_, close) * np.exp(-wick * np.abs(rng.standard_normal((T, n))))
    vwap = np.clip((high + low + open_ + close) / 4.0, low, high)
    base = rng.lognormal(np.log(2e6 / per_day), 0.8, n)
    volume = np.round(base * shape[:, None] * np.exp(0.4 * np.abs(ret) / bar_vol)).clip(min=100.0)
    amount = vwap * volume

    starts = np.zeros(n, dtype=int)
    ends = np.full(n, T - 1, dtype=int)
    if n > 1:
        starts[1] = (T // 3) // per_day * per_day
    if n > 2:
        ends[2] = (2 * T // 3) // per_day * per_day - 1
    fields_all = {"open": open_, "high": high, "low": low, "close": close, "volume": volume,
                  "amount": amount, "vwap": vwap}
    width = max(3, len(str(n)))
    names = [f"DEMO{i:0{width}d}" for i in range(n)]
    series = []
    for i in range(n):
        a, b = int(starts[i]), int(ends[i])
        fields = {k: arr[a : b + 1, i].astype(np.float32) for k, arr in fields_all.items()}
        fields["factor"] = np.ones(b - a + 1, dtype=np.float32)
        series.append(pv.SymbolSeries(names[i], a, fields))
    k = max(1, round(0.75 * n)) if n > 1 else 1
    market = DemoMarket(calendar=calendar, series=series, universes={"all": names, UNIVERSE: sorted(names[:k])})
    market.freq = freq
    return market


def _write_intraday(root: Path, market: DemoMarket, progress: bool = False) -> None:
    freq = market.freq
    pv.write_calendar(root, market.calendar, freq)
    day = [c[:10] for c in market.calendar]
    pv.write_instruments(root, "all", [(s.symbol, day[s.start], day[s.end]) for s in market.series])
    spans = []
    members = set(market.universes[UNIVERSE])
    for s in market.series:
        if s.symbol not in members:
            continue
        if s.symbol == market.series[0].symbol and len(market.series) > 1:
            # Out of the index for the middle third of its listing: two membership spans.
            n_days = (s.end - s.start + 1) // (len(market.calendar) // len(set(day)))
            d = sorted(set(day[s.start : s.end + 1]))
            spans.append((s.symbol, d[0], d[n_days // 3 - 1]))
            spans.append((s.symbol, d[2 * n_days // 3], d[-1]))
        else:
            spans.append((s.symbol, day[s.start], day[s.end]))
    pv.write_instruments(root, UNIVERSE, spans)
    items = market.series
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc=f"demo market ({freq})", unit="symbol", leave=False, disable=None)
    for s in items:
        pv.write_series(root, s, freq)
