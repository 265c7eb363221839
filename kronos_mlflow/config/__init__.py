"""The configuration: keys and their defaults, files, flags, validation, digests, run folders, settings, secrets.
May import ``runtime`` and ``errors`` only (docs/code-map.md)."""

from .core import DEFAULTS, load_config, model_kwargs
from . import settings  # noqa: F401 - the environment's settings, the progress interval's reader among them

__all__ = ["DEFAULTS", "load_config", "model_kwargs"]
