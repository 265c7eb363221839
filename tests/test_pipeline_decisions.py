"""The pipeline's decisions, fast: which run a step reuses, which stopped run it continues, what
``--force`` does, and where the champion aliases go; on a real MLflow sqlite store per test.

No step trains here. The runs the decisions read are made by the project's own code, as a
training makes them: a pipeline's child run (:func:`kronos_mlflow.tracking.child_runs.create_child`)
claimed by :func:`kronos_mlflow.training.run.start_tracking` (``owner.json`` in the run directory, the
``kronos.owner`` and ``run_directory`` tags), the digests tagged as ``train.main`` tags them, a
training state written by :func:`kronos_mlflow.training.loop.save_progress`, a tiny upstream-format
checkpoint logged by :func:`kronos_mlflow.serving.model_logging.log_best_model` (or
``log_forecaster``), the run ended by the logger's ``finalize``. The verdicts the champion rule
reads (``verdict``, ``verdict_vs_zeroshot``, ``test_tokenizer_loss``) are set as tags and metrics
on those runs: computing them takes a training. The decisions are the pipeline's own functions:
:meth:`Pipeline.finished_match`, :meth:`Pipeline.unfinished_match`, :meth:`Pipeline.run_step` and
:func:`kronos_mlflow.workflows.pipeline_champions.move_champions`. Where ``run_step`` launches a step's
process, ``run_child`` is replaced for that one command by a stand-in that ends the child
run the way the process would (or resumes a saved run through ``start_tracking``); every other
call goes to the real one.

tests/test_pipeline.py runs the same decisions end to end (slow, through ``mlflow run``)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
from tiny_runs import TINY, create_sqlite_store, isolate, write_config

from kronos_mlflow.cli.commands import COMMANDS
from kronos_mlflow.workflows import pipeline as pipeline_module
from kronos_mlflow.tracking.keys import TOKENIZER_TEST_LOSS, TEST_WINDOWS_DIGEST_TAG, VERDICT_TAG
from kronos_mlflow.workflows.pipeline import TAG_STEP, Pipeline, StepFailed, training_step
from kronos_mlflow.tracking.gate import HANDOVER_ENV

SIZES = {"epochs": 2, "predictor_epochs": 2, "batch_size": 8, "n_train_iter": 64, "n_val_iter": 36}
NAME = "kr"  # --registered-model-name


def _config_file(path: Path, save_path: Path, dataset_path: Path) -> Path:
    """The pipeline's YAML file: the tiny architecture (as tests/test_pipeline.py writes it),
    Comet and system metrics off (quoted: YAML reads a bare off as false)."""
    values = {k: v for k, v in TINY.items() if k not in SIZES}
    return write_config(path, **values, n_layers=2, save_path=str(save_path), dataset_path=str(dataset_path),
                        comet='"off"', system_metrics='"off"')


def _args(config_file: Path, *flags: str):
    """The pipeline's arguments from its own parser, --force and --nproc-per-node read as
    :func:`kronos_mlflow.workflows.pipeline.check` reads them."""
    parser = argparse.ArgumentParser()
    pipeline_module.add_arguments(parser)
    argv = ["--config", str(config_file), *[a for k, v in SIZES.items() for a in (f"--{k.replace('_', '-')}", str(v))]]
    args = parser.parse_args([*argv, *flags])
    args.force = pipeline_module.SWITCH[str(args.force).lower()]
    args.nproc_per_node = 1
    args.commands = COMMANDS  # as kronos-mlflow hands them (kronos_mlflow/cli/main.py)
    return args


@pytest.fixture(scope="module")
def market(tmp_path_factory):
    """The demo market, its prepared splits and the store template, made once for the module
    (what a logged model's input example and every data digest read)."""
    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.data import prepare_splits

    root = tmp_path_factory.mktemp("market")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, root)
        create_sqlite_store(root)  # the process's template store (its schema costs seconds once)
        args = _args(_config_file(root / "tiny.yaml", root / "outputs", root / "cache"))
        prepare_splits(load_config(pipeline_module._overrides(args, "tokenizer"), path=args.config_file))
    return {"home": root / "home", "cache": root / "cache"}


class World:
    """One test's store, experiment and pipeline arguments, and the runs made in it."""

    def __init__(self, root: Path, monkeypatch, market):
        from mlflow import MlflowClient

        isolate(monkeypatch, root)
        monkeypatch.setenv("KRONOS_MLFLOW_HOME", str(market["home"]))  # the module's demo market
        self.root, self.mp = root, monkeypatch
        self.uri = create_sqlite_store(root)
        self.client = MlflowClient(self.uri)
        self.experiment_id = self.client.create_experiment("pipeline")
        self.config_file = _config_file(root / "tiny.yaml", root / "outputs", market["cache"])
        self.runs = 0

    def args(self, *flags: str):
        return _args(self.config_file, *flags)

    def step(self, name: str = "tokenizer", *flags: str, tokenizer_run: str | None = None):
        """The step as the pipeline builds it (:func:`training_step`)."""
        extra = {} if name == "tokenizer" else {"finetuned_tokenizer_path": f"runs:/{tokenizer_run}/best_model",
                                                "evaluate": "off"}
        return training_step(self.args(*flags), name, extra)

    def pipeline(self, *flags: str) -> Pipeline:
        parent = self.client.create_run(self.experiment_id, run_name="pipeline").info.run_id
        self.client.set_tag(parent, "pipeline.role", "parent")
        return Pipeline(self.args(*flags), self.client, self.experiment_id, parent)

    def directory(self) -> Path:
        self.runs += 1
        return self.root / "runs" / f"run-{self.runs}"

    def training_run(self, step, *, end: str = "success", model: bool = False, state: bool = False,
                     directory: Path | None = None, by_pipeline: bool = True, tags=None, metrics=None,
                     tokenizer_dir: Path | None = None) -> str:
        """A training run of ``step``'s config as the training opens, tags and ends it: a
        pipeline's child (``by_pipeline``; else a stand-alone run) claimed by ``start_tracking``
        in ``directory`` (default: one of its own), with its training state after epoch 0
        (``state``), its best checkpoint logged as ``best_model`` (``model``; a predictor's
        forecaster holds ``tokenizer_dir``), ended ``end`` (success, killed, failed)."""
        from kronos_mlflow.tracking.child_runs import create_child
        from kronos_mlflow.tracking.gate import handover_env
        from kronos_mlflow.config.core import run_params
        from kronos_mlflow.config.layout import RunLayout
        from kronos_mlflow.model import KronosTokenizer
        from kronos_mlflow.stages import spec_of
        from kronos_mlflow.serving.model_logging import log_best_model, log_forecaster
        from kronos_mlflow.training.run import start_tracking
        from kronos_mlflow.training.loop import Progress, RunFiles, save_progress

        layout = RunLayout(Path(directory) if directory is not None else self.directory())
        with pytest.MonkeyPatch.context() as mp:
            if by_pipeline:  # the pipeline makes the child and hands it to the training
                earlier = self.client.create_run(self.experiment_id, run_name="pipeline").info.run_id
                child = create_child(self.client, self.experiment_id, earlier, f"pipeline {step.name}",
                                     {TAG_STEP: step.name, "config_digest": step.digest,
                                      "data_digest": step.data_digest})
                for key, value in handover_env(child).items():  # as child_env hands it to the step's process
                    mp.setenv(key, value)
            mp.setenv("MLFLOW_EXPERIMENT_ID", self.experiment_id)
            tracking = start_tracking(step.config, 0, layout, None)
        logger = tracking.logger
        logger.log_hyperparams(run_params(step.config))
        logger.set_tags({"data_digest": step.data_digest, "config_digest": step.digest})  # as train.main
        tokenizer = KronosTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir is not None else None
        net = spec_of(step.config).build_model(step.config, tokenizer=tokenizer) if state or model else None
        files = RunFiles(layout)
        if state:
            import torch

            save_progress(files, logger, net, torch.optim.AdamW(net.parameters()), None, Progress(), 0,
                          config=step.config, world_size=1, run_ids=tracking.run_ids())
        if model:
            files.save_best(net)
            if tokenizer is None:
                log_best_model(tracking.mlflow, str(layout.best_model), step.config, step=0)
            else:
                tokenizer.save_pretrained(layout.tokenizer)
                log_forecaster(tracking.mlflow, str(layout.tokenizer), str(layout.best_model), step.config, step=0)
        if tags:
            logger.set_tags(dict(tags))
        if metrics:
            logger.log_metrics(dict(metrics), step=0)
        logger.finalize(end, None if end == "success" else f"test: ended {end}")
        return tracking.mlflow.run_id

    def status(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.status

    def model_files(self, run_id: str) -> Path:
        """The local directory of the run's logged model ``best_model``."""
        from mlflow.utils.file_utils import local_file_uri_to_path

        uri = self.client.get_run(run_id).data.tags["best_model_uri"]
        model = self.client.get_logged_model(uri.split("/")[-1])
        return Path(local_file_uri_to_path(model.artifact_location))


@pytest.fixture()
def world(tmp_path, monkeypatch, market):
    import mlflow

    yield World(tmp_path, monkeypatch, market)
    mlflow.set_tracking_uri(None)  # model logging and registering set MLflow's process-global URI


class Launches:
    """``run_child`` (kronos_mlflow/tracking/command_runs.py) for one step's command: records each launch
    (command, environment) and does what ``then(run_id, env)`` does in place of the step's
    process (its return value is the exit code); any other command runs for real."""

    def __init__(self, monkeypatch, command, then=None):
        self.command, self.then, self.calls = list(command), then, []
        self.real = pipeline_module.run_child
        monkeypatch.setattr(pipeline_module, "run_child", self)

    def __call__(self, command, env):
        if list(command) != self.command:
            return self.real(command, env)
        self.calls.append((list(command), dict(env or {})))
        return self.then(env["MLFLOW_RUN_ID"], env) if self.then is not None else 0


def finish(client):
    """A step's process that trains to the end: the run it was handed ends FINISHED."""
    def then(run_id, env):
        client.set_terminated(run_id, "FINISHED")
        return 0
    return then


def never(run_id, env):
    raise AssertionError(f"the step's process was launched (run {run_id}), but the step should not run")


# --------------------------------------------------------------------------------------------
# reuse


def test_a_finished_owned_step_with_matching_digests_is_reused_and_nothing_is_launched(world, monkeypatch, capsys):
    step = world.step()
    genuine = world.training_run(step, model=True)
    world.training_run(world.step("tokenizer", "--seed", "7"), model=False)  # another config: never a match
    pipeline = world.pipeline()
    assert pipeline.finished_match(step).info.run_id == genuine
    Launches(monkeypatch, step.command, never)
    assert pipeline.run_step(step) == genuine
    tags = world.client.get_run(pipeline.parent_id).data.tags
    assert tags["pipeline.tokenizer_run_id"] == genuine and tags["pipeline.tokenizer_reused"] == "true"
    assert world.client.get_run(pipeline.parent_id).data.metrics["tokenizer_seconds"] == 0.0
    assert f"[pipeline] tokenizer: reused run {genuine} (same config and data, FINISHED)" in capsys.readouterr().out


def test_copied_tags_without_ownership_evidence_are_not_reused_and_the_line_says_why(world, capsys):
    """A newer FINISHED run carrying every tag of the genuine one (owner tag, run directory,
    model URI, digests) is passed over: its directory's owner.json names the genuine run. A run
    with the digests and no owner tag is passed over too. With only such runs, nothing is reused."""
    step = world.step()
    genuine = world.training_run(step, model=True)
    copied = {k: v for k, v in world.client.get_run(genuine).data.tags.items() if not k.startswith("mlflow.")}
    forged = world.client.create_run(world.experiment_id, run_name="copied tags", tags=copied).info.run_id
    world.client.set_terminated(forged, "FINISHED")
    bare = world.client.create_run(world.experiment_id, run_name="digests only", tags={
        "config_digest": step.digest, "data_digest": step.data_digest, TAG_STEP: "tokenizer"}).info.run_id
    world.client.set_terminated(bare, "FINISHED")

    pipeline = world.pipeline()
    assert pipeline.finished_match(step).info.run_id == genuine
    out = capsys.readouterr().out
    directory = copied["run_directory"]
    assert (f"[pipeline] tokenizer: run {forged} has this config but is not reused: run {forged}'s directory "
            f"{directory} does not record that run as its owner") in out, out
    assert (f"[pipeline] tokenizer: run {bare} has this config but is not reused: run {bare} carries no "
            "kronos.owner tag (it was not started by kronos-mlflow)") in out, out

    world.client.delete_run(genuine)  # only the runs without evidence are left: the step trains
    assert pipeline.finished_match(step) is None


def test_an_owned_finished_run_whose_model_is_missing_or_broken_is_not_reused(world, capsys):
    step = world.step()
    no_model = world.training_run(step, model=False)
    broken = world.training_run(step, model=True)
    for path in world.model_files(broken).rglob("model.safetensors"):
        path.write_bytes(b"not a safetensors file")
    pipeline = world.pipeline()
    assert pipeline.finished_match(step) is None
    out = capsys.readouterr().out
    assert f"run {no_model} has this config but is not reused: it logged no model" in out, out
    assert f"run {broken} has this config but is not reused: its logged model does not load (" in out, out


def test_an_owned_evaluation_is_reused_only_with_its_scorecard(world, capsys):
    """The evaluation step's run, claimed as ``kronos-mlflow evaluate`` claims it (a run
    directory of its own with owner.json): reused when it holds evaluation/scorecard.json."""
    from kronos_mlflow.tracking.child_runs import create_child
    from kronos_mlflow.tracking.gate import handover_env
    from kronos_mlflow.cli.evaluate import EVALUATIONS_FOLDER
    from kronos_mlflow.tracking.ownership import Claim, write_owner
    from kronos_mlflow.workflows.pipeline import evaluation_step
    from kronos_mlflow.workflows.reuse import SCORECARD_ARTIFACT
    from kronos_mlflow.tracking.mlflow import MLflowLogger

    step = evaluation_step(world.args(), "runs:/0123456789abcdef/best_model")

    def evaluation(scorecard: bool) -> str:
        child = create_child(world.client, world.experiment_id, world.pipeline().parent_id, "pipeline evaluation",
                             {TAG_STEP: "evaluation", "config_digest": step.digest, "data_digest": step.data_digest})
        with pytest.MonkeyPatch.context() as mp:
            for key, value in handover_env(child).items():  # as child_env hands it to the step's process
                mp.setenv(key, value)
            mp.setenv("MLFLOW_EXPERIMENT_ID", world.experiment_id)
            logger = MLflowLogger(None, run_name="evaluate", claim=Claim(command="evaluate"))
        root = Path(step.config["save_path"]) / EVALUATIONS_FOLDER / logger.run_id
        write_owner(root, logger.owner_token, logger.run_id, logger.experiment_id)
        logger.set_tags({"run_directory": str(root.resolve())})
        if scorecard:
            card = root / SCORECARD_ARTIFACT
            card.parent.mkdir(parents=True)
            card.write_text(json.dumps({"windows": 0}))
            world.client.log_artifact(logger.run_id, str(card), "evaluation")
        logger.finalize("success")
        return logger.run_id

    with_card = evaluation(True)
    without = evaluation(False)  # newer: looked at first
    assert world.pipeline().finished_match(step).info.run_id == with_card
    assert (f"run {without} has this config but is not reused: it holds no {SCORECARD_ARTIFACT}"
            in capsys.readouterr().out)


# --------------------------------------------------------------------------------------------
# continuing a stopped step


@pytest.mark.parametrize("end", ["killed", "failed"])
def test_a_stopped_owned_step_is_continued_in_its_own_run_when_its_training_state_is_its_own(
        world, monkeypatch, capsys, end):
    step = world.step()
    stopped = world.training_run(step, end=end, state=True)
    assert world.status(stopped) == end.upper()
    pipeline = world.pipeline()
    assert pipeline.finished_match(step) is None
    assert pipeline.unfinished_match(step).info.run_id == stopped
    launches = Launches(monkeypatch, step.command, finish(world.client))
    assert pipeline.run_step(step) == stopped
    ((_, env),) = launches.calls
    assert env["MLFLOW_RUN_ID"] == stopped  # relaunched into its own run: the training resumes there
    run = world.client.get_run(stopped)
    assert run.data.tags["mlflow.parentRunId"] == pipeline.parent_id and run.info.status == "FINISHED"
    tags = world.client.get_run(pipeline.parent_id).data.tags
    assert tags["pipeline.tokenizer_run_id"] == stopped and tags["pipeline.tokenizer_reused"] == "false"
    assert f"[pipeline] tokenizer: continuing run {stopped} (it ended {end.upper()})" in capsys.readouterr().out


def test_a_stopped_step_is_not_continued_without_its_own_training_state(world, monkeypatch, capsys):
    """Not continued, each with its reason, and the step gets a new child run: a run whose
    directory holds a training state another config saved (handed over), one with no training
    state, one no training ever claimed (a bare child with the step's tags)."""
    step = world.step()
    other = world.training_run(world.step("tokenizer", "--seed", "5"), end="killed", state=True)
    handed = world.directory()
    foreign = world.training_run(step, end="killed", state=False, directory=handed)
    shutil.copytree(Path(world.client.get_run(other).data.tags["run_directory"]) / "checkpoints",
                    handed / "checkpoints")
    empty = world.training_run(step, end="failed", state=False)
    bare = world.client.create_run(world.experiment_id, run_name="pipeline tokenizer", tags={
        TAG_STEP: "tokenizer", "config_digest": step.digest, "data_digest": step.data_digest}).info.run_id
    world.client.set_terminated(bare, "KILLED")

    pipeline = world.pipeline()
    capsys.readouterr()
    assert pipeline.unfinished_match(step) is None
    out = capsys.readouterr().out
    assert f"run {bare} has this config but is not continued: run {bare} carries no kronos.owner tag" in out, out
    assert (f"run {empty} has this config but is not continued: its run directory holds no training state "
            "this config resumes") in out, out
    # the handed-over state was saved by another config (seed 5): this config does not resume it
    assert f"run {foreign} has this config but is not continued: its run directory holds no training state" in out

    launches = Launches(monkeypatch, step.command, finish(world.client))
    new = pipeline.run_step(step)
    assert new not in (foreign, empty, bare)
    assert [env["MLFLOW_RUN_ID"] for _, env in launches.calls] == [new]
    assert world.status(foreign) == "KILLED" and world.status(empty) == "FAILED"


def test_a_training_state_of_the_same_config_but_another_run_is_not_continued(world, capsys):
    """Two runs of one config: the second's training state copied into the first's directory
    (it names the second run and holds its token): the first is not continued."""
    step = world.step()
    second_dir = world.directory()
    first_dir = world.directory()
    first = world.training_run(step, end="killed", state=False, directory=first_dir)
    second = world.training_run(step, end="killed", state=True, directory=second_dir)
    shutil.copytree(second_dir / "checkpoints", first_dir / "checkpoints")
    shutil.rmtree(second_dir / "checkpoints")  # else the second (newer) is continued before the first is looked at
    assert world.pipeline().unfinished_match(step) is None
    out = capsys.readouterr().out
    assert (f"run {first} has this config but is not continued: the training state in "
            f"{first_dir / 'checkpoints' / 'last'} is not run {first}'s") in out, out
    assert f"run {second} has this config but is not continued" in out


def test_a_training_that_resumed_a_stand_alone_run_makes_that_run_the_step_only_when_it_is_owned(
        world, monkeypatch, capsys):
    """A stopped stand-alone run (no pipeline.step tag: not found as the step) of the same config
    in the config's own run directory: the pipeline makes a new child, and the training it
    launches resumes the stand-alone run (``start_tracking`` with the saved state tags the child
    ``kronos.continued_in_run``). That run becomes the step; the child loses its config_digest.
    A child tagged as continued in a run that is not provably this project's fails the step."""
    from kronos_mlflow.training.checkpoint import find_resumable
    from kronos_mlflow.config.layout import RunLayout

    step = world.step()
    layout = RunLayout.of(step.config, 1)
    alone = world.training_run(step, end="killed", state=True, directory=layout.root, by_pipeline=False)

    def resume(run_id, env):  # the training's opening, with the state it finds
        state = find_resumable(layout.root, step.config, world_size=1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MLFLOW_RUN_ID", run_id)
            mp.setenv("MLFLOW_EXPERIMENT_ID", env["MLFLOW_EXPERIMENT_ID"])
            mp.setenv(HANDOVER_ENV, env[HANDOVER_ENV])  # the token the pipeline handed its child
            from kronos_mlflow.training.run import start_tracking

            tracking = start_tracking(step.config, 0, layout, state)
        tracking.logger.finalize("success")
        return 0

    pipeline = world.pipeline()
    Launches(monkeypatch, step.command, resume)
    assert pipeline.run_step(step) == alone
    run = world.client.get_run(alone)
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == pipeline.parent_id
    assert run.data.tags[TAG_STEP] == "tokenizer"
    (child,) = [r for r in world.client.search_runs([world.experiment_id])
                if r.data.tags.get("kronos.continued_in_run") == alone]
    assert "config_digest" not in child.data.tags and child.info.status == "FINISHED"
    assert world.client.get_run(pipeline.parent_id).data.tags["pipeline.tokenizer_run_id"] == alone

    step2 = world.step("tokenizer", "--seed", "9")
    unowned = world.client.create_run(world.experiment_id, run_name="elsewhere").info.run_id

    def claims(run_id, env):  # a process that says it continued in a run it does not own
        world.client.set_tag(run_id, "kronos.continued_in_run", unowned)
        world.client.set_terminated(run_id, "FINISHED")
        return 0

    Launches(monkeypatch, step2.command, claims)
    with pytest.raises(StepFailed, match=f"continued in run {unowned}, which is not provably this pipeline's"):
        pipeline.run_step(step2)
    assert "mlflow.parentRunId" not in world.client.get_run(unowned).data.tags


# --------------------------------------------------------------------------------------------
# --force, a failing step


def test_force_trains_again_in_a_new_run_past_a_reusable_and_a_continuable_run(world, monkeypatch, capsys):
    step = world.step()
    forced = world.step("tokenizer", "--force", "true")
    assert forced.digest == step.digest and forced.data_digest == step.data_digest  # result-neutral
    assert forced.command[-2:] == ["--resume", "never"] and "--resume" not in step.command
    finished = world.training_run(step, model=True)
    stopped = world.training_run(step, end="killed", state=True)
    pipeline = world.pipeline("--force", "true")
    launches = Launches(monkeypatch, forced.command, finish(world.client))
    new = pipeline.run_step(forced)
    assert new not in (finished, stopped)
    assert [env["MLFLOW_RUN_ID"] for _, env in launches.calls] == [new]
    run = world.client.get_run(new)
    assert run.data.tags["config_digest"] == step.digest and run.data.tags[TAG_STEP] == "tokenizer"
    assert run.data.tags["mlflow.parentRunId"] == pipeline.parent_id
    assert world.client.get_run(pipeline.parent_id).data.tags["pipeline.tokenizer_reused"] == "false"
    out = capsys.readouterr().out
    assert "reused run" not in out and "continuing run" not in out and f"[pipeline] tokenizer: run {new}" in out
    assert world.status(stopped) == "KILLED"  # left as it was


def test_each_step_is_named_after_its_stage_settings_and_market_and_a_given_run_name_wins(world):
    """The name of a step's child run, which its process keeps (``--run-name``), tells the steps
    apart; a walk-forward fold's steps start with the fold; the user's own run_name wins."""
    from kronos_mlflow.workflows.pipeline import evaluation_step

    step = world.step()
    assert step.run_name.startswith("tokenizer lr=") and step.run_name.endswith(" wd=0.1 demo")
    at = step.command.index("--run-name")
    assert step.command[at + 1] == step.run_name
    predictor = world.step("predictor", tokenizer_run="0" * 32)
    assert predictor.run_name.startswith("predictor lr=") and predictor.run_name.endswith(" demo")
    assert world.step("predictor", "--finetune-mode", "lora", "--lora-rank", "8", tokenizer_run="0" * 32
                      ).run_name.startswith("predictor lora r=8 lr=")
    args = world.args()
    args.run_name_fold = (2, 5)
    assert training_step(args, "tokenizer", {}).run_name == f"fold 2/5 {step.run_name}"
    assert evaluation_step(args, "runs:/x/best_model").run_name == "fold 2/5 evaluate demo"
    args = world.args()
    args.step_overrides = {"tokenizer": {"run_name": "my run"}}  # a run_name of the user's
    named = training_step(args, "tokenizer", {})
    assert named.run_name == "my run" and named.command.count("--run-name") == 1  # the user's only


def test_a_step_whose_process_dies_without_ending_its_run_ends_it_failed_and_names_the_step(world, monkeypatch):
    step = world.step()
    pipeline = world.pipeline()
    Launches(monkeypatch, step.command, lambda run_id, env: 137)
    with pytest.raises(StepFailed, match=r"^step tokenizer ended FAILED \(exit code 137, run \w+\); the same command "
                                         "again continues from this step$"):
        pipeline.run_step(step)
    run_id = world.client.get_run(pipeline.parent_id).data.tags["pipeline.tokenizer_run_id"]
    run = world.client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["failure_reason"].startswith("step tokenizer: its process exited with code 137")
    assert world.client.get_run(pipeline.parent_id).data.tags["pipeline.failed_step"] == "tokenizer"


# --------------------------------------------------------------------------------------------
# champions


def _champions(world, runs, configs, *flags):
    from kronos_mlflow.workflows.pipeline_champions import move_champions

    pipeline = world.pipeline("--registered-model-name", NAME, *flags)
    done = move_champions(world.client, pipeline.parent_id, runs, configs, pipeline.args)
    return done, world.client.get_run(pipeline.parent_id).data.tags


def _champion(world, suffix: str = "-tokenizer"):
    from kronos_mlflow.workflows.sweep.champion import current_champion

    return current_champion(world.client, NAME + suffix)


def test_the_tokenizer_champion_moves_on_a_better_verdict_and_stays_otherwise(world):
    step = world.step()
    worse = world.training_run(step, model=True, tags={VERDICT_TAG: "inconclusive"})
    better = world.training_run(step, model=True, tags={VERDICT_TAG: "better"})
    predictor = world.training_run(world.step("predictor", tokenizer_run=better), model=False)
    configs = {"tokenizer": step.config, "predictor": world.step("predictor", tokenizer_run=better).config}

    done, tags = _champions(world, {"tokenizer": worse, "predictor": predictor}, configs)
    assert _champion(world) is None
    assert tags["tokenizer_champion_unchanged"] == (f"run {worse}'s test verdict is inconclusive, not better; "
                                                    "--promote always moves the champion regardless")
    assert tags["predictor_champion_unchanged"] == f"run {predictor} logged no model"

    done, tags = _champions(world, {"tokenizer": better, "predictor": predictor}, configs)
    assert done["tokenizer"] == f"{NAME}-tokenizer/1" and tags["tokenizer_champion"] == f"{NAME}-tokenizer/1"
    assert _champion(world).run_id == better

    done, tags = _champions(world, {"tokenizer": worse, "predictor": predictor}, configs, "--promote", "always")
    assert tags["tokenizer_champion"] == f"{NAME}-tokenizer/2" and _champion(world).run_id == worse


def test_a_better_verdict_must_also_beat_the_champion_on_the_same_test_windows(world):
    step = world.step()
    same = {TEST_WINDOWS_DIGEST_TAG: "w" * 64, VERDICT_TAG: "better"}
    champion = world.training_run(step, model=True, tags=same, metrics={TOKENIZER_TEST_LOSS: 0.5})
    predictor = world.training_run(world.step("predictor", tokenizer_run=champion), model=False)
    configs = {"tokenizer": step.config, "predictor": world.step("predictor", tokenizer_run=champion).config}
    _champions(world, {"tokenizer": champion, "predictor": predictor}, configs)
    assert _champion(world).run_id == champion

    loses = world.training_run(step, model=True, tags=same, metrics={TOKENIZER_TEST_LOSS: 0.6})
    _, tags = _champions(world, {"tokenizer": loses, "predictor": predictor}, configs)
    assert tags["tokenizer_champion_unchanged"] == (f"run {loses}'s {TOKENIZER_TEST_LOSS} 0.600000 does not beat the "
                                                    "champion's (version 1) 0.500000 on the same test windows")
    assert _champion(world).run_id == champion

    beats = world.training_run(step, model=True, tags=same, metrics={TOKENIZER_TEST_LOSS: 0.4})
    _, tags = _champions(world, {"tokenizer": beats, "predictor": predictor}, configs)
    assert tags["tokenizer_champion"] == f"{NAME}-tokenizer/2" and _champion(world).run_id == beats


def test_the_champion_never_moves_to_a_model_whose_files_are_broken_even_with_promote_always(world):
    step = world.step()
    champion = world.training_run(step, model=True, tags={VERDICT_TAG: "better"})
    predictor = world.training_run(world.step("predictor", tokenizer_run=champion), model=False)
    configs = {"tokenizer": step.config, "predictor": world.step("predictor", tokenizer_run=champion).config}
    _champions(world, {"tokenizer": champion, "predictor": predictor}, configs)
    broken = world.training_run(step, model=True, tags={VERDICT_TAG: "better"})
    files = list(world.model_files(broken).rglob("model.safetensors"))
    assert files
    for path in files:
        path.write_bytes(b"\0" * 16)
    for flags in ((), ("--promote", "always")):
        done, tags = _champions(world, {"tokenizer": broken, "predictor": predictor}, configs, *flags)
        assert tags["tokenizer_champion_unchanged"].startswith(
            f"run {broken} cannot be the champion: its logged model does not load ("), tags
        assert _champion(world).run_id == champion
    from kronos_mlflow.workflows.sweep.champion import model_version_of

    assert model_version_of(world.client, f"{NAME}-tokenizer", broken) is None  # never registered


def test_the_predictor_champion_moves_on_its_scorecard_verdict_against_the_zero_shot_pair(world):
    tok_step = world.step()
    tokenizer = world.training_run(tok_step, model=True)  # no verdict: its alias stays
    tokenizer_dir = Path(world.client.get_run(tokenizer).data.tags["run_directory"]) / "checkpoints" / "best_model"
    step = world.step("predictor", tokenizer_run=tokenizer)
    predictor = world.training_run(step, model=True, tokenizer_dir=tokenizer_dir, tags={"verdict_vs_zeroshot": "worse"})
    configs = {"tokenizer": tok_step.config, "predictor": step.config}
    _, tags = _champions(world, {"tokenizer": tokenizer, "predictor": predictor}, configs)
    assert tags["tokenizer_champion_unchanged"].startswith(f"run {tokenizer}'s test verdict is missing, not better")
    assert tags["predictor_champion_unchanged"].startswith(
        f"run {predictor}'s verdict_vs_zeroshot is worse, not better")
    assert _champion(world, "-predictor") is None

    world.client.set_tag(predictor, "verdict_vs_zeroshot", "better")  # as the pipeline's summary copies it
    _, tags = _champions(world, {"tokenizer": tokenizer, "predictor": predictor}, configs)
    assert tags["predictor_champion"] == f"{NAME}-predictor/1" and _champion(world, "-predictor").run_id == predictor
