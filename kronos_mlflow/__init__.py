"""Fine-tune Kronos (its K-line tokenizer, then its predictor) under torchrun, judge the result and
track every run in MLflow and Comet. Packages by role, in layers: docs/code-map.md.
"""

__version__ = "0.1.0"
