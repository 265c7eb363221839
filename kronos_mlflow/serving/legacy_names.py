"""The module names that models logged before the packages by role import from their
model-from-code file: ``kronos_mlflow.mlflow_model`` (the tokenizer's pyfunc) and
``kronos_mlflow.forecasting.pyfunc`` (the forecaster's). A process that has already imported
this package resolves them here, to the modules that hold those classes now (a fresh process
runs the code the model carries). docs/mlflow-model.md."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: an old module name -> the module that holds its names now
MOVED = {
    "kronos_mlflow.mlflow_model": "kronos_mlflow.serving.tokenizer_model",
    "kronos_mlflow.forecasting": "kronos_mlflow.serving.forecasting",
    "kronos_mlflow.forecasting.pyfunc": "kronos_mlflow.serving.forecasting.pyfunc",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name of :data:`MOVED` and loads it as a module that hands out the names of
    the module it moved to (that module keeps its own name and spec)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname == "kronos_mlflow.forecasting")

    def create_module(self, spec):
        """The default module."""

    def exec_module(self, module):
        moved = importlib.import_module(MOVED[module.__name__])
        module.__dict__.update({k: v for k, v in vars(moved).items() if not k.startswith("__")})
        module.__getattr__ = lambda name: getattr(moved, name)


def find_spec(fullname: str):
    """The spec of old module name ``fullname`` (None: not one of :data:`MOVED`); the package's
    own finder asks this (``kronos_mlflow/__init__.py``)."""
    return _Alias().find_spec(fullname)


def install() -> None:
    """Resolve the old names from now on (once per process; after every other finder)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
