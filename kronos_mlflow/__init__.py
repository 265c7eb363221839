"""Fine-tune Kronos (its K-line tokenizer, then its predictor) under torchrun, judge the result and
track every run in MLflow and Comet. Packages by role, in layers: docs/code-map.md.
"""

__version__ = "0.1.0"

import sys  # noqa: E402


class _OldNames:
    """Models logged before the packages by role import two old module names: a name of this
    package that no other finder found (this one sits last) is handed to
    :mod:`kronos_mlflow.serving.legacy_names`, imported then, so that importing this package (or
    its config) imports no serving code."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        from .serving import legacy_names  # lazy: only when an old module name is imported

        return legacy_names.find_spec(fullname)


if not any(isinstance(finder, _OldNames) for finder in sys.meta_path):
    sys.meta_path.append(_OldNames())
