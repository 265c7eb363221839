"""The random-number-generator states of a run's processes (python, numpy, torch CPU, CUDA), as
JSON, so that a resumed run draws the numbers the killed one would have drawn."""

from __future__ import annotations

import base64
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...errors import CheckpointError, short_reason


def capture_rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch CPU and (if any) CUDA RNG states, as JSON."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [base64.b64encode(s.cpu().numpy().tobytes()).decode("ascii")
                         for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: Mapping[str, Any], where: str = "training state") -> None:
    """Put back what :func:`capture_rng_state` captured (CUDA only when the GPU count matches)."""
    try:
        py = state["python"]
        random.setstate((int(py["version"]), tuple(int(v) for v in py["state"]),
                         None if py["gauss_next"] is None else float(py["gauss_next"])))
        npst = state["numpy"]
        np.random.set_state((str(npst["name"]), np.asarray(npst["keys"], dtype=np.uint32), int(npst["pos"]),
                             int(npst["has_gauss"]), float(npst["cached_gaussian"])))
        raw = base64.b64decode(state["torch"], validate=True)
        torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone())
        cuda = list(state.get("cuda") or [])
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed field is a damaged state
        raise CheckpointError(f"{where}: the saved random-number-generator state is malformed ({short_reason(exc)})") from None
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone() for s in cuda]
        )


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's :func:`capture_rng_state`, in rank order (a collective under torchrun;
    without a process group: a list of one). Call it on every rank, save on rank 0."""
    mine = capture_rng_state()
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)  # our own processes: trusted
    return out
