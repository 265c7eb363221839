"""Optuna sweeps over learning rate and weight decay; every trial is a child MLflow run.

    python sweeps/sweep.py --n-trials 8 --epochs 3                      # demo market, sqlite study
    mlflow run . -e sweep --env-manager local -P n_trials=8 -P epochs=3
    python sweeps/sweep.py --storage postgresql://user@db/optuna --study-name lr-wd   # many workers

Design: this process (a "worker") opens one parent MLflow run and calls ``study.optimize``.
Each trial creates a nested child run, then trains in its own process (``python -m
kronos_mlflow.train``, or ``torchrun`` when ``nproc_per_node > 1``) with ``MLFLOW_RUN_ID`` set to
the child, so the child holds exactly what a normal training run holds. Rank 0 of the trial
reports the per-epoch validation loss to the study and asks the pruner; a pruned trial exits
with ``EXIT_PRUNED`` and its run ends KILLED with tag ``optuna.trial_state=PRUNED``, keeping its
metrics. Optuna's RDB heartbeat marks trials of a dead worker FAIL and retries them.

Several workers on several machines share one study through one RDB storage URL
(``load_if_exists``); rerunning the same command resumes the study and adds ``n_trials``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...config import core as cfg, checks, sections as cs
from ...config.argparsing import OneLineParser
from ...tracking.child_runs import Commands, as_flags as _flags, child_env, create_child, experiment_id_of, log_param_once
from ...tracking.command_runs import end_stopped, install as install_stops, run_child, started
from ...runtime.console import install_warning_format, terminal_only_bars
from ...evaluation.next_steps import sweep_lines
from ...runtime.distributed import resolve_device
from ...errors import UserError
from ...training.preflight import DataView, check_processes, check_start, check_tracking, check_training
from ...config.settings import check_environment
from ...stages import get, names, spec_of
from ...runtime.stopping import TrainingStopped
from ...tracking.comet import check_comet
from ...tracking.gate import check_handed, command_run, named_run
from ...tracking.project_run import end_failed, end_run, exit_in_one_line, record_failure
from ...tracking.server import ensure_sqlite_store
from . import fold_trial, folds as sweep_folds, pooled
from .champion import PROMOTE, best_trial_record, set_champion
from .dashboard import study_tags
from .space import DEFAULT_SPACE, OPTIONAL, PARAMS, load_search_space, suggest
from .study import (DuplicateTrial, default_storage, open_storage, open_study, optimize_distinct,
                    redact_url, repeated_trial)
from ...training.trial import DEFAULT_PRUNER, make_pruner, ENV_PRUNER, ENV_STORAGE, ENV_STUDY, ENV_TRIAL_ID, EXIT_PRUNED

#: The MLproject sweep entry's parameters besides every stage's own (``mlproject_params``):
#: the value it passes when one is not given is the config's default, which overrides nothing.
SWEEP_PARAMS = ("stage", "objective", "finetune_mode", "lora_rank", "freeze_layers", "dataset_begin_time",
                "dataset_end_time", "predictor_objective", "return_loss_weight")
DEFAULT_STUDY = get(cs.section({}, "job").stage).default_study  # the --study-name default (the default stage's)


def unset_by_default(stage: str) -> dict[str, str]:
    """What the MLproject sweep entry passes for a parameter that is not given (its default):
    config key -> the text it passes."""
    own = [cfg.canonical_key(name, stage) for keys in cfg.registered().values() for name in keys.mlproject_params]
    return {key: str(cfg.DEFAULTS[key]) for key in (*SWEEP_PARAMS, *own)}


def chosen_keys() -> set[str]:
    """The keys the sweep draws (every stage's learning rate, the weight decay): never flags."""
    return {keys.learning_rate for keys in cfg.registered().values()} | {"adam_weight_decay"}


#: What each objective's trial value is (a metric of the trial's run) and the study's direction.
OBJECTIVE_METRIC = {"val_loss": "best_val_loss", "val_skill": "best_val_skill", "val_ic": "best_val_ic"}
DIRECTION = {"val_loss": "minimize", "val_skill": "maximize", "val_ic": "maximize"}


def default_study_name(config: Mapping[str, Any]) -> str:
    """The study of a sweep whose --study-name is left at its default: one per stage and objective
    (``kronos-lr-wd``, ``kronos-predictor-lr-wd``, and ``...-val-skill`` for ``objective: val_skill``)."""
    name, objective = spec_of(config).default_study, cs.section(config, "training").objective
    return name if objective == "val_loss" else f"{name}-{objective.replace('_', '-')}"


def sweep_output_dir(save_path: str | None) -> str:
    """``sweeps`` next to the training save_path (./outputs/models gives ./outputs/sweeps)."""
    parent = os.path.dirname(str(save_path or "./outputs/models").rstrip("/\\")) or "."
    return os.path.join(parent, "sweeps")


def sweep_summary(study, worker) -> dict[str, float]:
    """Metrics and tags for the parent run: this worker's trial counts and work, the study's best."""
    import optuna

    metrics = {
        "trials_complete": worker.counts["COMPLETE"],
        "trials_pruned": worker.counts["PRUNED"],
        "trials_failed": worker.counts["FAIL"],
        "trials_repeat_skipped": worker.duplicates,
        "trial_epochs": worker.trial_epochs,
    }
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    metrics["study_trials_complete"] = states.count(optuna.trial.TrialState.COMPLETE)
    metrics["study_trials_pruned"] = states.count(optuna.trial.TrialState.PRUNED)
    metrics["study_trial_epochs"] = sum(int(t.user_attrs.get("epochs_trained", 0)) for t in trials)
    return metrics


# --------------------------------------------------------------------------- worker side


class SweepWorker:
    """One ``study.optimize`` loop with its parent MLflow run."""

    def __init__(self, args: argparse.Namespace, train_flags: list[str], space, storage, study, client,
                 experiment_id: str, parent_run_id: str, config: Mapping[str, Any] | None = None):
        config = config or {}
        spec = spec_of(config)
        self.args, self.train_flags, self.space = args, train_flags, space
        self.folder_key = spec.keys.save_folder  # each trial's run folder
        self.val_metric = spec.val_metric  # per epoch
        self.value_metric = OBJECTIVE_METRIC[str(cs.section(config, "training").objective)]  # the trial's value
        self.storage, self.study, self.client = storage, study, client
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id
        self.trial_epochs = 0
        self.trials_run = self.duplicates = 0
        self.counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
        self.stopped = False
        self.fold_plan = getattr(args, "fold_plan", [])  # --folds: each trial runs these (fold_trial)

    def budget_spent(self) -> bool:
        budget = getattr(self.args, "trial_epochs_budget", 0)
        return bool(budget) and self.trial_epochs >= budget

    def stop_on_budget(self, study, trial) -> None:
        """Optuna callback: no new trial once --trial-epochs-budget epochs are spent."""
        if self.budget_spent():
            self.stopped = True
            study.stop()

    def objective(self, trial) -> float:
        values = suggest(trial, self.space)
        repeat = repeated_trial(self.study, trial)
        if repeat is not None:
            self.duplicates += 1
            trial.set_user_attr("duplicate_of", repeat)
            self.study.sampler.reseed_rng()
            print(f"[sweep] trial {trial.number} repeats trial {repeat} (learning_rate={values['learning_rate']!r}, "
                  f"weight_decay={values['weight_decay']!r}); not run, drawing again", flush=True)
            raise DuplicateTrial(f"repeats trial {repeat}")
        self.trials_run += 1
        try:
            value = self._run_trial(trial, values)
        except TrialFailed:
            self.counts["FAIL"] += 1
            raise
        except Exception as exc:
            import optuna

            self.counts["PRUNED" if isinstance(exc, optuna.TrialPruned) else "FAIL"] += 1
            raise
        self.counts["COMPLETE"] += 1
        return value

    def _run_trial(self, trial, values: Mapping[str, float]) -> float:
        import optuna

        run_name = f"trial-{trial.number} lr={values['learning_rate']:.1e} wd={values['weight_decay']:.2g}" + "".join(
            f" {name}={values[name]}" for name in OPTIONAL if name in values)
        tags = {
            "optuna.study_name": self.study.study_name,
            "optuna.trial_number": str(trial.number),
            "optuna.trial_state": "RUNNING",
        }
        retried = self.storage.get_trial(trial._trial_id).system_attrs.get("failed_trial")  # set on a retry
        if retried is not None:
            tags["optuna.retry_of_trial"] = str(retried)
        run_id = create_child(self.client, self.experiment_id, self.parent_run_id, run_name, tags)
        trial.set_user_attr("mlflow_run_id", run_id)
        save_path = os.path.join(self.args.output_dir, self.study.study_name)
        flags = self.train_flags + _flags({
            "learning_rate": repr(values["learning_rate"]),
            "weight_decay": repr(values["weight_decay"]),
            **{name: str(values[name]) for name in OPTIONAL if name in values},
            "run_name": run_name,
            "save_path": save_path,
            self.folder_key: f"trial-{trial.number:04d}",
            "nproc_per_node": self.args.nproc_per_node,
        })
        env = child_env(run_id, self.experiment_id, self.client.tracking_uri, {
            ENV_STORAGE: self.args.storage,
            ENV_STUDY: self.study.study_name,
            ENV_TRIAL_ID: str(trial._trial_id),  # Trial has no public id; the child re-opens it
            ENV_PRUNER: self.args.pruner,
        })
        cmd = self.args.commands.train(self.args.nproc_per_node, flags)
        print(f"[sweep] trial {trial.number}: {run_name}", flush=True)
        if self.fold_plan:
            return fold_trial.judged_on_folds(self, trial, values, run_id, run_name, flags, TrialFailed)
        try:
            returncode = run_child(cmd, env)  # a stop goes on to the trial's process, then is raised here
        except TrainingStopped:
            self._stopped(trial, run_id)
            raise
        run = self.client.get_run(run_id)
        epochs_done = len(self.client.get_metric_history(run_id, self.val_metric))
        self.trial_epochs += epochs_done
        trial.set_user_attr("epochs_trained", epochs_done)
        # torchrun turns any worker's non-zero exit into its own code 1, so the run's status
        # (KILLED with a "pruned" stop reason, set by rank 0) is what tells a pruned trial.
        pruned = returncode == EXIT_PRUNED or (
            run.info.status == "KILLED" and run.data.tags.get("stop_reason", "").startswith("pruned"))
        if pruned:
            self._end(run_id, "KILLED", "PRUNED")
            raise optuna.TrialPruned(f"pruned after {epochs_done} epoch(s)")
        best = run.data.metrics.get(self.value_metric)
        if returncode != 0 or best is None:
            why = (f"training exited with code {returncode} ({shlex.join(cmd[:4])} ...)" if returncode
                   else f"its run has no {self.value_metric}")
            self._end(run_id, "FAILED", "FAIL", reason=f"trial {trial.number}: {why}")
            raise TrialFailed(f"trial {trial.number}: {why}")
        self._end(run_id, None, "COMPLETE")
        return float(best)

    def _stopped(self, trial, run_id: str) -> None:
        """A stop while the trial trained: the trial ends FAIL at once (not RUNNING until its
        heartbeat goes stale) and is retried with the same params, as the heartbeat retries a dead
        worker's trial (``--max-retry``); its run ends KILLED with the command's other runs."""
        import optuna

        self.counts["FAIL"] += 1
        self.client.set_tag(run_id, "optuna.trial_state", "FAIL")
        self.storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        retry = self.storage.get_heartbeat_stale_trial_callback()
        if retry is not None:
            retry(self.study, self.storage.get_trial(trial._trial_id))

    def _end(self, run_id: str, status: str | None, state: str, reason: str = "") -> None:
        self.client.set_tag(run_id, "optuna.trial_state", state)
        run = self.client.get_run(run_id)
        if status == "FAILED" and run.info.status in ("RUNNING", "SCHEDULED"):  # its process did not end it
            end_failed(self.client, run_id, reason or "its training process ended without ending the run")
        elif status and run.info.status in ("RUNNING", "SCHEDULED"):
            self.client.set_terminated(run_id, status)
        elif status == "KILLED" and run.info.status != "KILLED":
            self.client.set_terminated(run_id, "KILLED")


class TrialFailed(Exception):
    """A trial's training process failed; the trial is FAIL and the sweep continues."""


def _plots(study, out_dir: Path) -> list[Path]:
    """Optuna's matplotlib plots as PNG; a plot that cannot be drawn yet is skipped."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    import optuna.visualization.matplotlib as ovm

    out_dir.mkdir(parents=True, exist_ok=True)
    made, verbosity = [], optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # "no complete trials": the line below says it on stdout
    plots = {
        "optimization_history.png": lambda: ovm.plot_optimization_history(study),
        "param_importances.png": lambda: ovm.plot_param_importances(study, params=[p for p in PARAMS]),
        "contour_lr_wd.png": lambda: ovm.plot_contour(study, params=list(PARAMS)),
        "slice.png": lambda: ovm.plot_slice(study, params=list(PARAMS)),
        "intermediate_values.png": lambda: ovm.plot_intermediate_values(study),
    }
    for name, draw in plots.items():
        try:
            with warnings.catch_warnings():  # Optuna's "experimental", matplotlib's layout notes
                warnings.simplefilter("ignore")
                ax = draw()
                fig = ax.flat[0].figure if hasattr(ax, "flat") else ax.figure
                fig.set_size_inches(8, 5.5)
                fig.tight_layout()
                fig.savefig(out_dir / name, dpi=110)
            plt.close(fig)
            made.append(out_dir / name)
        except Exception as exc:  # noqa: BLE001 - e.g. importances need 2+ complete trials
            print(f"[sweep] plot {name} skipped: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    optuna.logging.set_verbosity(verbosity)
    return made


def _summary_table(study, value_name: str = "best_val_loss") -> str:
    import optuna

    rows = [("trial", "state", "learning_rate", "weight_decay", value_name, "epochs")]
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        lr = t.params.get("learning_rate", 0.0)
        wd = 0.0 if t.params.get("weight_decay_is_zero") else t.params.get("weight_decay", float("nan"))
        value = f"{t.value:.6f}" if t.value is not None else "-"
        rows.append((str(t.number), t.state.name, f"{lr:.3e}", f"{wd:.3g}", value,
                     str(t.user_attrs.get("epochs_trained", "-"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    try:
        best = study.best_trial
        lines.append(f"best: trial {best.number}, {value_name} {best.value:.6f}, params {best.params}")
    except ValueError:
        lines.append("best: no complete trial yet")
    del optuna
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def build_parser():
    p = OneLineParser(prog="sweeps/sweep.py", description="Optuna sweep over learning_rate and weight_decay; "
                      "one parent MLflow run, one child run per trial. Unlisted --key value flags go to training.")
    p.on_error = record_failure  # under `mlflow run -e sweep`: the parent run ends FAILED with this line
    p.add_argument("--n-trials", default=8, help="trials this worker runs (default 8)")
    p.add_argument("--timeout", default=0, help="stop starting trials after this many seconds (0: none)")
    p.add_argument("--study-name", default=DEFAULT_STUDY, help="Optuna study (resumed when it exists; another "
                   "stage's sweep defaults to its own: " + ", ".join(get(n).default_study for n in names()[1:]) + ")")
    p.add_argument("--storage", default="", help="SQLAlchemy URL of the study (default: sqlite:///./optuna.db)")
    p.add_argument("--pruner", default="", help=sweep_folds.PRUNER_HELP)
    p.add_argument("--sampler-seed", default=None, help="TPE sampler seed; a fresh study draws the same "
                   "trials for the same seed, a resumed one mixes in the trials already there")
    p.add_argument("--trial-epochs-budget", default=0,
                   help="stop starting trials once this worker's trials trained this many epochs (0: none)")
    p.add_argument("--search-space", default=str(DEFAULT_SPACE), help="YAML search space file")
    p.add_argument("--nproc-per-node", default=1, help="processes per trial (torchrun when > 1)")
    p.add_argument("--registered-model-name", default="", help="register the best trial's model, alias champion")
    p.add_argument("--promote", choices=PROMOTE, default="better",
                   help="when the alias champion moves to the best trial: better (its test verdict is better and it "
                        "beats the champion's test loss on the same data; default) or always")
    p.add_argument("--experiment-name", default="", help="MLflow experiment (default: MLflow's)")
    p.add_argument("--output-dir", default="", help="checkpoints go to OUTPUT_DIR/STUDY/trial-N (default: "
                   "'sweeps' next to the config's save_path, ./outputs/sweeps)")
    p.add_argument("--max-retry", default=1, help="retries of a trial whose worker died")
    p.add_argument("--config", dest="config_file", default="", help="YAML config for every trial")
    p.add_argument("--check", action="store_true", help="make every check a trial would make at its start or end, "
                   "then exit (the sweep makes them before its study is opened anyway)")
    p.add_argument("--objective", default=None, help="what ranks the trials: val_loss (best_val_loss, minimised; "
                   "the default) or val_skill (best_val_skill: forecast skill against persistence on the validation "
                   "split's origins, maximised; the pruner reads each epoch's val_skill_vs_persistence) or val_ic "
                   "(best_val_ic: those origins' mean per-date rank IC, maximised; the pruner reads val_rank_ic)")
    sweep_folds.add_arguments(p)
    return p


def _stage_of(extra: Sequence[str]) -> str:
    """The ``--stage`` among the pass-through flags (it decides what ``--learning-rate`` names)."""
    for i, flag in enumerate(extra):
        name, eq, value = flag.lstrip("-").partition("=")
        if name == "stage":
            return value if eq else (extra[i + 1] if i + 1 < len(extra) else "")
    return cs.section({}, "job").stage  # the declared default


def parse(argv: Sequence[str] | None):
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.objective is not None:  # a training key too: every trial records what the sweep ranks by
        extra = [*extra, "--objective", args.objective]
    # The sweep's own flags, each with its range (MLproject passes every -P value as text).
    try:
        check_environment()  # KRONOS_MLFLOW_*: what every trial's training reads
        args.n_trials = checks.integer("n_trials", args.n_trials, 1, 1_000_000, what="argument --n-trials")
        args.timeout = checks.number("timeout", args.timeout, 0.0, 1e9, what="argument --timeout")
        if args.sampler_seed not in (None, ""):
            args.sampler_seed = checks.seed("sampler_seed", args.sampler_seed, what="argument --sampler-seed")
        else:
            args.sampler_seed = None
        args.trial_epochs_budget = checks.integer("trial_epochs_budget", args.trial_epochs_budget, 0, 10**9,
                                                  what="argument --trial-epochs-budget")
        args.nproc_per_node = checks.integer("nproc_per_node", args.nproc_per_node, 1, 256,
                                             what="argument --nproc-per-node")
        args.max_retry = checks.integer("max_retry", args.max_retry, 0, 100, what="argument --max-retry")
        if args.storage:
            checks.storage_url(args.storage, "argument --storage")
        # The study's trials keep their checkpoints in OUTPUT_DIR/STUDY: the name is one folder there.
        checks.child_name("study_name", args.study_name, "--output-dir", what="argument --study-name", error=UserError)
        checks.mlflow_model_name("argument --registered-model-name", args.registered_model_name)
        checks.mlflow_experiment_name("argument --experiment-name", args.experiment_name)
        if args.output_dir:
            checks.directory("argument --output-dir", args.output_dir)
        sweep_folds.check_args(args)  # --folds, --p-threshold, the pruner: before any store is opened
    except UserError as exc:
        parser.error(str(exc))
    # Pass-through flags: every training key, validated now so a typo fails before any trial.
    overrides: dict[str, str] = {}
    stage = _stage_of(extra)
    unset, chosen = unset_by_default(stage), chosen_keys()
    i = 0
    while i < len(extra):
        flag = extra[i]
        if not flag.startswith("--"):
            parser.error(f"unexpected argument '{flag}'")
        name, eq, value = flag[2:].partition("=")
        if not eq:
            if i + 1 >= len(extra):
                parser.error(f"argument --{name}: expected a value")
            value = extra[i + 1]
            i += 1
        i += 1
        key = cfg.canonical_key(name, stage)
        if key in chosen:
            parser.error(f"argument --{name}: the sweep chooses it; edit the search space instead")
        if unset.get(key) == value:
            continue  # the MLproject default: what the config file (or the config's default) says stands
        overrides[key] = value
    config = cfg.load_config(overrides, path=args.config_file or None)
    job = cs.section(config, "job")  # the device, save_path
    check_processes(args.nproc_per_node, resolve_device(job.device, 0, args.nproc_per_node))
    check_comet(config)
    if not args.output_dir:
        args.output_dir = sweep_output_dir(job.save_path)
    if args.study_name == DEFAULT_STUDY:
        args.study_name = default_study_name(config)
    train_flags = []
    if args.config_file:
        train_flags += ["--config", args.config_file]
    train_flags += _flags(dict(overrides))  # no --registered-model-name: the worker registers the best trial once
    return args, train_flags, config


def check_space(space: Mapping[str, Any], train_flags: Sequence[str], config: Mapping[str, Any]) -> None:
    """A key the space draws is not also a flag; each mode the space may draw, at the highest
    value of each integer it draws, is a config training accepts (a freeze deeper than a fresh
    model refused before any trial)."""
    for name in OPTIONAL:
        if name in space and f"--{name.replace('_', '-')}" in train_flags:
            raise UserError(f"argument --{name.replace('_', '-')}: the sweep chooses it (the search space draws "
                            f"{name}); drop the flag, or the entry in the search space")
    modes = space.get("finetune_mode", {}).get("choices", [cs.section(config, "finetune").finetune_mode])
    for mode in modes:
        drawn = {name: space[name]["high"] for name in ("lora_rank", "freeze_layers") if name in space}
        try:
            cfg.validate({**config, **drawn, "finetune_mode": mode})
        except UserError as exc:
            raise UserError(f"search space: a trial of finetune_mode {mode} at its highest values would be refused: "
                            f"{exc}") from None


def check_trials(args, config: Mapping[str, Any]) -> None:
    """What every trial would refuse at its start or its end, before the study is opened or any
    run is made: its start (paths, device, processes, speed settings, Comet), its checkpoints
    (the tokenizer a run, a directory or a hub id names, loaded as a tokenizer; the predictor
    as a predictor, with the same bits), the forecast window against ``max_context``, the data
    (windows per rank, ``objective: val_skill``'s validation origins, the scorecard's backtest
    range) without writing the data cache before they pass (:mod:`kronos_mlflow.training.preflight`)."""
    trial = {**config, "save_path": os.path.join(args.output_dir, args.study_name),
             "nproc_per_node": args.nproc_per_node}
    check_start(trial, args.nproc_per_node)
    if cs.section(trial, "job").resume == "must":
        raise UserError("resume: 'must' resumes a saved training state, and each trial trains in a folder of its own "
                        "(trial-N) that holds none; expected resume auto or never for a sweep")
    with DataView() as data:
        check_training(trial, args.nproc_per_node, data)


def run_sweep(argv: Sequence[str] | None = None, *, commands: Commands) -> int:
    """The sweep; ``commands``: the command lines of its trials' processes, from the command layer
    (:mod:`kronos_mlflow.cli.sweep`)."""
    from mlflow import MlflowClient

    import optuna

    args, train_flags, config = parse(argv)
    args.commands = commands
    space = load_search_space(args.search_space)
    check_space(space, train_flags, config)
    args.storage = args.storage or default_storage()
    pruner = sweep_folds.pruner_of(args)
    named = args.experiment_name or cs.section(config, "tracking").experiment_name  # the flag's, else the config's
    experiment_name = named or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    check_handed("sweep", experiment_name or None)  # the run MLFLOW_RUN_ID hands over, before any data is read
    check_tracking({**config, "experiment_name": named})
    check_trials(args, config)  # the last check: its data cache is written once every check passed
    args.fold_plan = sweep_folds.plan_of(args, config, check_trials)  # --folds: the table, each fold's checks
    if args.check:
        print("[sweep] check passed: the flags, the search space, every trial's config, checkpoints and data, and "
              "the tracking server are usable", flush=True)
        return 0
    storage = open_storage(args.storage, max_retry=args.max_retry)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    objective = str(cs.section(config, "training").objective)
    study = open_study(storage, args.study_name, pruner, args.sampler_seed, direction=DIRECTION[objective],
                       value_name=OBJECTIVE_METRIC[objective])
    sweep_folds.prepare_study(study, args, config, space)

    import mlflow

    ensure_sqlite_store(mlflow.get_tracking_uri())  # created once, whatever number of workers start together
    client = MlflowClient()
    experiment_id = experiment_id_of(client, experiment_name)
    # `mlflow run -e sweep` already made a run for this process: it becomes the parent (the store gate checks it).
    parent_tags = {"optuna.study_name": study.study_name, "sweep.role": "parent", "sweep.objective": objective,
                   "optuna.storage": redact_url(args.storage)}

    parent_tags.update(study_tags(args.storage, study.study_name))  # how to open the study's dashboard
    install_stops()  # SIGTERM / Ctrl-C: sent on to a trial's process, then every run of this sweep ends KILLED
    parent_id = started(command_run(client, experiment_id, command="sweep", run_name=f"sweep {study.study_name}",
                                    tags=parent_tags))
    for key, value in {"n_trials": args.n_trials, "timeout": args.timeout, "study_name": args.study_name,
                       "pruner": args.pruner, "sampler_seed": args.sampler_seed, "nproc_per_node": args.nproc_per_node,
                       "promote": args.promote, "objective": objective,
                       "search_space": args.search_space, "trial_epochs_budget": args.trial_epochs_budget,
                       **sweep_folds.parent_params(args)}.items():
        log_param_once(client, parent_id, key, value)
    client.set_tag(parent_id, "sampler_seed_used", str(study.sampler_seed_used))

    worker = SweepWorker(args, train_flags, space, storage, study, client, experiment_id, parent_id, config)
    status, reason, stop = "FAILED", "", None
    began = time.time()
    try:
        optimize_distinct(study, worker.objective, worker, args.n_trials, args.timeout or None, (TrialFailed,))
        status = "FINISHED"
    except (KeyboardInterrupt, TrainingStopped) as exc:
        status, stop = "KILLED", exc
    except BaseException as exc:
        reason = f"sweep: {type(exc).__name__}: {exc}"
        raise
    finally:
        _finish_parent(client, parent_id, study, args, worker, status, time.time() - began, config, reason)
    return 0 if stop is None else end_stopped(client, "sweep", stop, commands.keep_killed)  # every run ends KILLED


def _finish_parent(client, parent_id, study, args, worker, status, elapsed, config, reason: str = "") -> None:
    import tempfile

    try:
        complete = [t for t in study.get_trials(deepcopy=False) if t.value is not None]
        metrics = sweep_summary(study, worker)
        for key, value in metrics.items():
            client.log_metric(parent_id, key, value)
        client.log_metric(parent_id, "sweep_seconds", elapsed)
        if complete:
            best = study.best_trial
            client.log_metric(parent_id, worker.value_metric, best.value)
            wd = 0.0 if best.params.get("weight_decay_is_zero") else best.params.get("weight_decay")
            for key, value in (("best_learning_rate", best.params.get("learning_rate")), ("best_weight_decay", wd),
                               ("best_trial_number", best.number)):
                log_param_once(client, parent_id, key, value)
                client.set_tag(parent_id, key, str(value))
            best_run = best.user_attrs.get("mlflow_run_id")
            if best_run:
                best_run = named_run(client, best_run, f"best trial {best.number}").info.run_id
                client.set_tag(parent_id, "best_run", best_run)
                _show_best_trial_test(client, parent_id, best_run)
            if args.registered_model_name and not worker.fold_plan:  # a fold sweep's: pooled.record
                _move_champion(client, parent_id, study, args, config)
        pooled.record(client, parent_id, study, worker, args, config)  # --folds: the pooled scores (else nothing)
        with tempfile.TemporaryDirectory() as tmp:
            for path in _plots(study, Path(tmp) / "plots"):
                client.log_artifact(parent_id, str(path), "plots")
            table = _summary_table(study, worker.value_metric)
            (Path(tmp) / "trials.txt").write_text(table + "\n")
            client.log_artifact(parent_id, str(Path(tmp) / "trials.txt"))
        print(table, flush=True)
        best = None
        if complete:
            trial = study.best_trial
            run_id = trial.user_attrs.get("mlflow_run_id")  # the study's storage is input too: a name, checked
            verdict = named_run(client, run_id, f"best trial {trial.number}").data.tags.get("verdict") if run_id else None
            best = {"number": trial.number, "value": trial.value, "run_id": run_id, "verdict": verdict}
        parent = client.get_run(parent_id)
        for line in sweep_lines(parent_id=parent_id, experiment_id=parent.info.experiment_id,
                                tracking_uri=client.tracking_uri, value_metric=worker.value_metric, best=best,
                                output_dir=os.path.abspath(os.path.join(args.output_dir, args.study_name))):
            print(f"[sweep] {line}", flush=True)
    finally:
        if status != "KILLED":  # a stopped sweep's parent ends KILLED with its other runs (command_runs)
            end_run(client, parent_id, status, reason or "sweep: it stopped before its trials ended")


def _show_best_trial_test(client, parent_id: str, best_run: str) -> None:
    """The best trial's test metrics and verdict on the parent run."""
    metrics, tags = best_trial_record(client.get_run(best_run))
    for key, value in metrics.items():
        client.log_metric(parent_id, key, value)
    for key, value in tags.items():
        client.set_tag(parent_id, key, value)


def _move_champion(client, parent_id: str, study, args, config) -> None:
    """The alias champion follows the rule of ``--promote``; the parent says where it went or why not."""
    version, reason = set_champion(client, study, args.registered_model_name, config=config, promote=args.promote)
    if version:
        client.set_tag(parent_id, "champion", f"{args.registered_model_name}/{version}")
    else:
        client.set_tag(parent_id, "champion_unchanged", reason)
        print(f"[sweep] champion unchanged: {reason}", flush=True)


def main(argv: Sequence[str] | None = None, *, commands: Commands) -> int:
    install_warning_format()
    terminal_only_bars()
    return exit_in_one_line("sweep", lambda: run_sweep(argv, commands=commands))
