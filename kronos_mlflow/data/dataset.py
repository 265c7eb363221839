"""Training windows: :class:`QlibDataset`, each epoch a deterministic permutation of a split's
windows read from the memory-mapped prepared splits (its loaders come from
:mod:`kronos_mlflow.data.loaders`; docs/data.md#scale-memory-mapped-splits).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from ..errors import DataError
from ..config.features import normalize_windows
from ..config.keys import BACKTEST, DATA, JOB, TRAINING
from ..config.sections import as_section, section
from .prepare import SPLITS, DataWarning, cached_splits, data_sections, read_manifest, validated

_SPLIT_CODE = {"train": 0, "val": 1, "test": 2}
# Up to this many windows an epoch is a prefix of a permutation of all windows; above it (minute
# markets: tens of millions) a sample without replacement drawn in O(epoch) memory.
_PERMUTE_UP_TO = 2_000_000


class WindowBatch(Sequence):
    """A batch from ``QlibDataset.__getitems__``: ``.x`` (B, T, 6) and ``.x_stamp`` (B, T, 5).

    It is also a sequence of per-sample ``(x, x_stamp)`` views, so ``default_collate`` works too.
    """

    __slots__ = ("x", "x_stamp")

    def __init__(self, x: torch.Tensor, x_stamp: torch.Tensor):
        self.x = x
        self.x_stamp = x_stamp

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return WindowBatch(self.x[i], self.x_stamp[i])
        return self.x[i], self.x_stamp[i]


def collate_windows(batch):
    """Collate for ``QlibDataset`` loaders: a ``WindowBatch`` becomes ``(x, x_stamp)`` as is;
    anything else goes to ``default_collate``."""
    if isinstance(batch, WindowBatch):
        return batch.x, batch.x_stamp
    return default_collate(batch)


class QlibDataset(Dataset):
    """Windows of one split (``train``, ``val`` or ``test``) of the prepared Qlib data.

    ``ds[i]`` -> ``(x, x_stamp)``: float32 tensors of shapes ``(window, len(feature_list))`` and
    ``(window, len(time_feature_list))``, window = lookback_window + predict_window + 1. ``x`` is
    z-scored with its lookback part's mean and std (+1e-5) and clipped to +-clip; ``x_stamp`` is
    the raw calendar features.

    Sampling: an epoch is a deterministic permutation of all windows of the split, drawn by
    ``numpy.random.default_rng((seed, epoch_seed, split))`` (above two million windows: a sample
    without replacement, ``Generator.choice(..., replace=False)``); ``ds[i]`` is its i-th window
    and ``len(ds) = min(n_train_iter | n_val_iter, windows available)``. So an epoch never repeats
    a window, is the same whatever ``num_workers``, and ``DistributedSampler(shuffle=False,
    drop_last=True)`` gives each rank a disjoint slice (``loaders.make_loader`` does that when
    ``world_size > 1``). Upstream's dataset ignored the index and drew from a random generator each
    worker copied, repeating samples across workers. Call :meth:`set_epoch_seed` before iterating
    (workers copy the dataset); validation uses epoch seed 0, the same windows every epoch.

    Empty splits: no training window raises ``DataError`` (from the preparation step); an empty
    ``val``/``test`` split gives a dataset of length 0 and a ``DataWarning``, and callers check
    ``len(ds) == 0`` and skip validation.

    ``data``: the config's data section, with ``job`` (its seed), ``training`` (``n_train_iter``,
    ``n_val_iter``) and ``backtest`` (its range widens the span read) sections, each left out at
    its declared defaults; or a whole config, full or partial (validated here, every section
    taken from it).
    """

    def __init__(self, split: str, data: Any, *, progress: bool = True, job: Any = None, training: Any = None,
                 backtest: Any = None):
        if split not in SPLITS:
            raise DataError(f"split '{split}' is not one of {', '.join(SPLITS)}")
        if isinstance(data, Mapping):
            cfg = validated(data)
            data, backtest, job, training = (section(cfg, name) for name in (DATA, BACKTEST, JOB, TRAINING))
        else:
            data, backtest = data_sections(data, backtest)
            job, training = (as_section({} if given is None else given, name)
                             for given, name in ((job, JOB), (training, TRAINING)))
        self.split = split
        self.lookback = int(data.lookback_window)
        self.window = self.lookback + int(data.predict_window) + 1
        self.clip = float(data.clip)
        self.seed = int(job.seed)
        self.cache_dir: Path = cached_splits(data, progress=progress, backtest=backtest)
        self.manifest = read_manifest(self.cache_dir)
        info = self.manifest["splits"][split]
        self.time_range = tuple(info["time_range"])
        self.symbols: list[str] = list(info["symbols"])
        try:
            self.x = self._load("x")  # (rows, 6) float32, raw features
            self.x_stamp = self._load("stamp")  # (rows, 5) uint8, calendar features (float32 per batch)
            self.starts = self._load("starts")  # (windows,) int64 row index of each window's first row
            self.offsets = self._load("offsets")  # (symbols + 1,) row offsets of each symbol
        except (OSError, ValueError):
            raise DataError(f"prepared splits at '{self.cache_dir}' are damaged; delete that directory and "
                            "run `kronos-mlflow prepare` again") from None
        self.n_windows = int(len(self.starts))
        # Window k of the split starts at offsets[j] + (k - first_window[j]) for its series j: the
        # starts file is never read whole (it is as long as the split has windows).
        per_series = np.maximum(np.diff(self.offsets) - self.window + 1, 0)
        self._first_window = np.r_[0, np.cumsum(per_series)].astype(np.int64)
        limit = int(training.n_train_iter if split == "train" else training.n_val_iter)
        self.n_samples = min(limit, self.n_windows)
        self._steps = np.arange(self.window, dtype=np.int64)
        # The epoch seed lives in shared memory so that persistent DataLoader workers (which copy
        # the dataset once) still see set_epoch_seed calls made in the main process.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._order: np.ndarray | None = None
        self._order_seed = -1
        if self.n_windows == 0:
            if split == "train":  # prepare_splits refuses this; kept for hand-made caches
                raise DataError(f"no training windows in '{self.cache_dir}'")
            a, b = self.time_range
            warnings.warn(f"no {split} windows for {split}_time_range {a}:{b} with instrument "
                          f"'{data.instrument}': this {split} split is empty (len 0)", DataWarning, stacklevel=2)

    def _load(self, name: str) -> np.ndarray:
        # Memory-mapped: a process's memory does not grow with the market (pages are shared with
        # the other ranks through the page cache). The per-series offsets are read in.
        arr = np.load(self.cache_dir / f"{self.split}_{name}.npy", allow_pickle=False,
                      mmap_mode=None if name == "offsets" else "r")
        return np.ascontiguousarray(arr) if name == "offsets" else arr

    # The collate function DataLoaders should use (``loaders.make_loader`` does).
    collate_fn = staticmethod(collate_windows)

    # ---- sampling ----
    @property
    def epoch_seed(self) -> int:
        return int(self._epoch[0])

    def set_epoch_seed(self, epoch_seed: int) -> None:
        """Choose the epoch: a new seed draws a new order of windows. Call it before iterating."""
        epoch_seed = int(epoch_seed)
        if epoch_seed < 0:
            raise ValueError(f"epoch seed {epoch_seed} must be >= 0")
        self._epoch[0] = epoch_seed

    def order(self) -> np.ndarray:
        """This epoch's window start rows, in order (length ``len(self)``)."""
        seed = int(self._epoch[0])
        if self._order is None or seed != self._order_seed:
            rng = np.random.default_rng([self.seed, seed, _SPLIT_CODE[self.split]])
            if self.n_windows <= _PERMUTE_UP_TO:
                perm = rng.permutation(self.n_windows)[: self.n_samples]
            else:  # a sample without replacement in O(n_samples) memory (Floyd's algorithm)
                perm = rng.choice(self.n_windows, self.n_samples, replace=False)
            self._order = self.start_rows(perm)
            self._order_seed = seed
        return self._order

    def start_rows(self, windows) -> np.ndarray:
        """First rows of windows (indices into the split's windows, as in the starts file)."""
        k = np.asarray(windows, dtype=np.int64)
        j = np.searchsorted(self._first_window, k, side="right") - 1
        return np.ascontiguousarray(self.offsets[j] + (k - self._first_window[j]))

    def __len__(self) -> int:
        return self.n_samples

    def _rows(self, indices) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        n = self.n_samples
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"index {bad} is out of range for a {self.split} epoch of {n} windows")
        return self.order()[idx]

    # ---- fetching ----
    def __getitem__(self, i: int):
        start = int(self._rows(i))
        x = normalize_windows(self.x[start : start + self.window], self.lookback, self.clip)
        return torch.from_numpy(x), torch.from_numpy(self.x_stamp[start : start + self.window].astype(np.float32))

    def __getitems__(self, indices) -> WindowBatch:
        """A whole batch (``DataLoader`` asks for one): gathered with one fancy index and normalised
        in one vectorised call, as a lazy :class:`WindowBatch` that :func:`collate_windows` turns
        into the two batch tensors without copying."""
        rows = self._rows(indices)[:, None] + self._steps  # (B, T)
        x = normalize_windows(self.x[rows], self.lookback, self.clip)
        return WindowBatch(torch.from_numpy(x), torch.from_numpy(self.x_stamp[rows].astype(np.float32)))

    def raw_windows(self, indices) -> np.ndarray:
        """The epoch's windows before normalisation, float32 ``(len(indices), window, features)``
        (what the MLflow model takes as input)."""
        rows = self._rows(indices)[:, None] + self._steps
        return self.x[rows]

    def window_info(self, i: int) -> dict[str, Any]:
        """Where the epoch's i-th window comes from: symbol and first/last date (for checks)."""
        start = int(self._rows(i))
        sym = int(np.searchsorted(self.offsets, start, side="right")) - 1
        dates = np.load(self.cache_dir / f"{self.split}_dates.npy", mmap_mode="r", allow_pickle=False)
        return {"symbol": self.symbols[sym], "start_row": start, "first": str(dates[start]),
                "last": str(dates[start + self.window - 1]),
                "same_symbol": bool(start + self.window <= self.offsets[sym + 1])}

    def window_times(self, i: int) -> list[str]:
        """The timestamps of the epoch's i-th window's bars (ISO text: dates, or date-times)."""
        start = int(self._rows(i))
        dates = np.load(self.cache_dir / f"{self.split}_dates.npy", mmap_mode="r", allow_pickle=False)
        return [str(d) for d in dates[start : start + self.window]]

    def __repr__(self) -> str:
        return (f"QlibDataset(split={self.split!r}, windows={self.n_windows}, len={len(self)}, "
                f"window={self.window}, epoch_seed={self.epoch_seed})")
