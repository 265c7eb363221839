"""Tags that make a run readable in the MLflow UI (and in Comet, as "others"): :func:`run_tags`.
``data_digest`` is tagged by the training entry point itself, a sweep's trials add ``optuna.*``
tags (:mod:`kronos_mlflow.workflows.sweep.driver`); every tag a run carries:
docs/run-records.md#params-metrics-tags-and-artifacts.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config.sections import section
from ..stages import spec_of

GIT_COMMIT_TAG = "mlflow.source.git.commit"
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def git_commit(path: str | os.PathLike | None = None, timeout: float = 5.0) -> str | None:
    """HEAD of the git checkout whose top level holds ``path`` (default: this package), or None.

    The package directory must sit directly under the checkout's top level, as it does in this
    project's repository, so a wheel installed into some other repository's virtualenv is not
    credited with that repository's commit. Never raises.
    """
    package_dir = Path(path) if path is not None else Path(__file__).resolve().parents[1]
    try:
        proc = subprocess.run(
            ["git", "-C", str(package_dir), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) != 2:
        return None
    top, sha = lines
    try:
        if Path(top).resolve() != package_dir.resolve().parent:
            return None
    except OSError:
        return None
    return sha if _SHA.match(sha) else None


def parameter_count(model: Any) -> int:
    from ..runtime.distributed import unwrap  # lazy: torch, numpy

    raw = unwrap(model)
    return int(sum(p.numel() for p in raw.parameters()))


def run_tags(config: Mapping[str, Any], model: Any = None) -> dict[str, str]:
    """The run's tags for ``config`` and (optionally) the built ``model``: ``instrument``;
    ``model_size``, the parameter count as a plain integer (sortable, filterable:
    ``tags.model_size = '3963526'``); ``codebook_bits``, ``"<s1_bits>+<s2_bits>"`` of the model
    actually trained (a pretrained checkpoint's, not the config's), so usage counts can be read
    against 2^s1_bits codes; the stage's own tags; ``mlflow.source.git.commit`` (:func:`git_commit`,
    absent when git is missing or fails, or the package is not at the top of a git checkout)."""
    from ..runtime.distributed import unwrap  # lazy: torch, numpy

    tags = {"instrument": str(section(config, "data").instrument)}
    if model is not None:
        tags["model_size"] = str(parameter_count(model))
        raw = unwrap(model)
        if hasattr(raw, "s1_bits") and hasattr(raw, "s2_bits"):
            tags["codebook_bits"] = f"{raw.s1_bits}+{raw.s2_bits}"
    tags.update(spec_of(config).run_tags(config))  # a predictor's tokenizer
    commit = git_commit()
    if commit:
        tags[GIT_COMMIT_TAG] = commit
    return tags
