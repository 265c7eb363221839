"""stages/: one folder per stage, found by name; everything outside it asks the spec instead of
comparing stage names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kronos_mlflow.config import core as cfg
from kronos_mlflow import stages
from kronos_mlflow.errors import ConfigError

PACKAGE = Path(stages.__file__).resolve().parents[1]


def _stage_name_comparisons(path: Path) -> list[str]:
    """``x == "predictor"``, ``"tokenizer" != x``, ``x in ("tokenizer", ...)``, ``runs["tokenizer"]``
    and ``config.get("stage", "tokenizer")`` in ``path``: code that knows a stage by its name."""
    names = set(stages.names())
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in names:
            found.append(where)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and len(node.args) == 2 and all(isinstance(a, ast.Constant) for a in node.args)
                and node.args[0].value == "stage"):
            found.append(where)
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, right in zip(node.ops, node.comparators):
            values = []
            if isinstance(op, (ast.Eq, ast.NotEq)):
                values = [o.value for o in operands if isinstance(o, ast.Constant)]
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                values = [e.value for e in right.elts if isinstance(e, ast.Constant)]
            if names & {v for v in values if isinstance(v, str)}:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_no_stage_name_is_compared_outside_the_stages_folder():
    files = [p for p in PACKAGE.rglob("*.py") if "stages" not in p.relative_to(PACKAGE).parts]
    found = [hit for p in files for hit in _stage_name_comparisons(p)]
    assert not found, "compare stage names only inside kronos_mlflow/stages/ (ask the spec): " + ", ".join(found)


def test_the_check_finds_a_comparison(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('if config["stage"] == "predictor" or s in ("tokenizer", "x"):\n    pass\n'
                      'run = runs["tokenizer"]\nstage = config.get("stage", "tokenizer")\n')
    assert len(_stage_name_comparisons_at(source)) == 4


def _stage_name_comparisons_at(path: Path) -> list[str]:
    global PACKAGE
    saved, PACKAGE = PACKAGE, path.parent.parent
    try:
        return _stage_name_comparisons(path)
    finally:
        PACKAGE = saved


def test_every_stage_is_registered_in_pipeline_order_with_its_config_keys():
    assert stages.names() == ("tokenizer", "predictor") == cfg.stage_names()
    for name in stages.names():
        spec = stages.get(name)
        assert spec.name == name and spec.keys is cfg.registered()[name]
        for key in (spec.keys.learning_rate, spec.keys.save_folder, spec.keys.grad_clip, spec.keys.pretrained,
                    *(k for keys in spec.keys.models.values() for k in keys)):
            assert key in cfg.DEFAULTS, (name, key)
        assert spec.test_loss == f"test_{spec.heldout_loss}" and spec.default_study and spec.champion_suffix
    assert stages.get("predictor").keys.learning_rate == "predictor_learning_rate"
    assert cfg.canonical_key("learning_rate", "predictor") == "predictor_learning_rate"


def test_an_unknown_stage_is_one_line_naming_the_registered_ones():
    with pytest.raises(ConfigError, match="stage: 'predicter' is not one of tokenizer, predictor"):
        stages.get("predicter")


PROBE = r"""
import json, sys
from types import SimpleNamespace

import kronos_mlflow.config
from kronos_mlflow.config import load_config, stage_keys

imported = sorted(m for m in sys.modules if m.startswith("kronos_mlflow"))
try:
    load_config({})
    unbuilt = ""
except RuntimeError as exc:
    unbuilt = str(exc)
stage_keys.add(SimpleNamespace(name="tokenizer", config_keys=stage_keys.StageKeys(
    "tokenizer_learning_rate", "tokenizer_save_folder_name", "grad_clip_norm", "pretrained_tokenizer_path",
    models={"tokenizer": ("pretrained_tokenizer_path",)})))
stage_keys.mark_built()
stage = load_config({})["stage"]
loaded = sorted(m for m in sys.modules if m.startswith("kronos_mlflow"))

from kronos_mlflow import stages
stage_keys.STAGES.clear(); stage_keys._BUILT.clear()
stages.build_registry()
before = set(sys.modules)
load_config({"stage": "predictor"})
new = sorted(m for m in set(sys.modules) - before if m.startswith("kronos_mlflow"))
print(json.dumps({"imported": imported, "loaded": loaded, "unbuilt": unbuilt, "stage": stage, "new": new}))
"""


def _below_the_config(module: str) -> bool:
    return module in ("kronos_mlflow", "kronos_mlflow.errors") or module.startswith(
        ("kronos_mlflow.config.", "kronos_mlflow.runtime.")) or module in ("kronos_mlflow.config", "kronos_mlflow.runtime")


def test_importing_and_loading_the_config_imports_nothing_above_it(tmp_path):
    """The config knows no stage: importing it and loading a config (with the stages the command
    registered, here one the test enters) import nothing above ``config/`` and ``runtime/``; a
    config loaded before the command built the registry is refused in one line naming the builder."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(_below_the_config(m) for m in got["imported"]), got["imported"]
    assert all(_below_the_config(m) for m in got["loaded"]), got["loaded"]
    assert "kronos_mlflow.config.core" in got["loaded"] and got["stage"] == "tokenizer"
    assert "kronos_mlflow.stages.build_registry()" in got["unbuilt"]
    assert all(_below_the_config(m) for m in got["new"]), got["new"]


def test_one_registry_holds_the_stages_and_their_config_keys():
    from kronos_mlflow.config import stage_keys
    from kronos_mlflow.stages import registry

    assert registry.REGISTRY is stage_keys.STAGES and stage_keys.built()
    assert {name: spec.config_keys for name, spec in registry.REGISTRY.items()} == cfg.registered()
    stages.build_registry()  # a second build finds it built
    assert tuple(stage_keys.STAGES) == cfg.stage_names()
