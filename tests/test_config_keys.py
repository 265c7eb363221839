"""The key declarations (kronos_mlflow/config/keys.py) against what reads them: the MLproject's
entry points, the digest, the typed sections."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from kronos_mlflow.config import core as cfg
from kronos_mlflow.config import digest, keys, sections as sec
from kronos_mlflow.config.keys import KEY, KEYS, SECTIONS

ROOT = Path(__file__).resolve().parents[1]


def test_every_key_is_declared_once_in_a_section_with_its_help():
    assert list(cfg.DEFAULTS) == [key.name for key in KEYS] and len(KEY) == len(KEYS)
    assert {key.section for key in KEYS} == set(SECTIONS)
    for key in KEYS:
        assert key.help.strip() and "\n" not in key.help, key.name
        assert isinstance(cfg.DEFAULTS[key.name], key.type), key.name
        if key.kind in ("int", "float"):  # every number has a largest value, or a rule of its own
            assert key.high is not None or key.rule is not None or key.low == keys.UNIT_OPEN, key.name


def test_entry_points_are_the_mlprojects():
    """``Key.entry_points`` names the MLproject entry points that take the key (by its name or an alias)."""
    project = yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"]
    taken: dict[str, set[str]] = {key.name: set() for key in KEYS}
    for entry, body in project.items():
        stage = "predictor" if entry == "predictor" else "tokenizer"
        for name in body.get("parameters", {}):
            key = name if name in cfg.DEFAULTS else cfg.canonical_key(name, stage)
            if key in taken:
                taken[key].add(entry)
    for key in KEYS:
        assert set(key.entry_points) == taken[key.name], key.name


def test_the_digest_tables_are_read_from_the_declarations():
    assert digest.RESULT_NEUTRAL_KEYS == {key.name for key in KEYS if key.neutral}
    assert digest.DEFAULT_OMITTED == {"cycle_momentum": "on", "finetune_mode": "full", "predictor_objective": "tokens",
                                      "return_loss_weight": 1.0}
    assert digest.MODE_KEYS == {"lora_rank": ("finetune_mode", "lora"), "lora_alpha": ("finetune_mode", "lora"),
                                "lora_dropout": ("finetune_mode", "lora"), "lora_targets": ("finetune_mode", "lora"),
                                "freeze_layers": ("finetune_mode", "freeze"),
                                "return_loss_weight": ("predictor_objective", "tokens+return")}
    base = cfg.load_config({"pretrained_tokenizer_path": "fresh"})
    for key in ("run_name", "num_threads", "backtest_signal_stride"):  # neutral: the same digest
        other = cfg.load_config({"pretrained_tokenizer_path": "fresh", key: "x" if key == "run_name" else 3})
        assert digest.config_digest(other) == digest.config_digest(base), key
    assert digest.config_digest(cfg.load_config({"pretrained_tokenizer_path": "fresh", "epochs": 3})) != \
        digest.config_digest(base)


def test_sections_hold_every_key_typed_and_frozen():
    config = cfg.load_config({"backtest_signal_stride": 0, "comet": "off", "stage": "predictor"})
    every = sec.sections(config)
    assert every.backtest.backtest_signal_stride == 0 and every.comet.comet == "off"
    assert every.job.stage == "predictor" and every.data.train_time_range == ("2011-01-01", "2022-12-31")
    seen = {}
    for name in SECTIONS:
        part = getattr(every, name)
        assert type(part) is sec.section_type(name) and part.section == name
        for field in dataclasses.fields(part):
            value = getattr(part, field.name)
            assert value == (tuple(config[field.name]) if isinstance(config[field.name], list) else config[field.name])
            seen[field.name] = name
    assert seen == {key.name: key.section for key in KEYS}
    with pytest.raises(dataclasses.FrozenInstanceError):
        every.backtest.backtest_signal_stride = 2  # type: ignore[misc]
    # a component handed a section takes one built from a few keys too (the rest at their defaults)
    assert sec.section({"backtest_n_random": 3}, "backtest").backtest_n_symbol_drop == 5
    assert sec.as_section(every.backtest, "backtest") is every.backtest
