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
