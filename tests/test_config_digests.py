"""The config digest of an unchanged config stays the same: the digests below were computed from
these configs when the keys were first declared in sections (kronos_mlflow/config/keys.py), and a
run directory (``cfg-`` + 12 hex digits) and a training state's resume check depend on them. A
change here moves every existing run to a new folder: a new key declares in its
:class:`~kronos_mlflow.config.keys.Key` that its default leaves the digest as it was (``since``)."""

from __future__ import annotations

import pytest

from kronos_mlflow.config import published
from kronos_mlflow.config.core import load_config
from kronos_mlflow.config.digest import config_digest

SEVERAL = {"epochs": "3", "learning_rate": "1e-3", "batch_size": 10, "n_train_iter": 100, "comet": "off",
           "run_name": "r1", "log_interval": 7, "num_threads": 2, "backtest_signal_stride": 0,
           "finetune_mode": "lora", "lora_rank": 4, "cycle_momentum": "off", "weight_decay_scope": "matrices",
           "precision": "bf16", "experiment_name": "e", "n_test_iter": 50, "calibration": "off",
           "pretrained_tokenizer_path": "fresh", "d_model": 128, "seed": 7}
WALKFORWARD_FOLD = {"stage": "predictor", "train_time_range": "2012-01-01:2019-12-31",
                    "val_time_range": "2019-10-01:2020-12-31", "test_time_range": "2020-10-01:2021-12-31",
                    "dataset_begin_time": "2012-01-01", "dataset_end_time": "2021-12-31",
                    "finetuned_tokenizer_path": "runs:/0123456789abcdef/best_model", "finetune_mode": "freeze",
                    "freeze_layers": 1, "predictor_learning_rate": 2e-5, "eval_stride": 5,
                    "backtest_time_range": "2021-01-04:2021-12-31", "save_path": "./outputs/wf/fold_1"}

CASES = {  # name: (overrides, auto finds the published checkpoints, world_size, digest)
    "defaults": ({}, False, None, "391badd4a3065eda42f16362fa2a4c7dcc8e2a32ebb0c6190ca13d5120aea18f"),
    "defaults, published": ({}, True, None, "614e738c130655134bced853895bc60d635d6592118a0182ee199213a98a9824"),
    "predictor": ({"stage": "predictor"}, False, None,
                  "b9a68dba6c532462afd19fcedfc1e8ee91ffd48be2a43b252f9ecaf40513ee9a"),
    "predictor, published, 2 ranks": ({"stage": "predictor"}, True, 2,
                                      "408c8667516df6e6c118fa29032b40f75795b8f4a16ab7164b51f431b32f5f51"),
    "several keys, result-neutral ones too": (SEVERAL, False, None,
                                              "d0a80d18bfedc8696d6ceff6fc5f1877bd1bfc0c851ba41be0331b1f4614aa8e"),
    "a walk-forward fold": (WALKFORWARD_FOLD, True, 1,
                            "f563cad266d02f894f6b117d7e5c4d01d4af29da9b31fddd1915d7a58df9d4fc"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_digest_of_an_unchanged_config_stays_the_same(name, monkeypatch):
    overrides, found, world_size, expected = CASES[name]
    # what auto decided, fixed: the digest holds the decision (config/published.py)
    for key, hub_id in (("pretrained_tokenizer_path", "NeoQuasar/Kronos-Tokenizer-base"),
                        ("pretrained_predictor_path", "NeoQuasar/Kronos-small")):
        monkeypatch.setitem(published._DECIDED, key, (hub_id if found else "", "fixed by the test"))
    assert config_digest(load_config(overrides), world_size=world_size) == expected
