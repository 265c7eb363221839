"""How to open a sweep's study in Optuna Dashboard, recorded on the sweep's parent MLflow run
(:func:`study_tags`; docs/sweeps.md#the-study-in-optuna-dashboard).
"""

from __future__ import annotations

import os
import shlex

from ...config.secrets import redact

DEFAULT_URL = "http://127.0.0.1:8080/dashboard"


def absolute_storage(url: str) -> str:
    """``sqlite:///rel/optuna.db`` -> ``sqlite:////abs/rel/optuna.db``; other URLs unchanged."""
    prefix = "sqlite:///"
    if url.startswith(prefix):
        path = url[len(prefix):]
        if path and not path.startswith("/") and not path.startswith(":memory:") and "?" not in path:
            return prefix + os.path.abspath(path)
    return url


def dashboard_command(storage_url: str) -> str:
    """``optuna-dashboard <storage>``, password redacted."""
    return f"optuna-dashboard {shlex.quote(redact(absolute_storage(storage_url)))}"


def study_tags(storage_url: str, study_name: str) -> dict[str, str]:
    """The parent run's tags that link it to its Optuna study: ``optuna.study_name``,
    ``optuna.storage`` (the storage URL, any password replaced by ``***``; a relative sqlite path
    made absolute, so the command works from any directory), ``optuna.dashboard`` (the command that
    opens it) and ``mlflow.note.content``, the run's description in the MLflow UI, which says the
    same in words."""
    storage = redact(absolute_storage(storage_url))
    command = dashboard_command(storage_url)
    hidden = storage != absolute_storage(storage_url)
    note = (
        f"Optuna study **{study_name}** in `{storage}`.\n\n"
        "Open it in Optuna Dashboard (trials with their learning_rate, weight_decay and MLflow run id):\n\n"
        f"```\npip install optuna-dashboard\n{command}\n```\n\n"
        f"then browse {DEFAULT_URL}"
        + (" (put the storage's password where `***` stands)." if hidden else ".")
    )
    return {
        "optuna.study_name": study_name,
        "optuna.storage": storage,
        "optuna.dashboard": command,
        "mlflow.note.content": note,
    }
