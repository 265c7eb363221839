"""How pytest-xdist hands tests to its workers (``-n N --dist loadfile``, the default).

Two rules on top of xdist's one-file-one-worker:

- the tests that read one shared session fixture (``SHARED``: a real ``mlflow run`` each, tens of
  seconds to minutes), directly or through other fixtures, go to one worker as one unit, so the
  run is made once per test session rather than once per worker that happens to get one of them;
  the other tests of their files stay units of their own file and go to whichever worker is free;
- the units start longest first (``COST``: seconds each took in CI, rounded), so the long
  end-to-end units do not start last and leave the other workers idle at the end; units not in
  ``COST`` follow in xdist's own order (most tests first).

The controller sees node ids only, so which test reads what is read from the test files' source
(``ast``): a test's parameters, the fixtures defined in its file and in ``conftest.py`` and their
parameters. ``tests/test_scheduling.py`` checks the reading against pytest's own fixture closure.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# the session fixtures that make a shared run (tests/conftest.py defines them); a test that reads
# two belongs to the first named here
SHARED: tuple[str, ...] = ("user_run", "user_sweep", "predictor_sweep")

# unit -> seconds its tests took together in a full run (under coverage; only the order matters)
COST: dict[str, int] = {
    "test_pipeline.py": 400, "test_walkforward.py": 385, "user_run": 375, "test_team_scale.py": 250,
    "test_finetune_modes.py": 350, "test_preemption.py": 335, "user_sweep": 285, "test_first_hour.py": 225,
    "test_scorecard_skill.py": 220, "test_hostile_input.py": 215, "test_backtest.py": 210, "test_forecast_eval.py": 210,
    "test_hostile_launchers.py": 200, "test_ui_browser.py": 190, "test_verdict_runs.py": 165, "predictor_sweep": 150,
    "test_spool.py": 140, "test_speed_paths.py": 115, "test_data_intraday.py": 110, "test_trainer.py": 90,
    "test_command_stops.py": 85, "test_late_stops.py": 90,
}


def _fixture_scope(node: ast.AST) -> str | None:
    """``"function"``, ``"module"``, ... for a ``@pytest.fixture``, else None."""
    for deco in getattr(node, "decorator_list", ()):
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            scope = [k.value for k in getattr(deco, "keywords", ()) if k.arg == "scope"]
            return scope[0].value if scope and isinstance(scope[0], ast.Constant) else "function"
    return None


def _params(node: ast.FunctionDef) -> set[str]:
    return {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}


@functools.cache
def _definitions(path: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], set[str]]:
    """``(fixtures, tests, shared)`` of one file: each name -> the fixture names it asks for (a
    test in a class is ``Class::name``); the fixtures made once for several tests (not
    function-scoped)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return {}, {}, set()
    fixtures: dict[str, set[str]] = {}
    tests: dict[str, set[str]] = {}
    once: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scope = _fixture_scope(node)
            if scope:
                fixtures[node.name] = _params(node)
                if scope != "function":
                    once.add(node.name)
            elif node.name.startswith("test"):
                tests[node.name] = _params(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                    tests[f"{node.name}::{item.name}"] = _params(item) - {"self"}
    return fixtures, tests, once


def _closure(names: set[str], fixtures: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(fixtures.get(name, ()))
    return seen


@functools.cache
def _shared_units(path: Path) -> dict[str, str]:
    """The tests of one file that read a shared run -> the run's fixture name; a test that shares
    a module fixture with one of them goes with it (the fixture is made once)."""
    conftest, _, _ = _definitions(TESTS / "conftest.py")
    local, tests, once = _definitions(path)
    fixtures = {**conftest, **local}
    closures = {test: _closure(params, fixtures) for test, params in tests.items()}
    units = {}
    for test, closure in closures.items():
        unit = next((name for name in SHARED if name in closure), None)
        if unit:
            units[test] = unit
    for unit in set(units.values()):  # the file's module fixtures those tests use, made on that worker
        used = set().union(*(closures[t] for t, u in units.items() if u == unit)) & once
        for test, closure in closures.items():
            if test not in units and closure & used:
                units[test] = unit
    return units


def unit_of(nodeid: str) -> str:
    """The work unit of a test: the shared run it reads, else its file."""
    path, _, rest = nodeid.partition("::")
    test = rest.split("[", 1)[0]
    return _shared_units(TESTS / Path(path).name).get(test, path)


def order(units: list[str]) -> list[str]:
    """``units`` (in xdist's order) with the ones ``COST`` names first, longest first."""
    def cost(unit: str) -> int:
        return COST.get(unit.rsplit("/", 1)[-1], 0)

    return sorted(units, key=lambda unit: -cost(unit))  # stable: the rest keep xdist's order


def make_scheduler(config, log):
    """A ``LoadFileScheduling`` whose units follow :func:`unit_of` and :func:`order`."""
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        _ranked = False

        def _assign_work_unit(self, node) -> None:
            if not self._ranked:  # the first call: xdist has just filled the queue
                self._ranked = True
                units = dict(self.workqueue)
                self.workqueue.clear()
                self.workqueue.update((unit, units[unit]) for unit in order(list(units)))
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)
