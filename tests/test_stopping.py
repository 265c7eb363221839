"""stopping.py: SIGTERM / SIGINT become TrainingStopped, except inside a deferred() block (a
checkpoint being written), which runs to its end before the stop is raised."""

from __future__ import annotations

import os
import signal

import pytest

from kronos_mlflow import stopping
from kronos_mlflow.stopping import TrainingStopped


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


def test_no_signal_no_stop(installed):
    with stopping.deferred():
        with stopping.deferred():  # nested blocks
            pass
    assert stopping.received() is None
