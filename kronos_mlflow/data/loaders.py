"""Batches for training and validation: the DataLoader on CPUs, windows gathered on the GPU
itself on CUDA (:class:`DeviceWindowLoader`), each rank its own share of the epoch."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from ..config.features import normalize_windows
from ..config.keys import PERFORMANCE, TRAINING
from ..config.sections import as_section


def make_loader(ds, batch_size: int, rank: int = 0, world_size: int = 1, num_workers: int = 0, *,
                drop_last: bool = False, sampler=None, **kwargs) -> DataLoader:
    """The one DataLoader factory: ``ds`` in the dataset's own epoch order (no shuffle), batched
    by its ``collate_fn``. With ``world_size > 1`` and no ``sampler``, ranks take disjoint, equal
    slices of the epoch (``DistributedSampler(shuffle=False, drop_last=True)``). Workers persist
    across epochs (the epoch seed is shared with them). Extra ``kwargs`` go to ``DataLoader``."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size {batch_size} must be >= 1")
    if sampler is None and world_size > 1:
        sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=False, drop_last=True)
    kwargs.setdefault("persistent_workers", int(num_workers) > 0)
    return DataLoader(ds, batch_size=int(batch_size), sampler=sampler, shuffle=False, drop_last=drop_last,
                      num_workers=int(num_workers), collate_fn=getattr(ds, "collate_fn", None), **kwargs)


def _batching(training: Any, performance: Any) -> tuple[Any, Any]:
    """The ``training`` section (``batch_size``) and the ``performance`` section (``num_workers``):
    ``training`` the training section (``performance`` then the performance section, or None for
    its declared defaults) or a whole config (both taken from it)."""
    if isinstance(training, Mapping):
        return as_section(training, TRAINING), as_section(training, PERFORMANCE)
    return as_section(training, TRAINING), as_section({} if performance is None else performance, PERFORMANCE)


def train_loader_for(ds, training, rank: int, world_size: int, device=None, *, performance=None):
    """Each rank takes its own share of the epoch (DistributedSampler, no padding repeats).

    ``ds[i]`` is the epoch's i-th window, so sampling indices in order is already a shuffle.
    On a CUDA ``device`` the windows are gathered and normalised on the GPU itself
    (:class:`DeviceWindowLoader`: same batches, same order), so the loader
    never holds the GPU back; elsewhere it is the DataLoader. ``training``, ``performance``: as
    :func:`_batching` takes them.
    """
    training, performance = _batching(training, performance)
    if device is not None and str(device).startswith("cuda"):
        return DeviceWindowLoader(ds, training.batch_size, device, rank, world_size, drop_last=True)
    return make_loader(ds, training.batch_size, rank, world_size, performance.num_workers, drop_last=True)


def val_loader_for(ds, training, rank: int, world_size: int, *, performance=None):
    """Validation shards by striding, keeping every sample exactly once over all ranks.
    ``training``, ``performance``: as :func:`_batching` takes them."""
    training, performance = _batching(training, performance)
    return make_loader(ds, training.batch_size, num_workers=performance.num_workers,
                       sampler=range(rank, len(ds), world_size))


def _to_device(arr, device: torch.device, rows: int = 1 << 20) -> torch.Tensor:
    """A float32 copy of ``arr`` (a numpy array or memory map) on ``device``, ``rows`` at a time."""
    out = torch.empty(tuple(arr.shape), dtype=torch.float32, device=device)
    for i in range(0, len(arr), rows):
        out[i : i + rows] = torch.from_numpy(np.array(arr[i : i + rows], dtype=np.float32))
    return out


class DeviceWindowLoader:
    """Training batches of a ``QlibDataset``, gathered and normalised on ``device``.

    The split's raw arrays go to the device once; each batch is then one index gather
    (``starts[:, None] + arange(window)``) and the same z-score as ``QlibDataset`` (lookback-only
    mean and population std + 1e-5, clipped), in torch on the device. The order is the
    dataset's epoch order (``ds.set_epoch_seed`` before iterating, as with the DataLoader) and
    each rank gets the share ``DistributedSampler(shuffle=False, drop_last=True)`` gives it, in
    batches of ``batch_size`` (``drop_last`` as the training DataLoader). Yields ``(x, x_stamp)``
    float32 tensors on the device, equal to the DataLoader's to float rounding (numpy and torch
    sum in different orders).
    """

    def __init__(self, ds, batch_size: int, device: torch.device | str, rank: int = 0, world_size: int = 1,
                 drop_last: bool = True):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        self.ds = ds
        self.batch_size = int(batch_size)
        self.device = torch.device(device)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        # The dataset's arrays are read-only memory maps: copied to the device a slice at a time, so
        # the host never holds a whole split (minute markets: gigabytes).
        self.x = _to_device(ds.x, self.device)
        self.x_stamp = _to_device(ds.x_stamp, self.device)
        self.steps = torch.arange(ds.window, device=self.device)
        self.lookback = int(ds.lookback)
        self.clip = float(ds.clip)

    def _indices(self) -> list[int] | range:
        n = len(self.ds)
        if self.world_size <= 1:
            return range(n)
        return list(DistributedSampler(self.ds, num_replicas=self.world_size, rank=self.rank, shuffle=False,
                                       drop_last=True))

    def _n_samples(self) -> int:
        n = len(self.ds)
        if self.world_size <= 1:
            return n
        return math.ceil((n - self.world_size) / self.world_size) if n % self.world_size else n // self.world_size

    def __len__(self) -> int:
        n = self._n_samples()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def gather(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows starting at rows ``starts`` (a device int64 tensor): normalised x, raw stamps."""
        rows = starts[:, None] + self.steps
        return normalize_windows(self.x[rows], self.lookback, self.clip), self.x_stamp[rows]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        idx = self._indices()
        order = self.ds.order()  # this epoch's start rows (numpy), by the dataset's epoch seed
        starts = torch.from_numpy(order[idx] if not isinstance(idx, range) else order[: len(idx)])
        starts = starts.to(self.device, non_blocking=False)
        for b in range(len(self)):
            yield self.gather(starts[b * self.batch_size:(b + 1) * self.batch_size])
