"""The config as typed, frozen sections: ``sections(config).backtest.backtest_signal_stride``.

Each section of :data:`kronos_mlflow.config.keys.SECTIONS` is a frozen dataclass whose fields are
its keys (:func:`kronos_mlflow.config.keys.section_keys`), named as the keys are named (upstream's
names, the flags', the logged params'), so a key reads the same everywhere and a grep for it
finds every reader. A component takes the section(s) it uses (Comet its ``comet`` section, the
Qlib backtest its ``backtest`` section) rather than the whole dict, and a test can hand it only
that: :func:`section` fills the keys a mapping leaves out with their declared defaults.

Lists become tuples (a section is frozen all the way down); nothing is resolved here (``auto``
stays ``auto``). A section is built from a validated config (:func:`kronos_mlflow.config.core.load_config`):
building one checks nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from .keys import KEY, SECTIONS, section_keys

__all__ = ["as_section", "key_section", "section", "section_type", "sections", "sections_type"]


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@functools.cache
def section_type(name: str) -> type:
    """The frozen dataclass of section ``name`` (``BacktestSection`` for ``backtest``), made on
    first use: a process that never builds a section pays nothing for it."""
    keys = section_keys(name)
    fields = [(key.name, tuple if key.type is list else key.type) for key in keys]
    cls = dataclasses.make_dataclass(f"{name.title()}Section", fields, frozen=True,
                                     namespace={"section": name, "__module__": __name__})
    cls.__doc__ = f"The config's {name} section:\n\n" + "\n".join(f"- ``{k.name}``: {k.help}" for k in keys)
    return cls


@functools.cache
def sections_type() -> type:
    """The frozen dataclass of every section: ``Sections``."""
    cls = dataclasses.make_dataclass("Sections", [(name, section_type(name)) for name in SECTIONS], frozen=True,
                                     namespace={"__module__": __name__})
    cls.__doc__ = "Every section of one config: ``sections(config).<section>.<key>``."
    return cls


def section(config: Mapping[str, Any], name: str):
    """The section ``name`` of ``config``: its keys' values, a key the mapping leaves out at its
    declared default."""
    cls = section_type(name)
    return cls(**{key.name: _frozen(config[key.name] if key.name in config else copy.deepcopy(key.default))
                  for key in section_keys(name)})


def sections(config: Mapping[str, Any]):
    """Every section of ``config`` (a validated config: every key present)."""
    return sections_type()(**{name: section(config, name) for name in SECTIONS})


def as_section(value: Any, name: str):
    """``value`` when it is already section ``name``, else that section of the mapping ``value``:
    what a component that takes a section calls, so a caller holding the whole config may pass it."""
    return value if isinstance(value, section_type(name)) else section(value, name)


def key_section(key: str) -> str:
    """The section of config key ``key``."""
    return KEY[key].section
