"""Fine-tune Kronos (its K-line tokenizer, then its predictor) under torchrun, judge the result and
track every run in MLflow and Comet. Packages by role, in layers: docs/code-map.md.
"""

__version__ = "0.1.0"

from .serving import legacy_names  # noqa: E402

legacy_names.install()  # models logged before the packages by role import two old module names
