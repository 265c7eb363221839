"""Preprocessing: features and splits as upstream defines them, a keyed safe cache, clear errors."""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest
from data_helpers import isolated_home, qlib_features, small_config, small_market, write_csv  # noqa: F401

from kronos_mlflow.cli.main import main
from kronos_mlflow.config.core import load_config
from kronos_mlflow.data import QlibDataset, data_digest, import_csv, prepare_splits, resolve_qlib_path
from kronos_mlflow.data.prepare import SPLITS, DataWarning, read_manifest
from kronos_mlflow.errors import ConfigError, DataError
from kronos_mlflow.config.features import amount_from_ohlcv, time_features


def _load(out, split, name):
    return np.load(out / f"{split}_{name}.npy", allow_pickle=False)


def test_features_and_splits_match_qlib(small_market, tmp_path):
    cfg = small_config(small_market, tmp_path / "ds")
    out = prepare_splits(cfg, progress=False)
    m = read_manifest(out)
    window = m["window"]
    assert window == 26
    df = qlib_features(small_market, "csi300", ["$open", "$high", "$low", "$close", "$volume"])
    finite = df[np.isfinite(df.to_numpy()).all(axis=1)]
    kept = [s for s, g in finite.groupby(level=0) if len(g) >= window]
    assert m["stats"]["rows_dropped_nonfinite"] == len(df) - len(finite) > 0, "suspension days are dropped"
    assert m["stats"]["symbols_kept"] == len(kept)
    for split in SPLITS:
        a, b = cfg[f"{split}_time_range"]
        x, stamp, dates = _load(out, split, "x"), _load(out, split, "stamp"), _load(out, split, "dates")
        offsets, starts = _load(out, split, "offsets"), _load(out, split, "starts")
        assert x.dtype == np.float32 and x.shape[1] == 6 and stamp.shape == (len(x), 5)
        assert x.flags.c_contiguous and np.isfinite(x).all()
        syms = m["splits"][split]["symbols"]
        n_windows = 0
        for k, sym in enumerate(syms):
            rows = slice(offsets[k], offsets[k + 1])
            ref = finite.loc[sym]
            ref = ref[(ref.index >= a) & (ref.index <= b)]
            o, h, lo, c, v = (ref[f].to_numpy() for f in ["$open", "$high", "$low", "$close", "$volume"])
            np.testing.assert_array_equal(x[rows], np.stack([o, h, lo, c, v, amount_from_ohlcv(o, h, lo, c, v)], 1))
            np.testing.assert_array_equal(dates[rows], ref.index.to_numpy().astype("datetime64[D]"))
            np.testing.assert_array_equal(stamp[rows], time_features(ref.index))
            n_windows += len(ref) - window + 1
        assert len(starts) == n_windows == m["splits"][split]["windows"] > 0
        # every window: inside one symbol and inside the split's dates
        sym_of = np.searchsorted(offsets, starts, side="right") - 1
        assert (starts + window <= offsets[sym_of + 1]).all()
        assert (dates[starts] >= np.datetime64(a)).all() and (dates[starts + window - 1] <= np.datetime64(b)).all()


def test_short_symbols_and_non_finite_rows_dropped(tmp_path):
    days = [d.strftime("%Y-%m-%d") for d in pd.bdate_range("2023-01-02", periods=60)]

    def rows(ds, bad=()):
        out = []
        for i, d in enumerate(ds):
            r = {"date": d, "open": 10 + i % 3, "high": 12 + i % 5, "low": 9, "close": 11, "volume": 100 + i}
            if i in bad:
                r["close"] = "inf" if i % 2 else ""
            out.append(r)
        return out

    cols = ["date", "open", "high", "low", "close", "volume"]
    write_csv(tmp_path / "in/LONG.csv", rows(days, bad=(5, 6)), cols)
    write_csv(tmp_path / "in/SHORT.csv", rows(days[:20]), cols)
    q = import_csv([tmp_path / "in"], tmp_path / "q")
    cfg = load_config({"qlib_data_path": str(q), "instrument": "all", "lookback_window": 20, "predict_window": 5,
                       "dataset_path": str(tmp_path / "ds"), "train_time_range": "2023-01-01:2023-12-31",
                       "val_time_range": "2023-01-01:2023-12-31", "test_time_range": "2023-01-01:2023-12-31"})
    m = read_manifest(prepare_splits(cfg, progress=False))
    assert m["stats"]["rows_dropped_nonfinite"] == 2
    assert m["stats"]["symbols_dropped_short"] == 1
    assert m["splits"]["train"]["symbols"] == ["LONG"]
    assert m["splits"]["train"]["windows"] == 58 - 26 + 1


def test_cache_reused_and_invalidated(small_market, tmp_path):
    ds = tmp_path / "ds"
    cfg = small_config(small_market, ds)
    out = prepare_splits(cfg, progress=False)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    assert prepare_splits(dict(cfg), progress=False) == out
    assert (out / "manifest.json").stat().st_mtime_ns == stamp, "nothing changed: reused"
    d0 = data_digest(cfg)
    assert data_digest(cfg) == d0 and d0[:20] in out.name
    # the data and backtest sections name the same cache as the whole config they come from
    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.config.sections import sections

    settings = sections(load_config(cfg))
    assert data_digest(settings.data, backtest=settings.backtest) == d0
    assert prepare_splits(settings.data, progress=False, backtest=settings.backtest) == out

    changed = [
        small_config(small_market, ds, val_time_range="2021-05-01:2021-10-31"),
        small_config(small_market, ds, train_time_range="2020-02-01:2021-06-30"),
        small_config(small_market, ds, dataset_end_time="2021-11-30"),
        small_config(small_market, ds, lookback_window=21),
        small_config(small_market, ds, instrument="all"),
        small_config(small_market, ds, feature_list="open,high,low,close,amt,vol"),
    ]
    digests = {data_digest(c) for c in changed}
    assert len(digests) == len(changed) and d0 not in digests
    # same data in another directory: a different cache
    copy = tmp_path / "copy"
    shutil.copytree(small_market, copy)
    assert prepare_splits(small_config(copy, ds), progress=False) != out
    # the data directory changes (a re-import touches its files): a different cache
    f = copy / "features/demo000/close.day.bin"
    before = data_digest(small_config(copy, ds))
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert data_digest(small_config(copy, ds)) != before
    # settings that do not change the data keep the cache
    assert prepare_splits(small_config(small_market, ds, epochs=3, batch_size=8, clip=3.0), progress=False) == out
    # ~ is expanded
    assert resolve_qlib_path({"qlib_data_path": str(small_market)}) == small_market.resolve()


def test_force_rebuilds_in_place(small_market, tmp_path):
    cfg = small_config(small_market, tmp_path / "ds")
    out = prepare_splits(cfg, progress=False)
    first = json.loads((out / "manifest.json").read_text())["created"]
    (out / "marker").write_text("old")
    assert prepare_splits(cfg, progress=False, force=True) == out
    assert not (out / "marker").exists()
    assert json.loads((out / "manifest.json").read_text())["digest"] == data_digest(cfg)
    assert first and json.loads((out / "manifest.json").read_text())["created"] >= first
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")) == [out.name]


def test_leftovers_of_a_crashed_build_are_cleaned(small_market, tmp_path):
    cfg = small_config(small_market, tmp_path / "ds")
    final = prepare_splits(cfg, progress=False)
    shutil.rmtree(final)
    stale = final.parent / f".{final.name}.tmp-crashed"
    stale.mkdir()
    (stale / "train_x.npy").write_bytes(b"partial")
    assert prepare_splits(cfg, progress=False) == final
    assert not stale.exists() and (final / "manifest.json").is_file()


def test_cache_is_pickle_free(small_market, tmp_path):
    out = prepare_splits(small_config(small_market, tmp_path / "ds"), progress=False)
    names = sorted(p.name for p in out.iterdir())
    assert all(n.endswith(".npy") or n == "manifest.json" for n in names)
    for n in names:
        if n.endswith(".npy"):
            np.load(out / n, allow_pickle=False)  # raises on object arrays
    json.loads((out / "manifest.json").read_text())


def _prepare(args):
    market, ds = args
    return str(prepare_splits(small_config(market, ds), progress=False))


def test_concurrent_prepare_is_safe(small_market, tmp_path):
    ds = tmp_path / "ds"
    ctx = mp.get_context("fork")
    with cf.ProcessPoolExecutor(3, mp_context=ctx) as ex:
        outs = list(ex.map(_prepare, [(small_market, ds)] * 3))
    assert len(set(outs)) == 1
    assert [n for n in os.listdir(ds) if ".tmp-" in n] == []
    read_manifest(outs[0])


def test_empty_path_prepares_the_demo_market(tmp_path, isolated_home):
    cfg = load_config({"qlib_data_path": "", "dataset_path": str(tmp_path / "ds"), "n_train_iter": 1000})
    out = prepare_splits(cfg, progress=False)
    m = read_manifest(out)
    assert m["key"]["qlib_data_path"].startswith(str(isolated_home))
    assert all(m["splits"][s]["windows"] > 1000 for s in SPLITS), "the default config works unchanged"
    assert m["stats"]["symbols_dropped_short"] >= 1, "the recent listing is shorter than a window"
    ds = QlibDataset("train", cfg, progress=False)
    assert len(ds) == 1000 and ds[0][0].shape == (101, 6) and ds[0][1].shape == (101, 5)


def test_the_demo_market_is_made_only_with_splits_prepared_from_it(tmp_path, isolated_home):
    """A demo market not made yet is made aside with the splits: a refusal of the data (an
    instrument the demo market lacks) leaves neither, and names the market's own place; a
    preparation that passes moves both into place, the splits named as every later command
    names them (the run prepares nothing again)."""
    from kronos_mlflow.data.prepare import cache_dir_for, market_calendar

    bad = load_config({"qlib_data_path": "", "dataset_path": str(tmp_path / "ds"), "instrument": "nasdaq"})
    with pytest.raises(DataError, match=f"'nasdaq' is not in '{isolated_home}/demo_market/"):
        prepare_splits(bad, progress=False)
    assert not isolated_home.exists() and not (tmp_path / "ds").exists()
    cfg = load_config({"qlib_data_path": "", "dataset_path": str(tmp_path / "ds"), "n_train_iter": 100})
    calendar = market_calendar(cfg)  # computed while the market is not made: nothing written
    assert not isolated_home.exists()
    out = prepare_splits(cfg, progress=False)
    assert out == cache_dir_for(cfg) and read_manifest(out)["key"]["qlib_data_path"] == str(resolve_qlib_path(cfg))
    assert [p.name for p in (tmp_path / "ds").iterdir() if not p.name.endswith(".lock")] == [out.name]
    assert np.array_equal(market_calendar(cfg), calendar)


def test_only_the_front_door_makes_the_demo_market(tmp_path, isolated_home):
    """Evaluation and training read data; they never generate it. Before any command prepared
    data, the scorecard's origins, the backtest's calendar and the path itself refuse in one
    line and write nothing; ``prepare_splits`` (every command's front door) makes the market,
    and then the same calls read it."""
    from kronos_mlflow.evaluation.origins import forecast_origins

    cfg = load_config({"qlib_data_path": "", "dataset_path": str(tmp_path / "ds"), "n_train_iter": 100})
    for call in (resolve_qlib_path, lambda c: forecast_origins(c, "test")):
        with pytest.raises(DataError, match="demo market .* is not made yet"):
            call(cfg)
    assert not any(isolated_home.rglob("day.txt")), "nothing was generated"
    prepare_splits(cfg, progress=False)
    made = resolve_qlib_path(cfg)
    assert (made / "calendars" / "day.txt").is_file() and str(made).startswith(str(isolated_home))
    assert len(forecast_origins(cfg, "test")) > 0


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def _a_file(tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("x")
    return p


def _not_provider(tmp_path):
    p = tmp_path / "notqlib"
    p.mkdir()
    (p / "prices.csv").write_text("a,b\n")
    return p


@pytest.mark.parametrize("make, needles", [
    (lambda t: t / "missing", ["does not exist", "calendars/day.txt"]),
    (lambda t: (t / "empty").mkdir() or t / "empty", ["empty directory"]),
    (_not_provider, ["not a Qlib provider", "calendars/day.txt is missing", "import-csv"]),
    (_a_file, ["not a directory"]),
])
def test_bad_data_directory(tmp_path, capsys, make, needles):
    path = make(tmp_path)
    with pytest.raises(DataError) as exc:
        prepare_splits({"qlib_data_path": str(path), "dataset_path": str(tmp_path / "ds")}, progress=False)
    for n in needles:
        assert n in str(exc.value)
    assert str(path) in str(exc.value)
    assert main(["prepare", "--qlib-data-path", str(path), "--dataset-path", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kronos-mlflow prepare: error: qlib_data_path")
    assert not (tmp_path / "ds").exists() or not any((tmp_path / "ds").iterdir())


def test_unknown_instrument_lists_available(small_market, tmp_path, capsys):
    with pytest.raises(DataError, match=r"instrument 'csi500'.*available: all, csi300"):
        prepare_splits(small_config(small_market, tmp_path / "ds", instrument="csi500"), progress=False)
    assert main(["prepare", "--qlib-data-path", str(small_market), "--instrument", "csi500",
                 "--dataset-path", str(tmp_path / "ds")]) == 2
    assert "available: all, csi300" in capsys.readouterr().err


@pytest.mark.parametrize("value, needle", [
    ("2021-01-01", "not a time range"),
    ("2021-13-01:2021-12-31", "not a date"),
    ("2021-06-01:2021-01-01", "after end"),
])
def test_bad_time_range(small_market, tmp_path, capsys, value, needle):
    with pytest.raises(ConfigError, match=needle):
        small_config(small_market, tmp_path / "ds", train_time_range=value)
    assert main(["prepare", "--qlib-data-path", str(small_market), "--train-time-range", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train_time_range" in err and needle in err


def test_no_training_windows_is_an_error(small_market, tmp_path, capsys):
    cfg = small_config(small_market, tmp_path / "ds", train_time_range="2020-01-01:2020-01-20")
    with pytest.raises(DataError) as exc:
        prepare_splits(cfg, progress=False)
    msg = str(exc.value)
    for n in ("no training windows", "train_time_range 2020-01-01:2020-01-20", "'csi300'", "26"):
        assert n in msg
    assert not (tmp_path / "ds").exists() or [p for p in (tmp_path / "ds").iterdir() if not p.name.endswith(".lock")] == []
    rc = main(["prepare", "--qlib-data-path", str(small_market), "--dataset-path", str(tmp_path / "ds"),
               "--train-time-range", "2020-01-01:2020-01-20", "--lookback-window", "20", "--predict-window", "5"])
    assert rc == 2 and "no training windows" in capsys.readouterr().err


def test_dates_outside_the_calendar(small_market, tmp_path):
    cfg = small_config(small_market, tmp_path / "ds", dataset_begin_time="2030-01-01", dataset_end_time="2030-12-31",
                       train_time_range="2030-01-01:2030-12-31")
    with pytest.raises(DataError, match="holds no trading day"):
        prepare_splits(cfg, progress=False)


def test_the_dates_read_follow_the_time_ranges(small_market, tmp_path):
    """auto (the default) reads from the earliest start to the latest end of the time ranges:
    upstream's 2011-01-01..2025-06-05 with upstream's splits, a given backtest range included;
    an explicit date narrows it; auto and the dates it stands for name one cache."""
    from kronos_mlflow.config.core import data_span

    assert load_config()["dataset_begin_time"] == "auto"
    assert data_span(load_config()) == ("2011-01-01", "2025-06-05")
    assert data_span(load_config({"backtest_time_range": "2024-05-01:2025-09-30"})) == ("2011-01-01", "2025-09-30")
    old = load_config({"train_time_range": "2004-09-01:2008-12-31", "val_time_range": "2008-06-01:2009-12-31",
                       "test_time_range": "2009-10-01:2010-12-31"})
    assert data_span(old) == ("2004-09-01", "2010-12-31")
    assert data_span({**old, "dataset_begin_time": "2006-01-01"}) == ("2006-01-01", "2010-12-31")
    market = {"qlib_data_path": str(small_market), "dataset_path": str(tmp_path / "ds")}
    assert data_digest(load_config(market)) == data_digest(load_config({**market, "dataset_begin_time": "2011-01-01",
                                                                         "dataset_end_time": "2025-06-05"}))
    assert data_digest(load_config(market)) != data_digest(load_config({**market, "dataset_begin_time": "2012-01-01"}))


def test_a_market_that_ends_before_2011_prepares_with_the_default_dates(tmp_path, capsys):
    """`kronos-mlflow prepare` on a market of 2004-2006 with split ranges inside it: the dates read
    follow the ranges (upstream's fixed 2011-01-01 start read nothing of it)."""
    from kronos_mlflow.data import write_demo_market

    market = write_demo_market(tmp_path / "old", 4, 5, start="2004-09-01", end="2006-12-31")
    flags = ["--qlib-data-path", str(market), "--dataset-path", str(tmp_path / "ds"), "--lookback-window", "20",
             "--predict-window", "5", "--train-time-range", "2004-09-01:2005-12-31",
             "--val-time-range", "2005-10-01:2006-06-30", "--test-time-range", "2006-05-01:2006-12-31"]
    assert main(["prepare", *flags]) == 0, capsys.readouterr().err
    assert "train" in capsys.readouterr().out
    # an explicit begin that leaves the training range too few bars is named in the refusal
    assert main(["prepare", *flags, "--dataset-begin-time", "2006-01-02"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no training windows" in err, err
    assert "dataset_begin_time 2006-01-02 starts after it (set them to auto to read the ranges' span)" in err, err


def test_empty_validation_split_is_a_warning(small_market, tmp_path, capsys):
    cfg = small_config(small_market, tmp_path / "ds", val_time_range="2021-12-20:2021-12-31")
    with pytest.warns(DataWarning, match="no val windows"):
        prepare_splits(cfg, progress=False)
    with pytest.warns(DataWarning, match="val split is empty"):
        val = QlibDataset("val", cfg, progress=False)
    assert len(val) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(QlibDataset("train", cfg, progress=False)) > 0
    assert main(["prepare", "--qlib-data-path", str(small_market), "--dataset-path", str(tmp_path / "ds2"),
                 "--lookback-window", "20", "--predict-window", "5",
                 "--test-time-range", "2021-12-20:2021-12-31"]) == 0
    out = capsys.readouterr()
    assert "warning: no test windows" in out.err and "cache:" in out.out


def test_qlib_errors_are_wrapped(small_market, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(small_market, bad)
    with open(bad / "calendars/day.txt", "a") as fh:
        fh.write("garbage\n")
    # A calendar line that is not a date is caught before Qlib reads it (provider.check_provider).
    with pytest.raises(DataError, match="Qlib cannot read|is not a date") as exc:
        prepare_splits(small_config(bad, tmp_path / "ds"), progress=False)
    assert "\n" not in str(exc.value) and "garbage" in str(exc.value)
    shutil.rmtree(bad)
    shutil.copytree(small_market, bad)
    (bad / "features/demo000/close.day.bin").write_bytes(b"\x00\x00\x80")  # truncated
    assert main(["prepare", "--qlib-data-path", str(bad), "--dataset-path", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    # The truncated bin is named before Qlib reads it (provider.check_provider).
    assert err.count("\n") == 1 and "Traceback" not in err and ("Qlib cannot read" in err or "close.day.bin" in err)


def test_cli_prepare_with_config_file(small_market, tmp_path, capsys):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"qlib_data_path: {small_market}\ninstrument: all\nlookback_window: 20\npredict_window: 5\n"
                         f"dataset_path: {tmp_path / 'ds'}\ntrain_time_range: 2020-01-01:2021-06-30\n"
                         "val_time_range: 2021-05-01:2021-09-30\ntest_time_range: 2021-09-01:2021-12-31\n")
    assert main(["prepare", "--config", str(yaml_file)]) == 0
    out = capsys.readouterr().out
    assert "cache:" in out and "train" in out and "'all'" in out
    # flags override the file
    assert main(["prepare", "--config", str(yaml_file), "--instrument", "csi300"]) == 0
    assert "'csi300'" in capsys.readouterr().out
    assert len([p for p in (tmp_path / "ds").iterdir() if p.is_dir()]) == 2
