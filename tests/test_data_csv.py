"""CSV import: both CSV shapes round-trip through Qlib; bad files give one-line errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from data_helpers import isolated_home, qlib_features, write_csv  # noqa: F401

from kronos_mlflow.cli import main
from kronos_mlflow.data import import_csv
from kronos_mlflow.data import provider as pv
from kronos_mlflow.errors import DataError
from kronos_mlflow.features import amount_from_ohlcv

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
