"""What a training run's ``auto`` values came to: a frozen record, made once, apart from the config.

The user's config says what was asked and stays as it was validated (``auto`` weights, an empty
``run_name``, ``nproc_per_node``, ``auto`` dates): :func:`kronos_mlflow.config.core.validate`
decides nothing that needs the network, and nothing writes the config afterwards. What those
values resolve to is :class:`Resolved`, made once per process after the checks:

- ``starts``: each ``auto`` checkpoint key the run reads -> (the published hub id, or '' for fresh
  weights; why), decided by rank 0 (the Hugging Face cache, then the hub) and taken by every rank
  (:func:`resolve`); the checks validation left to that answer run then, with the same lines;
- ``run_name`` (the config's, or the name :func:`kronos_mlflow.tracking.run_names.training`
  gives), ``nproc_per_node`` (torchrun's ``LOCAL_WORLD_SIZE`` when it started the process);
- ``world_size``, ``device`` and the dates read from the market (``dataset_begin_time`` /
  ``dataset_end_time``: ``auto`` is the time ranges' span), once the process group is up.

The code that needs a resolved value reads it here; the run's params and tags are those of the
config with ``run_name`` and ``nproc_per_node`` as resolved (:meth:`Resolved.run_config`, what the
params have always said), the starts as the ``<key>_source`` tags, and the whole record as the
artifact ``resolved.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..config import core as cfg, published
from ..config.sections import section
from ..config.timeranges import data_span
from ..tracking import run_names

#: The artifact that holds the record (at the run's root).
ARTIFACT = "resolved.json"


@dataclass(frozen=True)
class Resolved:
    """What ``auto`` and the launch made of a validated config (see the module's docstring)."""

    run_name: str
    nproc_per_node: int
    starts: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    world_size: int | None = None
    device: str | None = None
    dataset_begin_time: str | None = None
    dataset_end_time: str | None = None

    def run_config(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """``config`` as the run reads it: a new read-only mapping with ``run_name`` and
        ``nproc_per_node`` as resolved (``config`` itself unchanged)."""
        return MappingProxyType({**config, "run_name": self.run_name, "nproc_per_node": self.nproc_per_node})

    def start(self, key: str) -> tuple[str, str] | None:
        """(the hub id or '' for fresh, why) of an ``auto`` key this record decided; None otherwise."""
        return self.starts.get(key)

    def as_json(self) -> dict[str, Any]:
        """The record as JSON types (``starts`` as key -> {"source", "reason"})."""
        out = asdict(self)
        out["starts"] = {key: {"source": value[0], "reason": value[1]} for key, value in self.starts.items()}
        return out

    def write(self, directory: str | os.PathLike) -> str:
        """``resolved.json`` in ``directory``; its path."""
        path = os.path.join(os.fspath(directory), ARTIFACT)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.as_json(), fh, indent=2, sort_keys=True)
            fh.write("\n")
        return path


def launch_values(config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Resolved:
    """The record's first part, known before the process group: ``nproc_per_node`` (torchrun's
    ``LOCAL_WORLD_SIZE`` when it started this process, else the config's) and the run's name."""
    environ = os.environ if environ is None else environ
    job, tracking = section(config, "job"), section(config, "tracking")
    nproc = int(environ["LOCAL_WORLD_SIZE"]) if environ.get("LOCAL_WORLD_SIZE") else int(job.nproc_per_node)
    run_name = tracking.run_name or run_names.training({**config, "nproc_per_node": nproc})
    return Resolved(run_name=run_name, nproc_per_node=nproc)


def decide_starts(config: Mapping[str, Any], share=None, *, is_main: bool = True) -> dict[str, tuple[str, str]]:
    """``auto`` decided for the checkpoint keys a run of ``config`` reads: here (the cache, then
    the hub), or, given ``share`` (a broadcast from rank 0: ``share(value_on_rank_0)``), rank 0's
    decision on every rank; this process's later reads (:func:`published.source`) give the same.
    Then the checks validation left to the hub's answer (a fresh model's size, what
    ``objective: val_skill`` forecasts with): a ConfigError with the line validation would give."""
    keys = published.read_by(config)
    if share is None:
        starts = published.decisions(keys)
    else:
        starts = share(published.decisions(keys) if is_main else None)
    published.adopt(starts)
    cfg.check_models_and_objective(config, hub=True)
    return dict(starts)


def resolve(config: Mapping[str, Any], *, share=None, is_main: bool = True, environ: Mapping[str, str] | None = None,
            world_size: int | None = None, device: str | None = None) -> Resolved:
    """The record of ``config``: :func:`launch_values`, :func:`decide_starts`, the market's dates,
    and ``world_size`` / ``device`` when the process group gave them."""
    begin, end = data_span(config)
    return replace(launch_values(config, environ), starts=decide_starts(config, share, is_main=is_main), world_size=world_size,
                   device=device, dataset_begin_time=str(begin), dataset_end_time=str(end))
