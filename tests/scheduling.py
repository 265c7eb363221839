"""How pytest-xdist hands test files to its workers (``-n N --dist loadfile``, the default).

Two rules on top of xdist's one-file-one-worker:

- the files that read one session fixture (``user_run``, ``user_sweep``: a real ``mlflow run``
  each, tens of seconds) go to one worker as one unit, so the run is made once per test session
  rather than once per worker that happens to get one of them;
- the units start longest first (``COST``: seconds each took in CI, rounded), so the long
  end-to-end files do not start last and leave the other workers idle at the end; units not in
  ``COST`` follow in xdist's own order (most tests first).

``tests/test_scheduling.py`` checks that ``SHARED`` names every file that uses a shared fixture.
"""

from __future__ import annotations

# session fixture -> the test files that use it (tests/conftest.py defines the fixtures)
SHARED: dict[str, tuple[str, ...]] = {
    "user_run": ("test_first_hour.py", "test_predictor_train.py", "test_serving.py", "test_system_metrics.py",
                 "test_train.py", "test_verdict_runs.py"),
    "user_sweep": ("test_sweep.py", "test_sweep_distinct.py"),
}

# unit -> seconds its tests took together in a CI run (only the order matters)
COST: dict[str, int] = {
    "user_run": 410, "test_pipeline.py": 180, "test_command_stops.py": 300, "test_walkforward.py": 170, "test_team_scale.py": 170,
    "test_finetune_modes.py": 165, "user_sweep": 130, "test_forecast_eval.py": 125, "test_preemption.py": 120,
    "test_ui_browser.py": 100, "test_spool.py": 85, "test_val_skill.py": 85, "test_hostile_launchers.py": 70,
    "test_optuna_dashboard.py": 70, "test_speed_paths.py": 60, "test_hostile_input.py": 60,
    "test_scorecard_skill.py": 45, "test_backtest.py": 30, "test_data_intraday.py": 30, "test_published.py": 25,
}

_UNIT_OF_FILE = {name: unit for unit, names in SHARED.items() for name in names}


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its shared fixture's name, else its file."""
    path = nodeid.split("::", 1)[0]
    return _UNIT_OF_FILE.get(path.rsplit("/", 1)[-1], path)


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
