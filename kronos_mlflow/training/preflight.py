"""What a training step, a sweep's trial or an evaluation would refuse, checked before any work by every
door of stage two and by training's ``--check`` (docs/reliability.md#checked-before-work); the data
those checks read goes through :class:`DataView`, so a refusal leaves no cache or demo market behind.
The checks are the steps' own functions (``build_model``, ``val_origins``, ``forecast_origins``, the
backtest's range), called on the same config, never copies of them.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import published
from ..config.core import check_paths
from ..config.keys import BACKTEST, DATA, FINETUNE
from ..config.sections import as_section, sections
from ..errors import ConfigError, UserError
from ..evaluation.backtest import check_signal_days
from ..config.stage_keys import stage_keys
from ..stages import spec_of
from ..config.checks import sqlite_path


def forecasts(config: Mapping[str, Any]) -> bool:
    """Whether a training run with ``config`` forecasts: a predictor run (its logged forecaster,
    its scorecard) or a run on ``objective: val_skill`` (every epoch)."""
    return spec_of(config).forecasts(config)


def check_context(data: Any) -> None:
    """``lookback_window + predict_window`` bars fit the forecasting model's ``max_context``:
    a longer window is cut to its last ``max_context`` tokens while forecasting (the model never
    sees the start of its lookback), and one shorter than the horizon gives a shorter forecast.
    ``data``: the config's data section, or the whole config."""
    data = as_section(data, DATA)
    lookback, horizon, limit = int(data.lookback_window), int(data.predict_window), int(data.max_context)
    if lookback + horizon > limit:
        raise ConfigError(
            f"lookback_window {lookback} + predict_window {horizon} = {lookback + horizon} bars is more than "
            f"max_context {limit}, the longest context the forecasting model reads; expected lookback_window + "
            "predict_window <= max_context (Kronos-small and -base read 512): shorten the windows or raise max_context")


def check_processes(nproc: int, device) -> None:
    """``nproc_per_node`` processes fit this machine: on CPU at most 4 per usable CPU (each
    process imports torch and holds its own copy of the model), on CUDA one per visible GPU
    (:func:`~kronos_mlflow.runtime.distributed.resolve_device` checks that)."""
    if getattr(device, "type", str(device)) != "cpu":
        return
    import os

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    limit = max(4 * cpus, 4)
    if nproc > limit:
        raise ConfigError(f"nproc_per_node: {nproc} processes on CPU is too many for the {cpus} CPU(s) this process "
                          f"may use; expected at most {limit} (4 per CPU), or device cuda with one per GPU")


def check_partial_start(config: Mapping[str, Any]) -> None:
    """``finetune_mode`` lora or freeze keeps most of the starting weights as they are: on fresh
    (random) weights that trains adapters or a top on a random base. Refused unless the start is
    asked for by name (the stage's ``pretrained_*_path`` set to ``fresh``), not reached by ``auto``
    finding no published checkpoint, nor by an empty value."""
    mode = str(as_section(config, FINETUNE).finetune_mode or "full")
    key = stage_keys(config).pretrained
    value = str(config.get(key) or "").strip()
    if mode == "full" or value.lower() == published.FRESH or published.source(config, key):
        return
    why = (f"auto found no published checkpoint: {published.reason(config, key)}" if value.lower() == published.AUTO
           else f"{key} is empty")
    hub = published.PUBLISHED.get(key, "a checkpoint")
    raise ConfigError(f"finetune_mode {mode} on fresh (random) weights: {why}; expected {key} set to a checkpoint "
                      f"(e.g. {hub}), finetune_mode full, or {key}=fresh to train {mode} on fresh weights anyway")


def check_start(config: Mapping[str, Any], world_size: int | None = None) -> None:
    """What a run refuses before it reads any data, the same on every rank: output paths,
    lora or freeze on fresh weights not asked for (:func:`check_partial_start`), device and
    process count, speed settings, Comet's key, the forecast window of a run that
    forecasts against ``max_context``."""
    from ..runtime import perf  # lazy: torch
    from ..runtime.distributed import resolve_device  # lazy: torch, numpy
    from ..tracking.comet import check_comet  # lazy: numpy, urllib/http

    check_paths(config)
    check_partial_start(config)
    settings = sections(config)
    world = int(world_size or settings.job.nproc_per_node)
    device = resolve_device(settings.job.device, 0, world)
    check_processes(world, device)
    perf.describe(settings.performance, device, perf.run_steps(settings.training, world))
    check_comet(config)
    if forecasts(config):
        check_context(settings.data)


class DataView:
    """Configs whose prepared splits can be read, without writing the data cache or the demo
    market before every check has passed. ``with DataView() as data:`` ... ``data.config(config)``
    ... the caches prepared for the checks (and the demo market, when the checks made it) are
    moved into place when the block ends without an error (``publish=False``: removed either
    way), else removed."""

    def __init__(self, *, publish: bool = True, quiet_splits: tuple[str, ...] = ()):
        self.publish_on_success = publish
        self.quiet_splits = quiet_splits  # whose "no <split> windows" warning is not for this door to say
        self._root: Path | None = None
        #: the cache's folder as the checks name it -> (the scratch dataset_path, the config as given
        #: when its market is a demo market made here: its cache is renamed to it once that is in place)
        self._scratch: dict[Path, tuple[str, dict[str, Any] | None]] = {}
        self._demo: dict[str, Path] = {}  # freq -> the demo market made in the scratch folder
        self._warnings: list = []  # the data's warnings, said once every check passed (a refusal is one line)

    def __enter__(self) -> DataView:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if kind is None and self.publish_on_success:
                self.publish()
            elif isinstance(exc, UserError):  # a refusal names the demo market's own place, not the scratch copy
                exc.args = tuple(self._at_home(str(a)) for a in exc.args)
        finally:
            self.close()

    def _at_home(self, text: str) -> str:
        """``text`` naming the demo markets made here by their own places."""
        from ..data.demo import default_demo_path  # lazy: numpy

        for freq, made in self._demo.items():
            text = text.replace(str(made), str(default_demo_path(freq)))
        return text

    def _scratch_root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="kronos-check-"))
        return self._root

    def market(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with a market to read: its own ``qlib_data_path``; for an empty one the demo
        market where it is made, else one generated in the scratch folder (moved where it belongs
        by :meth:`publish`, once every check passed: a refusal leaves none)."""
        from ..data.demo import ensure_demo_market  # lazy: numpy
        from ..data.prepare import demo_market_made, provide_qlib_data

        data = as_section(config, DATA)
        if str(data.qlib_data_path or "").strip() or demo_market_made(data):
            provide_qlib_data(data)  # checks the directory (an older demo market gets its benchmark)
            return dict(config)
        freq = str(data.freq or "day")
        if freq not in self._demo:
            self._demo[freq] = ensure_demo_market(freq=freq, home=self._scratch_root() / "home")
        return {**config, "qlib_data_path": str(self._demo[freq])}

    def config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with a ``dataset_path`` that holds its prepared splits (and a market to read,
        :meth:`market`): its own when the cache is complete there, else a scratch folder's,
        prepared now (a refusal of the data is the one ``kronos-mlflow prepare`` gives)."""
        from ..data.prepare import (  # lazy: numpy
            MANIFEST, DataWarning, cache_dir_for, prepare_splits, warn_empty_splits,
        )

        market = self.market(config)
        final = cache_dir_for(market)
        if (final / MANIFEST).is_file():  # prepared before: its empty splits are said all the same
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DataWarning)
                warn_empty_splits(final, market)
            self._warnings += [w for w in caught if issubclass(w.category, DataWarning)]
            return market
        if final not in self._scratch:
            made_here = (str(as_section(market, DATA).qlib_data_path)
                         != str(as_section(config, DATA).qlib_data_path or ""))
            self._scratch[final] = (str(self._scratch_root() / str(len(self._scratch))),
                                    dict(config) if made_here else None)
        ready = {**market, "dataset_path": self._scratch[final][0]}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DataWarning)
            prepare_splits(ready)
        for w in caught:
            if issubclass(w.category, DataWarning):
                self._warnings.append(w)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return ready

    def publish(self) -> None:
        """Move the demo market made here to where it belongs, then each cache prepared here to
        its own ``dataset_path`` (as ``prepare`` would have written it: a complete cache published
        at once, never over a complete one), and say the data's warnings once each (bars dropped,
        a validation or test split with no window: a run without validation, or whose test
        verdict is unavailable), bar the empty splits of ``quiet_splits`` (a door that reads
        only some splits)."""
        from ..data.demo import ensure_demo_market  # lazy: numpy
        from ..data.prepare import MANIFEST, adopt_cache, publish_cache

        said = set()
        for w in self._warnings:
            if not any(str(w.message).startswith(f"no {split} windows") for split in self.quiet_splits):
                if (text := self._at_home(str(w.message))) not in said:
                    said.add(text)
                    warnings.warn_explicit(text, w.category, w.filename, w.lineno)
        self._warnings.clear()
        for freq, made in self._demo.items():
            ensure_demo_market(freq=freq, made=made)

        for final, (scratch, given) in self._scratch.items():
            built = Path(scratch) / final.name
            if not (built / MANIFEST).is_file():
                continue
            if given is not None:  # prepared from the demo market made here: named after its own place
                final = adopt_cache(built, given)
                if final is None:
                    continue
            publish_cache(built, final)

    def close(self) -> None:
        self._warnings.clear()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        self._scratch.clear()
        self._demo.clear()


def check_training(config: Mapping[str, Any], world_size: int, data: DataView, *, tokenizer=None):
    """What a training run with ``config`` on ``world_size`` processes refuses, bar its output
    paths, device and tracking (``check_start``, the tracking checks) and its training state:
    the checkpoints load (a predictor run's on ``tokenizer`` when given: the tokenizer a
    pipeline's first step will hand over, with the bits it will have), the objective's partner,
    the forecast window against ``max_context``, the data (one optimizer step per rank, the
    validation origins of ``objective: val_skill``) and the end-of-run scorecard's backtest.
    Returns the model the run starts from when it loaded one (else None)."""
    spec = spec_of(config)
    settings = sections(config)
    if spec.forecasts(config):
        check_context(settings.data)
    model = None
    if spec.loads_checkpoints(config):
        model = spec.build_model(config, tokenizer=tokenizer)  # loads each checkpoint as its kind; the same bits
    if settings.training.objective in ("val_skill", "val_ic"):
        spec.check_objective(config, model if model is not None else spec.build_model(config))
    if model is not None and settings.finetune.finetune_mode != "full":
        from ..model import finetune  # lazy: torch (peft for lora)

        finetune.apply(model, config, spec)  # freeze_layers within the model's blocks; lora_targets in it
    ready = data.config(config)
    if settings.training.objective in ("val_skill", "val_ic"):
        from ..evaluation.val_skill import val_origins  # lazy: torch, mlflow, pandas

        val_origins(ready)  # some validation origin forecasts bars after training
    if spec.scores_at_end(config):
        check_scorecard(ready, required=False)  # an empty test range: the run says so; its backtest must run
    check_windows(ready, world_size)
    return model


def check_scorecard(config: Mapping[str, Any], *, required: bool = True) -> int:
    """The number of test origins the scorecard of ``config`` scores (its data must be
    prepared: a :meth:`DataView.config`); none is a refusal when ``required`` (an evaluation
    with nothing to score). With origins, the backtest the scorecard runs has a day with a
    signal in its range, and with ``calibration: on`` at least ``calibration_min_origins``
    calibration origins. Reads the data, writes nothing."""
    from ..evaluation import calibration  # lazy: numpy
    from ..evaluation.origins import forecast_origins, no_origins_reason, signal_origins  # lazy: torch, pandas, numpy

    origins = forecast_origins(config)
    if not len(origins):
        if required:
            raise UserError(f"nothing to score: {no_origins_reason(origins, config)}")
        return 0
    if calibration.is_on(config):
        calibration.check_enough(len(calibration.origins_for(config, origins)), config)
    if int(as_section(config, BACKTEST).backtest_signal_stride):
        daily = signal_origins(config)
        check_signal_days(config, daily.dates if len(daily) else origins.dates)
    else:
        check_signal_days(config, origins.dates)
    return len(origins)


def check_tracking(config: Mapping[str, Any]) -> None:
    """The tracking store a door logs to, never created here: its URI and server, and, when the
    store exists, the run and experiment its runs would use (``MLFLOW_RUN_ID`` not deleted, the
    experiment not deleted: :func:`~kronos_mlflow.tracking.mlflow.check_run_target`)."""
    import mlflow

    from ..tracking.mlflow import check_run_target  # lazy: numpy, urllib/http
    from ..tracking.server import check_tracking_server, sqlite_store_ready

    check_tracking_server(create=False)
    db = sqlite_path(str(mlflow.get_tracking_uri()))
    if db is None or sqlite_store_ready(db):  # a store yet to be made holds no deleted run or experiment
        check_run_target(config)


def check_windows(config: Mapping[str, Any], world_size: int) -> None:
    """Each rank gets at least one optimizer step per epoch (as :func:`kronos_mlflow.training.loop.fit`
    requires), from the prepared splits' manifest."""
    from ..data import prepare_splits  # lazy: numpy
    from ..data.prepare import read_manifest

    settings = sections(config)
    windows = int(read_manifest(prepare_splits(settings.data, progress=False, backtest=settings.backtest))
                  ["splits"]["train"]["windows"])
    training = settings.training
    per_epoch = min(int(training.n_train_iter), windows)
    if per_epoch // max(1, world_size) // int(training.batch_size) == 0:
        raise ConfigError(
            f"batch_size {training.batch_size} x {world_size} process(es) is more than the "
            f"{per_epoch} training windows per epoch; lower batch_size or raise n_train_iter"
        )
