"""QlibDataset: the normalisation numbers, and an epoch that no worker or rank repeats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_helpers import batch_keys, isolated_home, sample_key, small_config, small_market, write_csv  # noqa: F401
from torch.utils.data import DataLoader

from kronos_mlflow.config.core import load_config
from kronos_mlflow.data import QlibDataset, import_csv, make_loader
from kronos_mlflow.data.dataset import WindowBatch, collate_windows
from kronos_mlflow.errors import DataError
from kronos_mlflow.config.features import normalize_windows, time_features


@pytest.fixture
def train_cfg(small_market, tmp_path):
    return small_config(small_market, tmp_path / "ds")


@pytest.fixture
def train_ds(train_cfg):
    return QlibDataset("train", train_cfg, progress=False)


def _epoch_keys(loader):
    keys = []
    for x, x_stamp in loader:
        keys += batch_keys(x, x_stamp)
    return keys


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def hand_made(tmp_path):
    """One symbol, open = high = low = close, constant volume: window 6 (lookback 4 + predict 1 + 1)."""
    close = [1, 2, 3, 4, 5, 100, 7, 7, 7, 7, 8, 6]
    days = ["2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-08", "2024-01-09",
            "2024-01-10", "2024-01-11", "2024-01-12", "2024-01-15", "2024-01-16", "2024-01-17"]
    rows = [{"date": d, "open": c, "high": c, "low": c, "close": c, "volume": 1000} for d, c in zip(days, close)]
    write_csv(tmp_path / "in/HAND.csv", rows, ["date", "open", "high", "low", "close", "volume"])
    q = import_csv([tmp_path / "in/HAND.csv"], tmp_path / "q")
    rng = "2024-01-01:2024-12-31"
    cfg = load_config({"qlib_data_path": str(q), "instrument": "all", "lookback_window": 4, "predict_window": 1,
                       "dataset_path": str(tmp_path / "ds"), "train_time_range": rng, "val_time_range": rng,
                       "test_time_range": rng, "dataset_begin_time": "2024-01-01", "dataset_end_time": "2024-12-31"})
    return QlibDataset("train", cfg, progress=False), days


def _index_of(ds, start_row):
    return next(i for i in range(len(ds)) if ds.window_info(i)["start_row"] == start_row)


def test_normalisation_numbers(hand_made):
    ds, days = hand_made
    assert ds.window == 6 and len(ds) == 12 - 6 + 1
    x, x_stamp = ds[_index_of(ds, 0)]
    assert x.dtype == torch.float32 and x.shape == (6, 6) and x_stamp.shape == (6, 5)
    # lookback 1, 2, 3, 4: mean 2.5, population std sqrt(1.25); 100 is clipped to +5
    std = np.sqrt(1.25) + 1e-5
    expect = np.array([(c - 2.5) / std for c in (1, 2, 3, 4, 5)] + [5.0], dtype=np.float32)
    for f in (0, 1, 2, 3, 5):  # open high low close, and amt (= close x constant volume)
        np.testing.assert_allclose(x[:, f].numpy(), expect, rtol=1e-5, atol=1e-6)
    assert (x[:, 4] == 0).all(), "constant volume: zero-variance lookback gives 0, not NaN"
    np.testing.assert_array_equal(x_stamp.numpy(), time_features(days[0:6]))
    assert x_stamp[0].tolist() == [0, 0, 1, 2, 1]  # minute, hour, weekday (Tue), day, month


def test_zero_variance_lookback_is_finite(hand_made):
    ds, _ = hand_made
    x, _ = ds[_index_of(ds, 6)]  # 7, 7, 7, 7 | 8, 6
    assert torch.isfinite(x).all()
    np.testing.assert_array_equal(x[:, 3].numpy(), [0, 0, 0, 0, 5, -5])
    xb = ds.__getitems__(list(range(len(ds)))).x
    assert torch.isfinite(xb).all() and xb.abs().max() <= ds.clip


def test_getitems_equals_getitem(train_ds):
    idx = [5, 0, 17, len(train_ds) - 1, 5]
    batch = train_ds.__getitems__(idx)
    assert isinstance(batch, WindowBatch) and len(batch) == 5
    for k, i in enumerate(idx):
        x, s = train_ds[i]
        assert torch.equal(batch.x[k], x) and torch.equal(batch.x_stamp[k], s)
    x, s = collate_windows(batch)
    assert x.shape == (5, 26, 6) and s.shape == (5, 26, 5) and x.dtype == s.dtype == torch.float32


def test_windows_lie_in_one_symbol_and_the_split(train_cfg, train_ds):
    for split in ("train", "val", "test"):
        ds = train_ds if split == "train" else QlibDataset(split, train_cfg, progress=False)
        a, b = train_cfg[f"{split}_time_range"]
        assert len(ds) == ds.n_windows > 0
        for i in range(0, len(ds), 7):
            info = ds.window_info(i)
            assert info["same_symbol"] and a <= info["first"] <= info["last"] <= b
        x = ds.__getitems__(list(range(len(ds)))).x
        assert torch.isfinite(x).all() and x.abs().max() <= 5.0


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------

def test_len_is_capped_by_n_iter(small_market, tmp_path):
    full = QlibDataset("train", small_config(small_market, tmp_path / "ds"), progress=False)
    few = QlibDataset("train", small_config(small_market, tmp_path / "ds", n_train_iter=100), progress=False)
    val = QlibDataset("val", small_config(small_market, tmp_path / "ds", n_val_iter=30), progress=False)
    assert len(full) == full.n_windows > 100 and len(few) == 100 and len(val) == 30
    keys = _epoch_keys(make_loader(few, 16))
    assert len(keys) == 100 == len(set(keys))
    with pytest.raises(IndexError):
        few[100]
    assert torch.equal(few[-1][0], few[99][0])


def test_pure_function_of_seed_epoch_and_index(train_cfg, small_market, tmp_path):
    a = QlibDataset("train", train_cfg, progress=False)
    b = QlibDataset("train", train_cfg, progress=False)
    a.set_epoch_seed(3)
    b.set_epoch_seed(3)
    for i in (0, 1, 99, len(a) - 1):
        assert torch.equal(a[i][0], b[i][0])
    # handed its sections, the dataset is the one the whole config gives
    from kronos_mlflow.config.sections import sections

    settings = sections(load_config(train_cfg))
    c = QlibDataset("train", settings.data, progress=False, job=settings.job, training=settings.training,
                    backtest=settings.backtest)
    c.set_epoch_seed(3)
    assert c.cache_dir == a.cache_dir and np.array_equal(c.order(), a.order()) and torch.equal(c[7][0], a[7][0])
    other_seed = QlibDataset("train", small_config(small_market, tmp_path / "ds", seed=8), progress=False)
    other_seed.set_epoch_seed(3)
    assert not np.array_equal(a.order(), other_seed.order())


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_has_no_repeats(train_ds, workers):
    keys = _epoch_keys(make_loader(train_ds, 50, num_workers=workers))
    assert len(keys) == len(train_ds) == len(set(keys))
    assert set(keys) == {sample_key(*train_ds[i]) for i in range(len(train_ds))}


def test_same_epoch_whatever_num_workers(train_ds):
    train_ds.set_epoch_seed(11)
    k0 = _epoch_keys(make_loader(train_ds, 50, num_workers=0))
    k2 = _epoch_keys(make_loader(train_ds, 50, num_workers=2))
    k2b = _epoch_keys(make_loader(train_ds, 32, num_workers=2))
    assert k0 == k2 == k2b


def test_two_ranks_split_an_epoch_without_overlap(train_ds):
    train_ds.set_epoch_seed(5)
    r0 = _epoch_keys(make_loader(train_ds, 50, rank=0, world_size=2))
    r1 = _epoch_keys(make_loader(train_ds, 50, rank=1, world_size=2, num_workers=2))
    assert len(r0) == len(r1) == len(train_ds) // 2
    assert not set(r0) & set(r1)
    assert len(set(r0) | set(r1)) == 2 * (len(train_ds) // 2)


def test_new_epoch_seed_draws_a_new_order(train_ds):
    train_ds.set_epoch_seed(0)
    e0 = _epoch_keys(make_loader(train_ds, 50))
    train_ds.set_epoch_seed(1)
    e1 = _epoch_keys(make_loader(train_ds, 50))
    train_ds.set_epoch_seed(0)
    again = _epoch_keys(make_loader(train_ds, 50, num_workers=2))
    assert e0 != e1 and sorted(e0) == sorted(e1), "all windows, another order"
    assert again == e0
    with pytest.raises(ValueError):
        train_ds.set_epoch_seed(-1)


def test_persistent_workers_follow_the_epoch_seed(train_ds):
    """Workers that outlive an epoch still see set_epoch_seed (the seed is in shared memory)."""
    loader = make_loader(train_ds, 50, num_workers=2, persistent_workers=True)
    fresh = make_loader(train_ds, 50, num_workers=0)
    for epoch in (0, 1, 2):
        train_ds.set_epoch_seed(epoch)
        assert _epoch_keys(loader) == _epoch_keys(fresh)


def test_dataset_exposes_its_collate_fn(train_ds):
    """``DataLoader(ds, collate_fn=ds.collate_fn)``, as a training loop may build it, is the fast path."""
    x, s = next(iter(DataLoader(train_ds, batch_size=8, collate_fn=train_ds.collate_fn)))
    assert x.shape == (8, 26, 6) and s.shape == (8, 26, 5)
    raw = train_ds.raw_windows([0, 1])
    assert raw.shape == (2, 26, 6) and raw.dtype == np.float32
    np.testing.assert_allclose(normalize_windows(raw, 20, 5.0)[0], train_ds[0][0].numpy())


def test_default_collate_also_works(train_ds):
    plain = DataLoader(train_ds, batch_size=40)  # no collate_fn: default_collate on a WindowBatch
    x, s = next(iter(plain))
    y, t = next(iter(make_loader(train_ds, 40)))
    assert torch.equal(x, y) and torch.equal(s, t)


def test_bad_arguments(train_cfg, train_ds):
    with pytest.raises(DataError, match="split 'valid' is not one of train, val, test"):
        QlibDataset("valid", train_cfg)
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(train_ds, 0)
    with pytest.raises(DataError, match="feature_list: 'volume' is not a known feature"):
        QlibDataset("train", dict(train_cfg, feature_list=["open", "high", "low", "close", "volume", "amt"]))


def test_feature_order_follows_config(small_market, tmp_path, train_ds):
    cfg = small_config(small_market, tmp_path / "ds", feature_list="amt,vol,close,low,high,open",
                       time_feature_list="month,day,weekday,hour,minute")
    rev = QlibDataset("train", cfg, progress=False)
    assert np.array_equal(rev.order(), train_ds.order())
    x, s = rev[3]
    y, t = train_ds[3]
    assert torch.equal(x, y.flip(-1)) and torch.equal(s, t.flip(-1))
