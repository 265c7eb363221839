"""The demo market: a real Qlib directory, deterministic, realistic, cached atomically."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os

import numpy as np
import pandas as pd
import pytest
from data_helpers import SMALL, isolated_home, qlib_features, small_market  # noqa: F401

from kronos_mlflow.cli.main import main
from kronos_mlflow.data import provider as pv
from kronos_mlflow.data.demo import (
    BENCHMARK,
    DEFAULT_SYMBOLS,
    FIELDS,
    demo_market_path,
    ensure_demo_market,
    generate_demo_market,
    write_demo_market,
)
from kronos_mlflow.data.prepare import provide_qlib_data, resolve_qlib_path
from kronos_mlflow.errors import DataError


def test_qlib_reads_back_the_generated_numbers(small_market):
    market = generate_demo_market(SMALL["n_symbols"], SMALL["seed"], SMALL["start"], SMALL["end"])
    fields = [f"${f}" for f in FIELDS]
    df = qlib_features(small_market, "all", fields)
    assert sorted(df.index.get_level_values(0).unique()) == sorted(s.symbol for s in market.series)
    cal = pd.DatetimeIndex(market.calendar)
    for s in market.series:
        got = df.loc[s.symbol]
        assert got.index[0] == cal[s.start] and got.index[-1] == cal[s.end]
        for f in FIELDS:
            np.testing.assert_array_equal(got[f"${f}"].to_numpy(), s.fields[f])  # NaN == NaN here
    # csi300 is a proper subset of all, with the same listing spans
    sub = qlib_features(small_market, "csi300", ["$close"])
    members = set(sub.index.get_level_values(0))
    assert members == set(market.universes["csi300"]) and members < set(market.universes["all"])


def test_qlib_instrument_spans_match(small_market):
    from qlib.data import D

    qlib_features(small_market, "all", ["$close"])  # initialises qlib on the market
    spans = D.list_instruments(D.instruments("all"), as_list=False)
    market = generate_demo_market(SMALL["n_symbols"], SMALL["seed"], SMALL["start"], SMALL["end"])
    for s in market.series:
        ((a, b),) = spans[s.symbol]
        assert (a.strftime("%Y-%m-%d"), b.strftime("%Y-%m-%d")) == (market.calendar[s.start], market.calendar[s.end])


@pytest.fixture(scope="module")
def default_market():
    return generate_demo_market()  # default size, in memory (~0.4 s)


def _returns(s):
    c = s.fields["close"].astype(np.float64)
    r = np.diff(np.log(c))
    return r[np.isfinite(r)]


def test_default_market_is_realistic(default_market):
    m = default_market
    assert len(m.series) == DEFAULT_SYMBOLS
    T = len(m.calendar)
    assert m.calendar[0] <= "2010-12-31" and m.calendar[-1] >= "2025-06-05"  # covers the default ranges
    for s in m.series:
        o, h, lo, c, v, amt, vw = (s.fields[k] for k in ("open", "high", "low", "close", "volume", "amount", "vwap"))
        ok = np.isfinite(c)
        assert ok[0] and ok[-1], "a series starts and ends on a trading day"
        assert (o[ok] > 0).all() and (lo[ok] > 0).all() and (v[ok] > 0).all() and (amt[ok] > 0).all()
        assert (h[ok] >= np.maximum(o[ok], c[ok])).all()
        assert (lo[ok] <= np.minimum(o[ok], c[ok])).all()
        assert ((vw[ok] >= lo[ok]) & (vw[ok] <= h[ok])).all()
        # suspended days are NaN in every field at once
        for k in FIELDS:
            assert (np.isfinite(s.fields[k]) == ok).all()
    assert any(s.start > 0 for s in m.series), "late listings"
    assert any(s.end < T - 1 for s in m.series), "delistings"
    assert any((~np.isfinite(s.fields["close"])).any() for s in m.series), "suspension gaps"
    kurt = [pd.Series(_returns(s)).kurt() + 3.0 for s in m.series if len(_returns(s)) > 250]
    assert np.median(kurt) > 3.0, "fat tails (Pearson kurtosis > 3)"
    acf = [pd.Series(np.abs(_returns(s))).autocorr(1) for s in m.series if len(_returns(s)) > 250]
    assert np.median(acf) > 0.05, "volatility clustering (|r| autocorrelated)"
    corr = []
    for s in m.series:
        c, v = s.fields["close"].astype(np.float64), s.fields["volume"].astype(np.float64)
        r = np.abs(np.diff(np.log(c)))
        ok = np.isfinite(r) & np.isfinite(v[1:])
        if ok.sum() > 250:
            corr.append(np.corrcoef(r[ok], np.log(v[1:][ok]))[0, 1])
    assert np.median(corr) > 0.1, "volume rises with |return|"


def test_small_markets_still_have_special_symbols():
    m = generate_demo_market(4, 0, "2020-01-01", "2021-12-31")
    T = len(m.calendar)
    members = set(m.universes["csi300"])
    assert any(s.start > 0 and s.symbol in members for s in m.series)
    assert any(s.end < T - 1 and s.symbol in members for s in m.series)


def test_deterministic_in_seed(tmp_path):
    a = write_demo_market(tmp_path / "a", 5, 11, start="2021-01-01", end="2021-12-31")
    b = write_demo_market(tmp_path / "b", 5, 11, start="2021-01-01", end="2021-12-31")
    c = write_demo_market(tmp_path / "c", 5, 12, start="2021-01-01", end="2021-12-31")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert (a / "features/demo000/close.day.bin").read_bytes() != (c / "features/demo000/close.day.bin").read_bytes()


def test_a_planted_signal_tilts_returns_by_the_lagged_30_day_rank_and_signal_0_is_the_plain_market(tmp_path):
    plain = write_demo_market(tmp_path / "a", 12, 3, start="2020-01-01", end="2021-12-31")
    zero = write_demo_market(tmp_path / "b", 12, 3, start="2020-01-01", end="2021-12-31", signal=0.0)
    files = sorted(p.relative_to(plain) for p in plain.rglob("*") if p.is_file())
    assert all((plain / f).read_bytes() == (zero / f).read_bytes() for f in files)
    assert demo_market_path(6, 4, signal=0.0) == demo_market_path(6, 4)
    assert demo_market_path(6, 4, signal=0.1).name.endswith("-signal0.1")

    def logs(m):  # (T, n) log closes, filled forward over suspensions
        import pandas as pd

        c = np.full((len(m.calendar), len(m.series)), np.nan)
        for i, s in enumerate(m.series):
            c[s.start : s.end + 1, i] = s.fields["close"]
        return np.log(pd.DataFrame(c).ffill().to_numpy())

    def rank_ic(m, h=10):
        import pandas as pd

        log = logs(m)
        ics = []
        for t in range(40, len(log) - h, h):
            feature, label = log[t] - log[t - 30], log[t + h] - log[t]
            ok = np.isfinite(feature) & np.isfinite(label)
            ics.append(pd.Series(feature[ok]).corr(pd.Series(label[ok]), method="spearman"))
        return float(np.mean(ics))

    base = generate_demo_market(40, 0, "2015-01-01", "2019-12-31")
    planted = generate_demo_market(40, 0, "2015-01-01", "2019-12-31", signal=0.1)
    assert abs(rank_ic(base)) < 0.08 < 0.2 < rank_ic(planted)
    # the first 30 days are the plain market's; the tilt draws no random numbers (volumes keep theirs)
    assert np.array_equal(logs(base)[:30], logs(planted)[:30], equal_nan=True)
    first = next(i for i, s in enumerate(base.series) if s.start == 0)
    assert np.array_equal(base.series[first].fields["volume"][:30], planted.series[first].fields["volume"][:30],
                          equal_nan=True)


def test_bin_format_is_qlibs(small_market):
    raw = np.fromfile(small_market / "features/demo001/close.day.bin", dtype="<f4")
    start, values = pv.read_series(small_market, "DEMO001", "close")
    assert raw[0] == start > 0 and len(raw) == len(values) + 1
    cal = (small_market / "calendars/day.txt").read_text().split()
    first = (small_market / "instruments/all.txt").read_text().splitlines()[1].split("\t")
    assert first[0] == "DEMO001" and first[1] == cal[start]


def test_cli_demo_data(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["demo-data", "--out", str(out), "--symbols", "5", "--seed", "2",
                 "--start", "2021-01-01", "--end", "2021-06-30"]) == 0
    assert (out / "calendars/day.txt").is_file() and (out / "instruments/csi300.txt").is_file()
    assert len(list((out / "features").iterdir())) == 5 + 1  # the symbols and the benchmark
    capsys.readouterr()
    # a non-empty --out is refused (exit 2, one line), and left as it was
    before = (out / "features/demo000/close.day.bin").read_bytes()
    assert main(["demo-data", "--out", str(out), "--symbols", "5", "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err and str(out) in err
    assert (out / "features/demo000/close.day.bin").read_bytes() == before
    assert main(["demo-data", "--out", str(out), "--symbols", "5", "--seed", "3", "--force",
                 "--start", "2021-01-01", "--end", "2021-06-30"]) == 0
    assert (out / "features/demo000/close.day.bin").read_bytes() != before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp or old dirs left"


@pytest.mark.parametrize("argv, needle", [
    (["--symbols", "0"], "--symbols: 0 is out of range"),
    (["--seed", "-1"], "--seed: -1 is out of range"),
    (["--start", "2022-01-01", "--end", "2021-01-01"], "after end"),
    (["--start", "yesterday"], "not dates"),
    (["--signal", "2"], "--signal: 2 is out of range"),
    (["--signal", "strong"], "--signal: 'strong' is not a number"),
    (["--signal", "0.1", "--freq", "5min"], "daily market only"),
])
def test_cli_demo_data_bad_input(tmp_path, capsys, argv, needle):
    out = tmp_path / "m"
    assert main(["demo-data", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert not out.exists()


def test_empty_qlib_data_path_uses_cached_demo(isolated_home):
    p = provide_qlib_data({"qlib_data_path": ""})
    assert p == demo_market_path() == resolve_qlib_path({"qlib_data_path": ""}) and str(p).startswith(str(isolated_home))
    assert len(pv.read_instrument_file(p, "all")) == DEFAULT_SYMBOLS
    stamp = (p / "calendars/day.txt").stat().st_mtime_ns
    assert provide_qlib_data({"qlib_data_path": "  "}) == p
    assert (p / "calendars/day.txt").stat().st_mtime_ns == stamp, "generated once, then reused"
    assert [x.name for x in p.parent.iterdir() if ".tmp-" in x.name] == []


def test_cli_demo_data_without_out_fills_the_cache(isolated_home, capsys):
    assert main(["demo-data", "--symbols", "6", "--seed", "4"]) == 0
    path = demo_market_path(6, 4)
    assert str(path) in capsys.readouterr().out and (path / "instruments/csi300.txt").is_file()


def _ensure(args):
    return str(ensure_demo_market(*args))


def test_concurrent_generation_is_safe(isolated_home):
    ctx = mp.get_context("fork")
    with cf.ProcessPoolExecutor(4, mp_context=ctx) as ex:
        paths = list(ex.map(_ensure, [(6, 1)] * 4))
    assert len(set(paths)) == 1
    parent = os.path.dirname(paths[0])
    assert [n for n in os.listdir(parent) if ".tmp-" in n] == []
    assert len(pv.read_instrument_file(paths[0], "all")) == 6


def test_unwritable_home_is_a_clear_error(tmp_path, monkeypatch):
    """A home that is a file is a malformed setting (kronos_mlflow.config.settings), refused before any
    write; a home whose folder cannot be written is a DataError naming the variable."""
    from kronos_mlflow.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("KRONOS_MLFLOW_HOME", str(blocker))
    with pytest.raises(ConfigError, match="KRONOS_MLFLOW_HOME"):
        ensure_demo_market(5, 0)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        monkeypatch.setenv("KRONOS_MLFLOW_HOME", str(locked))
        if not os.access(locked, os.W_OK):  # root writes anyway
            with pytest.raises(DataError, match="KRONOS_MLFLOW_HOME"):
                ensure_demo_market(5, 0)
    finally:
        locked.chmod(0o700)


def test_the_benchmark_is_an_equal_weight_index_of_csi300(small_market):
    """SH000300 compounds each day's mean close-to-close return of the csi300 members (read back
    through Qlib); it is in no instrument file, so no universe gains a symbol."""
    closes = qlib_features(small_market, "csi300", ["$close"])["$close"].unstack(0)
    mean = (closes / closes.shift(1) - 1.0).mean(axis=1, skipna=True).fillna(0.0)
    expected = 1000.0 * np.cumprod(1.0 + mean.to_numpy())
    bench = qlib_features(small_market, [BENCHMARK], ["$close"])["$close"].loc[BENCHMARK]
    assert bench.index.equals(closes.index)
    np.testing.assert_allclose(bench.reindex(closes.index).to_numpy(), expected, rtol=1e-5)
    for name in ("all", "csi300"):
        assert BENCHMARK not in pv.read_instrument_file(small_market, name)


def test_a_cached_market_without_the_benchmark_gets_it_and_nothing_else_changes(isolated_home):
    path = ensure_demo_market(6, 1)
    bench = path / "features" / BENCHMARK.lower()
    fresh = (bench / "close.day.bin").read_bytes()
    for f in bench.iterdir():
        f.unlink()
    bench.rmdir()
    others = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()}
    assert ensure_demo_market(6, 1) == path
    assert (bench / "close.day.bin").read_bytes() == fresh
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in path.rglob("*")
            if p.is_file() and bench not in p.parents} == others
    assert [p.name for p in path.iterdir() if p.name.startswith(".tmp-")] == []
