"""Fine-tune the Kronos K-line tokenizer under torchrun and track experiments in MLflow and Comet.

Modules: ``config`` (one validated dict), ``model`` (the tokenizer and its checkpoint format),
``data`` (Qlib, the demo market, CSV import, training windows), ``distributed``, ``tracking``
(MLflow, Comet, fan-out), ``train`` (the torchrun entry point), ``trainer`` (the loop),
``checkpoint`` (the resumable training state), ``mlflow_model`` (pyfunc over safetensors),
``cli`` (``kronos-mlflow``). docs/code-map.md has the whole map.
"""

__version__ = "0.1.0"
