"""kronos_mlflow.config.secrets: finding, redacting and scrubbing credentials (no network, no SDKs)."""

from __future__ import annotations

import io
import logging

import pytest

from kronos_mlflow.config.secrets import (
    REDACTED, SecretFilter, install_secret_filter, is_secret_name, redact, redact_uri, scrub_params,
    secret_values, uri_passwords,
)

SECRET_ENV = ("COMET_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_URI")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in SECRET_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "name",
    ["COMET_API_KEY", "api_key", "apiKey", "HF_TOKEN", "authToken", "db_password", "AWS_SECRET_ACCESS_KEY",
     "MLFLOW_TRACKING_TOKEN", "client-secret", "SOME_CREDENTIALS"],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["tokenizer_learning_rate", "pretrained_tokenizer_path", "TOKENIZERS_PARALLELISM", "keyboard", "learning_rate",
     "comet_project_name", "MLFLOW_TRACKING_URI"],
)
def test_ordinary_names_are_not_secret(name):
    assert not is_secret_name(name)


def test_secret_values_from_env_and_uri(monkeypatch):
    monkeypatch.setenv("COMET_API_KEY", "comet-fake-key-123")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw-4567")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-890")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:uri-pass-42@mlflow.example:5000/")
    monkeypatch.setenv("MY_SERVICE_SECRET", "svc-secret-value")
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # shorter than 4 characters: ignored
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # not a credential
    values = secret_values()
    for expected in ("comet-fake-key-123", "pw-4567", "tok-890", "uri-pass-42", "svc-secret-value"):
        assert expected in values
    assert "abc" not in values
    assert "false" not in values
    assert values == sorted(values, key=lambda v: (-len(v), v))  # longest first
    assert len(values) == len(set(values))


def test_secret_values_accepts_a_mapping():
    env = {"COMET_API_KEY": "k" * 10, "DATABASE_URL": "postgresql://u:dbpass@host/db", "PATH": "/usr/bin"}
    assert secret_values(env) == ["k" * 10, "dbpass"]


def test_uri_passwords_and_redact_uri():
    assert uri_passwords("http://u:p4ss@h:1/x and https://:only@h") == ["p4ss", "only"]
    assert uri_passwords("http://127.0.0.1:9/health") == []
    assert redact_uri("https://alice:pw@host:5000/path") == f"https://alice:{REDACTED}@host:5000/path"
    assert redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_redact(monkeypatch):
    monkeypatch.setenv("COMET_API_KEY", "comet-fake-key-123")
    text = "key=comet-fake-key-123 uri=http://bob:hunter22@h/ twice comet-fake-key-123"
    out = redact(text)
    assert "comet-fake-key-123" not in out and "hunter22" not in out
    assert out == f"key={REDACTED} uri=http://bob:{REDACTED}@h/ twice {REDACTED}"
    assert redact("nothing secret here") == "nothing secret here"
    assert redact(12345) == "12345"


def test_scrub_params(monkeypatch):
    monkeypatch.setenv("COMET_API_KEY", "comet-fake-key-123")
    params = {
        "api_key": "comet-fake-key-123",
        "password": "x",
        "tokenizer_learning_rate": 2e-4,
        "epochs": 3,
        "note": "uses comet-fake-key-123",
        "nested": {"token": "t", "path": "/data"},
        "ranges": ["a", "comet-fake-key-123"],
        "flag": True,
        "none": None,
    }
    out = scrub_params(params)
    assert "api_key" not in out and "password" not in out
    assert out["tokenizer_learning_rate"] == 2e-4 and out["epochs"] == 3
    assert out["note"] == f"uses {REDACTED}"
    assert out["nested"] == {"path": "/data"}
    assert out["ranges"] == ["a", REDACTED]
    assert out["flag"] is True and out["none"] is None
    assert params["note"] == "uses comet-fake-key-123"  # input left alone


def test_secret_filter_redacts_messages_and_tracebacks(monkeypatch):
    monkeypatch.setenv("COMET_API_KEY", "comet-fake-key-123")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretFilter())
    logger = logging.getLogger("kronos_mlflow.test_secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("key is %s", "comet-fake-key-123")
        try:
            raise RuntimeError("boom comet-fake-key-123")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    text = stream.getvalue()
    assert "comet-fake-key-123" not in text
    assert f"key is {REDACTED}" in text and f"boom {REDACTED}" in text


def test_install_secret_filter_is_idempotent():
    logger = logging.getLogger("kronos_mlflow.test_secrets.install")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    try:
        first = install_secret_filter(logger)
        second = install_secret_filter(logger)
        assert first is second
        assert sum(isinstance(f, SecretFilter) for f in logger.filters) == 1
        assert sum(isinstance(f, SecretFilter) for f in handler.filters) == 1
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(first)


def test_the_shells_directory_variables_are_not_secrets():
    from kronos_mlflow.config.secrets import redact, secret_values

    env = {"PWD": "/home/me/project", "OLDPWD": "/home/me", "DB_PASSWORD": "hunter2-long"}
    assert secret_values(env) == ["hunter2-long"]
    assert redact("sqlite:////home/me/project/optuna.db", secret_values(env)) == "sqlite:////home/me/project/optuna.db"
