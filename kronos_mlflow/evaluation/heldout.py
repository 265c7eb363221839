"""The end of every training run: its best checkpoint against its starting weights
(``checkpoints/start/``) on the test windows, recorded as metrics, tags and one console line
(:func:`evaluate_run`; docs/verdict.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config.core import format_time_range, stage_keys
from ..config.keys import DATA, TRAINING, VERDICT
from ..config.sections import as_section
from ..runtime.distributed import dist_sum
from ..tracking.keys import TEST_PREFIX, TEST_WINDOWS_DIGEST_TAG
from ..config import published
from .verdict import HeldOut, judge, unavailable
from .windows import HeldOutWindows, heldout_windows


def base_label(config: Mapping[str, Any]) -> str:
    """What the starting weights were: the stage's pretrained path or hub id as given
    (``pretrained_tokenizer_path``, ``pretrained_predictor_path``), or ``fresh``."""
    return published.source(config, stage_keys(config).pretrained) or "fresh"


def _base_source(config: Mapping[str, Any], start_dir: Path | None) -> str | None:
    if start_dir is not None and (Path(start_dir) / "model.safetensors").is_file():
        return str(start_dir)
    return published.source(config, stage_keys(config).pretrained) or None


def compare_on(windows: HeldOutWindows, model_source, base_source, device, *, config: Mapping[str, Any],
               label: str, rank: int = 0, world_size: int = 1, console=None, stage,
               names: tuple[str, str] = ("fine-tuned", "starting weights"), prefix: str = TEST_PREFIX) -> HeldOut:
    """Score a model and its base (each a checkpoint directory, hub id or loaded model) on
    ``windows`` with the stage's held-out piece ``stage`` (a
    :class:`~kronos_mlflow.stages.base.HeldOutPiece`) and judge the change (a collective when
    ``world_size > 1``)."""
    progress = console.progress if console is not None else None
    batch_size = int(as_section(config, TRAINING).batch_size)
    scored = []
    for source, name in ((model_source, names[0]), (base_source, names[1])):
        model = stage.load(source, device) if isinstance(source, (str, Path)) else source
        scored.append(stage.score(model, windows, device, batch_size=batch_size, rank=rank, world_size=world_size,
                                  progress=progress, desc=f"{windows.split}: {name}"))
        del model
    (losses, metrics), (base_losses, base_metrics) = scored
    return judge(losses, base_losses, metrics, base_metrics, min_change=float(as_section(config, VERDICT).verdict_min_change),
                 base_label=label, loss=stage.loss, split=windows.split, windows_digest=windows.digest, prefix=prefix)


def evaluate_run(config: Mapping[str, Any], best_dir: Path, start_dir: Path | None, device, *, rank: int,
                 world_size: int, logger, console, step: int, stage) -> HeldOut:
    """Judge the run's best checkpoint (``best_dir``) against its starting weights on the test
    windows; log the metrics at ``step`` (the best epoch), the tags, and the console line.

    Every rank calls it (the scoring is a collective); what only rank 0 does (print, log) goes
    through ``console`` and ``logger``, silent and no-op on other ranks. A run whose start was not
    saved falls back to the stage's pretrained path. The checkpoints are read from the run's
    directory on every rank (several nodes need a shared ``save_path``); when some rank cannot read
    them the verdict is ``unavailable``, on every rank."""
    started = time.time()
    label = base_label(config)
    windows = heldout_windows(config, "test")
    base = _base_source(config, start_dir)
    # Every rank must take the same branch (the scoring is a collective): the checkpoints count
    # as there only when every rank can read them (several nodes need a shared save_path).
    readable = dist_sum([float(base is not None), float((Path(best_dir) / "model.safetensors").is_file())])
    if not len(windows):
        data = as_section(config, DATA)
        result = unavailable(
            f"no test windows for instrument '{data.instrument}' in test_time_range "
            f"{format_time_range(data.test_time_range)}; widen test_time_range to judge the fine-tune",
            base_label=label)
    elif min(readable) < world_size:
        result = unavailable("the best checkpoint or the starting weights (checkpoints/start/) cannot be read on "
                             "every rank; keep save_path on a file system all nodes share", base_label=label)
    else:
        result = compare_on(windows, best_dir, base, device, config=config, label=label, rank=rank,
                            world_size=world_size, console=console, stage=stage)
    result.seconds = round(time.time() - started, 3)
    logger.log_metrics(result.run_metrics(), step=step)
    tags = result.tags()
    if result.windows_digest:
        tags[TEST_WINDOWS_DIGEST_TAG] = result.windows_digest
    logger.set_tags(tags)
    console.print(result.line())
    return result
