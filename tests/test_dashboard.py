"""The sweep parent's link to its study (``kronos_mlflow.workflows.sweep.dashboard``): absolute, redacted, runnable."""

from __future__ import annotations

import shlex

from kronos_mlflow.workflows.sweep.dashboard import study_tags


def test_relative_sqlite_storage_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tags = study_tags("sqlite:///optuna.db", "lr-wd")
    assert tags["optuna.storage"] == f"sqlite:///{tmp_path}/optuna.db"
    assert shlex.split(tags["optuna.dashboard"]) == ["optuna-dashboard", f"sqlite:///{tmp_path}/optuna.db"]
    assert tags["optuna.study_name"] == "lr-wd"
    assert tags["optuna.dashboard"] in tags["mlflow.note.content"] and "***" not in tags["mlflow.note.content"]


def test_password_is_redacted_everywhere(monkeypatch):
    monkeypatch.setenv("OPTUNA_DB_PASSWORD", "s3cret-pw")
    tags = study_tags("postgresql://bob:s3cret-pw@db.example:5432/optuna", "s")
    for value in tags.values():
        assert "s3cret-pw" not in value
    assert tags["optuna.dashboard"] == "optuna-dashboard 'postgresql://bob:***@db.example:5432/optuna'"
    assert "password" in tags["mlflow.note.content"]


def test_other_urls_are_kept():
    assert study_tags("sqlite:////abs/o.db", "s")["optuna.storage"] == "sqlite:////abs/o.db"
    assert study_tags("mysql+pymysql://u@h/optuna", "s")["optuna.storage"] == "mysql+pymysql://u@h/optuna"
