"""Intraday bars (freq), ISO 8601 time ranges, membership spans, and the finetune_csv import.

The expected windows and time features are computed here from the bars written, independently
of ``prepare``: plain Python over lists of timestamps.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from data_helpers import isolated_home, write_csv  # noqa: F401

from kronos_mlflow.cli.main import main
from kronos_mlflow.config.core import flatten, load_config
from kronos_mlflow.errors import ConfigError, DataError
from kronos_mlflow.config.features import amount_from_ohlcv

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("open", "high", "low", "close", "volume", "amount", "vwap", "factor")


# ----------------------------------------------------------------------------- writing dirs

def session_stamps(days: list[str], step: int) -> list[dt.datetime]:
    """Bars stamped with their closing minute: 09:30+step .. 11:30, 13:00+step .. 15:00."""
    out = []
    for d in days:
        base = dt.datetime.fromisoformat(d)
        for a, b in ((9 * 60 + 30, 11 * 60 + 30), (13 * 60, 15 * 60)):
            out += [base + dt.timedelta(minutes=m) for m in range(a + step, b + 1, step)]
    return out


def bars(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.002, n)))
    open_ = np.r_[close[0], close[:-1]]
    high = np.maximum(open_, close) * 1.001
    low = np.minimum(open_, close) * 0.999
    volume = rng.integers(100, 10000, n).astype(float)
    amount = (open_ + close) / 2 * volume
    return {"open": open_, "high": high, "low": low, "close": close, "volume": volume, "amount": amount,
            "vwap": amount / volume, "factor": np.ones(n)}


def write_dump_bin_layout(root: Path, freq: str, data: dict[str, tuple[list[dt.datetime], dict]],
                          universes: dict[str, list[tuple[str, str, str]]] | None = None) -> Path:
    """What Qlib's ``scripts/dump_bin.py dump_all --freq FREQ`` writes: ``calendars/FREQ.txt``
    (the union of all stamps, ``%Y-%m-%d %H:%M:%S``, or ``%Y-%m-%d`` for day),
    ``instruments/all.txt`` (``SYMBOL<TAB>first<TAB>last`` in the calendar's format) and
    ``features/<symbol lower>/<field>.FREQ.bin``: ``<f4`` values, the first one the calendar index
    of the symbol's first stamp, then one value per calendar entry up to its last (NaN where the
    symbol has no bar)."""
    fmt = "%Y-%m-%d" if freq == "day" else "%Y-%m-%d %H:%M:%S"
    calendar = sorted({t for stamps, _ in data.values() for t in stamps})
    (root / "calendars").mkdir(parents=True)
    (root / "calendars" / f"{freq}.txt").write_text("".join(t.strftime(fmt) + "\n" for t in calendar))
    (root / "instruments").mkdir()
    lines = [f"{sym.upper()}\t{min(s).strftime(fmt)}\t{max(s).strftime(fmt)}\n" for sym, (s, _) in sorted(data.items())]
    (root / "instruments" / "all.txt").write_text("".join(lines))
    for name, spans in (universes or {}).items():
        (root / "instruments" / f"{name}.txt").write_text("".join(f"{s}\t{a}\t{b}\n" for s, a, b in spans))
    index = {t: i for i, t in enumerate(calendar)}
    for sym, (stamps, values) in data.items():
        folder = root / "features" / sym.lower()
        folder.mkdir(parents=True)
        first, last = index[min(stamps)], index[max(stamps)]
        for field, col in values.items():
            full = np.full(last - first + 1, np.nan)
            full[[index[t] - first for t in stamps]] = col
            np.hstack([first, full]).astype("<f").tofile(folder / f"{field}.{freq}.bin")
    return root


def qlib_read(path: Path, names, fields, freq: str, start=None, end=None):
    import qlib
    from qlib.constant import REG_CN
    from qlib.data import D

    qlib.init(provider_uri=str(path), region=REG_CN, logging_level=logging.WARNING, kernels=1)
    return D.features(names, fields, start_time=start, end_time=end, freq=freq)


DAYS = ["2024-06-17", "2024-06-18", "2024-06-19", "2024-06-20"]


@pytest.fixture()
def market5(tmp_path) -> tuple[Path, dict]:
    """Three symbols of 5-minute bars over four days; S2 misses two bars, S3 lists on day two."""
    stamps = session_stamps(DAYS, 5)
    data = {}
    for k, sym in enumerate(("S1", "S2", "S3")):
        s = list(stamps)
        if sym == "S2":
            del s[100], s[30]
        if sym == "S3":
            s = s[48:]
        data[sym] = (s, bars(len(s), k))
    spans = [(sym, min(s).strftime("%Y-%m-%d"), max(s).strftime("%Y-%m-%d")) for sym, (s, _) in data.items()]
    return write_dump_bin_layout(tmp_path / "q5", "5min", data, {"idx": spans}), data


# ----------------------------------------------------------------------------- config

def test_freq_and_iso_interval_config():
    cfg = load_config({"freq": "5min", "train_time_range": "2024-06-18T09:30/2024-08-29T15:00"})
    assert cfg["freq"] == "5min" and cfg["train_time_range"] == ["2024-06-18T09:30", "2024-08-29T15:00"]
    flat = flatten(cfg)
    assert flat["freq"] == "5min" and flat["train_time_range"] == "2024-06-18T09:30/2024-08-29T15:00"
    assert flat["val_time_range"] == "2022-09-01:2024-06-30"  # dates keep START:END
    assert load_config({"train_time_range": "2024-06-18/2024-06-20"})["train_time_range"] == ["2024-06-18", "2024-06-20"]
    assert load_config({})["freq"] == "day" and load_config({})["membership_gaps"] == "split"
    assert load_config({"train_time_range": ["2024-06-18 09:30", "2024-06-20"]})["train_time_range"] == \
        ["2024-06-18T09:30", "2024-06-20"]
    assert load_config({"train_time_range": " 2011-01-01 : 2022-12-31 "})["train_time_range"] == ["2011-01-01", "2022-12-31"]
    for bad, needle in [({"freq": "2min"}, "freq: '2min' is not one of day, 1min, 5min"),
                        ({"train_time_range": "2024-06-18T09:30:2024-08-29T15:00"}, "ISO 8601 interval"),
                        ({"train_time_range": "2024-06-18T16:00/2024-06-18T09:30"}, "after end"),
                        ({"membership_gaps": "merge"}, "split, join")]:
        with pytest.raises(ConfigError, match=needle):
            load_config(bad)


# ----------------------------------------------------------------------------- Qlib layout

def test_dump_bin_layout_read_back_by_qlib(market5):
    path, data = market5
    df = qlib_read(path, ["S2", "S3"], ["$close", "$volume"], "5min")
    for sym in ("S2", "S3"):
        got = df.loc[sym]
        got = got[np.isfinite(got["$close"].to_numpy())]
        stamps, values = data[sym]
        assert list(got.index.to_pydatetime()) == stamps
        np.testing.assert_allclose(got["$close"].to_numpy(), values["close"], rtol=1e-6)
    times = df.loc["S3"].index
    assert str(times[0]) == "2024-06-18 09:35:00" and "2024-06-18 11:35:00" not in set(map(str, times))


def _expected_windows(data, syms, a: dt.datetime, b: dt.datetime, window: int, spans=None):
    """(symbol, first stamp, last stamp) of every window: consecutive finite bars of one series."""
    out = set()
    for sym in syms:
        stamps, values = data[sym]
        pieces = spans.get(sym) if spans else [(dt.datetime.min, dt.datetime.max)]
        for s0, s1 in pieces:
            rows = [i for i, t in enumerate(stamps) if a <= t <= b and s0 <= t <= s1]
            for k in range(len(rows) - window + 1):
                out.add((sym, stamps[rows[k]], stamps[rows[k + window - 1]]))
    return out


def test_prepare_5min_windows_and_time_features(market5, tmp_path):
    from kronos_mlflow.data import QlibDataset
    from kronos_mlflow.data.prepare import data_digest

    path, data = market5
    cfg = load_config({"qlib_data_path": str(path), "freq": "5min", "instrument": "idx",
                       "dataset_begin_time": "2024-06-17", "dataset_end_time": "2024-06-20",
                       "train_time_range": "2024-06-17T10:00/2024-06-19T14:00",
                       "val_time_range": "2024-06-19:2024-06-20", "test_time_range": "2024-06-19:2024-06-20",
                       "lookback_window": 20, "predict_window": 5, "n_train_iter": 10**6, "n_val_iter": 10**6,
                       "dataset_path": str(tmp_path / "cache"), "seed": 1})
    ds = QlibDataset("train", cfg, progress=False)
    window = 26
    got = {(w["symbol"], dt.datetime.fromisoformat(w["first"]), dt.datetime.fromisoformat(w["last"]))
           for w in map(ds.window_info, range(len(ds)))}
    expected = _expected_windows(data, ("S1", "S2", "S3"), dt.datetime(2024, 6, 17, 10), dt.datetime(2024, 6, 19, 14),
                                 window)
    assert got == expected and len(ds) == len(expected)
    assert any(f.date() != last.date() for _, f, last in got), "windows run across nights"
    assert any(f.hour < 12 < last.hour and f.date() == last.date() for _, f, last in got), "and across lunch"
    # A date as a range end covers every bar of that day.
    val = QlibDataset("val", cfg, progress=False)
    assert len(val) == len(_expected_windows(data, ("S1", "S2", "S3"), dt.datetime(2024, 6, 19),
                                             dt.datetime(2024, 6, 20, 23, 59), window))

    # Raw features and time features of some windows, from the written bars.
    for i in (0, 7, len(ds) // 2, len(ds) - 1):
        info = ds.window_info(i)
        stamps, values = data[info["symbol"]]
        k = stamps.index(dt.datetime.fromisoformat(info["first"]))
        rows = range(k, k + window)
        ohlcv = [values[f][list(rows)] for f in ("open", "high", "low", "close", "volume")]
        raw = np.stack([*ohlcv, amount_from_ohlcv(*ohlcv)], axis=1)
        np.testing.assert_allclose(ds.raw_windows([i])[0], raw.astype(np.float32), rtol=1e-6)
        _, x_stamp = ds[i]
        t = [stamps[r] for r in rows]
        np.testing.assert_array_equal(x_stamp.numpy(), [[s.minute, s.hour, s.weekday(), s.day, s.month] for s in t])

    # freq is part of the data digest; the prepared arrays are memory-mapped.
    assert isinstance(ds.x, np.memmap) and isinstance(ds.x_stamp, np.memmap)
    np.testing.assert_array_equal(ds.start_rows(np.arange(ds.n_windows)), ds.starts)
    assert ds.manifest["freq"] == "5min" and ds.manifest["key"]["freq"] == "5min"
    assert data_digest(cfg) != data_digest({**cfg, "train_time_range": "2024-06-17T10:05/2024-06-19T14:00"})


def test_a_frequency_the_directory_lacks_is_one_line(market5, tmp_path, capsys):
    path, _ = market5
    rc = main(["prepare", "--qlib-data-path", str(path), "--freq", "1min", "--instrument", "idx",
               "--dataset-path", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "freq '1min'" in err and "it has: 5min" in err
    with pytest.raises(DataError, match="it has: 5min"):
        from kronos_mlflow.data.prepare import resolve_qlib_path

        resolve_qlib_path({"qlib_data_path": str(path), "freq": "day"})


# ----------------------------------------------------------------------------- membership spans

def _daily_market(tmp_path):
    """Daily bars of A (two membership spans with a gap), B (two touching spans: one series)."""
    days = [dt.datetime(2020, 1, 1) + dt.timedelta(days=i) for i in range(200)]
    days = [d for d in days if d.weekday() < 5]
    data = {"A": (days, bars(len(days), 1)), "B": (days, bars(len(days), 2))}
    f = "%Y-%m-%d"
    spans = [("A", days[0].strftime(f), days[59].strftime(f)), ("A", days[90].strftime(f), days[-1].strftime(f)),
             ("B", days[0].strftime(f), days[69].strftime(f)), ("B", days[70].strftime(f), days[-1].strftime(f))]
    root = write_dump_bin_layout(tmp_path / "qd", "day", data, {"idx": spans})
    member = {"A": [(days[0], days[59]), (days[90], days[-1])], "B": [(days[0], days[-1])]}
    return root, data, days, member


@pytest.mark.parametrize("gaps", ["split", "join"])
def test_windows_respect_membership_spans(tmp_path, gaps):
    from kronos_mlflow.data import QlibDataset

    root, data, days, member = _daily_market(tmp_path)
    cfg = load_config({"qlib_data_path": str(root), "instrument": "idx", "membership_gaps": gaps,
                       "dataset_begin_time": "2020-01-01", "dataset_end_time": "2020-12-31",
                       "train_time_range": "2020-01-01:2020-12-31", "val_time_range": "2020-01-01:2020-12-31",
                       "test_time_range": "2020-01-01:2020-12-31", "lookback_window": 20, "predict_window": 5,
                       "n_train_iter": 10**6, "dataset_path": str(tmp_path / "cache")})
    ds = QlibDataset("train", cfg, progress=False)
    got = {(w["symbol"], dt.datetime.fromisoformat(w["first"]), dt.datetime.fromisoformat(w["last"]))
           for w in map(ds.window_info, range(len(ds)))}
    window = 26
    # Bars outside every span are dropped in both modes.
    kept = {s: ([t for t in stamps if any(a <= t <= b for a, b in member[s])], None) for s, (stamps, _) in data.items()}
    if gaps == "split":
        expected = _expected_windows(data, ("A", "B"), days[0], days[-1], window, member)
        gap = (days[59], days[90])
        assert not any(s == "A" and f <= gap[0] and last >= gap[1] for s, f, last in got)
    else:
        expected = set()
        for s, (stamps, _) in kept.items():
            for k in range(len(stamps) - window + 1):
                expected.add((s, stamps[k], stamps[k + window - 1]))
        assert any(s == "A" and f <= days[59] and last >= days[90] for s, f, last in got)
    assert got == expected
    assert ds.manifest["membership_gaps"] == gaps


# ----------------------------------------------------------------------------- demo and CSV

def test_demo_data_5min_has_sessions(tmp_path, capsys):
    assert main(["demo-data", "--freq", "5min", "--symbols", "4", "--start", "2024-06-17", "--end", "2024-06-21",
                 "--out", str(tmp_path / "m")]) == 0
    cal = (tmp_path / "m" / "calendars" / "5min.txt").read_text().splitlines()
    assert len(cal) == 5 * 48 and cal[0] == "2024-06-17 09:35:00" and cal[47] == "2024-06-17 15:00:00"
    times = {c[11:16] for c in cal}
    assert "11:30" in times and "13:05" in times and not times & {"11:35", "12:00", "13:00", "15:05"}
    assert (tmp_path / "m" / "features" / "demo000" / "close.5min.bin").is_file()
    spans = [line.split("\t")[0] for line in (tmp_path / "m" / "instruments" / "csi300.txt").read_text().splitlines()]
    assert spans.count("DEMO000") == 2, "one symbol leaves the index and comes back"
    df = qlib_read(tmp_path / "m", ["DEMO003"], ["$close"], "5min")
    assert len(df) == len(cal) and np.isfinite(df["$close"].to_numpy()).all()


def _finetune_csv_rows(stamps, seed):
    v = bars(len(stamps), seed)
    return [{"timestamps": t.strftime("%Y-%m-%d %H:%M:%S"), **{k: float(v[k][i]) for k in
             ("open", "high", "low", "close", "volume", "amount")}} for i, t in enumerate(stamps)]


COLS = ["timestamps", "open", "high", "low", "close", "volume", "amount"]


def test_import_finetune_csv(tmp_path, capsys):
    stamps = session_stamps(DAYS[:3], 5)
    s1 = [t for i, t in enumerate(stamps) if i != 40]  # one missing bar
    rows1 = _finetune_csv_rows(s1, 1)
    write_csv(tmp_path / "in" / "XSHG600000.csv", rows1, COLS)
    long_rows = [{"symbol": sym, **r} for sym, seed in (("AAA", 2), ("BBB", 3))
                 for r in _finetune_csv_rows(stamps, seed)]
    write_csv(tmp_path / "long.csv", long_rows, ["symbol", *COLS])
    out = tmp_path / "q"
    assert main(["import-csv", str(tmp_path / "in"), str(tmp_path / "long.csv"), "--out", str(out),
                 "--instrument", "mine"]) == 0
    assert "freq: 5min" in capsys.readouterr().out
    cal = (out / "calendars" / "5min.txt").read_text().splitlines()
    assert cal == [t.strftime("%Y-%m-%d %H:%M:%S") for t in stamps]
    df = qlib_read(out, ["XSHG600000", "AAA"], ["$open", "$close", "$volume", "$amount"], "5min")
    got = df.loc["XSHG600000"].dropna()
    assert list(got.index.to_pydatetime()) == s1, "every bar kept, the missing one missing"
    np.testing.assert_allclose(got["$close"].to_numpy(), [r["close"] for r in rows1], rtol=1e-6)
    np.testing.assert_allclose(df.loc["AAA"]["$amount"].to_numpy(), [r["amount"] for r in long_rows[:len(stamps)]],
                               rtol=1e-6)

    # --freq overrides the inference, and is checked against the stamps.
    assert main(["import-csv", str(tmp_path / "long.csv"), "--out", str(tmp_path / "q15"), "--freq", "15min"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a multiple of 15min" in err and not (tmp_path / "q15").exists()
    assert main(["import-csv", str(tmp_path / "long.csv"), "--out", str(tmp_path / "q1"), "--freq", "1min"]) == 0
    assert (tmp_path / "q1" / "calendars" / "1min.txt").is_file()


# ----------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_mlflow_run_5min_end_to_end(tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from tiny_runs import TINY

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KRONOS_MLFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    paths = {"save_path": str(tmp_path / "outputs"), "dataset_path": str(tmp_path / "cache")}
    (tmp_path / "tiny.yaml").write_text("".join(f"{k}: {v}\n" for k, v in {**TINY, **paths}.items()))
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local",
           "-P", f"config_file={tmp_path / 'tiny.yaml'}", "-P", "comet=off", "-P", "freq=5min",
           "-P", "train_time_range=2022-07-01T09:30/2022-12-30T15:00", "-P", "val_time_range=2023-01-03:2023-03-31",
           "-P", "epochs=1", "-P", "batch_size=8", "-P", "n_train_iter=32", "-P", "n_val_iter=16"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = MlflowClient().search_runs(["0"])[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["freq"] == "5min"
    assert run.data.params["train_time_range"] == "2022-07-01T09:30/2022-12-30T15:00"
    ds_input = run.inputs.dataset_inputs[0]
    tags = {t.key: t.value for t in ds_input.tags}
    assert tags["freq"] == "5min" and ds_input.dataset.name == "qlib-csi300-demo-5min"
    import mlflow

    model = mlflow.pyfunc.load_model(run.data.tags["best_model_uri"])
    assert model.metadata.metadata["freq"] == "5min"
    manifests = list((tmp_path / "cache").glob("kronos-*/manifest.json"))
    assert [json.loads(m.read_text())["freq"] for m in manifests] == ["5min"]


def test_plot_time_axis_carries_timestamps(tmp_path):
    from kronos_mlflow.evaluation import plots

    stamps = [str(np.datetime64(t, "s")) for t in session_stamps(DAYS[:2], 5)[40:66]]
    ticks, labels = plots.time_ticks(stamps)
    assert ticks[0] == 0 and ticks[-1] == 25 and labels[0] == "06-17 14:25" and labels[-1] == "06-18 11:00"
    assert plots.time_ticks(["2024-06-17", "2024-06-18"])[1] == ["2024-06-17", "2024-06-18"]
    rng = np.random.default_rng(0)
    raw = np.abs(rng.normal(10, 1, (26, 6)))
    x = rng.normal(0, 1, (26, 6))
    out = plots.plot_reconstruction(raw, x, x, x, 20, str(tmp_path / "r.png"), stamps=stamps)
    assert Path(out).stat().st_size > 10_000
