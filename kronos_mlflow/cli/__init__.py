"""Every command's front door: parse the flags, check them, call the library, print one line on a user's error.
May import every other package; nothing imports it (docs/code-map.md)."""

from .main import main

__all__ = ["main"]
