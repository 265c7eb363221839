"""JSON encoding of state dicts (the optimizer's, the scheduler's): every tensor goes to a side
table, saved as safetensors, and is replaced by ``{"__tensor__": name}``; what JSON cannot say
directly (tuples, integer keys, non-finite floats) is tagged the same way. Nothing is pickled."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...errors import CheckpointError


def encode(value: Any, path: str, tensors: dict[str, Any]) -> Any:
    """``value`` as JSON; its tensors (CPU copies) go into ``tensors``, named by their path."""
    if isinstance(value, torch.Tensor):
        name = path
        tensors[name] = value.detach().to("cpu").contiguous().clone()
        return {"__tensor__": name}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"__float__": repr(value)}  # 'inf', '-inf', 'nan'
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {"__dict__": {k: encode(v, f"{path}.{k}", tensors) for k, v in value.items()}}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in value):
            return {"__intdict__": [[k, encode(v, f"{path}.{k}", tensors)] for k, v in value.items()]}
        raise CheckpointError(f"cannot save the training state: {path} has keys of mixed types")
    try:  # numpy scalars
        if isinstance(value, np.generic):
            return encode(value.item(), path, tensors)
    except ImportError:  # pragma: no cover
        pass
    raise CheckpointError(
        f"cannot save the training state: {path} is a {type(value).__name__}, which is neither a tensor nor JSON"
    )


def decode(value: Any, tensors: Mapping[str, Any], where: str) -> Any:
    """What :func:`encode` made of a value, back (``where`` names the file in errors)."""
    if isinstance(value, list):
        return [decode(v, tensors, where) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise CheckpointError(f"{where}: an object with keys {sorted(value)[:3]} is not a saved value")
    (tag, inner), = value.items()
    if tag == "__tensor__":
        if not isinstance(inner, str) or inner not in tensors:
            raise CheckpointError(f"{where}: it refers to tensor '{inner}', which the tensor file does not hold")
        return tensors[inner]
    if tag == "__float__":
        if inner not in ("inf", "-inf", "nan"):
            raise CheckpointError(f"{where}: '{inner}' is not a saved float")
        return float(inner)
    if tag == "__tuple__" and isinstance(inner, list):
        return tuple(decode(v, tensors, where) for v in inner)
    if tag == "__dict__" and isinstance(inner, dict):
        return {k: decode(v, tensors, where) for k, v in inner.items()}
    if tag == "__intdict__" and isinstance(inner, list):
        out = {}
        for item in inner:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)):
                raise CheckpointError(f"{where}: a malformed integer-keyed entry")
            out[item[0]] = decode(item[1], tensors, where)
        return out
    raise CheckpointError(f"{where}: '{tag}' is not a saved value type")
