"""``kronos-mlflow evaluate-tokenizer``: any tokenizer against any other, on any data.

    kronos-mlflow evaluate-tokenizer outputs/models/finetune_tokenizer_demo/cfg-<digest>/checkpoints/best_model \\
        --base NeoQuasar/Kronos-Tokenizer-base
    kronos-mlflow evaluate-tokenizer runs:/<run id>/best_model --base ./Kronos-Tokenizer-base \\
        --qlib-data-path ./my_qlib --instrument mine --test-time-range 2025-01-01:2025-06-30 --log
    kronos-mlflow evaluate-tokenizer models:/kronos-tokenizer@champion --split val

MODEL and ``--base`` are each a checkpoint directory, ``runs:/<id>/best_model``,
``models:/NAME@ALIAS`` or a hub id. The windows are chosen as at the end of a training run
(every window of the split, or an evenly spaced subset of ``n_test_iter``; docs/verdict.md),
from the data flags (the demo market by default) and the window sizes, which must be those the
tokenizer was trained with (``--lookback-window``, ``--predict-window``; defaults 90 and 10).
It prints a table of the metrics and, with ``--base``, the change and the verdict line; with
``--log`` it records an MLflow run holding the same metric names (``test_*``, ``base_test_*``,
``test_loss_change`` ...; ``val_*`` ... with ``--split val``) and tags ``verdict``,
``verdict_base``. Bad input is one line on stderr and exit code 2.

A MODEL that names a run (``runs:/``, ``models:/``) is scored, by default, on that run's data
and at its sizes: every key of :data:`INHERITED_KEYS` the run recorded is the default under
the config file and the flags (a console line names those that differ from the defaults), so
``evaluate-tokenizer runs:/<id>/best_model`` scores the windows the run's own verdict scored.
Where it writes (the data cache, ``dataset_path``) is never the run's: always this command's
flags, config file or default.
Every argument is checked before anything is downloaded: the flags, the store and the run,
then ``--base`` is loaded, then MODEL.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from typing import Any

from ...config import core as cfg
from ...runtime.console import Console
from ...data import provide_qlib_data
from ...runtime.distributed import resolve_device
from ...errors import UserError
from ...evaluation.heldout import compare_on
from ...evaluation.sources import ACCEPTED, kept_settings, recorded_settings, resolve_tokenizer
from ...config.keys import DATA_WINDOW_KEYS, PLACES_TO_WRITE
from ...config.sections import sections
from ...evaluation.verdict import HeldOut, percent
from ...evaluation.windows import HELDOUT_SPLITS, heldout_windows
from ...tracking.keys import TEST_WINDOWS_DIGEST_TAG
from .heldout import PIECE

#: The config keys this command takes as flags: the data, the windows, the evaluation.
DATA_KEYS = (
    "qlib_data_path", "instrument", "freq", "membership_gaps", "dataset_begin_time", "dataset_end_time",
    "train_time_range", "val_time_range", "test_time_range", "dataset_path", "lookback_window", "predict_window",
    "clip", "n_test_iter", "n_val_iter", "batch_size", "verdict_min_change", "device",
)


#: What MODEL's run decides unless a flag or the config file says otherwise: its data, windows and
#: sizes; never a place to write (``dataset_path``: the data cache is this command's own).
INHERITED_KEYS = tuple(k for k in (*DATA_WINDOW_KEYS, "n_test_iter", "n_val_iter", "batch_size", "verdict_min_change")
                       if k not in PLACES_TO_WRITE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help=f"the tokenizer to score: {ACCEPTED}")
    parser.add_argument("--base", metavar="MODEL", default="", help="the tokenizer to compare with (e.g. the one "
                        "MODEL was fine-tuned from); without it only MODEL is scored")
    parser.add_argument("--split", choices=HELDOUT_SPLITS, default="test", help="the windows (default: test)")
    parser.add_argument("--log", action="store_true", help="record the result as an MLflow run")
    parser.add_argument("--experiment", metavar="NAME", default="", help="the MLflow experiment of --log (default: "
                        "MLFLOW_EXPERIMENT_NAME, else MLflow's default)")
    parser.add_argument("--tracking-uri", metavar="URI", default=None, help="MLflow tracking URI for runs:/ and "
                        "models:/ and --log; default: MLFLOW_TRACKING_URI, else ./mlflow.db")
    parser.add_argument("--config", dest="_config_file", metavar="FILE.yaml", help="YAML file of config keys (only "
                        "the data and window keys matter here)")
    for key in DATA_KEYS:
        default = cfg.DEFAULTS[key]
        shown = ":".join(default) if key in cfg.TIME_RANGE_KEYS else default
        parser.add_argument(f"--{key.replace('_', '-')}", f"--{key}", dest=f"cfg__{key}", default=argparse.SUPPRESS,
                            metavar="VALUE", help=f"{cfg.HELP[key]} (default: {shown!s})".replace("%", "%%"))


def run(args: argparse.Namespace) -> int:
    overrides = {k[5:]: v for k, v in vars(args).items() if k.startswith("cfg__")}
    if not str(args.model or "").strip():
        raise UserError(f"MODEL is empty; expected {ACCEPTED}")
    recorded, run_id = recorded_settings(args.model, INHERITED_KEYS, "MODEL", args.tracking_uri)
    config = cfg.load_config(overrides, path=getattr(args, "_config_file", None), beneath=recorded)
    console = Console(True)
    kept = kept_settings(recorded, config, cfg.DEFAULTS)
    if kept:
        console.print(f"MODEL's run {run_id} recorded {kept}: scored at those (flags override them)")
    parts = sections(config)  # the device, the instrument, the batch size
    device = resolve_device(parts.job.device)
    # the base first: a base that cannot be loaded is refused before MODEL's artifacts are downloaded
    base = resolve_tokenizer(args.base, device, tracking_uri=args.tracking_uri, what="--base") if args.base else None
    model = resolve_tokenizer(args.model, device, tracking_uri=args.tracking_uri, what="MODEL")
    provide_qlib_data(config)  # the front door, once the models load: an empty qlib_data_path's demo market
    windows = heldout_windows(config, args.split)
    if not len(windows):
        a, b = windows.time_range
        raise UserError(f"no {args.split} windows for instrument '{parts.data.instrument}' in "
                        f"{args.split}_time_range {a}:{b}; choose another range or instrument")
    prefix = f"{args.split}_"
    if base is not None:
        result = compare_on(windows, model, base, device, config=config, label=args.base, console=console,
                            names=("model", "base"), prefix=prefix, stage=PIECE)
    else:  # the model alone: its metrics, no verdict
        _, metrics = PIECE.score(model, windows, device, batch_size=int(parts.training.batch_size),
                                     progress=console.progress, desc=f"{args.split}: model")
        result = HeldOut("", base_label="", windows=len(windows), metrics=metrics, split=args.split,
                         windows_digest=windows.digest, prefix=prefix)
    print(f"model: {args.model}" + (f"\nbase:  {args.base}" if args.base else ""))
    print(f"data:  {windows.describe()} (windows digest {windows.digest[:12]})")
    print(format_table(result.metrics, result.base_metrics if base is not None else None))
    if base is not None:
        print(result.line(base_words="base"))
    if args.log:
        run_id = log_run(args, config, result)
        print(f"logged: MLflow run {run_id}")
    return 0


def format_table(metrics: Mapping[str, float], base: Mapping[str, float] | None) -> str:
    """Metric, model and (with a base) base and relative change; one row per metric."""
    header = ["metric", "model"] + (["base", "change"] if base is not None else [])
    rows = [header]
    for name, value in metrics.items():
        row = [name, _number(value)]
        if base is not None:
            other = base.get(name, float("nan"))
            change = (value - other) / other if other and math.isfinite(other) and name != "windows" else float("nan")
            row += [_number(other), percent(change) if math.isfinite(change) else "-"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 1 else f"{value:.6g}"


def log_run(args: argparse.Namespace, config: Mapping[str, Any], result) -> str:
    """An MLflow run holding the result: params (the models, the split, the data keys), the
    metrics and tags a training run's verdict has, the windows as its input."""
    import os

    from mlflow import MlflowClient

    from ...tracking.server import resolve_tracking_uri  # lazy: urllib/http
    from ...serving.model_logging import log_heldout_dataset  # lazy: mlflow, pandas, urllib/http

    # An explicit --tracking-uri must exist; otherwise MLflow's own default, as training runs use.
    client = MlflowClient(tracking_uri=resolve_tracking_uri(args.tracking_uri) if args.tracking_uri else None)
    name = args.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", "")
    from ...tracking.gate import experiment_named, new_run  # lazy: numpy, urllib/http

    experiment_id = experiment_named(client, name) if name else "0"
    tags = {"evaluation.split": args.split, TEST_WINDOWS_DIGEST_TAG: result.windows_digest}
    if result.verdict:
        tags.update(result.tags())
    run = new_run(client, experiment_id, run_name=f"evaluate {os.path.basename(args.model.rstrip('/'))}", tags=tags)
    run_id = run.info.run_id
    params = {"model": args.model, "base": args.base, "split": args.split,
              **{k: v for k, v in cfg.flatten(config).items() if k in DATA_KEYS}}
    for key, value in params.items():
        client.log_param(run_id, key, str(value)[:500])
    for key, value in result.run_metrics().items():
        client.log_metric(run_id, key, value)
    log_heldout_dataset(client, run_id, config, {"split": args.split, "windows_digest": result.windows_digest,
                                                "windows": result.windows})
    client.set_terminated(run_id)
    return run_id
