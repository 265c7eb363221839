"""Config: defaults, YAML, overrides, aliases and one-line errors naming the key."""

from __future__ import annotations

import pytest

from kronos_mlflow.config.core import DEFAULTS, flatten, load_config
from kronos_mlflow.errors import ConfigError


def test_defaults_are_upstreams():
    c = load_config()
    assert c["instrument"] == "csi300"
    assert c["lookback_window"] == 90 and c["predict_window"] == 10
    assert c["train_time_range"] == ["2011-01-01", "2022-12-31"]
    assert c["val_time_range"] == ["2022-09-01", "2024-06-30"]
    assert c["test_time_range"] == ["2024-04-01", "2025-06-05"]
    assert c["n_train_iter"] == 100000 and c["n_val_iter"] == 20000
    assert c["tokenizer_learning_rate"] == 2e-4 and c["adam_weight_decay"] == 0.1
    assert (c["adam_beta1"], c["adam_beta2"]) == (0.9, 0.95)
    assert c["seed"] == 100 and c["epochs"] == 30 and c["batch_size"] == 50
    assert c["tokenizer_save_folder_name"] == "finetune_tokenizer_demo"


def test_yaml_then_overrides_with_aliases_and_dashes(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("epochs: 3\nlearning_rate: 1e-3\ntrain_time_range: 2012-01-01:2013-06-30\n")
    c = load_config({"epochs": "5", "weight-decay": "0.0", "--batch-size": 10}, path=path)
    assert c["epochs"] == 5
    assert c["tokenizer_learning_rate"] == pytest.approx(1e-3)
    assert c["adam_weight_decay"] == 0.0
    assert c["batch_size"] == 10
    assert c["train_time_range"] == ["2012-01-01", "2013-06-30"]


def test_flatten_is_strings_with_ranges_as_start_end():
    flat = flatten(load_config())
    assert flat["train_time_range"] == "2011-01-01:2022-12-31"
    assert flat["feature_list"] == "open,high,low,close,vol,amt"
    assert set(flat) == set(DEFAULTS)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"lerning_rate": 1}, "learning_rate"),
        ({"epochs": 0}, "epochs"),
        ({"epochs": "two"}, "epochs"),
        ({"learning_rate": "fast"}, "tokenizer_learning_rate"),
        ({"learning_rate": -1e-4}, "tokenizer_learning_rate"),
        ({"learning_rate": "nan"}, "tokenizer_learning_rate"),
        ({"batch_size": 0}, "batch_size"),
        ({"weight_decay": -0.1}, "adam_weight_decay"),
        ({"batch_size": 50, "accumulation_steps": 3}, "accumulation_steps"),
        ({"train_time_range": "2013-01-01:2012-01-01"}, "train_time_range"),
        ({"val_time_range": "2013-13-01:2014-01-01"}, "val_time_range"),
        ({"test_time_range": "2013"}, "test_time_range"),
        ({"test_time_range": "2013-01-01Tnoon:2013-02-01"}, "test_time_range"),
        ({"time_feature_list": ["hour", "weekday", "day", "month"]}, "time_feature_list"),
        ({"comet": "sometimes"}, "comet"),
        ({"comet_api_key": "abcd"}, "credential"),
        ({"d_model": 10_000_000}, "d_model"),
        ({"d_model": 30, "n_heads": 4}, "d_model"),
        ({"adam_beta2": 1.0}, "adam_beta2"),
    ],
)
def test_bad_values_name_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    message = str(err.value)
    assert needle in message and "\n" not in message


@pytest.mark.parametrize(
    "text, needle",
    [
        ("epochs: [1, 2\n", "not valid YAML"),
        ("- 1\n- 2\n", "mapping"),
        (b"\xff\xfe epochs: 1", "UTF-8"),
    ],
)
def test_bad_yaml_files(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=needle):
        load_config(path=path)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(path=tmp_path / "nope.yaml")


def test_config_file_with_a_key_twice_is_one_line(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("epochs: 3\nbatch_size: 8\nepochs: 4\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"gives 'epochs' twice \(line 3\)"):
        load_config(path=path)


def test_upstreams_inference_T_keeps_its_case_as_a_flag_and_a_file_key(tmp_path):
    """``inference_T`` (upstream's name) is reached as ``--inference-T`` and as a YAML key; other
    names are case-blind as before."""
    from kronos_mlflow.config.core import load_config

    (tmp_path / "c.yaml").write_text("inference_T: 0.7\n")
    assert load_config(path=tmp_path / "c.yaml")["inference_T"] == 0.7
    assert load_config({"inference-T": 0.8})["inference_T"] == 0.8
    assert load_config({"INSTRUMENT": "csi100"})["instrument"] == "csi100"


def test_what_a_scored_run_recorded_sits_under_the_config_file_and_the_flags(tmp_path):
    """``load_config(beneath=...)``: defaults < the run's recorded params < the file < the flags;
    and the console line names only the recorded values kept that differ from the defaults."""
    from kronos_mlflow.config.core import DEFAULTS, load_config
    from kronos_mlflow.evaluation.sources import kept_settings

    recorded = {"n_val_iter": "40", "lookback_window": "30", "predict_window": "5", "qlib_data_path": "",
                "test_time_range": "2024-01-01:2024-06-30"}
    path = tmp_path / "c.yaml"
    path.write_text("lookback_window: 60\n")
    config = load_config({"predict_window": "7"}, path=path, beneath=recorded)
    assert (config["n_val_iter"], config["lookback_window"], config["predict_window"]) == (40, 60, 7)
    assert config["test_time_range"] == ["2024-01-01", "2024-06-30"]
    assert kept_settings(recorded, config, DEFAULTS) == "n_val_iter=40, test_time_range=2024-01-01:2024-06-30"
    assert load_config(beneath={})["n_val_iter"] == DEFAULTS["n_val_iter"]
