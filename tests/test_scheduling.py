"""The test session's own scheduling (tests/scheduling.py): every file that reads a shared session
fixture is in that fixture's unit, and the long units are handed out first."""

from __future__ import annotations

import re
from pathlib import Path

import scheduling

TESTS = Path(__file__).resolve().parent


def _files_using(fixture: str) -> set[str]:
    uses = re.compile(rf"^\s*def \w+\([^)]*\b{fixture}\b[^)]*\)", re.MULTILINE)
    return {p.name for p in TESTS.glob("test_*.py") if uses.search(p.read_text())}


def test_every_file_that_reads_a_shared_run_is_in_its_unit():
    for fixture, files in scheduling.SHARED.items():
        assert _files_using(fixture) == set(files), fixture


def test_units_and_their_order():
    assert scheduling.unit_of("tests/test_train.py::test_x[a-b]") == "user_run"
    assert scheduling.unit_of("tests/test_sweep.py::test_y") == "user_sweep"
    assert scheduling.unit_of("tests/test_model.py::test_z") == "tests/test_model.py"
    units = ["tests/test_model.py", "tests/test_hostile_input.py", "user_sweep", "tests/test_cli.py", "user_run",
             "tests/test_ui_browser.py"]
    assert scheduling.order(units) == ["user_run", "user_sweep", "tests/test_ui_browser.py",
                                       "tests/test_hostile_input.py", "tests/test_model.py", "tests/test_cli.py"]
    assert set(scheduling.COST) - set(scheduling.SHARED) <= {p.name for p in TESTS.glob("test_*.py")}
