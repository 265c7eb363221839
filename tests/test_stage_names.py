"""The names a finished run shows its users, pinned per stage: metric, tag, param and artifact
names, and the names of its logged models, against ``tests/golden/stage_names.json``.

Two tiny trainings in this process through ``kronos_mlflow.training.run.main`` (what ``python -m
kronos_mlflow.train`` and ``kronos-mlflow train`` run after parsing their flags), in one sqlite
store: the tokenizer on the demo market, then the predictor on that run's
``runs:/<id>/best_model`` (as tests/test_predictor_train.py's ``mlflow run . -e predictor``
does), with the scorecard and backtest on (``evaluate: on``, the default). A renamed, lost or
added name fails with the names missing and the names extra.

Not compared, because their presence depends on the machine rather than on the code:
``system/*`` metrics (MLflow's system metrics: GPU ones only where a GPU is visible, each
sampled by a thread) and the tags of :data:`ENVIRONMENT_TAGS` (MLflow's user and source
context, and the git commit, absent outside a git checkout).

After an intended change of names, regenerate the golden file and review its diff::

    KRONOS_TEST_UPDATE_GOLDEN=1 python -m pytest tests/test_stage_names.py
    python tests/test_stage_names.py          # the same
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from tiny_runs import isolate, tiny_config

GOLDEN = Path(__file__).resolve().parent / "golden" / "stage_names.json"
UPDATE = os.environ.get("KRONOS_TEST_UPDATE_GOLDEN", "") not in ("", "0")
ENVIRONMENT_TAGS = frozenset({"mlflow.user", "mlflow.source.name", "mlflow.source.type", "mlflow.source.git.commit",
                              "mlflow.source.git.branch", "mlflow.source.git.repoURL", "mlflow.source.git.dirty"})
KINDS = ("metrics", "tags", "params", "artifacts", "logged_models")
# Fewer windows than TINY's: the names do not depend on how many windows a run sees.
SIZES = {"epochs": 1, "n_train_iter": 16, "n_val_iter": 16, "n_test_iter": 40}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One isolated directory (cwd, demo cache, sqlite store, no inherited tracking variable)
    for both runs of this module; its path and the MlflowClient of its store."""
    from mlflow import MlflowClient

    tmp = tmp_path_factory.mktemp("stage-names")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp)
        yield tmp, MlflowClient(os.environ["MLFLOW_TRACKING_URI"])


def _train(tmp: Path, client, **extra):
    """``train.main`` of a TINY config with ``extra``; the finished run it made."""
    import mlflow

    from kronos_mlflow.training import run as train

    before = {r.info.run_id for r in client.search_runs(["0"])}
    from kronos_mlflow.config.core import load_config

    config = load_config(tiny_config(tmp, **{**SIZES, **extra}))
    asked = copy.deepcopy(config)
    try:
        train.main(config)
    finally:
        mlflow.set_tracking_uri(None)  # log_best_model sets MLflow's process-global URI: do not leak it
    (run,) = [r for r in client.search_runs(["0"]) if r.info.run_id not in before]
    assert run.info.status == "FINISHED"
    # what auto and the launch resolved is a record apart (resolved.json): the config is as validated
    assert config == asked and config["run_name"] == ""
    record = json.loads(Path(client.download_artifacts(run.info.run_id, "resolved.json", str(tmp))).read_text())
    assert record["run_name"] == run.data.params["run_name"] == run.info.run_name
    assert record["nproc_per_node"] == 1 and record["world_size"] == 1 and record["device"] == "cpu"
    assert set(record["starts"]) == {key[:-len("_source")] for key in run.data.tags if key.endswith("_path_source")}
    return run


@pytest.fixture(scope="module")
def tokenizer_run(store):
    tmp, client = store
    return _train(tmp, client)


@pytest.fixture(scope="module")
def predictor_run(store, tokenizer_run):
    tmp, client = store
    return _train(tmp, client, stage="predictor", n_layers=2, evaluate="on",
                  finetuned_tokenizer_path=f"runs:/{tokenizer_run.info.run_id}/best_model")


def names_of(client, run) -> dict[str, list[str]]:
    """The sorted names of each kind the run shows: metrics, tags, params, artifact paths (the
    root's entries and those one folder below) and the names of the models it logged."""
    run_id = run.info.run_id
    artifacts = []
    for entry in client.list_artifacts(run_id):
        artifacts.append(entry.path)
        if entry.is_dir:
            artifacts += [child.path for child in client.list_artifacts(run_id, entry.path)]
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id],
                                         filter_string=f"source_run_id = '{run_id}'")
    return {
        "metrics": sorted(m for m in run.data.metrics if not m.startswith("system/")),
        "tags": sorted(t for t in run.data.tags if t not in ENVIRONMENT_TAGS),
        "params": sorted(run.data.params),
        "artifacts": sorted(artifacts),
        "logged_models": sorted(m.name for m in models),
    }


def differences(golden: dict[str, list[str]], seen: dict[str, list[str]]) -> list[str]:
    """One line per kind whose names differ: those the golden file has and the run lacks, and
    those the run has beyond it."""
    lines = []
    for kind in KINDS:
        want, got = set(golden.get(kind, [])), set(seen.get(kind, []))
        if want != got:
            lines.append(f"{kind}: missing {sorted(want - got)}, extra {sorted(got - want)}")
    return lines


def _check(stage: str, seen: dict[str, list[str]]) -> None:
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    if UPDATE:
        golden[stage] = seen
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")
        return
    assert stage in golden, f"{GOLDEN} has no {stage!r} entry; regenerate it (see this module's docstring)"
    diff = differences(golden[stage], seen)
    assert not diff, (f"the {stage} run's names differ from {GOLDEN.name} (an intended change: regenerate it, "
                      "see tests/test_stage_names.py):\n  " + "\n  ".join(diff))


def test_the_tokenizer_runs_names_are_the_golden_ones(store, tokenizer_run):
    _check("tokenizer", names_of(store[1], tokenizer_run))


def test_the_predictor_runs_names_are_the_golden_ones(store, predictor_run):
    """Also the one in-process fit of the predictor stage through ``train.main``, scorecard included."""
    seen = names_of(store[1], predictor_run)
    assert predictor_run.data.tags["tokenizer_run_id"] in predictor_run.data.tags["tokenizer_uri"]
    _check("predictor", seen)


def test_a_changed_name_is_reported_missing_and_extra():
    golden = {"metrics": ["a", "b"], "tags": ["t"], "params": [], "artifacts": ["x"], "logged_models": ["m"]}
    seen = {**golden, "metrics": ["a", "c"]}
    assert differences(golden, golden) == []
    assert differences(golden, seen) == ["metrics: missing ['b'], extra ['c']"]


if __name__ == "__main__":
    import sys

    os.environ["KRONOS_TEST_UPDATE_GOLDEN"] = "1"
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
