"""CSV import: both CSV shapes round-trip through Qlib; bad files give one-line errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from data_helpers import isolated_home, qlib_features, write_csv  # noqa: F401

from kronos_mlflow.cli.main import main
from kronos_mlflow.data import import_csv
from kronos_mlflow.data import provider as pv
from kronos_mlflow.errors import DataError
from kronos_mlflow.config.features import amount_from_ohlcv

COLS = ["timestamps", "open", "high", "low", "close", "volume", "amount"]


def _bars(dates, seed, with_amount=True):
    rng = np.random.default_rng(seed)
    rows = []
    price = 10.0 + seed
    for d in dates:
        o = price
        c = o * float(np.exp(rng.normal(0, 0.02)))
        h, lo = max(o, c) * 1.01, min(o, c) * 0.99
        v = float(rng.integers(1000, 100000))
        row = {"timestamps": d, "date": d, "open": round(o, 4), "high": round(h, 4), "low": round(lo, 4),
               "close": round(c, 4), "volume": v}
        if with_amount:
            row["amount"] = round(v * (o + c) / 2, 2)
        rows.append(row)
        price = c
    return rows


def _check_roundtrip(out, expected: dict[str, list[dict]]):
    """Qlib's D.features gives back every value; calendar = union; spans = first/last dates."""
    cal = (out / "calendars/day.txt").read_text().split()
    union = sorted({r["timestamps"][:10] for rows in expected.values() for r in rows})
    assert cal == union
    spans = pv.read_instrument_file(out, "all")
    fields = ["$open", "$high", "$low", "$close", "$volume", "$amount", "$factor"]
    df = qlib_features(out, "all", fields)
    for sym, rows in expected.items():
        dates = [r["timestamps"][:10] for r in rows]
        assert spans[sym] == [(min(dates), max(dates))]
        got = df.loc[sym]
        got = got[np.isfinite(got["$close"].to_numpy())]
        assert [d.strftime("%Y-%m-%d") for d in got.index] == sorted(dates)
        for f in ("open", "high", "low", "close", "volume"):
            np.testing.assert_allclose(got[f"${f}"].to_numpy(), [r[f] for r in rows], rtol=1e-6)
        amount = [r["amount"] if "amount" in r else
                  amount_from_ohlcv(r["open"], r["high"], r["low"], r["close"], r["volume"]) for r in rows]
        np.testing.assert_allclose(got["$amount"].to_numpy(), amount, rtol=1e-6)
        assert (got["$factor"] == 1.0).all()
    return df


def test_one_file_per_symbol_roundtrip(tmp_path):
    days = [d.strftime("%Y-%m-%d") for d in pd.bdate_range("2023-01-02", periods=30)]
    a = _bars(days, 1)
    b = _bars(days[5:25], 2, with_amount=False)  # lists late, ends early; amount computed
    b = [r for r in b if r["timestamps"] != days[10]]  # a suspended day: a gap in b
    c = _bars(days[:12], 3)
    write_csv(tmp_path / "in/SH600000.csv", a, COLS)
    write_csv(tmp_path / "in/SZ000001.csv", b, [c for c in COLS if c != "amount"])
    write_csv(tmp_path / "in/AAPL.US.csv", c, COLS)
    out = import_csv(sorted((tmp_path / "in").glob("*.csv")), tmp_path / "q")
    df = _check_roundtrip(out, {"SH600000": a, "SZ000001": b, "AAPL.US": c})
    # the gap day is NaN inside SZ000001's span, as Qlib stores suspensions
    assert np.isnan(df.loc[("SZ000001", pd.Timestamp(days[10])), "$close"])
    assert (out / "features/sh600000/close.day.bin").is_file()
    assert not (out / "instruments/csi300.txt").exists()


def test_long_file_with_symbol_column_and_instrument(tmp_path):
    days = [d.strftime("%Y-%m-%d") for d in pd.bdate_range("2022-06-01", periods=20)]
    a, b = _bars(days, 4), _bars(days[3:], 5)
    rows = [dict(r, symbol="AAA") for r in a] + [dict(r, symbol="BBB") for r in b]
    rows = sorted(rows, key=lambda r: (r["timestamps"], r["symbol"]))  # interleaved, as exports often are
    f = write_csv(tmp_path / "long.csv", rows, ["symbol", "date", "open", "high", "low", "close", "volume", "amount"])
    for r in a + b:
        r["timestamps"] = r["date"]
    out = import_csv([f], tmp_path / "q", instrument="mine")
    _check_roundtrip(out, {"AAA": a, "BBB": b})
    assert (out / "instruments/mine.txt").read_text() == (out / "instruments/all.txt").read_text()
    sub = qlib_features(out, "mine", ["$close"])
    assert set(sub.index.get_level_values(0)) == {"AAA", "BBB"}


def test_upstream_finetune_csv_format(tmp_path):
    """Upstream's finetune_csv header; daily timestamps with a time part; directory argument."""
    days = [d.strftime("%Y-%m-%d") + " 00:00:00" for d in pd.bdate_range("2024-03-01", periods=15)]
    rows = _bars(days, 6)
    write_csv(tmp_path / "in/XYZ.csv", rows, COLS)
    rc = main(["import-csv", str(tmp_path / "in"), "--out", str(tmp_path / "q"), "--instrument", "csi300"])
    assert rc == 0
    _check_roundtrip(tmp_path / "q", {"XYZ": rows})
    assert pv.read_instrument_file(tmp_path / "q", "csi300") == {"XYZ": [(days[0][:10], days[-1][:10])]}


def _good(tmp_path, name="S1.csv"):
    return write_csv(tmp_path / name, _bars(["2024-01-02", "2024-01-03"], 1), COLS)


@pytest.mark.parametrize("content, needles", [
    ("timestamps,open,high,close\n2024-01-02,1,2,1.5\n", ["low", "volume", "timestamps,"]),
    ("open,high,low,close,volume\n1,2,0.5,1.5,10\n", ["timestamps (or date)"]),
    ("timestamps,open,high,low,close,volume\n2024-01-02,1,2,0.5,1.5,10\n2024-13-45,1,2,0.5,1.5,10\n",
     ["'2024-13-45'", "row 3", "bad.csv"]),
    ("date,open,high,low,close,volume\nnot-a-date,1,2,0.5,1.5,10\n", ["'not-a-date'"]),
    ("date,open,high,low,close,volume\n2024-01-02,1,2,0.5,abc,10\n", ["'abc'", "close"]),
    ("date,open,high,low,close,volume\n2024-01-02 09:30,1,2,0.5,1.5,10\n2024-01-02 09:30,1,2,0.5,1.5,10\n",
     ["duplicated timestamp 2024-01-02 09:30:00", "row 3"]),
    ("date,open,high,low,close,volume\n2024-01-03,1,2,0.5,1.5,10\n2024-01-02,1,2,0.5,1.5,10\n",
     ["2024-01-02 comes before", "sorted"]),
    ("date,open,high,low,close,volume\n2024-01-02 09:30,1,2,0.5,1.5,10\n2024-01-02 09:37,1,2,0.5,1.5,10\n",
     ["7 minute(s) apart", "not a Qlib frequency"]),
    ("date,open,high,low,close,volume\n2024-01-02 09:35,1,2,0.5,1.5,10\n2024-01-02 09:40,1,2,0.5,1.5,10\n"
     "2024-01-02 09:45,1,2,0.5,1.5,10\n2024-01-02 09:46,1,2,0.5,1.5,10\n", ["mixed spacings", "09:45:00"]),
    ("", ["empty"]),
    ("date,open,high,low,close,volume\n", ["no rows"]),
])
def test_bad_csv_is_one_clear_error(tmp_path, capsys, content, needles):
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    out = tmp_path / "q"
    with pytest.raises(DataError) as exc:
        import_csv([_good(tmp_path), bad], out)
    msg = str(exc.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    assert not out.exists(), "nothing half-written"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # the same through the command line: exit 2, one line on stderr
    assert main(["import-csv", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kronos-mlflow import-csv: error:")


def test_bad_symbols_and_paths(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        import_csv([tmp_path / "nope.csv"], tmp_path / "q")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(DataError, match="no .csv files"):
        import_csv([tmp_path / "emptydir"], tmp_path / "q")
    weird = _good(tmp_path, "bad name!.csv")
    with pytest.raises(DataError, match="not a valid name"):
        import_csv([weird], tmp_path / "q")
    a = _good(tmp_path, "ABC.csv")
    b = _good(tmp_path / "sub", "abc.csv")
    with pytest.raises(DataError, match="appears twice"):
        import_csv([a, b], tmp_path / "q")
    with pytest.raises(DataError, match="--instrument"):
        import_csv([a], tmp_path / "q", instrument="../x")
    assert not (tmp_path / "q").exists()


def test_refuses_non_empty_out_unless_force(tmp_path, capsys):
    out = tmp_path / "q"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    f = _good(tmp_path)
    assert main(["import-csv", str(f), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err and err.count("\n") == 1
    assert (out / "keep.txt").read_text() == "mine"
    assert main(["import-csv", str(f), "--out", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "calendars/day.txt").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # an existing empty directory is fine without --force
    (tmp_path / "empty").mkdir()
    assert main(["import-csv", str(f), "--out", str(tmp_path / "empty")]) == 0



def test_one_writer_per_out_and_an_empty_folder_is_written_into(tmp_path, commands):
    """Two imports on one new --out: the second, started while the first writes, refuses in one
    line and writes nothing; the first's data is what --out holds. An existing empty folder (a
    mounted volume) is written into, not replaced: the same folder afterwards."""
    import os

    f = _good(tmp_path)
    out = tmp_path / "q"
    with pv.atomic_output_dir(out) as tmp:  # the first import, mid-write
        pv.write_calendar(tmp, ["2024-01-02"])
        second = commands.run(["kronos-mlflow", "import-csv", str(f), "--out", str(out)], cwd=tmp_path)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert "being written by another process" in second.stderr and f"pid {os.getpid()}" in second.stderr
    assert [p.name for p in out.iterdir()] == ["calendars"]
    assert (out / "calendars/day.txt").read_text() == "2024-01-02\n"
    volume = tmp_path / "volume"
    volume.mkdir()
    before = volume.stat().st_ino
    done = commands.run(["kronos-mlflow", "import-csv", str(f), "--out", str(volume)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert volume.stat().st_ino == before
    assert sorted(p.name for p in volume.iterdir()) == ["calendars", "features", "instruments"]


# ----------------------------------------------------------------------------- epoch timestamps

EPOCH = np.datetime64("1970-01-01T00:00:00", "s")
PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _epoch_file(path, times, unit: str, seed: int = 1) -> tuple:
    """A CSV of bars at ``times`` (datetime64[s]) whose time column holds epoch ``unit`` numbers,
    as exchanges export them; returns (times, rows)."""
    rows = _bars([str(t) for t in times], seed)
    for r, t in zip(rows, times):
        r["timestamps"] = int((t - EPOCH) // np.timedelta64(1, "s")) * PER_SECOND[unit]
    write_csv(path, rows, COLS)
    return times, rows


def _read_back(out, freq):
    """Every series of `all` through the project's Qlib reader (what prepare reads)."""
    from kronos_mlflow.data.prepare import read_qlib

    return {sym: (t, v) for sym, t, v in read_qlib(out, "all", "1970-01-01", "2100-01-01", 0, 0, freq=freq)}


def _intraday(day: str, minutes: int, n: int) -> np.ndarray:
    start = np.datetime64(f"{day}T09:30:00", "s")
    return start + np.arange(n) * np.timedelta64(minutes * 60, "s")


@pytest.mark.parametrize("unit, times, freq", [
    ("s", pd.bdate_range("2024-01-02", periods=12).to_numpy().astype("datetime64[s]"), "day"),  # 1d klines, 00:00 UTC
    ("ms", np.concatenate([_intraday("2024-06-17", 5, 10), _intraday("2024-06-18", 5, 10)]), "5min"),
    ("us", _intraday("2024-06-17", 1, 15), "1min"),
    ("ns", _intraday("2024-06-17", 60, 4), "60min"),
])
def test_epoch_timestamps_import_with_their_unit_detected(tmp_path, commands, unit, times, freq):
    """Through `kronos-mlflow import-csv`: epoch numbers of each unit give the bars' UTC times,
    without a pandas warning on the way; --time-unit of the same unit gives the same directory."""
    _, rows = _epoch_file(tmp_path / "in" / "BTCUSDT.csv", times, unit)
    proc = commands.run(["kronos-mlflow", "import-csv", str(tmp_path / "in"), "--out", str(tmp_path / "q")],
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # no "[kronos] warning: Could not infer format ..."
    assert f"freq: {freq}" in proc.stdout
    (sym, (got_times, values)), = _read_back(tmp_path / "q", freq).items()
    assert sym.upper() == "BTCUSDT"
    want = times.astype("datetime64[D]") if freq == "day" else times
    np.testing.assert_array_equal(got_times, want)
    np.testing.assert_allclose(values[:, 3], [r["close"] for r in rows], rtol=1e-6)
    flagged = commands.run(["kronos-mlflow", "import-csv", str(tmp_path / "in"), "--out", str(tmp_path / "q2"),
                            "--time-unit", unit], cwd=tmp_path)
    assert flagged.returncode == 0 and flagged.stderr == "", flagged.stderr
    for name in ("calendars", "instruments", "features/btcusdt"):
        a, b = sorted((tmp_path / "q" / name).iterdir()), sorted((tmp_path / "q2" / name).iterdir())
        assert [p.name for p in a] == [p.name for p in b] and all(x.read_bytes() == y.read_bytes()
                                                                   for x, y in zip(a, b))


def test_time_unit_reads_what_detection_refuses(tmp_path, commands):
    """Epoch seconds of 1970 are too small to be detected; --time-unit s names them."""
    times = pd.date_range("1970-01-05", periods=6, freq="D").to_numpy().astype("datetime64[s]")
    _epoch_file(tmp_path / "OLD.csv", times, "s")
    refused = commands.run(["kronos-mlflow", "import-csv", str(tmp_path / "OLD.csv"), "--out", str(tmp_path / "q")],
                           cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "'345600'" in refused.stderr and "--time-unit" in refused.stderr and not (tmp_path / "q").exists()
    proc = commands.run(["kronos-mlflow", "import-csv", str(tmp_path / "OLD.csv"), "--out", str(tmp_path / "q"),
                         "--time-unit", "s"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    (_, (got, _)), = _read_back(tmp_path / "q", "day").items()
    np.testing.assert_array_equal(got, times.astype("datetime64[D]"))


@pytest.mark.parametrize("column, needles", [
    (["1704067200", "1704153600000"], ["rows 2 and 3", "'1704153600000'", "epoch seconds and epoch milliseconds",
                                       "mixed units"]),
    (["15000000000", "15000086400"], ["row 2", "'15000000000'", "1971 to 2262"]),
    (["1704067200", "2024-01-03"], ["row 2", "'1704067200'", "not a date"]),
    (["01/02/2024", "13/02/2024"], ["row 3", "'13/02/2024'", "'01/02/2024' (%m/%d/%Y)", "one date format"]),
    (["99999999999999999999999", "1704067200"], ["row 2", "too large"]),
])
def test_ambiguous_or_impossible_times_are_one_line(tmp_path, commands, column, needles):
    rows = _bars(["2024-01-02"] * len(column), 1)
    for r, t in zip(rows, column):
        r["timestamps"] = t
    write_csv(tmp_path / "X.csv", rows, COLS)
    proc = commands.run(["kronos-mlflow", "import-csv", str(tmp_path / "X.csv"), "--out", str(tmp_path / "q")],
                        cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("kronos-mlflow import-csv: error:") and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not (tmp_path / "q").exists()


def test_dates_are_parsed_in_one_explicit_format(tmp_path):
    """ISO 8601 in any layout, or every value in the first one's format (YYYYMMDD, 01/31/2024,
    Jan 2, 2024); never pandas' per-value guessing, which warns and can read 01/02 and 13/02 in
    two orders."""
    import warnings

    from kronos_mlflow.data.csv_import import parse_times

    cases = {
        ("2024-01-02", "2024-01-03 09:30", "2024-01-04T10:00:00"): ["2024-01-02T00:00", "2024-01-03T09:30",
                                                                   "2024-01-04T10:00"],
        ("20240102", "20240103"): ["2024-01-02", "2024-01-03"],
        ("01/02/2024", "12/02/2024"): ["2024-01-02", "2024-12-02"],
        ("Jan 2, 2024", "Jan 3, 2024"): ["2024-01-02", "2024-01-03"],
        ("2024-01-02 09:30:00+08:00", "2024-01-02 09:35:00+08:00"): ["2024-01-02T09:30", "2024-01-02T09:35"],
        ("1704067200123", "1704067260123"): ["2024-01-01T00:00:00", "2024-01-01T00:01:00"],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (pandas' "Could not infer format") fails the test
        for raw, want in cases.items():
            got = parse_times(pd.Series(raw), "'x.csv'", "date")
            np.testing.assert_array_equal(got, np.array(want, dtype="datetime64[s]"), err_msg=str(raw))
        for bad in (["not-a-date", "2024-01-02"], ["1704067200.5"]):
            with pytest.raises(DataError, match="is not a date"):
                parse_times(pd.Series(bad), "'x.csv'", "date")
    with pytest.raises(DataError, match="--time-unit 'sec' is not a unit"):
        import_csv([_good(tmp_path)], tmp_path / "q", time_unit="sec")


# ----------------------------------------------------------------------------- real exports' layouts

def _frame(dates, seed: int = 3) -> pd.DataFrame:
    rows = _bars(dates, seed)
    return pd.DataFrame([{k: r[k] for k in ("open", "high", "low", "close", "volume")} for r in rows])


@pytest.mark.parametrize("layout", ["pandas default", "pandas index named index", "yahoo", "yfinance",
                                    "exchange epoch"])
def test_real_exports_import_as_they_come(tmp_path, commands, layout):
    """Through `kronos-mlflow import-csv`, one file per layout users bring: pandas' default
    ``df.to_csv()`` of a frame indexed by date (the dates in an unnamed first column; the summary
    line says it read them there), the same with the index named ``index``, Yahoo Finance's
    (``Date``, ``Adj Close``), yfinance's ``Ticker.history().to_csv()`` (New York midnights whose
    UTC offset moves from -05:00 to -04:00 on 2019-03-10: the local dates, and the summary line
    says the offsets were dropped), and an exchange's epoch milliseconds."""
    dates = [d.strftime("%Y-%m-%d") for d in pd.bdate_range("2019-03-01", periods=15)]
    frame = _frame(dates)
    path = tmp_path / "in" / "SPY.csv"
    path.parent.mkdir()
    if layout == "pandas default":
        frame.set_axis(pd.DatetimeIndex(dates)).to_csv(path)  # header ",open,high,..."
    elif layout == "pandas index named index":
        frame.set_axis(pd.DatetimeIndex(dates, name="index")).to_csv(path)
    elif layout == "yahoo":
        frame.rename(columns=str.title).assign(**{"Adj Close": frame["close"] * 0.98}).set_axis(
            pd.DatetimeIndex(dates, name="Date")).to_csv(path)
    elif layout == "yfinance":
        frame.rename(columns=str.title).assign(Dividends=0.0, **{"Stock Splits": 0.0}).set_axis(
            pd.DatetimeIndex(dates, name="Date").tz_localize("America/New_York")).to_csv(path)
        assert "\n2019-03-08 00:00:00-05:00," in path.read_text() and "\n2019-03-11 00:00:00-04:00," in path.read_text()
    else:
        stamps = pd.DatetimeIndex(dates).as_unit("ms").asi8
        frame.assign(timestamp=stamps)[["timestamp", "open", "high", "low", "close", "volume"]].rename(
            columns={"timestamp": "timestamps"}).to_csv(path, index=False)
    proc = commands.run(["kronos-mlflow", "import-csv", str(path), "--out", str(tmp_path / "q")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "imported 1 symbol(s), 15 days (2019-03-01..2019-03-21)" in proc.stdout
    said = "dates: the unnamed first column" if layout == "pandas default" else "dates: column index"
    assert (said in proc.stdout) == layout.startswith("pandas"), proc.stdout
    clock = "; times: the exchange's local clock (UTC offsets -05:00, -04:00 dropped: daylight saving)"
    assert proc.stdout.rstrip().endswith(clock) == (layout == "yfinance"), proc.stdout
    ((sym, (times, values)),) = _read_back(tmp_path / "q", "day").items()
    assert sym.upper() == "SPY" and [str(t)[:10] for t in times] == dates
    np.testing.assert_allclose(values[:, 3], frame["close"], rtol=1e-6)


def test_offsets_are_one_clock_only_where_one_zone_s_daylight_saving_moves_them(tmp_path):
    """Offsets that change where one time zone's daylight saving does (New York's, Berlin's
    intraday bars) keep their local clock times; offsets that no zone has at those moments (a
    summer offset in January, two zones' bars in one file) are two clocks: refused, rows named."""
    from kronos_mlflow.data.csv_import import _one_clock

    berlin = pd.date_range("2024-03-28 08:00", periods=120, freq="h", tz="UTC").tz_convert("Europe/Berlin")
    raw = pd.Series([str(t) for t in berlin if 9 <= t.hour <= 17])  # the switch on 2024-03-31
    local, note = _one_clock(tmp_path / "x.csv", raw, "datetime")
    assert list(local) == [t[:19] for t in raw] and "UTC offsets +01:00, +02:00 dropped" in note
    for bad, rows in ((["2024-01-02 09:30:00-05:00", "2024-01-03 09:30:00-04:00"], "rows 2 and 3"),
                      (["2024-06-03 09:30:00-04:00", "2024-06-03 15:30:00+01:00"], "rows 2 and 3")):
        with pytest.raises(DataError, match=f"{rows}: .* are in different time zones"):
            _one_clock(tmp_path / "x.csv", pd.Series(bad), "date")


def test_an_unnamed_first_column_of_row_numbers_is_no_date_column(tmp_path, capsys):
    """``df.to_csv()`` of a frame without a date index: its row numbers are not taken for times;
    the refusal names the missing date column."""
    dates = [d.strftime("%Y-%m-%d") for d in pd.bdate_range("2019-03-01", periods=5)]
    path = tmp_path / "X.csv"
    _frame(dates).to_csv(path)
    with pytest.raises(DataError, match=r"lacks column\(s\) timestamps \(or date\); it has unnamed: 0, open"):
        import_csv(path, tmp_path / "q")
