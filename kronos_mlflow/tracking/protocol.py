"""The logger protocol every backend implements (:class:`ExperimentLogger`), and the two combinators:
:class:`NullLogger` for every rank but 0, :class:`MultiLogger` (MLflow, then Comet when enabled) for
rank 0, as :func:`kronos_mlflow.tracking.build_tracking` decides once: the training loop never checks
its rank. Backend-only features go through the adapters :class:`~kronos_mlflow.tracking.Tracking` holds.
"""

from __future__ import annotations

import logging
import math
import numbers
import shlex
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from ..config.core import TIME_RANGE_KEYS
from ..config.secrets import redact

log = logging.getLogger("kronos_mlflow.tracking")

# "killed": stopped on purpose (a pruned sweep trial, Ctrl-C): MLflow status KILLED.
Status = Literal["success", "failed", "killed"]

FAILURE_REASON_MAX_CHARS = 1000


@runtime_checkable
class ExperimentLogger(Protocol):
    """What the training loop may call. Every method returns None."""

    def log_hyperparams(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def persist(self) -> None:
        """Make everything logged so far durable (sent, or on local disk when the backend is
        unreachable): called before a training state is saved, so a kill right after the save
        loses no value of the steps that state says are done."""

    def finalize(self, status: Status, reason: str | None = None) -> None: ...


# --------------------------------------------------------------------------------------------
# helpers shared by the adapters


def one_line(text: Any, limit: int) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: max(0, limit - 3)] + "..."


def same_param(old: str, new: str) -> bool:
    """Equal, or equal once MLflow Projects' shell quoting (``''``) or number spelling
    (``2e-4`` / ``0.0002``) is undone: then the param is already there, nothing to say."""
    if old == new or old == shlex.quote(new):
        return True
    try:
        return float(old) == float(new)
    except ValueError:
        return False


def check_status(status: str) -> None:
    if status not in ("success", "failed", "killed"):
        raise ValueError(f"finalize status must be 'success', 'failed' or 'killed', not {status!r}")


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings become dotted keys; time ranges become START:END, other lists a,b,c."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, prefix=f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = (":" if key in TIME_RANGE_KEYS else ",").join(map(str, value))
        else:
            out[name] = value
    return out


class MetricCleaner:
    """Turns metric values into floats; drops the rest with one warning per key."""

    def __init__(self, owner: str):
        self.owner = owner
        self._warned: set[str] = set()

    def number(self, key: str, value: Any) -> float | None:
        raw = value
        if not isinstance(value, (int, float)) and hasattr(value, "item"):
            try:  # numpy scalars, 0-d arrays, one-element tensors (also moves them to the CPU)
                value = value.item()
            except Exception:
                pass
        if isinstance(value, numbers.Real):
            number = float(value)
            if math.isfinite(number):
                return number
            why = f"non-finite value {number}"
        else:
            why = f"non-numeric value of type {type(raw).__name__}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s: dropping metric '%s' (%s); further drops of this key are silent", self.owner, key, why)
        return None

    def clean(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in metrics.items():
            number = self.number(str(key), value)
            if number is not None:
                out[str(key)] = number
        return out


# --------------------------------------------------------------------------------------------
# trivial loggers


class NullLogger:
    """Every method is a no-op: what non-zero ranks (and tests) get."""

    essential = False

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        return None

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        return None

    def set_tags(self, tags: Mapping[str, str]) -> None:
        return None

    def finalize(self, status: Status, reason: str | None = None) -> None:
        return None

    def persist(self) -> None:
        return None


class MultiLogger:
    """Fans each call out to ``loggers`` in list order.

    A logger whose ``essential`` attribute is false (Comet) that raises is warned about once and
    dropped; the others keep going. An essential logger (MLflow, and any logger without the
    attribute) that raises propagates the error. ``finalize`` reaches every logger even when an
    earlier one fails, then re-raises the first essential failure.
    """

    def __init__(self, loggers: Iterable[ExperimentLogger], skip_steps: Mapping[str, set[int]] | None = None):
        """``skip_steps``: metric key -> steps already recorded (a resumed run replays them);
        values at those steps go to no backend. Read at every call, so it may keep growing."""
        self.loggers: list[ExperimentLogger] = list(loggers)
        self._cleaner = MetricCleaner("metrics")
        self._finalized = False
        self._skip_steps: Mapping[str, set[int]] = skip_steps if skip_steps is not None else {}

    def _drop(self, logger: Any, method: str, exc: BaseException) -> None:
        name = type(logger).__name__
        log.warning(
            "%s failed in %s (%s: %s); it is dropped and the run continues with the other loggers",
            name, method, type(exc).__name__, one_line(redact(str(exc)), 300),
        )
        self.loggers = [lg for lg in self.loggers if lg is not logger]

    def _fan_out(self, method: str, *args: Any, **kwargs: Any) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args, **kwargs)
            except Exception as exc:
                if getattr(logger, "essential", True):
                    raise
                self._drop(logger, method, exc)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self._fan_out("log_hyperparams", params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        # Cleaned once here, so a bad value is warned about once, not once per backend.
        clean = self._cleaner.clean(metrics)
        if self._skip_steps:
            step = int(step)
            clean = {k: v for k, v in clean.items() if step not in self._skip_steps.get(k, ())}
            if not clean:
                return
        self._fan_out("log_metrics", clean, step)

    def persist(self) -> None:
        self._fan_out("persist")

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        self._fan_out("log_artifact", local_path, artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._fan_out("set_tags", tags)

    def finalize(self, status: Status, reason: str | None = None) -> None:
        check_status(status)
        if self._finalized:
            return
        self._finalized = True
        first_error: BaseException | None = None
        for logger in list(self.loggers):
            try:
                logger.finalize(status, reason)
            except Exception as exc:
                if getattr(logger, "essential", True):
                    first_error = first_error or exc
                else:
                    self._drop(logger, "finalize", exc)
        if first_error is not None:
            raise first_error


