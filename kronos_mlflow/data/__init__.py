"""Data: Qlib directories (the demo market, CSV import), prepared splits and training windows.

    from kronos_mlflow.data import QlibDataset, make_loader
    ds = QlibDataset("train", config)          # prepares the cache on first use
    loader = make_loader(ds, config["batch_size"], rank, world_size)
    for epoch in range(config["epochs"]):
        ds.set_epoch_seed(epoch)               # before iterating: workers copy the dataset
        for x, x_stamp in loader: ...

Modules: ``provider`` (the Qlib directory format), ``demo`` (synthetic market),
``csv_import`` (CSV -> Qlib), ``prepare`` (Qlib -> cached splits), ``dataset`` (windows).
Names are imported lazily so that ``kronos-mlflow demo-data`` does not load torch or qlib.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "QlibDataset": "dataset",
    "make_loader": "dataset",
    "collate_windows": "dataset",
    "prepare_splits": "prepare",
    "cached_splits": "prepare",
    "resolve_qlib_path": "prepare",
    "provide_qlib_data": "prepare",
    "data_digest": "prepare",
    "write_demo_market": "demo",
    "ensure_demo_market": "demo",
    "import_csv": "csv_import",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kronos_mlflow.data' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
