"""What a validation pass says about a tokenizer beyond its MSE: codebook use and per-feature error,
gathered by :class:`ValidationStats` during the pass the training loop already makes, over every
rank (docs/comparing-runs.md#quality-metrics). Plain computation on tensors; the only collectives
are in :mod:`kronos_mlflow.runtime.distributed` (no-ops without a process group).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..runtime.distributed import all_gather_varlen, all_reduce_sum_, dist_sum, unwrap
from ..config.features import FEATURES
from ..tracking.keys import FEATURE_MSE_PREFIX, PERPLEXITY_FULL, PERPLEXITY_S1, RECON_PRE, USAGE_FULL, USAGE_S1

#: Widest code counted in a dense histogram (2**20 int64 bins = 8 MiB); wider codes are sparse.
DENSE_MAX_BITS = 20


#: Every metric :meth:`ValidationStats.metrics` returns, in logging order.
METRIC_NAMES: tuple[str, ...] = (
    USAGE_FULL, USAGE_S1, PERPLEXITY_FULL, PERPLEXITY_S1, RECON_PRE,
    *(f"{FEATURE_MSE_PREFIX}{name}" for name in FEATURES),
)


# --------------------------------------------------------------------------------------------
# pure functions


def s1_codes(full_codes: torch.Tensor, s1_bits: int) -> torch.Tensor:
    """The s1 (coarse) part of full codes: their low ``s1_bits`` bits (see ``KronosTokenizer``)."""
    return full_codes & ((1 << int(s1_bits)) - 1)


def code_histogram(codes: torch.Tensor | np.ndarray | Sequence[int], n_bits: int) -> np.ndarray:
    """Dense counts of each code in ``[0, 2**n_bits)``: an int64 array of ``2**n_bits`` bins."""
    codes = torch.as_tensor(codes, dtype=torch.long).reshape(-1)
    size = 1 << int(n_bits)
    _check_range(codes, size)
    return torch.bincount(codes.cpu(), minlength=size).numpy()


def perplexity(counts: np.ndarray | Sequence[int]) -> float:
    """``exp(H)`` with ``H = -sum p log p`` the entropy of the distribution ``counts / sum``.

    Zero bins do not count; ``k`` equally frequent codes give ``k``; no counts at all give 0.
    """
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    c = c[c > 0]
    total = c.sum()
    if total <= 0:
        return 0.0
    p = c / total
    return float(math.exp(-(p * np.log(p)).sum()))


def usage(counts: np.ndarray | Sequence[int]) -> int:
    """Number of distinct codes seen (bins with a count above zero)."""
    return int(np.count_nonzero(np.asarray(counts)))


def feature_sse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum of squared errors per feature (last axis) over every other axis, float64 ``(F,)``."""
    if pred.shape != target.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} differs from target shape {tuple(target.shape)}")
    diff = (pred.detach() - target.detach()).to(torch.float64)
    return (diff * diff).reshape(-1, diff.shape[-1]).sum(dim=0)


def feature_mse(pred: torch.Tensor, target: torch.Tensor) -> np.ndarray:
    """Mean squared error of each feature (last axis), float64 ``(F,)``."""
    n = max(1, target.numel() // max(1, target.shape[-1]))
    return (feature_sse(pred, target) / n).cpu().numpy()


def _check_range(codes: torch.Tensor, size: int) -> None:
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= size):
        bad = codes[(codes < 0) | (codes >= size)][0]
        raise ValueError(f"code {int(bad)} is outside [0, {size})")


def _merge_sparse(ids: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the counts of equal ids: sorted unique ids and their total counts."""
    if ids.numel() == 0:
        return ids.new_empty(0), counts.new_empty(0)
    uniq, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    total = torch.zeros(uniq.numel(), dtype=torch.long, device=ids.device)
    total.scatter_add_(0, inverse, counts.to(torch.long))
    return uniq, total


# --------------------------------------------------------------------------------------------
# accumulators


class CodeHistogram:
    """Counts of ``n_bits``-bit codes over a validation pass, summable over ranks.

    ``update(codes)`` per batch (any shape, int64, on any device), then ``all_reduce()`` on every
    rank, then read ``distinct``, ``perplexity``, ``total`` or ``ids_and_counts()``. Dense
    (``2**n_bits`` bins) up to ``dense_max_bits``, summed over ranks with one all-reduce; wider
    codes (up to the 62 bits a checkpoint may have) are counted sparsely (sorted unique ids and
    their counts) and merged over ranks by gathering every rank's ids: the cost then grows with
    the codes actually seen, never with ``2**n_bits``. Codes are buffered and counted in bulk, so a
    batch costs a list append, not a pass over ``2**n_bits`` bins.
    """

    def __init__(self, n_bits: int, device: torch.device | str | None = None,
                 dense_max_bits: int = DENSE_MAX_BITS):
        if not 1 <= int(n_bits) <= 62:
            raise ValueError(f"n_bits {n_bits} must be from 1 to 62")
        self.n_bits = int(n_bits)
        self.size = 1 << self.n_bits
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dense = self.n_bits <= int(dense_max_bits)
        # Count in bulk once this many codes are waiting (a dense bincount costs O(bins)).
        self._flush_at = max(1 << 16, self.size if self.dense else 1 << 20)
        self._pending: list[torch.Tensor] = []
        self._n_pending = 0
        self._hist = torch.zeros(self.size, dtype=torch.long, device=self.device) if self.dense else None
        self._ids = torch.empty(0, dtype=torch.long, device=self.device)
        self._counts = torch.empty(0, dtype=torch.long, device=self.device)

    def update(self, codes: torch.Tensor) -> None:
        codes = codes.detach().reshape(-1).to(device=self.device, dtype=torch.long)
        self._pending.append(codes)
        self._n_pending += codes.numel()
        if self._n_pending >= self._flush_at:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        codes = torch.cat(self._pending)
        self._pending, self._n_pending = [], 0
        _check_range(codes, self.size)
        if self.dense:
            self._hist += torch.bincount(codes, minlength=self.size)
        else:
            ids, counts = torch.unique(codes, sorted=True, return_counts=True)
            self._ids, self._counts = _merge_sparse(torch.cat([self._ids, ids]), torch.cat([self._counts, counts]))

    def all_reduce(self) -> None:
        """Sum the counts over every rank (a no-op in one process). Every rank must call it."""
        self._flush()
        if self.dense:
            all_reduce_sum_(self._hist)
        else:
            ids = torch.cat(all_gather_varlen(self._ids))
            counts = torch.cat(all_gather_varlen(self._counts))
            self._ids, self._counts = _merge_sparse(ids, counts)

    def ids_and_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The codes seen, ascending, and how often: two int64 arrays (no zero counts)."""
        self._flush()
        if self.dense:
            hist = self._hist.cpu()
            ids = torch.nonzero(hist, as_tuple=True)[0]
            return ids.numpy(), hist[ids].numpy()
        return self._ids.cpu().numpy(), self._counts.cpu().numpy()

    def counts(self) -> np.ndarray:
        """The non-zero counts, in code order."""
        return self.ids_and_counts()[1]

    @property
    def total(self) -> int:
        return int(self.counts().sum())

    @property
    def distinct(self) -> int:
        return usage(self.counts())

    @property
    def perplexity(self) -> float:
        return perplexity(self.counts())


class ValidationStats:
    """Everything :data:`METRIC_NAMES` needs, gathered batch by batch during validation.

    ``update(x, z_pre, z, codes)`` takes what one forward of ``KronosTokenizer`` gives
    (``codes`` = its full int64 indices); ``all_reduce()`` runs on every rank after the pass;
    ``metrics()`` returns the dict to log. Cheap per batch: two squared-error sums and a list
    append, all on the model's device (no host sync).
    """

    def __init__(self, s1_bits: int, s2_bits: int, n_features: int = len(FEATURES),
                 device: torch.device | str | None = None, dense_max_bits: int = DENSE_MAX_BITS,
                 feature_names: Sequence[str] = FEATURES):
        self.s1_bits, self.s2_bits = int(s1_bits), int(s2_bits)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.feature_names = tuple(feature_names)
        if len(self.feature_names) != n_features:
            raise ValueError(f"{n_features} features but {len(self.feature_names)} names")
        self.full = CodeHistogram(self.s1_bits + self.s2_bits, self.device, dense_max_bits)
        self.s1 = CodeHistogram(self.s1_bits, self.device, dense_max_bits)
        self.sse_full = torch.zeros(n_features, dtype=torch.float64, device=self.device)
        self.sse_pre = torch.zeros(n_features, dtype=torch.float64, device=self.device)
        self.rows = 0  # time steps seen (batch x window), per feature
        self._reduced = False

    @classmethod
    def for_model(cls, model, device: torch.device | str | None = None, **kwargs) -> ValidationStats:
        """Stats sized for a ``KronosTokenizer`` (or a DDP wrapper of one)."""
        raw = unwrap(model)
        return cls(raw.s1_bits, raw.s2_bits, n_features=raw.d_in, device=device, **kwargs)

    def update(self, x: torch.Tensor, z_pre: torch.Tensor, z: torch.Tensor, codes: torch.Tensor) -> None:
        self.sse_full += feature_sse(z, x).to(self.device)
        self.sse_pre += feature_sse(z_pre, x).to(self.device)
        self.rows += x.numel() // x.shape[-1]
        self.full.update(codes)
        self.s1.update(s1_codes(codes, self.s1_bits))

    def all_reduce(self) -> None:
        """Sum everything over ranks; every rank calls it once, after its validation pass."""
        if self._reduced:
            raise RuntimeError("ValidationStats.all_reduce was already called")
        self._reduced = True
        n = self.sse_full.numel()
        summed = dist_sum([*self.sse_full.tolist(), *self.sse_pre.tolist(), self.rows])
        self.sse_full = torch.tensor(summed[:n], dtype=torch.float64)
        self.sse_pre = torch.tensor(summed[n:2 * n], dtype=torch.float64)
        self.rows = int(round(summed[-1]))
        self.full.all_reduce()
        self.s1.all_reduce()

    def feature_mse(self) -> dict[str, float]:
        if not self.rows:
            return {}
        return {name: float(v) / self.rows for name, v in zip(self.feature_names, self.sse_full.tolist(), strict=True)}

    def metrics(self) -> dict[str, float]:
        """:data:`METRIC_NAMES` -> value; empty when no sample was seen."""
        if not self.rows:
            return {}
        out: dict[str, float] = {
            USAGE_FULL: float(self.full.distinct),
            USAGE_S1: float(self.s1.distinct),
            PERPLEXITY_FULL: self.full.perplexity,
            PERPLEXITY_S1: self.s1.perplexity,
            RECON_PRE: float(self.sse_pre.sum()) / (self.rows * self.sse_pre.numel()),
        }
        for name, value in self.feature_mse().items():
            out[f"{FEATURE_MSE_PREFIX}{name}"] = value
        return out


def describe(metrics: Mapping[str, float], s1_bits: int, s2_bits: int) -> str:
    """One console line: codebook use and the worst-reconstructed feature."""
    if not metrics:
        return ""
    mses = {k[len(FEATURE_MSE_PREFIX):]: v for k, v in metrics.items() if k.startswith(FEATURE_MSE_PREFIX)}
    worst = max(mses, key=mses.get) if mses else None
    text = (f"codes s1 {metrics[USAGE_S1]:.0f}/{1 << s1_bits} (ppl {metrics[PERPLEXITY_S1]:.1f}), "
            f"full {metrics[USAGE_FULL]:.0f} (ppl {metrics[PERPLEXITY_FULL]:.1f}), "
            f"s1-only mse {metrics[RECON_PRE]:.4f}")
    if worst is not None:
        text += f", worst feature {worst} mse {mses[worst]:.4f}"
    return text
