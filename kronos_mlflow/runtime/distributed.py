"""Process-group set-up, seeding and the few collectives training needs, in one place.

``torchrun`` sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``; when they are present we join the
process group (NCCL on CUDA, gloo on CPU). Without them the same code runs as one plain
process, rank 0 of 1, with no process group at all, so tests and laptops need nothing else.
Collectives are no-ops when there is no group.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ..errors import ConfigError, UserError, short_reason


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None: one process, no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


SETUP_TIMEOUT_S = 120.0  # every rank of a (re)started group arrives well within this


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def resolve_device(preference: str, local_rank: int = 0, local_world_size: int = 1) -> torch.device:
    """``auto`` picks CUDA when present, else CPU. On CUDA each local rank gets its own GPU."""
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' was asked for but no CUDA GPU is visible; use device auto or cpu")
    n_gpus = torch.cuda.device_count()
    if local_world_size > n_gpus:
        raise ConfigError(
            f"nproc_per_node {local_world_size} exceeds the {n_gpus} visible GPU(s); "
            f"use nproc_per_node <= {n_gpus} (or device cpu)"
        )
    return torch.device("cuda", local_rank)


def init_distributed(device_preference: str = "auto", timeout_s: float = 1800.0,
                     setup_timeout_s: float = SETUP_TIMEOUT_S) -> DistInfo:
    """Join torchrun's process group when launched by it; otherwise describe one process.

    ``timeout_s`` bounds each collective; ``setup_timeout_s`` bounds joining the group (all
    ranks must arrive within it, see :func:`_join_group`).
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world_size)
    device = resolve_device(device_preference, local_rank, local_world)
    if "RANK" not in os.environ or world_size <= 1 and not dist.is_torchelastic_launched():
        return DistInfo(rank=0, local_rank=0, world_size=1, device=device, backend=None)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        _join_group(backend, rank, world_size, timedelta(seconds=timeout_s), setup_timeout_s)
    return DistInfo(rank=dist.get_rank(), local_rank=local_rank, world_size=dist.get_world_size(),
                    device=device, backend=backend)


class GroupSetupError(UserError):
    """The ranks of a torchrun group did not all arrive to form the process group in time."""


def _group_store(rank: int, world_size: int, setup_timeout: timedelta):
    """The store the process group is formed on, under a key prefix of its own per group attempt.

    torchrun's agent (c10d rendezvous, ``TORCHELASTIC_USE_AGENT_STORE=True``) hands every worker
    group the same TCPStore, across restarts. ``init_process_group("env://")`` writes its keys
    there without an attempt prefix, so a restarted group reads the dead group's addresses and
    waits forever (torch 2.13; pytorch issue 135712). Here each attempt gets its own prefix,
    ``TORCHELASTIC_RESTART_COUNT`` (one agent restarts all ranks of a node together, so every
    rank of a single-node group sees the same count). Without the agent store (torchrun with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, or a plain launcher) rank 0 serves a fresh store
    on a fresh port each attempt, as ``env://`` would.
    """
    addr = os.environ.get("MASTER_ADDR", "")
    port = _env_int("MASTER_PORT", -1)
    if not addr or not 0 <= port < 2**16:
        raise UserError(f"MASTER_ADDR/MASTER_PORT ({addr!r}:{port}) must name the rendezvous store when RANK "
                        "is set; launch with torchrun, which sets them")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        store = dist.TCPStore(addr, port, world_size, is_master=not agent_store and rank == 0,
                              timeout=setup_timeout, multi_tenant=True, wait_for_workers=False)
    except (RuntimeError, dist.DistError) as exc:
        raise GroupSetupError(
            f"process group set-up: rank {rank} could not reach the rendezvous store at {addr}:{port} within "
            f"{setup_timeout.total_seconds():.0f} s ({short_reason(exc)})") from None
    if not agent_store:
        return store, "kronos_pg"
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    return dist.PrefixStore(f"kronos_pg/{run_id}/attempt_{attempt}", store), f"attempt {attempt}"


def _arrive(store, rank: int, world_size: int, setup_timeout_s: float, what: str) -> None:
    """Every rank counts itself in and waits (bounded) until all ``world_size`` have."""
    arrived = store.add("arrived", 1)
    deadline = time.monotonic() + setup_timeout_s
    while arrived < world_size:
        if time.monotonic() > deadline:
            raise GroupSetupError(
                f"process group set-up: {arrived} of {world_size} ranks arrived within {setup_timeout_s:.0f} s "
                f"({what}); a rank that stays away means its node restarted a different number of times: "
                "launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment")
        time.sleep(0.05)
        arrived = store.add("arrived", 0)


def _join_group(backend: str, rank: int, world_size: int, timeout: timedelta, setup_timeout_s: float) -> None:
    """``init_process_group`` on a store of this group attempt; fails within ``setup_timeout_s``
    with one line instead of waiting forever when the ranks cannot meet."""
    setup_timeout = timedelta(seconds=setup_timeout_s)
    store, what = _group_store(rank, world_size, setup_timeout)
    _arrive(store, rank, world_size, setup_timeout_s, what)
    try:
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    except (RuntimeError, dist.DistError) as exc:
        raise GroupSetupError(f"process group set-up ({backend}, {what}) failed on rank {rank}: "
                              f"{short_reason(exc)}") from None
    store.set_timeout(timeout)  # later store traffic (new groups, barriers) waits like a collective


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed python, numpy and torch with ``seed + rank`` (upstream's per-rank seeding)."""
    s = int(seed) + int(rank)
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(s)


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def dist_sum(values, device: torch.device | None = None) -> list[float]:
    """Sum a list of floats over all ranks (float64), returned as Python floats."""
    values = [float(v) for v in values]
    if not _active():
        return values
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.cpu()]


def _collective_device(tensor: torch.Tensor) -> torch.device:
    """Where a collective must run: NCCL needs CUDA tensors, gloo takes CPU ones."""
    if dist.get_backend() == "nccl":
        return tensor.device if tensor.is_cuda else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum_(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place (any dtype gloo/NCCL sum); returns it."""
    if not _active():
        return tensor
    device = _collective_device(tensor)
    work = tensor if tensor.device == device else tensor.to(device)
    dist.all_reduce(work, op=dist.ReduceOp.SUM)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def all_gather_varlen(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's 1-D ``tensor`` (lengths may differ), in rank order, on ``tensor``'s device.

    Lengths are gathered first, then each tensor is padded to the longest and gathered.
    """
    if not _active():
        return [tensor]
    device = _collective_device(tensor)
    flat = tensor.reshape(-1).to(device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([flat.numel()], dtype=torch.long, device=device))
    lengths = [int(s.item()) for s in sizes]
    longest = max(lengths)
    if longest == 0:
        return [tensor.reshape(-1)[:0] for _ in lengths]
    padded = torch.zeros(longest, dtype=flat.dtype, device=device)
    padded[: flat.numel()] = flat
    parts = [torch.empty(longest, dtype=flat.dtype, device=device) for _ in lengths]
    dist.all_gather(parts, padded)
    return [p[:n].to(tensor.device) for p, n in zip(parts, lengths, strict=True)]


def broadcast_object(obj, src: int = 0):
    """Send a picklable Python object from ``src`` to every rank (trusted: our own processes)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if _active():
        dist.barrier()


def teardown() -> None:
    if _active():
        dist.destroy_process_group()


def unwrap(model):
    """The plain module under ``torch.compile`` and DDP wrappers (the one unwrap: the loop,
    the stages, the tags and the quality metrics all read the model through it)."""
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif "_orig_mod" in getattr(model, "_modules", {}):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model
