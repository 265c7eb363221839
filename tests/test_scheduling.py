"""The test session's own scheduling (tests/scheduling.py): every test that reads a shared session
fixture is in that fixture's unit, the other tests of its file are not, and the long units are
handed out first."""

from __future__ import annotations

import pytest
import scheduling


def test_every_test_that_reads_a_shared_run_is_in_its_unit(request):
    """The unit read from the source against pytest's own fixture closure of every collected test
    (all of them in a whole-suite session)."""
    for item in request.session.items:
        reads = [name for name in scheduling.SHARED if name in item.fixturenames]
        unit = scheduling.unit_of(item.nodeid)
        if reads:
            assert unit == reads[0], item.nodeid
        elif unit in scheduling.SHARED:  # only a test that shares one of the unit's module fixtures
            assert set(item.fixturenames) - {"request"}, item.nodeid
        else:
            assert unit == item.nodeid.split("::", 1)[0], item.nodeid


def test_a_file_splits_into_its_shared_run_and_its_own_unit(tmp_path):
    source = tmp_path / "test_example.py"
    source.write_text(
        "import pytest\n\n"
        "@pytest.fixture(scope='module')\ndef derived(user_run):\n    return user_run\n\n"
        "@pytest.fixture\ndef cheap(tmp_path):\n    return tmp_path\n\n"
        "def test_reads(derived):\n    pass\n\n"
        "@pytest.mark.slow\ndef test_reads_the_sweep(user_sweep, cheap):\n    pass\n\n"
        "def test_shares_the_module_fixture(derived, cheap):\n    pass\n\n"
        "def test_alone(cheap):\n    pass\n\n"
        "class TestGroup:\n    def test_method(self, user_run):\n        pass\n")
    units = scheduling._shared_units(source)
    assert units == {"test_reads": "user_run", "test_reads_the_sweep": "user_sweep",
                     "test_shares_the_module_fixture": "user_run", "TestGroup::test_method": "user_run"}


@pytest.mark.parametrize(("nodeid", "unit"), [
    ("tests/test_train.py::test_mlflow_run_end_to_end", "user_run"),
    ("tests/test_sweep.py::test_a_sweep_and_its_resume_record_trials_parents_champion_and_plots", "user_sweep"),
    ("tests/test_model.py::test_z[a-b]", "tests/test_model.py"),
])
def test_units_of_node_ids(nodeid, unit):
    assert scheduling.unit_of(nodeid) == unit


def test_units_start_longest_first():
    units = ["tests/test_model.py", "tests/test_hostile_input.py", "user_sweep", "tests/test_cli.py", "user_run",
             "tests/test_ui_browser.py"]
    assert scheduling.order(units) == ["user_run", "user_sweep", "tests/test_hostile_input.py",
                                       "tests/test_ui_browser.py", "tests/test_model.py", "tests/test_cli.py"]
    assert set(scheduling.COST) - set(scheduling.SHARED) <= {p.name for p in scheduling.TESTS.glob("test_*.py")}
