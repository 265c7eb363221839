"""Reading a user's YAML file (a config, a sweep's search space) with limits: one line for every
way it can be wrong, and nothing in it can cost time or memory out of proportion to its size.
The parser's events are checked first (:func:`_check_events`), then the value is built from plain
mappings, lists and scalars; what is refused: docs/configuration.md#the-config-file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .checks import shown

MAX_BYTES = 1 << 20  # a config or search space is a few hundred bytes; /dev/zero is endless
MAX_DEPTH = 10  # a config is one mapping of scalars and short lists; a search space two levels
MAX_NODES = 10_000  # values, keys, lists and mappings: a config has a few hundred
MAX_NUMBER_CHARS = 100  # the longest number a config key takes is a few dozen characters

_STR = "tag:yaml.org,2002:str"
_KINDS = {
    "tag:yaml.org,2002:int": "a number", "tag:yaml.org,2002:float": "a number", "tag:yaml.org,2002:bool":
    "true/false", "tag:yaml.org,2002:null": "empty (null)",
}
ACCEPTED = "plain text, numbers, true/false, lists and mappings with text keys"


class _Refused(Exception):
    """A rule of the first pass broken, at ``line`` (1-based)."""

    def __init__(self, line: int, thing: str, rule: str):
        super().__init__(thing)
        self.line, self.thing, self.rule = line, thing, rule


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int):
        super().__init__(key)
        self.key, self.line = key, line


_loader_classes: dict[bool, type] = {}


def _loader(libyaml: bool = True):
    """A safe loader class (libyaml's parser when PyYAML has it and ``libyaml``) whose implicit
    types are text, int, float, bool and null only: dates stay text (the config reads them itself),
    and ``=`` and ``<<`` are plain text too (YAML 1.1's "value" and "merge" keys are not used)."""
    if libyaml in _loader_classes:
        return _loader_classes[libyaml]
    import yaml
    from yaml.constructor import SafeConstructor
    from yaml.resolver import BaseResolver, Resolver

    class PlainResolver(BaseResolver):
        yaml_implicit_resolvers: dict = {}

    dropped = {"tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"}
    for first, resolvers in Resolver.yaml_implicit_resolvers.items():
        PlainResolver.yaml_implicit_resolvers[first] = [(tag, regexp) for tag, regexp in resolvers
                                                        if tag not in dropped]

    if libyaml and getattr(yaml, "__with_libyaml__", False):
        from yaml.cyaml import CParser

        class PlainLoader(CParser, SafeConstructor, PlainResolver):
            def __init__(self, stream):
                CParser.__init__(self, stream)
                SafeConstructor.__init__(self)
                PlainResolver.__init__(self)
    else:  # PyYAML without libyaml
        from yaml.composer import Composer
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        class PlainLoader(Reader, Scanner, Parser, Composer, SafeConstructor, PlainResolver):
            def __init__(self, stream):
                Reader.__init__(self, stream)
                Scanner.__init__(self)
                Parser.__init__(self)
                Composer.__init__(self)
                SafeConstructor.__init__(self)
                PlainResolver.__init__(self)

    _loader_classes[libyaml] = PlainLoader
    return PlainLoader


def _check_events(text: str, libyaml: bool = True) -> None:
    """The first pass: every event of ``text``, checked before any value is built; raises
    :class:`_Refused` at the first rule broken (``yaml.YAMLError`` for text that is not YAML).

    The node cap is there because the size cap alone would let a 1 MiB file of short items cost
    seconds and hundreds of megabytes to build; the number cap because Python refuses to read, or
    takes very long to compute, integers of thousands of digits; a key given twice is refused
    because PyYAML would keep the last one silently."""
    import yaml

    loader = _loader(libyaml)(text)
    # One frame per open collection: [is_mapping, next node is a key, keys seen].
    frames: list[list[Any]] = []
    documents = nodes = 0
    try:
        while True:
            event = loader.get_event()
            if isinstance(event, yaml.StreamEndEvent):
                return
            line = event.start_mark.line + 1 if event.start_mark is not None else 0
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise _Refused(line, "a second YAML document ('---')", "expected one document")
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frames.pop()
                continue
            if not isinstance(event, yaml.NodeEvent):
                continue
            nodes += 1
            if nodes > MAX_NODES:
                raise _Refused(line, f"more than {MAX_NODES:,} values, keys, lists and mappings",
                               f"expected at most {MAX_NODES:,}")
            if isinstance(event, yaml.AliasEvent):
                raise _Refused(line, "an alias (*name)", "aliases are not allowed: write each value out")
            if event.tag is not None:
                raise _Refused(line, "an explicit tag (!...)", f"tags are not allowed: write {ACCEPTED}")
            parent = frames[-1] if frames else None
            is_key = parent is not None and parent[0] and parent[1]
            if parent is not None and parent[0]:
                parent[1] = not parent[1]  # a key, then its value, then a key ...
            if isinstance(event, yaml.ScalarEvent):
                resolved = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
                if is_key:
                    if resolved != _STR:
                        kind = _KINDS.get(resolved, "not text")
                        raise _Refused(line, f"a key that YAML reads as {kind}, not as text,",
                                       "keys must be names such as epochs")
                    if event.value in parent[2]:
                        raise _DuplicateKey(event.value, line)
                    parent[2].add(event.value)
                elif _KINDS.get(resolved) == "a number" and len(event.value) > MAX_NUMBER_CHARS:
                    raise _Refused(line, f"a number of {len(event.value):,} characters",
                                   f"expected numbers of at most {MAX_NUMBER_CHARS} characters")
                continue
            # the start of a mapping or a list
            if is_key:
                kind = "mapping" if isinstance(event, yaml.MappingStartEvent) else "list"
                raise _Refused(line, f"a {kind} used as a key", "keys must be names such as epochs")
            if len(frames) >= MAX_DEPTH:
                raise _Refused(line, f"lists and mappings nested more than {MAX_DEPTH} deep",
                               f"expected at most {MAX_DEPTH} levels")
            frames.append([isinstance(event, yaml.MappingStartEvent), True, set()])
    finally:
        loader.dispose()


def _load(text: str, libyaml: bool = True) -> Any:
    """The value of ``text`` (one YAML document), refused as :func:`_check_events` says."""
    import yaml

    _check_events(text, libyaml)
    return yaml.load(text, Loader=_loader(libyaml))  # noqa: S506 - a SafeConstructor, after the checks above


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
        raise ConfigError(f"{what} '{path}' is {st.st_size:,} bytes; expected a YAML file of at most "
                          f"{MAX_BYTES:,} bytes")
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
        data = _load(_read_small_text(Path(path), what))
    except _DuplicateKey as exc:
        raise ConfigError(f"{what} '{path}' gives '{shown(exc.key)}' twice (line {exc.line}); each key may appear "
                          "once") from None
    except _Refused as exc:
        raise ConfigError(f"{what} '{path}' has {exc.thing} at line {exc.line}; {exc.rule}") from None
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{what} '{path}' does not exist") from None
    except PermissionError:
        raise ConfigError(f"{what} '{path}' cannot be read (permission denied)") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} '{path}' is a directory; expected a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} '{path}' is not UTF-8 text; expected a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"{what} '{path}' cannot be read ({exc.strerror or type(exc).__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} '{path}' is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} '{path}' {expected}, not {type(data).__name__}")
    return data
