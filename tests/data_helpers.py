"""Shared pieces of the data tests: one small demo market per session, small configs, isolation."""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from tiny_runs import isolated_vars

SMALL = {"n_symbols": 8, "seed": 3, "start": "2020-01-01", "end": "2021-12-31"}
_MARKETS: dict[tuple, Path] = {}


def small_market_path() -> Path:
    """The session's small demo market (8 symbols, 2020-2021), written once per process."""
    key = tuple(sorted(SMALL.items()))
    if key not in _MARKETS:
        from kronos_mlflow.data import write_demo_market

        root = Path(tempfile.mkdtemp(prefix="kronos-test-market-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _MARKETS[key] = write_demo_market(root / "market", SMALL["n_symbols"], SMALL["seed"],
                                          start=SMALL["start"], end=SMALL["end"])
    return _MARKETS[key]


@pytest.fixture(scope="session")
def small_market() -> Path:
    return small_market_path()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every data test writes its demo cache and prepared splits under tmp_path only."""
    for name, value in isolated_vars(tmp_path).items():
        monkeypatch.setenv(name, value)
    return tmp_path / "home"


def small_config(market, dataset_path, **overrides) -> dict:
    """Lookback 20 + predict 5 (window 26) on the small market; ranges overlap as upstream's do."""
    from kronos_mlflow.config.core import load_config

    cfg = {
        "qlib_data_path": str(market),
        "instrument": "csi300",
        "dataset_begin_time": "2020-01-01",
        "dataset_end_time": "2021-12-31",
        "train_time_range": "2020-01-01:2021-06-30",
        "val_time_range": "2021-05-01:2021-09-30",
        "test_time_range": "2021-09-01:2021-12-31",
        "lookback_window": 20,
        "predict_window": 5,
        "dataset_path": str(dataset_path),
        "seed": 7,
    }
    cfg.update(overrides)
    return load_config(cfg)


def sample_key(x, x_stamp) -> str:
    """A content hash identifying one window (normalised features + calendar features)."""
    h = hashlib.sha1(np.ascontiguousarray(x.numpy()).tobytes())
    h.update(np.ascontiguousarray(x_stamp.numpy()).tobytes())
    return h.hexdigest()


def batch_keys(x, x_stamp) -> list[str]:
    return [sample_key(x[i], x_stamp[i]) for i in range(len(x))]


def qlib_features(path, instruments, fields, start=None, end=None):
    """Read through Qlib itself (qlib.init + D.features), quietly."""
    import logging

    import qlib
    from qlib.constant import REG_CN
    from qlib.data import D

    qlib.init(provider_uri=str(path), region=REG_CN, logging_level=logging.WARNING, kernels=1)
    if isinstance(instruments, str):
        instruments = D.instruments(instruments)
    return D.features(instruments, fields, start_time=start, end_time=end, freq="day")


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
