"""``kronos-mlflow pipeline``: tokenizer -> predictor -> evaluation as one parent MLflow run.

    kronos-mlflow pipeline --epochs 2 --predictor-epochs 2          # the demo market
    mlflow run . -e pipeline --env-manager local -P epochs=2 -P predictor_epochs=2
    mlflow run . -e pipeline --env-manager local -P force=true      # train every step again

One parent run, one child run per step, each a run of its own started the way a sweep starts
its trials (:mod:`kronos_mlflow.tracking.child_runs`, with the command lines the command layer hands
down as ``args.commands``: :mod:`kronos_mlflow.cli.commands`): the tokenizer (the training command),
the predictor on that child's tokenizer (``--tokenizer runs:/<tokenizer run>/best_model``), and
the scorecard of that predictor (``kronos-mlflow evaluate --model runs:/<predictor run>/best_model``;
the predictor step runs with ``evaluate: off`` so the scorecard is computed once, in its own run).

Before the parent run is made, every check a step would make at its start or its end runs
(:func:`check`; ``--check`` runs only them): a refusal is one line naming the step, and no run,
data cache or file is made. A step whose config digest (:func:`kronos_mlflow.config.digest.config_digest`)
and data digest match a FINISHED run of the experiment is reused, not run again (``--force
true`` runs it again). A step
that fails or is stopped ends the pipeline with one line naming it; the same command again
continues there: a stopped training step is relaunched into its own run with the same config,
so it resumes from its ``checkpoints/last`` (stopped after its last epoch: from the phase it
reached, without training again). See docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tracking import run_names
from ..config import checks
from ..tracking.child_runs import as_flags, child_env, create_child, experiment_id_of, log_param_once
from ..tracking.command_runs import end_stopped, install as install_stops, run_child, started as run_started
from ..config.core import EVALUATION_KEYS, load_config
from ..config.digest import config_digest, digest_config
from ..errors import UserError
from ..tracking.keys import VERDICT_TAG
from ..evaluation.next_steps import look_command
from ..tracking.ownership import evidence
from .pipeline_champions import move_champions
from ..training.preflight import DataView, check_context, check_scorecard, check_start, check_tracking, check_training
from .reuse import continue_problem, reuse_problem
from ..runtime.runlock import hold
from ..stages import get, names
from ..runtime.stopping import TrainingStopped
from .sweep.champion import PROMOTE
from ..training.run import check_resume

EVALUATION = "evaluation"  # the last step: the scorecard of the last training step's model
TAG_STEP = "pipeline.step"
#: config keys every training step takes from the flag of the same name
SHARED = ("batch_size", "accumulation_steps", "n_train_iter", "n_val_iter", "n_test_iter", "seed", "comet",
          "pretrained_tokenizer_path",
          # what each training step trains (docs/finetune-modes.md)
          "finetune_mode", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "freeze_layers")
#: ... and every step, the evaluation's included
DATA = ("qlib_data_path", "instrument", "freq", "membership_gaps", "dataset_begin_time", "dataset_end_time",
        "train_time_range", "val_time_range", "test_time_range")
#: the evaluation step's flags, flag -> (help, config key); a stage's own are on its spec
EVALUATION_FLAGS = {
    "backtest_signal_stride": ("trading days between two backtest signal dates (evaluation step; 1: daily, 0: the "
                               "scorecard's origin dates)", "backtest_signal_stride"),
    "calibration": ("on: the predictor's logged model carries a calibrator fit on validation origins and the "
                    "evaluation scores the calibrated forecaster too; off: neither (docs/calibration.md)",
                    "calibration"),
}


def steps() -> tuple[str, ...]:
    """The pipeline's steps in order: every registered stage (:attr:`StageSpec.pipeline_position`),
    then the evaluation."""
    return (*names(), EVALUATION)


def flags() -> dict[str, tuple[str, dict[str, str]]]:
    """flag -> (help, the steps it goes to and the config key it sets there): each stage's own
    flags (its spec's ``pipeline_flags``), ``weight_decay``, :data:`SHARED`, :data:`DATA`, the
    evaluation's (``calibration`` also goes to every stage that reads it)."""
    trained = names()
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for stage in trained:
        for flag, (help_text, key) in get(stage).pipeline_flags.items():
            out.setdefault(flag, (help_text, {}))[1][stage] = key
    out["weight_decay"] = ("AdamW weight decay of every training step", {s: "adam_weight_decay" for s in trained})
    out.update({k: (f"config key {k}, every training step", {s: k for s in trained}) for k in SHARED})
    out.update({k: (f"config key {k}, every step", {s: k for s in steps()}) for k in DATA})
    for flag, (help_text, key) in EVALUATION_FLAGS.items():
        _, readers = out.pop(flag, ("", {}))  # a stage that reads it too says so in its pipeline_flags
        out[flag] = (help_text, {**readers, EVALUATION: key})
    return out


SWITCH = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", dest="config_file", default="", metavar="FILE.yaml",
                        help="YAML config for every step")
    for name, (help_text, _) in flags().items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, metavar="VALUE",
                            help=f"{help_text} (default: the config's)")
    parser.add_argument("--nproc-per-node", default="1", help="processes per training step (torchrun when > 1)")
    parser.add_argument("--registered-model-name", default="",
                        help="register NAME-tokenizer and NAME-predictor; alias champion moves on a better verdict")
    parser.add_argument("--promote", choices=PROMOTE, default="better",
                        help="when the champion alias moves: better (the verdict against the starting weights "
                             "is better; default) or always")
    parser.add_argument("--force", default="false", help="true: run every step again, even when a FINISHED run "
                        "with the same config and data exists (default false)")
    parser.add_argument("--check", action="store_true", help="make every step's checks (what each would refuse at "
                        "its start or end), then exit: the pipeline makes them before its first run anyway")


@dataclass
class Step:
    name: str
    config: dict
    command: list[str]
    digest: str
    data_digest: str
    resume: bool = True  # a training step: relaunch a stopped run of the same config into that run
    record: dict = field(default_factory=dict)
    run_name: str = ""  # its run's name (kronos_mlflow/tracking/run_names.py)


def _overrides(args, step: str) -> dict[str, str]:
    """The step's config overrides: the flags that go to it, then ``args.step_overrides[step]``
    (a walk-forward fold's time ranges, per step)."""
    out = {}
    for name, (_, targets) in flags().items():
        value = getattr(args, name, None)
        if value is not None and step in targets:
            out[targets[step]] = value
    out.update((getattr(args, "step_overrides", None) or {}).get(step, {}))
    return out


def step_config(args, step: str) -> dict:
    """The config ``step`` runs with (before the step before it hands over its model)."""
    return _load(args, _overrides(args, step))


def _load(args, overrides: Mapping[str, Any]) -> dict:
    return load_config(dict(overrides), path=args.config_file or None)


def evaluation_digest(config: Mapping[str, Any], model: str, aci_start_run: str = "") -> str:
    """The evaluation step's config digest: the model, the data and windows, the scorecard's keys
    (and the run whose aci levels it starts from, a walk-forward fold's previous fold's)."""
    body = {"model": model, "config": digest_config(config), "scorecard": {k: config[k] for k in EVALUATION_KEYS}}
    if aci_start_run:
        body["aci_start_run"] = aci_start_run
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def check(args, command: str = "pipeline", data: DataView | None = None) -> None:
    """Every value, and everything a step would refuse at its start or its end, before any run
    is made (:func:`check_steps`): one UserError naming the bad value and the step. The run
    ``MLFLOW_RUN_ID`` hands to ``command`` is checked first, by the store gate."""
    text = str(args.force).strip().lower()
    if text not in SWITCH:
        raise UserError(f"argument --force: '{checks.shown(args.force)}' is not a switch; expected true or false")
    args.force = SWITCH[text]
    args.nproc_per_node = checks.integer("nproc_per_node", args.nproc_per_node, 1, 256, what="argument --nproc-per-node")
    checks.mlflow_model_name("argument --registered-model-name", args.registered_model_name, error=UserError)
    configs = {}
    for step in steps():
        with _step_named(step):  # the predictor's `epochs` is --predictor-epochs: say which step
            configs[step] = _load(args, check_overrides(args, step))
    from ..tracking.gate import check_handed  # lazy: numpy, urllib/http

    first = configs[names()[0]]
    check_handed(command, first.get("experiment_name"))  # before any data is read

    check_tracking(first)  # the parent's experiment (experiment_name, MLFLOW_EXPERIMENT_NAME)
    check_steps(args, configs, data)  # the last check: its data cache is written once every check passed


#: What the predictor step's tokenizer is called while the checks run (its run does not exist yet).
HANDED_OVER = "runs:/<the tokenizer step's run>/best_model"


def check_overrides(args, step: str) -> dict[str, Any]:
    """The overrides of ``step``'s config as the checks see it: the step's own, with the
    process count; the predictor's tokenizer is the one the tokenizer step will hand over (the
    checks pass it in: :func:`check_steps`)."""
    if step == EVALUATION:
        return _overrides(args, step)

    extra = get(step).handed_over(HANDED_OVER)  # what the step before hands it ({} for the first)
    return {**_overrides(args, step), "stage": step, "nproc_per_node": args.nproc_per_node, **extra}


@contextlib.contextmanager
def _step_named(step: str):
    """``with _step_named("predictor"):`` a refusal inside names the step."""
    try:
        yield
    except UserError as exc:
        raise UserError(f"{step} step: {exc}") from None


def check_steps(args, configs: Mapping[str, dict], data: DataView | None = None) -> None:
    """What each step would refuse, before the first child run or data cache: the training
    steps' start (paths, device, processes, speed settings, Comet), their checkpoints (kinds,
    finite weights; the predictor on the tokenizer the first step will hand over: the same
    bits), the forecast window against ``max_context``, the data (windows per rank, the
    validation origins of ``objective: val_skill``), the tokenizer step's training state (unless
    ``--force``; the predictor's run folder is named after the tokenizer step's run, which does
    not exist yet), and the evaluation's test origins and backtest range
    (:mod:`kronos_mlflow.training.preflight`). ``data``: the view of a caller that checks more (a
    walk-forward's folds): it publishes what was prepared once all of it passed."""
    world = args.nproc_per_node
    with (contextlib.nullcontext(data) if data is not None else DataView()) as data:
        handed = None  # what the step before starts from and hands over: its bits stay
        for index, step in enumerate(names()):
            config = configs[step]
            with _step_named(step):
                check_start(config, world)
                built = check_training(config, world, data, tokenizer=handed)
                if index == 0 and not args.force:  # the next step's folder is named after the first step's run
                    check_resume(config, world)
            handed = built if built is not None else get(step).build_model(config, tokenizer=handed)
        with _step_named(EVALUATION):
            check_context(configs[EVALUATION])
            check_scorecard(data.config(configs[EVALUATION]))


def training_step(args, name: str, extra: Mapping[str, Any]) -> Step:
    from ..data import data_digest  # lazy: numpy

    overrides = {**_overrides(args, name), "stage": name, **extra}
    config = _load(args, overrides)
    flags = (["--config", args.config_file] if args.config_file else []) + as_flags(overrides)
    flags += ["--nproc-per-node", str(args.nproc_per_node)]
    run_name = run_names.training(config, fold=getattr(args, "run_name_fold", None))
    if not run_names.given(config):  # result-neutral; it names the fold a walk-forward's step belongs to
        flags += ["--run-name", run_name]
    if args.force:
        flags += ["--resume", "never"]  # result-neutral: the digest stays the same
    return Step(name, config, args.commands.train(args.nproc_per_node, flags),
                config_digest(config, world_size=args.nproc_per_node), data_digest(config), run_name=run_name)


def evaluation_step(args, model: str) -> Step:
    from ..data import data_digest  # lazy: numpy

    overrides = _overrides(args, EVALUATION)
    config = _load(args, overrides)
    flags = (["--config", args.config_file] if args.config_file else []) + as_flags(overrides)
    run_name = run_names.evaluation(config, fold=getattr(args, "run_name_fold", None))
    if not run_names.given(config):
        flags += ["--run-name", run_name]
    carried = getattr(args, "aci_start_run", "")  # a walk-forward fold's: its previous fold's evaluation run
    flags += ["--aci-start-run", carried] if carried else []
    return Step(EVALUATION, config, args.commands.evaluate(model, flags), evaluation_digest(config, model, carried), data_digest(config),
                resume=False,
                run_name=run_name)


def claim_step(step: Step):
    """The step's claim (:mod:`kronos_mlflow.runtime.runlock`): a lock file per step and config under
    ``{save_path}/.claims/``, held while this process runs the step. A second pipeline of the
    same config waits for it, saying so in one line."""
    from pathlib import Path

    folder = Path(os.path.expanduser(str(step.config["save_path"]))) / ".claims"
    return hold(folder / f"{step.name}-{step.digest[:16]}.lock", f"pipeline step {step.name}", wait=True,
                on_wait=lambda holder: print(f"[pipeline] {step.name}: another pipeline ({holder}) runs this step "
                                             "with the same config; waiting for it", flush=True))


class StepFailed(Exception):
    """A step's process failed or was stopped; the message names the step."""


class Pipeline:
    """The parent run and its steps."""

    def __init__(self, args, client, experiment_id: str, parent_id: str):
        self.args, self.client = args, client
        self.experiment_id, self.parent_id = experiment_id, parent_id
        self.runs: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.reused: dict[str, bool] = {}
        self.configs: dict[str, dict] = {}

    def _search(self, query: str) -> list:
        return self.client.search_runs([self.experiment_id], filter_string=query, order_by=["attributes.start_time DESC"],
                                       max_results=50)

    def finished_match(self, step: Step):
        """The newest FINISHED run with this step's config and data digests that proves it can be
        reused (:func:`kronos_mlflow.workflows.reuse.reuse_problem`: made by this project, its model or
        scorecard there and loadable), or None. A run that matches by its tags alone is named,
        with why it is not reused, in one line."""
        runs = self._search(f"tags.config_digest = '{step.digest}' and tags.data_digest = '{step.data_digest}' "
                            "and attributes.status = 'FINISHED'")
        return self._first_with_evidence(step, runs, lambda run: reuse_problem(self.client, run, step.name), "reused")

    def unfinished_match(self, step: Step):
        """The newest run of this step and config that did not finish (stopped, failed) and whose
        run directory holds its own training state (:func:`kronos_mlflow.workflows.reuse.continue_problem`),
        or None."""
        runs = self._search(f"tags.config_digest = '{step.digest}' and tags.`{TAG_STEP}` = '{step.name}'")
        runs = [r for r in runs if r.info.status != "FINISHED"]
        return self._first_with_evidence(
            step, runs, lambda run: continue_problem(self.client, run, step.config, self.args.nproc_per_node),
            "continued")

    @staticmethod
    def _first_with_evidence(step: Step, runs, problem, what: str):
        for run in runs:
            why = problem(run)
            if why is None:
                return run
            print(f"[pipeline] {step.name}: run {run.info.run_id} has this config but is not {what}: {why}", flush=True)
        return None

    def run_step(self, step: Step) -> str:
        """The step's run id: a FINISHED match, or a run made (or continued) now. The step is
        claimed first (:func:`claim_step`): a second identical pipeline waits for this one and
        then reuses what it finished."""
        order = steps()
        number = f"{order.index(step.name) + 1}/{len(order)}" if step.name in order else "?"
        print(f"[pipeline] step {number}: {step.name}", flush=True)
        with claim_step(step):
            return self._run_step(step)

    def _run_step(self, step: Step) -> str:
        from ..tracking.project_run import end_failed  # lazy: numpy, urllib/http

        self.configs[step.name] = step.config
        match = None if self.args.force else self.finished_match(step)
        if match is not None:
            run_id = match.info.run_id
            print(f"[pipeline] {step.name}: reused run {run_id} (same config and data, FINISHED)", flush=True)
            self._mark(step.name, run_id, reused=True, seconds=0.0)
            return run_id
        earlier = None if (self.args.force or not step.resume) else self.unfinished_match(step)
        if earlier is not None:
            run_id = run_started(earlier.info.run_id)  # a stop ends it KILLED again
            self.client.set_tag(run_id, "mlflow.parentRunId", self.parent_id)
            print(f"[pipeline] {step.name}: continuing run {run_id} (it ended {earlier.info.status})", flush=True)
        else:
            tags = {TAG_STEP: step.name, "config_digest": step.digest, "data_digest": step.data_digest}
            run_id = create_child(self.client, self.experiment_id, self.parent_id,
                                  step.run_name or f"pipeline {step.name}", tags)
            print(f"[pipeline] {step.name}: run {run_id}", flush=True)
        self.client.set_tag(self.parent_id, f"pipeline.{step.name}_run_id", run_id)
        started = time.time()
        # a stop signal goes on to the step's process; once it has exited, the stop is raised here
        returncode = run_child(step.command, child_env(run_id, self.experiment_id, self.client.tracking_uri))
        run_id, run = self._continued(run_id, returncode)
        if returncode != 0 or run.info.status != "FINISHED":
            if run.info.status in ("RUNNING", "SCHEDULED"):  # its process ended without ending it
                end_failed(self.client, run_id, f"step {step.name}: its process exited with code {returncode} "
                           "before ending its run")
            self.client.set_tag(self.parent_id, "pipeline.failed_step", step.name)
            ended = run.info.status if run.info.status != "RUNNING" else "FAILED"
            raise StepFailed(f"step {step.name} ended {ended} (exit code {returncode}, run {run_id}); "
                             "the same command again continues from this step")
        self._mark(step.name, run_id, reused=False, seconds=time.time() - started)
        return run_id

    def _continued(self, run_id: str, returncode: int):
        """``(run id, run)`` of the step: training that resumed a stopped run of the same config
        made outside the pipeline continued in that run (tag ``kronos.continued_in_run``), which
        becomes the step's; the child made for the launch holds only its parameters and ends."""
        run = self.client.get_run(run_id)
        moved = run.data.tags.get("kronos.continued_in_run")
        if not moved or moved == run_id:
            return run_id, run
        self.client.delete_tag(run_id, "config_digest")  # never found as this config's run
        why = evidence(self.client, self.client.get_run(moved))  # a tag naming a run is a claim: checked
        if why is not None:
            message = (f"step {run.data.tags.get(TAG_STEP, '')} continued in run {moved}, which is not provably "
                       f"this pipeline's ({why})")
            self.client.set_tag(run_id, "failure_reason", message)
            self.client.set_terminated(run_id, "FAILED")
            raise StepFailed(message)
        if run.info.status in ("RUNNING", "SCHEDULED"):
            if returncode == 0:
                self.client.set_terminated(run_id, "FINISHED")
            else:
                from ..tracking.project_run import end_failed  # lazy: numpy, urllib/http

                end_failed(self.client, run_id, f"the training it launched continued in run {moved}, whose process "
                           f"exited with code {returncode}")
        self.client.set_tag(moved, "mlflow.parentRunId", self.parent_id)
        self.client.set_tag(moved, TAG_STEP, self.client.get_run(run_id).data.tags.get(TAG_STEP, ""))
        return run_started(moved), self.client.get_run(moved)

    def _mark(self, name: str, run_id: str, *, reused: bool, seconds: float) -> None:
        self.runs[name], self.seconds[name], self.reused[name] = run_id, seconds, reused
        self.client.set_tag(self.parent_id, f"pipeline.{name}_run_id", run_id)
        self.client.set_tag(self.parent_id, f"pipeline.{name}_reused", "true" if reused else "false")
        self.client.log_metric(self.parent_id, f"{name}_seconds", seconds)

    def run_all(self) -> None:
        """Every step in order, each training step handing its logged model to the next, then
        the scorecard and the parent's summary."""
        model = None
        for step in names():
            run_id = self.run_step(training_step(self.args, step, get(step).handed_over(model) if model else {}))
            model = f"runs:/{run_id}/best_model"
        self.run_step(evaluation_step(self.args, model))
        self.summarize()

    def summarize(self) -> None:
        """The verdicts and the scorecard's skills on the parent run."""
        trained = {name: self.client.get_run(self.runs[name]) for name in names()}
        forecaster = trained[names()[-1]]  # the model the evaluation scored
        evaluation = self.client.get_run(self.runs[EVALUATION])
        tags = {f"{name}_verdict": run.data.tags.get(VERDICT_TAG, "missing") for name, run in trained.items()}
        tags.update({k: v for k, v in evaluation.data.tags.items() if k.startswith("verdict_vs_")})
        for key, value in tags.items():
            self.client.set_tag(self.parent_id, key, value)
            if key.startswith("verdict_vs_"):  # as a stand-alone predictor run (evaluate: on) has them
                self.client.set_tag(forecaster.info.run_id, key, value)
        for key, value in evaluation.data.metrics.items():
            if key.startswith("skill_vs_"):
                self.client.log_metric(self.parent_id, key, value)
        shown = ", ".join(f"{k} {v}" for k, v in tags.items())
        print(f"[pipeline] {shown}", flush=True)
        self.describe_steps()
        skill = evaluation.data.metrics.get("skill_vs_zeroshot")
        if skill is not None:
            print(f"[pipeline] scorecard: skill_vs_zeroshot {skill:+.4f} ({tags.get('verdict_vs_zeroshot', '?')}), "
                  f"artifact evaluation/scorecard.json of run {evaluation.info.run_id}", flush=True)
        print(f"[pipeline] done: parent run {self.parent_id}; look at it: "
              f"{look_command(self.client.tracking_uri, self.experiment_id, self.parent_id)}", flush=True)

    def describe_steps(self) -> None:
        """The parent's description (MLflow's note) links every step's run: a reused one stays under
        the parent that made it, so the UI shows this parent's steps through these links."""
        lines = ["Steps of this pipeline (a reused step stays under the pipeline that made it):", ""]
        for name in steps():
            run_id = self.runs.get(name)
            if run_id:
                reused = " (reused)" if self.reused.get(name) else ""
                lines.append(f"- {name}: [{run_id}](#/experiments/{self.experiment_id}/runs/{run_id}){reused}")
        self.client.set_tag(self.parent_id, "mlflow.note.content", "\n".join(lines))


def open_store(args: argparse.Namespace):
    """The tracking store (a sqlite file made ready) and the experiment the steps' runs go to."""
    import mlflow
    from mlflow import MlflowClient

    from ..tracking.server import ensure_sqlite_store  # lazy: mlflow

    ensure_sqlite_store(mlflow.get_tracking_uri())
    client = MlflowClient()
    base = step_config(args, names()[0])
    return client, experiment_id_of(client, base.get("experiment_name") or os.environ.get("MLFLOW_EXPERIMENT_NAME"))


def run_to_an_end(client, run_id: str, command: str, work: Callable[[], None],
                  stopped: str = "it stopped before every step ended", *,
                  keep_killed: Callable[[str, int], Sequence[str]]) -> int:
    """``work()`` for the parent ``run_id``: FINISHED when it returns (0); on SIGTERM or Ctrl-C
    (sent on to the step's process, which ends its run KILLED and continues next time) every run
    the command started ends KILLED, one line, ``128 + signal``
    (:func:`kronos_mlflow.tracking.command_runs.end_stopped`, ``keep_killed`` its helper's command
    line); FAILED with a failed step's one line as its failure_reason (1, the line on stderr),
    FAILED with the error otherwise."""
    from ..tracking.project_run import end_run  # lazy: numpy, urllib/http

    status, reason, stop = "FAILED", None, None
    try:
        work()
        status = "FINISHED"
    except (KeyboardInterrupt, TrainingStopped) as exc:
        stop = exc  # the parent is ended with the command's other runs, below
    except StepFailed as exc:
        reason = f"{command}: {exc}"
        print(reason, file=sys.stderr, flush=True)
        return 1
    except BaseException as exc:
        reason = f"{command}: {type(exc).__name__}: {exc}"
        raise
    finally:
        if stop is None:
            end_run(client, run_id, status, reason or f"{command}: {stopped}")
    if stop is not None:
        return end_stopped(client, command, stop, keep_killed)
    return 0


def run(args: argparse.Namespace) -> int:
    check(args)
    if args.check:
        print("[pipeline] check passed: every step's config, checkpoints, data, origins and the tracking server "
              "are usable", flush=True)
        return 0
    from ..tracking.gate import command_run  # lazy: numpy, urllib/http

    client, experiment_id = open_store(args)
    install_stops()  # SIGTERM / Ctrl-C: sent on to a step's process, then every run of this command ends KILLED
    parent_id = run_started(command_run(client, experiment_id, command="pipeline",
                                        run_name=run_names.pipeline(step_config(args, names()[0])),
                                    tags={"pipeline.role": "parent"}))
    for key in ("force", "promote", "registered_model_name", "nproc_per_node"):
        log_param_once(client, parent_id, key, getattr(args, key))
    pipeline = Pipeline(args, client, experiment_id, parent_id)

    def work() -> None:
        pipeline.run_all()
        if args.registered_model_name:
            move_champions(client, parent_id, pipeline.runs, pipeline.configs, args)

    return run_to_an_end(client, parent_id, "kronos-mlflow pipeline", work, keep_killed=args.commands.keep_killed)
