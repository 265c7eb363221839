"""stopping.py: SIGTERM / SIGINT become TrainingStopped, except inside a deferred() block (a
checkpoint being written), which runs to its end before the stop is raised."""

from __future__ import annotations

import os
import signal

import pytest

from kronos_mlflow.runtime import stopping
from kronos_mlflow.runtime.stopping import TrainingStopped


@pytest.fixture()
def installed():
    saved = {sig: signal.getsignal(sig) for sig in stopping.STOP_SIGNALS}
    assert stopping.install()
    yield
    stopping.install()  # forget what this test received
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_raises_where_the_process_is(installed):
    with pytest.raises(TrainingStopped) as info:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # Python runs the handler between bytecodes, here
            pass
        pytest.fail("the signal was not raised")
    assert info.value.signum == signal.SIGTERM and stopping.received() == signal.SIGTERM


def test_a_signal_inside_a_deferred_block_waits_for_its_end(installed, tmp_path):
    done = []
    with pytest.raises(TrainingStopped) as info:
        with stopping.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for i in range(3):  # the "checkpoint" is written whole
                (tmp_path / f"part{i}").write_text("x")
                done.append(i)
    assert done == [0, 1, 2]
    assert info.value.signum == signal.SIGINT and stopping.received() == signal.SIGINT


def test_a_second_signal_while_stopping_is_ignored(installed):
    with pytest.raises(TrainingStopped):
        with stopping.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
    assert stopping.received() == signal.SIGTERM
    os.kill(os.getpid(), signal.SIGTERM)  # the run is already being ended: no second raise


def test_an_error_after_a_signal_stands_for_the_stop(installed):
    """A rank inside a collective when the signal came: its peer stopped first and closed the
    connection, so the collective fails; that failure is the stop, not a crash."""
    with pytest.raises(RuntimeError) as info:
        with stopping.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("Connection closed by peer")
    stop = stopping.standing_for(info.value)
    assert isinstance(stop, TrainingStopped) and stop.signum == signal.SIGTERM
    assert stopping.standing_for(stop) is None  # already the stop: raised as it is


def test_an_error_without_a_signal_is_a_failure(installed):
    assert stopping.standing_for(RuntimeError("boom")) is None


def test_no_signal_no_stop(installed):
    with stopping.deferred():
        with stopping.deferred():  # nested blocks
            pass
    assert stopping.received() is None


# A training process stopped inside its end-of-epoch save: the same command line with a hook that
# sends SIGTERM to the process itself at the Nth save, at one point of it (while the metrics the
# state counts are sent, or while the new state directory is swapped in).
STOP_INSIDE_SAVE = """
import os, signal, sys
where, nth = sys.argv[1], int(sys.argv[2])
del sys.argv[1:3]
from kronos_mlflow.training.checkpoint import state
from kronos_mlflow.tracking.mlflow import MLflowLogger
calls = []
def wrap(owner, name):
    original = getattr(owner, name)
    def hooked(*args, **kwargs):
        calls.append(name)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered between the bytecodes of what follows
        return original(*args, **kwargs)
    setattr(owner, name, hooked)
wrap(MLflowLogger, "persist") if where == "persist" else wrap(state, "_swap_in")
from kronos_mlflow.train import cli
sys.exit(cli(prog="python -m kronos_mlflow.train"))
"""


@pytest.mark.slow
def test_a_stop_inside_the_epoch_save_keeps_that_epoch_and_ends_killed_in_one_line(tmp_path):
    """SIGTERM while epoch 0's state is saved (its metrics being sent), then, after the same
    command resumed, while epoch 1's state is swapped in: each time the state of that epoch is
    kept whole, the run ends KILLED with its stop_reason, the process exits 143 with one line
    and no traceback ("database is locked" was one), and no metric step is logged twice."""
    import json
    import subprocess
    import sys

    from mlflow import MlflowClient

    from tiny_runs import create_sqlite_store, isolated_env, run_dir, train_command

    uri = create_sqlite_store(tmp_path)
    env = isolated_env(tmp_path, uri)
    command = train_command(tmp_path, epochs=3)[3:]  # the flags after `python -m kronos_mlflow.train`
    state_json = None
    for where, nth, epoch in (("persist", 2, 0), ("swap", 1, 1)):  # save 1 is epoch -1's; a resume has none
        proc = subprocess.run([sys.executable, "-c", STOP_INSIDE_SAVE, where, str(nth), *command], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        said = proc.stdout + proc.stderr
        assert proc.returncode == 143, said[-3000:]
        assert "Traceback" not in said and "database is locked" not in said, said[-3000:]
        stops = [line for line in proc.stderr.splitlines() if "stopped by SIGTERM" in line]
        assert len(stops) == 1, proc.stderr[-3000:]
        state_json = run_dir(tmp_path / "outputs") / "checkpoints" / "last" / "state.json"
        assert json.loads(state_json.read_text())["epoch"] == epoch, where
        (run,) = MlflowClient(uri).search_runs(["0"])
        assert run.info.status == "KILLED" and "stopped by SIGTERM" in run.data.tags["stop_reason"], where
    history = MlflowClient(uri).get_metric_history(run.info.run_id, "val_tokenizer_loss_epoch")
    assert sorted(m.step for m in history) == [0, 1]
