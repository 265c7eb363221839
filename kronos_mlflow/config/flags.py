"""Every config key (and alias) as a command-line flag, for ``python -m kronos_mlflow.train``,
``kronos-mlflow train`` and the sweep (which takes the same flags through argparse ``parents=``)."""

from __future__ import annotations

import argparse

from . import core as cfg
from .keys import KEY, SECTIONS


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--key-name`` / ``--key_name`` for every config key and alias, plus ``--config FILE.yaml``;
    values are parsed and validated by :func:`kronos_mlflow.config.core.load_config`."""
    parser.add_argument("--config", dest="_config_file", metavar="FILE.yaml", help="YAML file of config keys")
    # --help lists the keys by section (config/keys.py), each alias beside its key's section
    groups = {name: parser.add_argument_group(f"{name} (config keys)") for name in SECTIONS}
    for key in list(cfg.DEFAULTS) + list(cfg.ALIASES):
        target = cfg.ALIASES.get(key, key)
        flags = sorted({f"--{key.replace('_', '-')}", f"--{key}"})
        default = cfg.DEFAULTS[target]
        time_range = target in cfg.TIME_RANGE_KEYS or target in cfg.OPTIONAL_TIME_RANGE_KEYS
        shown = ":".join(default) if time_range else default
        help_text = (f"alias of --{target.replace('_', '-')}" if key in cfg.ALIASES
                     else f"{cfg.HELP[key]} (default: {shown!s})")
        groups[KEY[target].section].add_argument(*flags, dest=f"cfg__{key}", default=argparse.SUPPRESS,
                                                 metavar="VALUE",
                                                 help=help_text.replace("%", "%%"))  # argparse formats help with %


def config_overrides(args: argparse.Namespace) -> dict:
    """The config keys given on the command line, as typed."""
    return {name[5:]: value for name, value in vars(args).items() if name.startswith("cfg__")}


def config_from_args(args: argparse.Namespace) -> dict:
    """Defaults, then ``--config FILE.yaml``, then the flags: validated."""
    return cfg.load_config(config_overrides(args), path=getattr(args, "_config_file", None))
