"""Reading a user's YAML file (a config, a sweep's search space): one line for every way it can
be wrong, and a key given twice refused instead of silently keeping the last one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import ConfigError


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int):
        super().__init__(key)
        self.key, self.line = key, line


def _load_unique(text: str):
    """``yaml.safe_load`` that refuses a mapping key given twice (PyYAML keeps the last one)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise _DuplicateKey(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


MAX_BYTES = 1 << 20  # a config or search space is a few hundred bytes; /dev/zero is endless


def _read_small_text(path: Path, what: str) -> str:
    """The text of a regular file of at most ``MAX_BYTES`` (a FIFO would block, a device or a
    huge file would fill memory)."""
    import stat

    st = path.stat()  # FileNotFoundError / NotADirectoryError go to the caller
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(str(path))
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} '{path}' is not a regular file (a pipe, socket or device); expected a YAML file")
    if st.st_size > MAX_BYTES:
        raise ConfigError(f"{what} '{path}' is {st.st_size:,} bytes; expected a YAML file of at most {MAX_BYTES:,} bytes")
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{what} '{path}' is more than {MAX_BYTES:,} bytes; expected a small YAML file")
    return data.decode("utf-8")


def read_mapping(path: str | os.PathLike, what: str, expected: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` ({} for an empty file). ``what`` names the file in
    messages ("config file"); ``expected`` says what it must hold when it is not a mapping."""
    import yaml

    try:
        data = _load_unique(_read_small_text(Path(path), what))
    except _DuplicateKey as exc:
        raise ConfigError(f"{what} '{path}' gives '{exc.key}' twice (line {exc.line}); each key may appear once") \
            from None
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{what} '{path}' does not exist") from None
    except PermissionError:
        raise ConfigError(f"{what} '{path}' cannot be read (permission denied)") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} '{path}' is a directory; expected a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} '{path}' is not UTF-8 text; expected a YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} '{path}' is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} '{path}' {expected}, not {type(data).__name__}")
    return data
