"""``kronos-mlflow walk-forward``: fine-tune and judge fold after fold, one verdict over all.

    kronos-mlflow walk-forward --folds 3 --fold-length 2M --check       # the fold table, every check
    mlflow run . -e walkforward --env-manager local -P folds=3 -P fold_length=2M
    mlflow run . -e walkforward -P fold=2 -P parent_run_id=<id>          # one fold, into that parent
    kronos-mlflow walk-forward --aggregate <parent run id>               # the verdict, once every fold ended

One parent run (role ``walkforward``), one child pipeline per fold (the pipeline of
:mod:`kronos_mlflow.workflows.pipeline`: a fold's parent run with its tokenizer, predictor and evaluation
child runs), every step reused by digest as the pipeline reuses it: a second identical command
trains nothing, a stopped one continues at the step that stopped. The folds come from
:mod:`kronos_mlflow.workflows.walkforward.folds` (printed, and logged as ``walkforward/folds.json``); with
``walkforward_retrain: predictor`` (the default) every fold's tokenizer step has the first
fold's ranges, so one tokenizer is fine-tuned and reused by all. Once every fold's evaluation
has FINISHED, the parent gets the pooled verdict (:mod:`kronos_mlflow.workflows.walkforward.aggregate`).
With ``--registered-model-name`` the champion alias moves to the last fold's pair only when the
walk-forward verdict against the zero-shot pair is ``better``. docs/walk-forward.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from ...tracking import handover, run_names
from ...config import names, checks
from .. import pipeline as pl
from ...tracking.child_runs import create_child, log_param_once
from ...tracking.command_runs import install as install_stops, started
from ...config.core import format_time_range
from ...config.sections import section
from ...data.prepare import market_calendar
from ...errors import UserError
from ...training.preflight import DataView
from ...runtime.stopping import TrainingStopped
from ...tracking.ownership import OwnershipError
from ...evaluation.next_steps import look_command
from ..pipeline_champions import move_champions
from ...stages import get, names as stage_names
from . import aggregate as agg, folds as fl, table as forecasters_table

ROLE_TAG, FOLD_TAG, PLAN_TAG = "walkforward.role", "walkforward.fold", "walkforward.plan_digest"
#: flag -> (default, help); the walk-forward's own settings (not config keys)
SETTINGS = {
    "folds": ("4", "number of consecutive test periods (folds)"),
    "fold_length": ("3M", f"one fold's test period: {fl.LENGTH_ACCEPTED}"),
    "walkforward_mode": ("expanding", "expanding (training from train_time_range's start) or rolling (train_length)"),
    "train_length": ("", "rolling mode: the training period's length"),
    "embargo": ("", "bars left out between a fold's validation end and its test start (default predict_window)"),
    "val_length": ("", "a fold's validation period (default one fold_length)"),
    "walkforward_end": ("", "the last fold's last date (default the end of test_time_range)"),
    "walkforward_retrain": ("predictor", "predictor (one tokenizer, fine-tuned before the first fold) or both"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pl.add_arguments(parser)  # the pipeline's flags, --check included
    for name, (default, help_text) in SETTINGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=f"wf_{name}", default=default, metavar="VALUE",
                            help=f"{help_text} (default: {default or 'see docs/walk-forward.md'})")
    parser.add_argument("--fold", default="0", metavar="K", help="run fold K alone (1 = the earliest); 0: every fold")
    parser.add_argument("--parent-run-id", default="", metavar="RUN_ID",
                        help="the walk-forward parent run a --fold run goes into (made by an earlier command)")
    parser.add_argument("--aggregate", default="", metavar="RUN_ID",
                        help="recompute the verdict of the walk-forward parent RUN_ID from its folds, then exit")


def settings_of(args) -> fl.Settings:
    return fl.Settings.checked(folds=args.wf_folds, fold_length=args.wf_fold_length, mode=args.wf_walkforward_mode,
                               train_length=args.wf_train_length, embargo=args.wf_embargo,
                               val_length=args.wf_val_length, end=args.wf_walkforward_end,
                               retrain=args.wf_walkforward_retrain)


def calendar_of(config) -> np.ndarray:
    """The market's calendar; the demo market's is computed when it is not made yet (it is made
    once every fold's check passed: :class:`~kronos_mlflow.training.preflight.DataView`)."""
    return market_calendar(config)


def fold_args(args, folds: list[fl.Fold], settings: fl.Settings, fold: fl.Fold):
    """The pipeline's arguments for ``fold``: its ranges per step, no champion of its own."""
    out = copy.copy(args)
    out.step_overrides = {name: {k: format_time_range(v) for k, v in
                                 fl.stage_ranges(folds, settings, fold, get(name).retrained_every_fold).items()}
                          for name in stage_names()}
    out.step_overrides[pl.EVALUATION] = {k: format_time_range(v) for k, v in fold.ranges.items()}
    out.registered_model_name, out.check = "", False
    out.run_name_fold = (fold.fold, len(folds))  # its runs' names start with the fold (kronos_mlflow/tracking/run_names.py)
    return out


def plan_of(args) -> tuple[fl.Settings, list[fl.Fold], int]:
    """The settings, the fold table and the fold asked for (0: all), every value checked."""
    settings = settings_of(args)
    base = pl.step_config(args, stage_names()[-1])  # the forecaster's: the folds are its test periods
    folds = fl.plan(section(base, "data"), settings, calendar_of(base))
    only = checks.integer("fold", args.fold, 0, len(folds), what="fold", error=UserError)
    return settings, folds, only


def check_folds(args, folds, settings, only: int) -> None:
    """Every fold's pipeline checks (:func:`kronos_mlflow.workflows.pipeline.check`), naming the fold, on
    one data view: the folds' data caches (and the demo market) are written once all passed."""
    with DataView() as data:
        for fold in folds:
            if only and fold.fold != only:
                continue
            check_fold(args, folds, settings, fold, data)


def check_fold(args, folds, settings, fold, data) -> None:
    """One fold's pipeline checks, a refusal naming the fold."""
    checked = fold_args(args, folds, settings, fold)
    try:
        pl.check(checked, "walk-forward", data)
    except OwnershipError:
        raise  # the store gate's refusal names the run, not a fold
    except UserError as exc:
        raise UserError(f"fold {fold.fold}: {exc}") from None
    args.force, args.nproc_per_node = checked.force, checked.nproc_per_node  # as the check read them


def run(args: argparse.Namespace) -> int:
    from ...tracking import gate  # lazy: numpy, urllib/http

    if args.aggregate:
        run_id = names.run_id(args.aggregate, "--aggregate")
        return aggregate_parent(gate.reader(f"--aggregate {run_id}"), run_id, args)
    if args.parent_run_id:
        args.parent_run_id = names.run_id(args.parent_run_id, "--parent-run-id")
    if gate.handed_run_id():  # the run MLFLOW_RUN_ID hands over, before the fold table reads any data
        gate.check_handed("walk-forward", section(pl.step_config(args, stage_names()[0]), "tracking").experiment_name)
    settings, folds, only = plan_of(args)
    print(f"[walk-forward] {fl.describe(folds)}, {settings.mode}, retraining {settings.retrain}:", flush=True)
    print(fl.table(folds), flush=True)
    if args.parent_run_id:  # before any run is made, with --check too
        checked_parent(gate.reader(f"--parent-run-id {args.parent_run_id}"), args.parent_run_id,
                       fl.plan_digest(folds, settings))
    check_folds(args, folds, settings, only)  # the last check: its data (and demo market) written once all passed
    if args.check:
        print("[walk-forward] check passed: every fold's config, checkpoints, data, origins and the tracking server "
              "are usable", flush=True)
        return 0
    client, experiment_id = pl.open_store(args)
    install_stops()  # SIGTERM / Ctrl-C: sent on to a step's process, then every run of this command ends KILLED
    parent_id = started(open_parent(client, experiment_id, args, folds, settings))
    return run_folds(client, experiment_id, parent_id, args, folds, settings, only)


def parent_rule(digest: str | None):
    """Why a run is not a walk-forward parent (of the fold table ``digest``, when given): for the
    store gate's :func:`~kronos_mlflow.tracking.gate.continued_parent`. A walk-forward's own rule
    lets a FINISHED parent take another fold or be aggregated again."""

    def why(run) -> str | None:
        if run.data.tags.get(ROLE_TAG) != "parent":
            return (f"the run is not a walk-forward parent (no {ROLE_TAG} tag); expected the parent run id a "
                    "walk-forward command printed")
        if digest is not None and run.data.tags.get(PLAN_TAG) != digest:
            return (f"the run is not a walk-forward parent of this fold table (its {PLAN_TAG} tag differs); expected "
                    "the parent that printed the same fold table, or no --parent-run-id for a new one")
        return None

    return why


def checked_parent(client, run_id: str, digest: str):
    """``--parent-run-id``'s run, when it is a walk-forward parent of this very fold table."""
    from ...tracking import gate  # lazy: numpy, urllib/http

    return gate.continued_parent(client, run_id, flag="--parent-run-id", experiment_id=None, rule=parent_rule(digest))


def open_parent(client, experiment_id: str, args, folds, settings) -> str:
    """The walk-forward parent: ``--parent-run-id`` (checked: a walk-forward parent of this very
    fold table), ``MLFLOW_RUN_ID`` under ``mlflow run``, else a new run."""
    from ...tracking import gate  # lazy: numpy, urllib/http

    digest = fl.plan_digest(folds, settings)
    if args.parent_run_id:
        run = checked_parent(client, args.parent_run_id, digest)
        parent_id = args.parent_run_id
        launcher = gate.handed_run_id()
        if launcher and launcher != parent_id:  # mlflow run's own run: it says where its fold went
            gate.handed_run(client, command="walk-forward",
                            experiment_id=os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip() or experiment_id)
        if run.info.status != "RUNNING":
            client.update_run(parent_id, "RUNNING")
        if launcher and launcher != parent_id:
            client.set_tag(launcher, "walkforward.ran_into", parent_id)
    else:
        parent_id = gate.command_run(client, experiment_id, command="walk-forward",
                                     run_name=run_names.walkforward(pl.step_config(args, stage_names()[-1]), len(folds)))
    client.set_tag(parent_id, ROLE_TAG, "parent")
    client.set_tag(parent_id, PLAN_TAG, digest)
    for key, value in (("folds", settings.folds), ("fold_length", settings.fold_length),
                       ("walkforward_mode", settings.mode), ("walkforward_retrain", settings.retrain),
                       ("embargo", folds[0].embargo), ("val_length", settings.val_length or settings.fold_length),
                       ("train_length", settings.train_length), ("walkforward_end", folds[-1].test[1])):
        log_param_once(client, parent_id, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "folds.json"
        path.write_text(json.dumps(fl.as_json(folds, settings), indent=2) + "\n")
        client.log_artifact(parent_id, str(path), "walkforward")
    return parent_id


def run_folds(client, experiment_id: str, parent_id: str, args, folds, settings, only: int) -> int:
    def work() -> None:
        last = None
        for fold in folds:
            if only and fold.fold != only:
                continue
            this = fold_args(args, folds, settings, fold)
            this.aci_start_run = carried_from(client, parent_id, folds, fold)  # aci across folds, in date order
            last = run_fold(client, experiment_id, parent_id, this, fold, total=len(folds))
        if only:
            print(f"[walk-forward] fold {only} done; when every fold has run: kronos-mlflow walk-forward --aggregate "
                  f"{parent_id}", flush=True)
            return
        summary = aggregate(client, parent_id, folds, evaluation_runs(client, parent_id, folds))
        if args.registered_model_name:
            champion(client, parent_id, summary, last, args)

    return pl.run_to_an_end(client, parent_id, "kronos-mlflow walk-forward", work,
                            "it stopped before every fold ended", keep_killed=args.commands.keep_killed)


def run_fold(client, experiment_id: str, parent_id: str, args, fold: fl.Fold, total: int = 0):
    """Fold ``fold``'s pipeline under a fold parent run of its own (a child of ``parent_id``);
    ``total``: the plan's number of folds (for the fold's line)."""
    from ...tracking.project_run import end_run  # lazy: numpy, urllib/http

    print(f"[walk-forward] fold {fold.fold}/{total or '?'}: train {fold.train[0]}..{fold.train[1]}, "
          f"val {fold.val[0]}..{fold.val[1]}, test {fold.test[0]}..{fold.test[1]}", flush=True)
    name = run_names.fold_run(pl.step_config(args, stage_names()[-1]),
                              getattr(args, "run_name_fold", None) or (fold.fold, total or fold.fold))
    fold_id = create_child(client, experiment_id, parent_id, name,
                           {"pipeline.role": "parent", FOLD_TAG: str(fold.fold)})
    for key, value in fold.ranges.items():
        client.log_param(fold_id, key, format_time_range(value))
    client.set_tag(parent_id, f"walkforward.fold{fold.fold}_run_id", fold_id)
    pipeline, status = pl.Pipeline(args, client, experiment_id, fold_id), "FAILED"
    try:
        pipeline.run_all()
        status = "FINISHED"
    except (KeyboardInterrupt, TrainingStopped):
        status = None  # ended KILLED with the command's other runs (kronos_mlflow.tracking.command_runs)
        raise
    finally:
        if status is not None:
            end_run(client, fold_id, status, f"fold {fold.fold}: it stopped before its steps ended")
    return pipeline


def carried_from(client, parent_id: str, folds, fold: fl.Fold) -> str:
    """The evaluation run whose aci levels fold ``fold``'s aci starts from: the previous fold's,
    proven as the aggregate proves a fold (:func:`evaluation_runs`) and holding an aci state (its
    tag ``aci_start``; the evaluation checks the file itself); '' (the nominal levels) for the
    first fold, or, in one line saying why, when the previous fold has not finished or ran no aci."""
    before = [f for f in folds if f.fold == fold.fold - 1]
    if not before:
        return ""
    try:
        run_id = evaluation_runs(client, parent_id, before)[before[0].fold]
    except UserError as exc:
        print(f"[walk-forward] fold {fold.fold}: aci starts at the nominal levels: {exc}", flush=True)
        return ""
    if "aci_start" not in client.get_run(run_id).data.tags:
        print(f"[walk-forward] fold {fold.fold}: aci starts at the nominal levels: fold {before[0].fold}'s evaluation "
              f"run {run_id} scored no aci", flush=True)
        return ""
    print(f"[walk-forward] fold {fold.fold}: aci starts where fold {before[0].fold}'s ended (evaluation run {run_id})",
          flush=True)
    return run_id


def evaluation_runs(client, parent_id: str, folds) -> dict[int, str]:
    """Fold -> its evaluation run, read from the parent's fold runs and checked: each fold run is
    a FINISHED child of ``parent_id`` with this fold's ranges, whose evaluation run FINISHED
    scoring exactly the fold's test range. A tag naming a run is a claim; this is the proof."""
    from ...tracking import gate  # lazy: numpy, urllib/http

    out = {}
    tags = client.get_run(parent_id).data.tags
    for fold in folds:
        fold_id = tags.get(f"walkforward.fold{fold.fold}_run_id")
        if not fold_id:
            raise UserError(f"walk-forward {parent_id}: fold {fold.fold} has not run; expected every fold (run it with "
                            f"--fold {fold.fold} --parent-run-id {parent_id})")
        run = gate.named_run(client, fold_id, f"walk-forward {parent_id}: its tag walkforward.fold{fold.fold}_run_id")
        fold_id = run.info.run_id
        want = format_time_range(fold.ranges["test_time_range"])
        problem = (f"it is {run.info.status}" if run.info.status != "FINISHED" else
                   "it is not this parent's" if run.data.tags.get("mlflow.parentRunId") != parent_id else
                   "its test range differs" if run.data.params.get("test_time_range") != want else "")
        evaluation = run.data.tags.get("pipeline.evaluation_run_id", "")
        if not problem:
            where = f"walk-forward {parent_id}: fold {fold.fold}'s run {fold_id}, its tag pipeline.evaluation_run_id"
            scored = gate.named_run(client, evaluation, where) if evaluation else None
            problem = ("it has no evaluation run" if scored is None else
                       f"its evaluation run {evaluation} is {scored.info.status}" if scored.info.status != "FINISHED"
                       else f"its evaluation run {evaluation} scored {scored.data.params.get('test_time_range')}"
                       if scored.data.params.get("test_time_range") != want else "")
        if problem:
            raise UserError(f"walk-forward {parent_id}: fold {fold.fold} (run {fold_id}) cannot be aggregated: "
                            f"{problem}; expected it run to its end (--fold {fold.fold} --parent-run-id {parent_id})")
        out[fold.fold] = evaluation
    return out


def _fold_result(client, fold: fl.Fold, run_id: str, scratch: Path) -> agg.FoldResult:
    """One fold's evaluation run with its two tables, each downloaded into a folder of its own
    under ``scratch`` and read through its reader (:mod:`kronos_mlflow.tracking.handover`)."""
    run = client.get_run(run_id)
    frames = {}
    for name, artifact, read in (("origins", handover.ORIGINS_PARQUET, handover.read_origins),
                                 ("forecasts", handover.FORECASTS_PARQUET, handover.read_forecasts)):
        where = f"fold {fold.fold}'s evaluation run {run_id}"
        frames[name] = read(handover.download(client, run_id, artifact, scratch, where), f"{where}: its {artifact}")
    return agg.FoldResult(fold=fold.fold, run_id=run_id, test_period=fold.test, metrics=dict(run.data.metrics),
                          tags=dict(run.data.tags), origins=frames["origins"], forecasts=frames["forecasts"])


def aggregate(client, parent_id: str, folds, runs: dict[int, str]) -> dict:
    """The folds' scorecards pooled onto the parent: metrics (per fold also at step = fold),
    tags, ``walkforward/summary.json`` and ``walkforward/skill_by_fold.png``."""
    with tempfile.TemporaryDirectory(prefix="kronos-walkforward-") as tmp:
        scratch = Path(tmp)
        results = [_fold_result(client, fold, runs[fold.fold], scratch) for fold in folds]
        params = client.get_run(runs[folds[0].fold]).data.params  # the scorecard's rule, as the folds recorded it
        summary = agg.summarize(results, *handover.scorecard_rule(params, f"fold {folds[0].fold}'s evaluation run "
                                                                          f"{runs[folds[0].fold]}"))
        for key, value in summary["metrics"].items():
            if math.isfinite(value):  # an interval a single fold cannot give stays out, as the scorecard leaves it
                client.log_metric(parent_id, key, value)
        for key, value, step in summary["steps"]:
            if math.isfinite(value):
                client.log_metric(parent_id, key, value, step=step or 0)
        for key, value in summary["tags"].items():
            client.set_tag(parent_id, key, value)
        out = scratch / "out"
        out.mkdir()
        agg.write_summary(summary, out)
        forecasters_table.write(summary["forecasters"], out)  # forecasters.csv, .json, .md
        agg.skill_figure(summary, out / "skill_by_fold.png")
        client.log_artifacts(parent_id, str(out), "walkforward")
    tags, metrics = summary["tags"], summary["metrics"]
    if summary["forecasters"]:
        print("[walk-forward] each forecaster over every fold (walkforward/forecasters.md):\n"
              + forecasters_table.markdown(summary["forecasters"]), end="", flush=True)
    for base in ("zeroshot", "persistence"):
        name = f"pooled_skill_vs_{base}"
        if name in metrics:
            print(f"[walk-forward] {name} {metrics[name]:+.4f} [{metrics.get(name + '_ci_low', float('nan')):+.4f}, "
                  f"{metrics.get(name + '_ci_high', float('nan')):+.4f}], folds better "
                  f"{int(metrics.get(f'folds_better_vs_{base}', 0))}/{len(folds)}: walk-forward verdict "
                  f"{tags.get(f'walkforward_verdict_vs_{base}', '?')}", flush=True)
    print(f"[walk-forward] done: parent run {parent_id}; files: walkforward/summary.json, walkforward/skill_by_fold.png, "
          "walkforward/forecasters.md (.csv, .json); "
          f"look at it: {look_command(client.tracking_uri, client.get_run(parent_id).info.experiment_id, parent_id)}",
          flush=True)
    return summary


def champion(client, parent_id: str, summary: dict, last, args) -> None:
    """The alias moves to the last fold's pair only on a ``better`` walk-forward verdict."""
    verdict = summary["tags"].get("walkforward_verdict_vs_zeroshot", "inconclusive")
    if verdict != "better" or last is None:
        why = (f"walk-forward verdict vs zeroshot is {verdict}: {summary['tags'].get('walkforward_verdict_why', '')}"
               if last is not None else "the last fold was not run by this command")
        client.set_tag(parent_id, "champion_unchanged", why)
        print(f"[walk-forward] champion unchanged: {why}", flush=True)
        return
    promote = copy.copy(args)
    promote.promote = "always"  # the walk-forward verdict decided; each stage's own verdict does not
    move_champions(client, parent_id, last.runs, last.configs, promote)


def aggregate_parent(client, parent_id: str, args) -> int:
    """``--aggregate RUN_ID``: the parent's folds (from its own folds.json and fold runs) pooled again."""
    from ...tracking import gate  # lazy: numpy, urllib/http

    run = gate.continued_parent(client, parent_id, flag="--aggregate", experiment_id=None, rule=parent_rule(None))
    with tempfile.TemporaryDirectory(prefix="kronos-walkforward-") as tmp:  # checked before any fold's download
        local = handover.download(client, parent_id, handover.FOLDS_JSON, tmp, f"--aggregate {parent_id}")
        settings, folds = fl.read_folds_json(local, f"--aggregate {parent_id}: its {handover.FOLDS_JSON}")
    if fl.plan_digest(folds, settings) != run.data.tags.get(PLAN_TAG):
        raise UserError(f"--aggregate {parent_id}: its walkforward/folds.json does not match its {PLAN_TAG} tag; "
                        "expected the files the walk-forward command logged")
    aggregate(client, parent_id, folds, evaluation_runs(client, parent_id, folds))
    if run.info.status != "FINISHED":
        client.set_terminated(parent_id, "FINISHED")
    return 0
