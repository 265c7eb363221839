"""The project's own files agree with each other: conda.yaml vs pyproject, MLproject vs config."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from kronos_mlflow.config import core as cfg
from kronos_mlflow.config.stage_keys import MLPROJECT_PARAMS

ROOT = Path(__file__).resolve().parents[1]


def _mlproject():
    return yaml.safe_load((ROOT / "MLproject").read_text())


def test_conda_pip_dependencies_match_pyproject():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    conda = yaml.safe_load((ROOT / "conda.yaml").read_text())
    pip_block = next(d["pip"] for d in conda["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert sorted(pip_block) == sorted(pyproject["project"]["dependencies"])


def test_mlproject_main_parameters_are_the_interface():
    params = _mlproject()["entry_points"]["main"]["parameters"]
    launcher = {"config_file", "max_restarts"}  # read by the command itself / torchrun, not config keys
    assert set(params) - launcher == set(MLPROJECT_PARAMS)
    for name, spec in params.items():
        if name in launcher:
            continue
        default = cfg.DEFAULTS[MLPROJECT_PARAMS[name]]
        if name == "qlib_data_path":
            assert spec["default"] == ""  # empty: the built-in demo market
        elif isinstance(default, list):
            assert spec["default"] == ":".join(default)
        else:
            assert type(default)(spec["default"]) == default, name


def test_mlproject_main_is_one_command_that_names_each_parameter_once():
    """``main``: the launcher checks the training flags in its process (``--check-first``), then
    hands the same flags to torchrun's workers; torchrun's process count and restarts come from
    the checked flags, so each parameter is named once. ``predictor`` is the same command with
    the predictor's training module."""
    entries = _mlproject()["entry_points"]
    for entry, module in (("main", "kronos_mlflow.train"), ("predictor", "kronos_mlflow.train_predictor")):
        assert entries[entry]["command"].startswith(
            f"python -m kronos_mlflow.launch --check-first --standalone -m {module} "), entry


def test_every_mlproject_entry_point_is_one_command_that_names_each_parameter_once():
    """No entry point lists its flags twice (a ``--check ... && ...`` pair): each is one command
    and each declared parameter appears in it exactly once."""
    for entry, spec in _mlproject()["entry_points"].items():
        command = spec["command"]
        assert "&&" not in command, entry
        for name in spec["parameters"]:
            assert command.count("{" + name + "}") == 1, (entry, name)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"^python3 -m venv .*pytest.*$", readme, flags=re.M)
    assert commands, "README.md must show the test command"
    assert commands[0].strip() in ci


def test_requires_python_covers_what_the_tests_import_and_conda_pins():
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = (int(x) for x in re.fullmatch(r">=(\d+)\.(\d+)", floor).groups())
    assert (major, minor) >= (3, 11), floor  # tomllib, imported above, is new in 3.11
    conda = yaml.safe_load((ROOT / "conda.yaml").read_text())
    pinned = next(d for d in conda["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert tuple(int(x) for x in pinned.split("=")[1].split(".")[:2]) >= (major, minor), pinned
