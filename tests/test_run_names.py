"""The names runs get in the MLflow UI list (kronos_mlflow/tracking/run_names.py): stage, fine-tune mode,
key settings and market tell runs apart; a given run_name wins; a handed run whose name MLflow
made up is renamed, a name the user chose is kept. A real MLflow sqlite store, in process."""

from __future__ import annotations

from tiny_runs import create_sqlite_store

from kronos_mlflow.tracking import run_names
from kronos_mlflow.config.core import load_config
from kronos_mlflow.training.run import default_run_name


def test_a_training_run_is_named_after_its_stage_mode_settings_and_market():
    tokenizer = load_config({"tokenizer_learning_rate": 2e-4, "adam_weight_decay": 0.1})
    assert run_names.training(tokenizer) == default_run_name(tokenizer) == "tokenizer lr=2e-04 wd=0.1 demo"
    market = load_config({"tokenizer_learning_rate": 2e-4, "qlib_data_path": "/data/cn", "instrument": "csi300"})
    assert run_names.training(market).endswith(" csi300") and run_names.training(market).startswith("tokenizer lr=")
    lora = load_config({"stage": "predictor", "finetune_mode": "lora", "lora_rank": 8, "predictor_learning_rate": 4e-5})
    assert run_names.training(lora).startswith("predictor lora r=8 lr=4e-05 wd=") and run_names.training(lora).endswith(" demo")
    freeze = load_config({"finetune_mode": "freeze", "freeze_layers": 1})
    assert run_names.training(freeze).startswith("tokenizer freeze 1 lr=")
    assert run_names.training({**tokenizer, "run_name": "mine"}, fold=(2, 5)) == "mine"  # the user's own wins
    assert run_names.training(tokenizer, fold=(2, 5)) == "fold 2/5 tokenizer lr=2e-04 wd=0.1 demo"
    assert run_names.pipeline(tokenizer) == "pipeline demo" and run_names.pipeline(market) == "pipeline csi300"
    assert run_names.walkforward(tokenizer, 5) == "walkforward demo 5 folds"
    assert run_names.evaluation(tokenizer) == "evaluate demo"
    # the parts of a name take the sections they read, a test handing only those
    from kronos_mlflow.config.sections import section, sections

    assert run_names.market(sections(market).data) == "csi300" and run_names.market(section({}, "data")) == "demo"
    assert run_names.mode_words(section({"finetune_mode": "lora", "lora_rank": 4}, "finetune")) == ["lora", "r=4"]
    assert run_names.given(section({"run_name": " mine "}, "tracking")) == "mine"


def test_a_handed_run_keeps_a_users_name_and_loses_one_mlflow_made_up(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from kronos_mlflow.tracking.gate import command_run

    assert run_names.generated("bright-owl-123") and not run_names.generated("pipeline demo")
    client = MlflowClient(create_sqlite_store(tmp_path))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    new = command_run(client, "0", command="pipeline", run_name="pipeline demo")
    assert client.get_run(new).info.run_name == "pipeline demo"
    for given, expected in (("bright-owl-123", "pipeline demo"), ("my pipeline", "my pipeline")):
        handed = client.create_run("0", run_name=given).info.run_id  # what `mlflow run` hands over
        monkeypatch.setenv("MLFLOW_RUN_ID", handed)
        assert command_run(client, "0", command="pipeline", run_name="pipeline demo") == handed
        assert client.get_run(handed).info.run_name == expected
