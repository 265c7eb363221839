"""The training state's format (``{save_dir}/checkpoints/last/``: ``state.json`` plus
``model.safetensors`` and ``optimizer.safetensors``), written atomically, read back with every field
and both tensor files checked (their SHA-256 and size are in ``state.json``). Nothing is pickled and
nothing goes through ``torch.load``; docs/reliability.md#training-state-every-epoch.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from ...config.digest import digest_config
from ...errors import CheckpointError, short_reason
from ...runtime.disks import writing
from ...runtime.fsutil import fsync_dir, fsync_file, read_json
from ...config.layout import RunLayout
from ...model.io import check_finite
from .encoding import decode, encode
from .rng import capture_rng_state, restore_rng_state

FORMAT = "kronos-mlflow-training-state"
FORMAT_VERSION = 1
STATE_NAME = "state.json"
MODEL_NAME = "model.safetensors"
OPTIMIZER_NAME = "optimizer.safetensors"
LAST_DIR = "last"
OLD_SUFFIX = ".old"
TMP_PREFIX = ".last.tmp-"

# state.json is small (counters, param groups, RNG states): a huge one is not ours.
_MAX_STATE_BYTES = 64 << 20


def state_dir(save_dir: str | os.PathLike) -> Path:
    """``{save_dir}/checkpoints/last``: where a run's training state lives."""
    return RunLayout(Path(os.path.expanduser(os.fspath(save_dir)))).training_state


# --------------------------------------------------------------------------------------------
# saving


def save_training_state(directory: str | os.PathLike, **state: Any) -> Path:
    """:func:`write_training_state`; a full disk or a folder that cannot be written is one line
    naming ``directory`` (:class:`~kronos_mlflow.runtime.disks.DiskError`): the state saved before
    stays whole, so the same command resumes from it once that is fixed."""
    with writing(directory):
        return write_training_state(directory, **state)


def write_training_state(
    directory: str | os.PathLike,
    *,
    model,
    optimizer,
    scheduler,
    epoch: int,
    global_step: int,
    best_val_loss: float | None,
    run_ids: Mapping[str, str | None],
    config_digest: str,
    extra: Mapping[str, Any] | None = None,
    rng_states: list[Mapping[str, Any]] | None = None,
    config: Mapping[str, Any] | None = None,
    trained_only: bool = False,
) -> Path:
    """Write the training state after ``epoch`` (0-based, just completed; -1 = before the first
    epoch, so that a crash in it still resumes into the same run) atomically into ``directory``
    (normally :func:`state_dir` of the save directory). Returns ``directory``.

    ``model`` is the plain module (unwrap DDP / torch.compile first). ``rng_states`` is one
    entry per rank (:func:`gather_rng_states`); default: this process's state as rank 0's.
    ``config`` (optional) is stored as :func:`digest_config` so that a refused resume can name
    the keys that changed. ``extra`` is any JSON-able dict (history, best epoch...).
    ``trained_only`` (a LoRA or freeze run: :mod:`kronos_mlflow.model.finetune`) keeps the parameters
    that train, not the frozen base.

    Atomicity: a complete new directory (``.last.tmp-*``, every file fsynced) is swapped in:
    ``last -> last.old``, ``tmp -> last``, ``last.old`` removed; a kill at any moment leaves ``last``
    or ``last.old`` complete (the loaders rename it back), and the next save removes stale temps.
    """
    final = Path(os.path.expanduser(os.fspath(directory)))
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(parent, final.name)

    model_tensors: dict[str, Any] = {}
    for name, tensor in _model_tensors(model, trained_only).items():
        model_tensors[name] = tensor.detach().to("cpu").contiguous().clone()
    opt_tensors: dict[str, Any] = {}
    opt_json = encode(optimizer.state_dict(), "optimizer", opt_tensors)
    sched_tensors: dict[str, Any] = {}
    sched_json = encode(scheduler.state_dict(), "scheduler", sched_tensors) if scheduler is not None else None
    if sched_tensors:  # no scheduler of ours holds tensors; keep them with the optimizer's
        opt_tensors.update(sched_tensors)
    extra_tensors: dict[str, Any] = {}
    extra_json = encode(dict(extra or {}), "extra", extra_tensors)
    if extra_tensors:
        raise CheckpointError("cannot save the training state: 'extra' must hold JSON values, not tensors")

    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=parent))
    try:
        files = {}
        for fname, tensors in ((MODEL_NAME, model_tensors), (OPTIMIZER_NAME, opt_tensors)):
            path = tmp / fname
            safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt", "kind": fname})
            fsync_file(path)
            files[fname] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
        state = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "saved_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "epoch": int(epoch),
            "next_epoch": int(epoch) + 1,
            "global_step": int(global_step),
            "best_val_loss": encode(None if best_val_loss is None else float(best_val_loss), "best_val_loss", {}),
            # The data order of an epoch is a pure function of (seed, epoch): the sampler's
            # state is the epoch to draw next.
            "sampler": {"epoch": int(epoch) + 1},
            "run_ids": {str(k): (None if v is None else str(v)) for k, v in dict(run_ids or {}).items()},
            "config_digest": str(config_digest),
            "config": digest_config(config) if config is not None else None,
            "optimizer": opt_json,
            "scheduler": sched_json,
            "rng": [dict(s) for s in (rng_states if rng_states is not None else [capture_rng_state()])],
            "extra": extra_json,
            "files": files,
            "torch_version": _torch_version(),
        }
        text = json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False)
        with open(tmp / STATE_NAME, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _swap_in(tmp: Path, final: Path) -> None:
    """``final -> final.old``, ``tmp -> final``, remove ``final.old``; fsync the parent between."""
    old = final.with_name(final.name + OLD_SUFFIX)
    parent = final.parent
    if final.exists():
        if old.exists():
            # A previous swap was interrupted after ``final`` came back: ``old`` is stale.
            shutil.rmtree(old)
        os.rename(final, old)
        fsync_dir(parent)
    elif old.exists():
        pass  # ``final`` was lost mid-swap; ``old`` stays until the new state is in place
    os.rename(tmp, final)
    fsync_dir(parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
        fsync_dir(parent)


def _remove_stale_temps(parent: Path, name: str) -> None:
    """Temp directories of saves that were killed (by this or a dead process)."""
    prefix = f".{name}.tmp-"
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(prefix) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# reading


def _recover(directory: Path) -> Path:
    """``directory`` when it exists; else rename ``directory.old`` back (a save killed mid-swap)."""
    if directory.is_dir():
        return directory
    old = directory.with_name(directory.name + OLD_SUFFIX)
    if old.is_dir():
        try:
            os.rename(old, directory)
            fsync_dir(directory.parent)
        except FileNotFoundError:  # another rank recovered it first
            pass
        except OSError:
            return old  # read-only location: read it where it is
        if directory.is_dir():
            return directory
    return directory


def read_training_state(directory: str | os.PathLike, *, verify: bool = True) -> dict[str, Any]:
    """``state.json`` of ``directory`` checked (format, fields, file sizes and SHA-256 of both
    tensor files when ``verify``), without loading any tensor. Recovers ``last.old``."""
    directory = _recover(Path(os.path.expanduser(os.fspath(directory))))
    state_path = directory / STATE_NAME
    if not directory.is_dir():
        raise CheckpointError(f"training state directory '{directory}' does not exist")
    try:
        state = read_json(state_path, what="training state file", max_bytes=_MAX_STATE_BYTES,
                          advice="it is truncated or damaged: delete that directory to start over",
                          error=CheckpointError)
    except FileNotFoundError:
        raise CheckpointError(
            f"training state '{directory}' has no {STATE_NAME} (an interrupted or foreign save); "
            "delete that directory to start over, or set resume to never"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"'{state_path}' is not a kronos-mlflow training state; delete that directory to start over")
    if state.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"training state '{state_path}' has format version {state.get('version')!r}; this kronos-mlflow reads "
            f"version {FORMAT_VERSION}: resume with the version that wrote it, or delete that directory"
        )
    for key, kind in (("epoch", int), ("next_epoch", int), ("global_step", int), ("config_digest", str),
                      ("run_ids", dict), ("optimizer", dict), ("rng", list), ("files", dict)):
        value = state.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(f"training state '{state_path}': field '{key}' is missing or not a {kind.__name__}; "
                                  "delete that directory to start over")
    if state["epoch"] < -1 or state["global_step"] < 0 or state["next_epoch"] != state["epoch"] + 1:
        raise CheckpointError(f"training state '{state_path}': epoch {state['epoch']} / global_step "
                              f"{state['global_step']} are inconsistent; delete that directory to start over")
    where = f"training state '{state_path}'"
    state["best_val_loss"] = decode(state.get("best_val_loss"), {}, where)
    if state["best_val_loss"] is not None and not isinstance(state["best_val_loss"], (int, float)):
        raise CheckpointError(f"{where}: best_val_loss is not a number")
    state["extra"] = decode(state.get("extra") or {"__dict__": {}}, {}, where)
    for fname in (MODEL_NAME, OPTIMIZER_NAME):
        meta = state["files"].get(fname)
        path = directory / fname
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str) or not isinstance(meta.get("bytes"), int):
            raise CheckpointError(f"{where}: no size and checksum recorded for {fname}; delete that directory to start over")
        if not path.is_file():
            raise CheckpointError(f"training state '{directory}' has no {fname}; it is incomplete: "
                                  "delete that directory to start over")
        if verify:
            actual = path.stat().st_size
            if actual != meta["bytes"]:
                raise CheckpointError(
                    f"tensor file '{path}' is {actual:,} bytes, {meta['bytes']:,} were saved; it is truncated or "
                    "damaged: delete that directory to start over"
                )
            if _sha256(path) != meta["sha256"]:
                raise CheckpointError(f"tensor file '{path}' does not match its saved checksum; it is damaged: "
                                      "delete that directory to start over")
            # A diverged run saves NaN weights and moments with valid checksums: resuming it
            # would train on to the end with NaN losses and no best model.
            check_finite(path, _read_tensors(path, "cpu"),
                         advice="the saved state is from a diverged run: delete that directory or set resume to never")
    state["directory"] = str(directory)
    return state


def _read_tensors(path: Path, map_location) -> dict[str, Any]:
    try:
        return safetensors.torch.load_file(str(path), device=str(map_location) if map_location is not None else "cpu")
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError...: a bad file
        raise CheckpointError(f"tensor file '{path}' cannot be read ({short_reason(exc)}); it is truncated or damaged: "
                              "delete that directory to start over") from None


def load_training_state(
    directory: str | os.PathLike,
    *,
    model,
    optimizer,
    scheduler,
    map_location="cpu",
    rank: int | None = None,
    restore_rng: bool = True,
    verify: bool = True,
    trained_only: bool = False,
) -> dict[str, Any]:
    """Load a saved state into ``model`` (plain module), ``optimizer`` and ``scheduler`` (built
    exactly as for a fresh run), and restore this rank's RNG states (``rank``: default env
    ``RANK`` or 0). ``verify`` checks both tensor files' sizes and checksums first.

    Returns ``state.json``'s content, decoded: ``epoch`` (last completed), ``next_epoch``,
    ``global_step``, ``best_val_loss``, ``run_ids``, ``config_digest``, ``config``, ``sampler``,
    ``extra``, ``directory``. Shapes and names are checked before anything is copied, so a state
    from another model is refused with one line and the objects are left as they were.
    """
    state = read_training_state(directory, verify=verify)
    directory = Path(state["directory"])
    where = f"training state '{directory}'"

    # Read on the CPU; load_state_dict copies onto the model's device, and the optimizer moves
    # its state next to each parameter. ``map_location`` is accepted for symmetry with torch.
    del map_location
    weights = _read_tensors(directory / MODEL_NAME, "cpu")
    expected = _model_tensors(model, trained_only)
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights if n not in expected]
    if missing or unexpected:
        names = (missing or unexpected)[:3]
        raise CheckpointError(f"{where}: the model does not match the saved one ({'missing' if missing else 'unexpected'} "
                              f"tensors {names}); resume with the config that made it, or delete that directory")
    for name, tensor in expected.items():
        if tuple(weights[name].shape) != tuple(tensor.shape) or weights[name].dtype != tensor.dtype:
            raise CheckpointError(
                f"{where}: tensor '{name}' was saved as {weights[name].dtype} {list(weights[name].shape)}, the model has "
                f"{tensor.dtype} {list(tensor.shape)}; resume with the config that made it, or delete that directory"
            )

    opt_tensors = _read_tensors(directory / OPTIMIZER_NAME, "cpu")
    opt_state = decode(state["optimizer"], opt_tensors, where)
    if not isinstance(opt_state, dict) or "state" not in opt_state or "param_groups" not in opt_state:
        raise CheckpointError(f"{where}: the optimizer state is malformed; delete that directory to start over")
    _check_optimizer_state(opt_state, optimizer, where)
    sched_state = decode(state.get("scheduler"), opt_tensors, where) if state.get("scheduler") is not None else None
    if scheduler is not None and not isinstance(sched_state, dict):
        raise CheckpointError(f"{where}: no learning-rate scheduler state was saved; delete that directory to start over")

    with torch.no_grad():
        if trained_only:  # the frozen base is the model's own; the state names each trained tensor
            for name, tensor in expected.items():
                tensor.copy_(weights[name])
        else:
            model.load_state_dict(weights, strict=True)
    try:
        optimizer.load_state_dict(opt_state)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"{where}: the optimizer state does not fit this optimizer ({short_reason(exc)})") from None
    if scheduler is not None:
        unknown = sorted(set(sched_state) - set(scheduler.state_dict()))
        if unknown:
            raise CheckpointError(f"{where}: the scheduler state has unknown field '{unknown[0]}' "
                                  f"(saved by {type(scheduler).__name__}?); delete that directory to start over")
        scheduler.load_state_dict(sched_state)

    if restore_rng:
        if rank is None:
            try:
                rank = int(os.environ.get("RANK", "0"))
            except ValueError:
                rank = 0
        rngs = state["rng"]
        if 0 <= rank < len(rngs) and isinstance(rngs[rank], dict):
            restore_rng_state(rngs[rank], where)
    state["optimizer"] = None  # the tensors now live in the optimizer; do not keep a second copy
    state["scheduler"] = sched_state
    return state


def _model_tensors(model, trained_only: bool) -> dict[str, Any]:
    """The model's tensors a training state holds: all of its state, or its trained parameters."""
    if trained_only:
        return {name: p for name, p in model.named_parameters() if p.requires_grad}
    return model.state_dict()


def _check_optimizer_state(opt_state: Mapping[str, Any], optimizer, where: str) -> None:
    """Group count, parameter count per group, and every state tensor's shape against the params."""
    groups = opt_state["param_groups"]
    live = optimizer.param_groups
    if not isinstance(groups, list) or len(groups) != len(live):
        raise CheckpointError(f"{where}: {len(groups) if isinstance(groups, list) else '?'} optimizer parameter group(s) "
                              f"were saved, this optimizer has {len(live)} (weight_decay_scope changed?)")
    params = []
    for saved, group in zip(groups, live):
        ids = saved.get("params") if isinstance(saved, dict) else None
        if not isinstance(ids, list) or len(ids) != len(group["params"]):
            raise CheckpointError(f"{where}: an optimizer group holds {len(ids) if isinstance(ids, list) else '?'} "
                                  f"parameters, this optimizer's holds {len(group['params'])}")
        params.extend(zip(ids, group["params"]))
    by_id = dict(params)
    states = opt_state["state"]
    if not isinstance(states, dict):
        raise CheckpointError(f"{where}: the optimizer state is malformed")
    for pid, entry in states.items():
        if pid not in by_id or not isinstance(entry, dict):
            raise CheckpointError(f"{where}: optimizer state for parameter {pid!r}, which the optimizer does not have")
        shape = tuple(by_id[pid].shape)
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != shape:
                raise CheckpointError(f"{where}: optimizer state '{name}' of parameter {pid} has shape "
                                      f"{list(value.shape)}, the parameter {list(shape)}")


# --------------------------------------------------------------------------------------------
# small helpers


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _torch_version() -> str:
    try:
        return str(torch.__version__)
    except Exception:  # pragma: no cover
        return "unknown"
