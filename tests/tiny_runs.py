"""Tiny trainings for the tests (a few seconds each): the one tiny config and isolated environments.

``TINY`` is the architecture and data size of every end-to-end run in ``tests/``. Fixtures that
wrap these helpers live in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = {
    "d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2, "s1_bits": 4, "s2_bits": 4,
    "lookback_window": 20, "predict_window": 5, "batch_size": 8, "n_train_iter": 64, "n_val_iter": 36,
    "epochs": 2, "log_interval": 1000, "n_eval_windows": 100,
    # the backtest on the scorecard's origins, without random controls: each control is one more
    # Qlib backtest (about 2 s) and a daily signal one more forecast per symbol and day
    "backtest_signal_stride": 0, "backtest_n_random": 0,
}
# TINY without epochs, for sweeps and tests that set the epochs themselves
TINY_NO_EPOCHS: dict[str, Any] = {k: v for k, v in TINY.items() if k != "epochs"}
# Variables that point a process at some tracking store, run, experiment or credential.
TRACKING_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID",
                "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT", "COMET_API_KEY",
                "COMET_OFFLINE_DIRECTORY")


def tiny_values(tmp: Path, **extra: Any) -> dict[str, Any]:
    """TINY on the demo market, Comet off, every output under ``tmp`` (plain values, not validated)."""
    return {**TINY, "qlib_data_path": "", "comet": "off", "dataset_path": str(Path(tmp) / "cache"),
            "save_path": str(Path(tmp) / "outputs"), **extra}


def tiny_config(tmp: Path, **extra: Any) -> dict:
    """A validated config: TINY on the demo market, Comet off, every output under ``tmp``."""
    from kronos_mlflow.config.core import load_config

    return load_config(tiny_values(tmp, **extra))


def train_command(tmp: Path, **extra: Any) -> list[str]:
    """``python -m kronos_mlflow.train`` with TINY (plus ``extra``) as flags."""
    flags: list[str] = []
    for key, value in tiny_values(tmp, **extra).items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return [sys.executable, "-m", "kronos_mlflow.train", *flags]


def write_config(path: Path, **values: Any) -> Path:
    """A YAML config file at ``path`` (flat ``key: value`` lines, as users write them)."""
    Path(path).write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return Path(path)


def isolated_vars(tmp: Path, tracking_uri: str | None = None) -> dict[str, str]:
    """What every isolated process gets: demo cache, Comet and (by default sqlite) MLflow under ``tmp``."""
    return {
        "KRONOS_MLFLOW_HOME": str(Path(tmp) / "home"),
        "MLFLOW_TRACKING_URI": tracking_uri or sqlite_uri(tmp),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "TQDM_DISABLE": "1",
        "COMET_DISABLE_AUTO_LOGGING": "1",
        "COMET_OFFLINE_DIRECTORY": str(Path(tmp) / "comet"),
    }


def isolated_env(tmp: Path, tracking_uri: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess: demo market, caches and MLflow all under ``tmp``; no
    inherited MLFLOW_*/KRONOS_* variable, run, experiment or credential (``extra`` adds its own)."""
    env = {k: v for k, v in os.environ.items() if k not in TRACKING_ENV and not k.startswith(("MLFLOW_", "KRONOS_"))}
    env.update({**isolated_vars(tmp, tracking_uri), **(extra or {})})
    return env


def isolate(mp: Any, tmp: Path) -> None:
    """Isolate this process with ``mp`` (a pytest MonkeyPatch): no inherited tracking variable,
    ``isolated_vars(tmp)`` set, cwd = ``tmp``."""
    for name in TRACKING_ENV:
        mp.delenv(name, raising=False)
    for name, value in isolated_vars(tmp).items():
        mp.setenv(name, value)
    mp.chdir(tmp)


def sqlite_uri(root: Path) -> str:
    return f"sqlite:///{Path(root) / 'mlflow.db'}"


def _migrated_store() -> Path:
    """This process's template store: an MLflow sqlite store whose schema MLflow created (which
    costs seconds) in a directory of its own, made on first use and removed at exit."""
    global _TEMPLATE
    if _TEMPLATE is None:
        import atexit
        import shutil
        import tempfile

        import pytest
        from mlflow import MlflowClient

        root, pid = Path(tempfile.mkdtemp(prefix="kronos-test-store-")), os.getpid()
        atexit.register(lambda: os.getpid() == pid and shutil.rmtree(root, ignore_errors=True))  # not a fork's exit
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)  # the store (cached per process) resolves its default artifact root ./mlruns now
            MlflowClient(sqlite_uri(root)).search_experiments()
        _TEMPLATE = root
    return _TEMPLATE


_TEMPLATE: Path | None = None


def create_sqlite_store(root: Path) -> str:
    """An MLflow sqlite store under ``root`` with its schema created (which must happen once
    before several processes race to migrate it); its URI. The store is a copy of a template
    that MLflow created (the migration costs seconds, a copy none), with its Default
    experiment's artifact root moved to ``root/mlruns/0``, where MLflow would have put it."""
    import shutil
    import sqlite3

    template = _migrated_store()
    shutil.copyfile(template / "mlflow.db", Path(root) / "mlflow.db")
    old, new = os.path.realpath(template), os.path.realpath(root)
    with sqlite3.connect(Path(root) / "mlflow.db") as db:
        (location,) = db.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()
        assert location.startswith(old), (location, old)  # MLflow put it under the template's cwd
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                   (new + location[len(old):],))
    db.close()
    return sqlite_uri(root)


def run_dir(save_path: Path, folder: str = "finetune_tokenizer_demo") -> Path:
    """The one run directory under ``{save_path}/{folder}`` (``cfg-<digest>``: see layout.py)."""
    found = sorted(p for p in (Path(save_path) / folder).glob("cfg-*") if p.is_dir())
    assert len(found) == 1, f"expected one run directory under {Path(save_path) / folder}, found {found}"
    return found[0]


def pipeline_workdir(root: Path) -> tuple[Path, dict[str, str]]:
    """``root`` with a tiny config file (``tiny.yaml``: the tiny model, 2 layers, no sizes: the
    command's -P values give them) and an isolated environment on a sqlite store of its own:
    where the pipeline and walk-forward tests type their commands."""
    root.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in TINY.items() if k not in ("epochs", "batch_size", "n_train_iter", "n_val_iter")}
    write_config(root / "tiny.yaml", **config, n_layers=2, save_path=str(root / "outputs"),
                 dataset_path=str(root / "cache"))
    return root, isolated_env(root, create_sqlite_store(root))


def fault_injection():
    """``benchmarks/fault_injection.py`` as a module (preempt a torchrun rank, kill a process tree)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fault_injection",
                                                  Path(__file__).resolve().parents[1] / "benchmarks" / "fault_injection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def process_under(root_pid: int, *words: bytes) -> int | None:
    """The first process under ``root_pid`` whose argv holds every one of ``words``, or None."""
    for pid in fault_injection().descendants(root_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(word in argv for word in words):
            return pid
    return None


def interrupt_when(proc, ready: Callable[[], object], stderr: Path, timeout_s: float = 300) -> int:
    """Ctrl-C for a command started in a session of its own: once ``ready()`` returns, SIGINT
    ``proc`` and wait for it to exit; its process group is SIGKILLed if it is still there on the
    way out. Returns how many bytes ``stderr`` held when the signal was sent (what follows is
    what the command said about the stop)."""
    import signal

    try:
        ready()
        before = Path(stderr).stat().st_size
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return before


def torchrun_to_the_end(cmd: list[str], root: Path, env: Mapping[str, str], *, kill_rank_after_epoch0: str | None = None,
                        timeout: float = 600) -> str:
    """Run a torchrun command in ``root`` (output in ``root/torchrun.log``) to its end; with
    ``kill_rank_after_epoch0`` (a run folder under ``root/outputs``), SIGKILL rank 1 once epoch 0's
    training state is saved (torchrun then restarts the group). Asserts exit code 0; the output."""
    import subprocess

    faults = fault_injection()
    log = Path(root) / "torchrun.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=root, env=dict(env), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if kill_rank_after_epoch0:
            faults.preempt(proc, Path(root) / "outputs" / kill_rank_after_epoch0, rank=1, after_epoch=0)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            faults.kill_tree(proc.pid)
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    return output


def forget_published() -> None:
    """Decide ``auto`` again on next use (after a test changed the Hugging Face cache)."""
    from kronos_mlflow.config import published

    published._DECIDED.clear()
