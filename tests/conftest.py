"""Shared test set-up: keep every library off the network and every write inside tmp dirs."""

from __future__ import annotations

import os

# Set before any test module imports mlflow or comet_ml.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
os.environ.setdefault("COMET_ERROR_TRACKING_ENABLE", "false")
os.environ.setdefault("COMET_AUTO_LOG_ENV_DETAILS", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# An empty Hugging Face cache of the test session's own: `auto` (the published checkpoints when
# the cache has them) chooses fresh weights unless a test writes a cache (tests/hf_cache.py),
# whatever this machine's own cache holds. Subprocesses inherit it.
if not os.environ.get("KRONOS_TEST_HF_CACHE"):
    import atexit as _atexit
    import shutil as _shutil
    import tempfile as _tempfile

    os.environ["KRONOS_TEST_HF_CACHE"] = _tempfile.mkdtemp(prefix="kronos-test-hf-")
    _atexit.register(_shutil.rmtree, os.environ["KRONOS_TEST_HF_CACHE"], True)
os.environ["HF_HUB_CACHE"] = os.environ["KRONOS_TEST_HF_CACHE"]
os.environ.setdefault("TQDM_DISABLE", "1")

# The commands the tests press Ctrl-C on start as from a terminal: SIGINT at its default. A test
# session started as a shell's background job (`pytest ... &`, nohup) inherits SIGINT ignored, and
# Python keeps an inherited SIG_IGN (it installs KeyboardInterrupt only over the default), as does
# every process it starts: `mlflow run`, which answers Ctrl-C only through KeyboardInterrupt, would
# never hear the test's SIGINT. Each test process gives SIGINT Python's usual handler back here,
# so what it starts begins with the default, as a user's command does.
import signal as _signal  # noqa: E402

if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)

# The stage registry, built as every command builds it before it loads a config (the tests load
# configs and ask stages directly); a subprocess that does the same builds its own.
from kronos_mlflow.stages import build_registry  # noqa: E402

build_registry()

# Shared fixtures. The helpers behind them (importable by tests that need another scope or a
# subprocess environment): tests/tiny_runs.py (the one tiny config, isolated environments, the
# sqlite store) and tests/servers.py (mlflow server, PostgreSQL, wait_until).
import shutil  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from servers import MlflowServer, postgres_available, postgres_server  # noqa: E402
from tiny_runs import TRACKING_ENV, create_sqlite_store, isolate, tiny_config  # noqa: E402


@pytest.fixture()
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process, isolated: cwd, demo cache, Comet's offline dir and a sqlite MLflow store
    (``tmp_path/mlflow.db``, created on first use) all under ``tmp_path``; no inherited run,
    experiment or credential. Returns ``tmp_path``."""
    isolate(monkeypatch, tmp_path)
    return tmp_path


@pytest.fixture()
def tiny(isolated: Path):
    """``tiny(**extra)``: a validated TINY config with every output under the isolated ``tmp_path``,
    its demo market made (as a command's front door makes it: the loop and evaluation only read it)."""
    from kronos_mlflow.data import provide_qlib_data

    def make(**extra):
        config = tiny_config(isolated, **extra)
        provide_qlib_data(config)
        return config

    return make


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory) -> str:
    """One MLflow sqlite store per test module, schema created; its URI."""
    return create_sqlite_store(tmp_path_factory.mktemp("mlflow-sqlite"))


@pytest.fixture()
def tracking_env(sqlite_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """No inherited tracking variables, ``MLFLOW_TRACKING_URI`` = the module's sqlite store,
    cwd = ``tmp_path``. Returns the URI."""
    for name in TRACKING_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store)
    monkeypatch.chdir(tmp_path)
    return sqlite_store


@pytest.fixture()
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    """A real ``mlflow server`` (sqlite under ``tmp_path/server``, proxied artifacts, one worker)
    on a free 127.0.0.1 port, healthy; stopped and reaped whatever happens. ``.url``, ``.port``,
    ``.root``, ``.log_path``, ``.stop()``, ``.start()``."""
    with MlflowServer(tmp_path / "server") as server:
        yield server


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A PostgreSQL server URL: ``KRONOS_TEST_POSTGRES_URL`` (.ci/run starts one), else a
    throwaway cluster from scripts/pg_throwaway.sh; skipped when neither is possible."""
    if not postgres_available():
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql); .ci/run installs them")
    # Not under pytest's basetemp: pytest resets /tmp/pytest-of-<user> to 0700 whenever a pytest
    # starts, and the cluster runs as the postgres user when we are root.
    base = Path(tempfile.mkdtemp(prefix="kronos-test-pg-"))
    try:
        with postgres_server(base) as url:
            yield url
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def user_run(tmp_path_factory):
    """One real ``mlflow run .`` (tests/shared_runs.py), made on first use and read by several
    tests: the table of what a run records, the end-to-end checks, serving, system metrics."""
    from shared_runs import mlflow_run_main

    return mlflow_run_main(tmp_path_factory.mktemp("user-run"))


@pytest.fixture(scope="session")
def user_sweep(tmp_path_factory):
    """``mlflow run . -e sweep`` typed twice on one study (tests/shared_runs.py), read by the
    sweep tests and the Optuna Dashboard test."""
    from shared_runs import mlflow_run_sweep_twice

    return mlflow_run_sweep_twice(tmp_path_factory.mktemp("user-sweep"))


@pytest.fixture(scope="session")
def user_predictor_run(user_run):
    """One real ``mlflow run . -e predictor`` on ``user_run``'s tokenizer (tests/shared_runs.py),
    made on first use: read by the predictor training and the scorecard tests."""
    from shared_runs import mlflow_run_predictor

    return mlflow_run_predictor(user_run)


@pytest.fixture(scope="session")
def commands(tmp_path_factory):
    """``commands.run(argv, cwd=..., env=...)``: a short user command (``kronos-mlflow ...``,
    ``python -m kronos_mlflow.train ...``, ``python sweeps/sweep.py ...``) in a process of its own,
    forked from one pre-imported interpreter (tests/commands.py); a ``CompletedProcess``."""
    from commands import Commands

    runner = Commands(tmp_path_factory.mktemp("commands"))
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def predictor_sweep(tmp_path_factory):
    """``mlflow run . -e sweep`` of predictor trials on val_skill whose space draws the fine-tune
    mode (tests/shared_sweeps.py), read by the val_skill and the fine-tune-mode tests."""
    from shared_sweeps import mlflow_run_predictor_sweep

    return mlflow_run_predictor_sweep(tmp_path_factory.mktemp("predictor-sweep"))


def pytest_collection_modifyitems(config, items):
    """A test that uses the ``postgres`` fixture (directly or through another fixture) is marked
    ``postgres``: ``-m "not postgres"`` leaves out what needs the system's PostgreSQL, as
    ``-m "not browser"`` leaves out what needs Chromium (marked in its file)."""
    for item in items:
        if "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (the default) with the files of one shared session fixture on one
    worker and the long files first (tests/scheduling.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from scheduling import make_scheduler

    return make_scheduler(config, log)
