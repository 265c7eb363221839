"""The validators every front door uses (kronos_mlflow/config/checks.py), checked against the
libraries whose limits they stand for: MLflow's own name checks and store registry, numpy's and
Optuna's seeds, the process count a machine holds."""

from __future__ import annotations

import os

import pytest

from kronos_mlflow.config import checks
from kronos_mlflow.errors import ConfigError, UserError


def _mlflow_refuses_model_name(name: str) -> bool:
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name

    try:
        _validate_model_name(name)
        return False
    except MlflowException:
        return True


@pytest.mark.parametrize("name", ["kronos-tokenizer", "a/b:c%", "a/b", "x:y", "./a", "a/../b", "..", ".", " ",
                                  "a b", "a%b", "a@b", "Kronos_Tokenizer.v2", "/abs"])
def test_registered_model_names_mlflow_refuses_are_refused(name):
    """Every name MLflow's registry refuses (after a whole training) is refused when the config is
    read; the names MLflow takes pass."""
    refused = True
    try:
        checks.mlflow_model_name("registered_model_name", name)
        refused = False
    except ConfigError as exc:
        assert "registered_model_name" in str(exc) and "\n" not in str(exc)
    assert refused == _mlflow_refuses_model_name(name)


def test_longer_names_than_the_store_columns_are_refused():
    checks.mlflow_model_name("m", "m" * 256)
    with pytest.raises(ConfigError, match="256"):
        checks.mlflow_model_name("m", "m" * 257)
    checks.mlflow_experiment_name("e", "e" * 256)
    with pytest.raises(ConfigError, match="256"):
        checks.mlflow_experiment_name("e", "e" * 257)
    with pytest.raises(ConfigError, match="250"):
        checks.mlflow_run_name("r", "r" * 251)


def test_tracking_schemes_are_those_mlflow_serves():
    from mlflow.tracking._model_registry.utils import _get_store_registry
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    assert set(checks.TRACKING_SCHEMES) == set(_tracking_store_registry._registry)
    assert set(checks.TRACKING_SCHEMES) == set(_get_store_registry()._registry)


@pytest.mark.parametrize("uri, needle", [
    ("ftp://host/x", "scheme 'ftp'"),
    ("sqlite:////nonexistent/dir/m.db", "does not exist"),
    ("file:///dev/null/x", "/dev/null"),
    ("http://", "names no host"),
    ("https://user:pw-NOT-SHOWN@nosuch", None),  # accepted here: the probe says whether it answers
])
def test_tracking_uris(uri, needle):
    if needle is None:
        assert checks.tracking_uri(uri, "MLFLOW_TRACKING_URI") == uri
        return
    with pytest.raises(UserError) as info:
        checks.tracking_uri(uri, "MLFLOW_TRACKING_URI")
    assert needle in str(info.value) and "MLFLOW_TRACKING_URI" in str(info.value)


def test_a_uri_password_is_never_shown():
    with pytest.raises(UserError) as info:
        checks.tracking_uri("ftp://user:pw-NOT-SHOWN@host/x", "MLFLOW_TRACKING_URI")
    assert "pw-NOT-SHOWN" not in str(info.value)


def test_seeds_are_what_numpy_and_optuna_take():
    import numpy as np
    import optuna

    top = checks.seed("seed", checks.SEED_MAX)
    np.random.seed(top)
    optuna.samplers.TPESampler(seed=top)
    with pytest.raises(ConfigError, match="4,294,967,295"):
        checks.seed("seed", checks.SEED_MAX + 1)
    with pytest.raises(ValueError):
        np.random.seed(checks.SEED_MAX + 1)  # the limit is numpy's, not ours


@pytest.mark.parametrize("value, ok", [("12", True), ("1e3", True), (7, True), ("1.5", False), ("nan", False),
                                       ("inf", False), ("1e400", False), ("abc", False), (True, False), ("-1", False)])
def test_integers(value, ok):
    if ok:
        assert isinstance(checks.integer("k", value, 0, 10**6), int)
    else:
        with pytest.raises(ConfigError, match="k:"):
            checks.integer("k", value, 0, 10**6)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", float("nan"), "x", True])
def test_numbers_are_finite(value):
    with pytest.raises(ConfigError):
        checks.number("k", value, 0.0, 1.0)


@pytest.mark.parametrize("name, ok", [("run-1", True), ("../x", False), ("a/b", False), ("a\\b", False),
                                      (".hidden", False), ("..", False), ("", False), ("/abs", False),
                                      ("x" * 300, False), ("tab\there", False)])
def test_child_names_stay_inside(name, ok):
    if ok:
        assert checks.child_name("folder", name, "save_path") == name
    else:
        with pytest.raises(ConfigError, match="save_path"):
            checks.child_name("folder", name, "save_path")


def test_directories(tmp_path):
    (tmp_path / "f").write_text("x")
    assert checks.directory("p", tmp_path / "new" / "deeper")  # creatable
    with pytest.raises(ConfigError, match="is a file"):
        checks.directory("p", tmp_path / "f")
    with pytest.raises(ConfigError, match="lies under"):
        checks.directory("p", tmp_path / "f" / "sub")


def test_process_count_fits_the_machine():
    import torch

    from kronos_mlflow.training.preflight import check_processes

    cpus = len(os.sched_getaffinity(0))
    check_processes(4 * cpus, torch.device("cpu"))
    with pytest.raises(ConfigError, match="nproc_per_node"):
        check_processes(4 * cpus + 1, torch.device("cpu"))
