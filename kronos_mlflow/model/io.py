"""Checkpoint I/O: the Hugging Face "model hub mixin" directory (``config.json`` +
``model.safetensors``), written atomically and read strictly.

Every failure is one :class:`~kronos_mlflow.errors.CheckpointError` line naming the file.
Nothing here unpickles: weights are read with safetensors only.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, UserError, short_reason
from ..runtime.disks import writing
from ..runtime.fsutil import fsync_dir, fsync_file, read_json
from .return_head import HEAD_ATTR

SIDE_PREFIX = f"{HEAD_ATTR}."  # the tensors of a module trained beside the model, not in its checkpoint

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

_MAX_CONFIG_BYTES = 1 << 20
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

def _download_hint(hub_id: str) -> str:
    return (
        f"download the checkpoint where there is network access, e.g. `hf download {hub_id} --local-dir DIR` "
        f"(`huggingface-cli download {hub_id} --local-dir DIR` with older huggingface_hub), and pass DIR"
    )


def save_checkpoint(model: torch.nn.Module, save_directory: str | os.PathLike) -> str:
    """:func:`write_checkpoint`; a full disk or a folder that cannot be written is one line naming
    ``save_directory`` (:class:`~kronos_mlflow.runtime.disks.DiskError`), the files there before
    left whole."""
    with writing(save_directory):
        return write_checkpoint(model, save_directory)


def write_checkpoint(model: torch.nn.Module, save_directory: str | os.PathLike) -> str:
    """Write ``model.config`` to ``config.json`` and its weights to ``model.safetensors`` in
    ``save_directory`` (created).

    The layout is the Hugging Face hub mixin's, so upstream ``KronosTokenizer.from_pretrained``
    (``Kronos.from_pretrained`` for the predictor) loads it. Each file is written to a temporary
    file in the same directory, flushed to disk, then renamed over the old one, so an
    interrupted save never leaves a half-written file. Returns the directory as a string.
    """
    directory = Path(os.path.expanduser(os.fspath(save_directory)))
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"cannot save the checkpoint: '{directory}' is a file, not a directory")
    directory.mkdir(parents=True, exist_ok=True)

    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(SIDE_PREFIX):  # a return head keeps its own file: the backbone's stay upstream's
            continue
        t = tensor.detach().to("cpu")
        if t.is_floating_point():
            t = t.to(torch.float32)
        tensors[name] = t.contiguous().clone()
    config_text = json.dumps(model.config, sort_keys=True, indent=2)

    import safetensors.torch

    temps: list[str] = []
    try:
        weights_tmp = _temp_path(directory, WEIGHTS_NAME)
        temps.append(weights_tmp)
        safetensors.torch.save_file(tensors, weights_tmp, metadata={"format": "pt"})
        fsync_file(weights_tmp)
        config_tmp = _temp_path(directory, CONFIG_NAME)
        temps.append(config_tmp)
        with open(config_tmp, "w", encoding="utf-8") as fh:
            fh.write(config_text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(weights_tmp, directory / WEIGHTS_NAME)
        os.replace(config_tmp, directory / CONFIG_NAME)
        temps.clear()
        fsync_dir(directory)
    finally:
        for tmp in temps:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return str(directory)


def load_checkpoint(cls, path_or_hub_id: str | os.PathLike, *, map_location: str | torch.device = "cpu"):
    """A ``cls`` model (the tokenizer or the predictor class) from a checkpoint directory, or a
    hub id (``owner/name``) through the local HF cache.

    Loading is strict (every tensor present, none extra, shapes as ``config.json`` implies,
    float tensors floating-point, finite and converted to float32, int buffers int64) and the
    config is checked before anything is allocated, by ``cls.CONFIG_SCHEMA`` and
    ``cls.validate_config``; ``cls.fixed_buffers(config)`` names the buffers whose values are
    defined (they must hold them). A hub id is resolved with
    ``huggingface_hub.snapshot_download`` (which honours ``HF_HUB_OFFLINE``). Every failure is
    a one-line :class:`CheckpointError` naming the path. The model is returned in eval mode,
    as upstream's mixin returns it.
    """
    directory = _resolve_checkpoint_dir(path_or_hub_id, getattr(cls, "hub_example", "NeoQuasar/Kronos-Tokenizer-base"))
    config = _read_config(directory / CONFIG_NAME, cls)
    weights_path = directory / WEIGHTS_NAME
    expected = _expected_tensors(cls, config)
    _check_weights_header(weights_path, expected)

    import safetensors.torch

    try:
        loaded = safetensors.torch.load_file(str(weights_path), device="cpu")
    except Exception as exc:  # noqa: BLE001 - any read failure is a bad file
        raise CheckpointError(
            f"weights file '{weights_path}' cannot be read ({short_reason(exc)}); it may be truncated or corrupt: "
            "save or download it again"
        ) from None
    for name, tensor in loaded.items():
        if tensor.is_floating_point():
            loaded[name] = tensor.to(torch.float32)
    check_finite(weights_path, loaded)
    for name, (want, meaning) in cls.fixed_buffers(config).items():
        if not torch.equal(loaded[name], want):
            raise CheckpointError(
                f"weights file '{weights_path}': buffer '{name}' does not hold {meaning}; "
                "the file is corrupt or from another model"
            )

    model = cls(**config)
    try:
        model.load_state_dict(loaded, strict=True)
    except RuntimeError as exc:  # names and shapes were checked; this is a safety net
        raise CheckpointError(f"weights file '{weights_path}' does not fit config.json ({short_reason(exc)})") from None
    model.eval()
    return model.to(map_location)


class HubCheckpoint:
    """``save_pretrained`` / ``from_pretrained`` in the hub mixin's layout, for a model class that
    has ``config`` (its constructor arguments), ``CONFIG_SCHEMA``, ``validate_config`` and
    ``fixed_buffers``: upstream's method names, without the mixin's non-strict loading."""

    def save_pretrained(self, save_directory: str | os.PathLike) -> str:
        """Write ``config.json`` and ``model.safetensors`` into ``save_directory`` (created), in
        the hub mixin's layout that upstream's ``from_pretrained`` loads; atomic (see
        :func:`save_checkpoint`). Returns the directory."""
        return save_checkpoint(self, save_directory)  # type: ignore[arg-type]

    @classmethod
    def from_pretrained(cls, path_or_hub_id: str | os.PathLike, *, map_location: str | torch.device = "cpu"):
        """Load a checkpoint directory or a hub id strictly, in eval mode (see
        :func:`load_checkpoint`); failures are one-line CheckpointErrors."""
        return load_checkpoint(cls, path_or_hub_id, map_location=map_location)


# --------------------------------------------------------------------------------------------



def check_finite(path: Path, tensors: Mapping[str, torch.Tensor], *,
                 advice: str = "use the checkpoint of an earlier epoch or a fresh model") -> None:
    """Every float tensor is finite, else a one-line CheckpointError naming the first bad one and
    the count (``advice`` ends it): a NaN or inf weight (a diverged run's checkpoint, a damaged
    file) would train to the end with NaN losses and no best model."""
    bad = []
    total = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        if not tensor.is_floating_point():
            continue
        n = int((~torch.isfinite(tensor)).sum())
        if n:
            bad.append((name, n, tensor.numel()))
            total += n
    if bad:
        name, n, size = bad[0]
        more = f" and {len(bad) - 1} more tensor{'s' if len(bad) > 2 else ''}" if len(bad) > 1 else ""
        raise CheckpointError(
            f"weights file '{path}': tensor '{name}' holds {n:,} of {size:,} values that are NaN or infinite"
            f"{more} ({total:,} in all); expected finite weights: {advice}"
        )


def _temp_path(directory: Path, final_name: str) -> str:
    fd, path = tempfile.mkstemp(prefix=f".{final_name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    return path




def _resolve_checkpoint_dir(path_or_hub_id: str | os.PathLike, hub_example: str = "NeoQuasar/Kronos-Tokenizer-base") -> Path:
    raw = os.fspath(path_or_hub_id)
    if not isinstance(raw, str) or not raw.strip():
        raise CheckpointError("the checkpoint path is empty; pass a directory holding config.json and model.safetensors")
    path = Path(os.path.expanduser(raw))
    if path.is_dir():
        _require_files(path)
        return path
    if path.exists():
        raise CheckpointError(
            f"checkpoint path '{path}' is a file, not a directory; pass the directory holding "
            f"{CONFIG_NAME} and {WEIGHTS_NAME}"
        )
    if not _HUB_ID_RE.match(raw) or ".." in raw:
        raise CheckpointError(
            f"checkpoint directory '{path}' does not exist; pass a directory holding {CONFIG_NAME} and "
            f"{WEIGHTS_NAME}, or a Hugging Face hub id such as {hub_example}"
        )
    from ..config.published import HubUnreachable, fetch  # lazy: published imports this module

    try:
        resolved = fetch(raw, [CONFIG_NAME, WEIGHTS_NAME, "README.md"])
    except HubUnreachable as exc:
        raise CheckpointError(
            f"'{raw}' is not a local directory and the Hugging Face hub id could not be reached "
            f"({short_reason(exc.cause, 120)}); {_download_hint(raw)}"
        ) from None
    except UserError as exc:  # the cache's ref or snapshot points outside its folder
        raise CheckpointError(str(exc)) from None
    if not resolved.is_dir():
        raise CheckpointError(f"hub id '{raw}' resolved to '{resolved}', which is not a directory; {_download_hint(raw)}")
    _require_files(resolved)
    return resolved


def _require_files(directory: Path) -> None:
    if not (directory / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"checkpoint directory '{directory}' has no {CONFIG_NAME}; expected the hub layout "
            f"{CONFIG_NAME} + {WEIGHTS_NAME} as save_pretrained writes it"
        )
    if not (directory / WEIGHTS_NAME).is_file():
        pickled = " (pickle files such as pytorch_model.bin are never loaded)" if (
            directory / "pytorch_model.bin").exists() else ""
        raise CheckpointError(
            f"checkpoint directory '{directory}' has no {WEIGHTS_NAME}{pickled}; expected the hub layout "
            f"{CONFIG_NAME} + {WEIGHTS_NAME} as save_pretrained writes it"
        )


def _read_config(path: Path, cls: type) -> dict[str, Any]:
    expected = cls.CONFIG_SCHEMA.expected
    try:
        obj = read_json(path, what="config file", max_bytes=_MAX_CONFIG_BYTES,
                        advice=f"expected a JSON object of {expected}", error=CheckpointError)
    except FileNotFoundError as exc:
        raise CheckpointError(f"config file '{path}' cannot be read ({short_reason(exc)})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"config file '{path}' holds a JSON {type(obj).__name__}; expected an object of {expected}")
    return cls.validate_config(obj, origin=f"config file '{path}'", error=CheckpointError)


def _expected_tensors(cls: type, config: Mapping[str, Any]) -> dict[str, tuple[list[int], torch.dtype]]:
    """Name -> (shape, dtype) of every persistent tensor, from a model built on the meta device."""
    with torch.device("meta"):
        model = cls(**config)
    return {name: (list(t.shape), t.dtype) for name, t in model.state_dict().items()}


_SAFETENSORS_FLOATS = {"F64", "F32", "F16", "BF16"}


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_weights_header(path: Path, expected: Mapping[str, tuple[list[int], torch.dtype]]) -> None:
    """Check names, shapes and dtypes from the safetensors header, before reading any data."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            header = {}
            for name in fh.keys():
                sl = fh.get_slice(name)
                header[name] = (list(sl.get_shape()), sl.get_dtype())
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError, ...: all a bad file
        raise CheckpointError(
            f"weights file '{path}' cannot be read ({short_reason(exc)}); it may be truncated or corrupt: "
            "save or download it again"
        ) from None
    missing = [n for n in expected if n not in header]
    unexpected = sorted(n for n in header if n not in expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensor{'s' if len(missing) > 1 else ''} {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected tensor{'s' if len(unexpected) > 1 else ''} {_names(unexpected)}")
        raise CheckpointError(
            f"weights file '{path}' does not match its config.json: {'; '.join(parts)}"
        )
    for name, (shape, dtype) in expected.items():
        found_shape, found_dtype = header[name]
        if found_shape != shape:
            raise CheckpointError(
                f"weights file '{path}': tensor '{name}' has shape {found_shape}, expected {shape} from config.json"
            )
        if dtype.is_floating_point:
            if found_dtype not in _SAFETENSORS_FLOATS:
                raise CheckpointError(
                    f"weights file '{path}': tensor '{name}' has dtype {found_dtype}; expected a floating-point "
                    "dtype (F32)"
                )
        elif found_dtype != "I64":
            raise CheckpointError(f"weights file '{path}': tensor '{name}' has dtype {found_dtype}; expected I64")
