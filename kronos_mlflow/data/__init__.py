"""Market data: Qlib directories (the demo market, CSV import), the prepared splits, training windows and loaders.
May import ``config``, ``runtime`` and ``errors`` (docs/code-map.md); names load lazily, so ``demo-data`` never loads torch.

    from kronos_mlflow.data import QlibDataset, make_loader
    ds = QlibDataset("train", config)          # prepares the cache on first use
    loader = make_loader(ds, config["batch_size"], rank, world_size)

docs/data.md says what each split and key means.
"""

from __future__ import annotations

from ..runtime.lazy import lazy_exports

_EXPORTS = {
    "QlibDataset": "dataset",
    "make_loader": "loaders",
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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
