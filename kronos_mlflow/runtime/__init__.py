"""The process: ranks and collectives, signals that stop it, what it prints, locks, durable writes, speed settings.
May import ``errors`` only (docs/code-map.md)."""
