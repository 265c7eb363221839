"""The held-out windows a run is judged on, chosen from the data and the config only (no seed):
evenly spaced windows of the split, normalised exactly as training normalises them
(:func:`kronos_mlflow.config.features.normalize_windows`; docs/verdict.md#which-windows).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data import QlibDataset
from ..config.features import normalize_windows
from ..config.keys import TRAINING, VERDICT
from ..config.sections import as_section

HELDOUT_SPLITS = ("test", "val")


def window_limit(verdict: Any, training: Any = None) -> int:
    """How many windows the held-out evaluation scores at most: ``n_test_iter``, or
    ``n_val_iter`` when it is 0 (so a quick run stays quick). ``verdict``, ``training``: the
    config's verdict and training sections, or the whole config as ``verdict``."""
    training = verdict if training is None else training
    return int(as_section(verdict, VERDICT).n_test_iter or 0) or int(as_section(training, TRAINING).n_val_iter)


def evenly_spaced(n_windows: int, limit: int) -> np.ndarray:
    """Indices of the windows to score, ascending: all of ``range(n_windows)`` when it has at
    most ``limit``, else ``floor(i * n_windows / limit)`` for ``i`` in ``range(limit)``."""
    n, k = int(n_windows), int(limit)
    if k < 1:
        raise ValueError(f"limit {limit} must be at least 1")
    if n <= k:
        return np.arange(n, dtype=np.int64)
    return (np.arange(k, dtype=np.int64) * n) // k


@dataclass
class HeldOutWindows:
    """The selected windows of one split of the prepared data (docs/verdict.md#which-windows).
    A window's position in the selection is its identity: per-window losses of two models line up
    index for index, which is what the paired bootstrap (:mod:`.verdict`) needs; :attr:`digest`
    names the selection, so two runs can tell whether they were judged on the same windows.

    ``positions`` index the selection (0 .. len-1); :meth:`batches` yields normalised
    ``(x, x_stamp)`` float32 tensors of the given positions, in order.
    """

    split: str
    time_range: tuple[str, str]
    available: int  # windows the split has
    indices: np.ndarray  # the selected windows, ascending indices into the split's windows
    start_rows: np.ndarray  # their first rows in the split's arrays
    x: np.ndarray  # the split's raw features (memory-mapped), rows x 6
    x_stamp: np.ndarray  # the split's calendar features, rows x 5
    window: int
    lookback: int
    clip: float
    data_key: str  # the prepared data's key (its cache directory's name)

    def __len__(self) -> int:
        return int(len(self.indices))

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of what decides the numbers of a window: data key, split, window
        sizes, clip and the chosen start rows."""
        h = hashlib.sha256(f"{self.data_key}|{self.split}|{self.window}|{self.lookback}|{self.clip!r}|".encode())
        h.update(np.ascontiguousarray(self.start_rows, dtype="<i8").tobytes())
        return h.hexdigest()

    def rows(self, positions) -> np.ndarray:
        starts = self.start_rows[np.asarray(positions, dtype=np.int64)]
        return starts[:, None] + np.arange(self.window, dtype=np.int64)

    def raw(self, positions) -> np.ndarray:
        """The windows before normalisation, float32 ``(len(positions), window, 6)``."""
        return np.asarray(self.x[self.rows(positions)], dtype=np.float32)

    def batch(self, positions) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows(positions)
        x = normalize_windows(np.asarray(self.x[rows], dtype=np.float32), self.lookback, self.clip)
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(self.x_stamp[rows].astype(np.float32))

    def shard(self, rank: int, world_size: int) -> np.ndarray:
        """The positions this rank scores: every ``world_size``-th, from ``rank`` (each once)."""
        return np.arange(int(rank), len(self), max(1, int(world_size)), dtype=np.int64)

    def batches(self, positions, batch_size: int) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        """``(positions, x, x_stamp)`` of ``positions`` in chunks of ``batch_size``."""
        positions = np.asarray(positions, dtype=np.int64)
        for i in range(0, len(positions), int(batch_size)):
            chunk = positions[i:i + int(batch_size)]
            yield (chunk, *self.batch(chunk))

    def describe(self) -> str:
        a, b = self.time_range
        shown = f"{len(self):,}" if len(self) == self.available else f"{len(self):,} of {self.available:,}"
        return f"{shown} {self.split} windows in {a}:{b}"


def heldout_windows(config: Mapping[str, Any], split: str = "test") -> HeldOutWindows:
    """The windows of ``split`` (test or val) the held-out evaluation scores, from the prepared
    splits of ``config`` (prepared on first use)."""
    if split not in HELDOUT_SPLITS:
        raise ValueError(f"split '{split}' is not one of {', '.join(HELDOUT_SPLITS)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an empty split is reported once, by the caller
        ds = QlibDataset(split, config, progress=False)
    indices = evenly_spaced(ds.n_windows, window_limit(config))
    return HeldOutWindows(
        split=split, time_range=tuple(ds.time_range), available=ds.n_windows, indices=indices,
        start_rows=ds.start_rows(indices) if len(indices) else np.empty(0, dtype=np.int64),
        x=ds.x, x_stamp=ds.x_stamp, window=ds.window, lookback=ds.lookback, clip=ds.clip,
        data_key=ds.cache_dir.name,
    )
