"""Keep credentials out of params, tags, failure reasons and log lines: credentials only ever come
from the environment, and their current values (and any ``scheme://user:password@host``
password) become ``***`` wherever text leaves the process (docs/reliability.md#hostile-input-and-secrets).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# Always secret, whatever their name looks like.
SECRET_ENV_VARS = ("COMET_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
# The shell's current and previous directory: "pwd" names a directory here, not a password
# (hiding it would turn every path under the working directory into "***").
_DIRECTORY_ENV_VARS = ("PWD", "OLDPWD")

# Values shorter than this are not treated as secrets: hiding "0" or "ab" everywhere would
# mangle ordinary text and protect nothing.
MIN_SECRET_LENGTH = 4

# scheme://user:password@host -> group "password". The user part may be empty (":pw@").
_URI_PASSWORD_RE = re.compile(r"(?P<prefix>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)(?P<password>[^@/?#\s]+)(?=@)")

# The one rule set of credential names (every reader of a name asks is_secret_key or
# is_secret_name below). Whole words mark a credential: word matching keeps names such as
# TOKENIZERS_PARALLELISM or tokenizer_learning_rate from looking secret.
_KEY_PREFIXES = ("api", "access", "private", "secret")  # api_key, ACCESS_KEY, privateKey, secret-key...
#: words of a name split on anything but letters and digits, lower-cased (a config key, a flag)
SECRET_WORDS = frozenset({"token", "tokens", "password", "passwd", "pwd", "secret", "secrets", "credential",
                          "credentials", "apikey", "auth"})
#: the same words, found also between camelCase parts (``authToken``, ``apiKey``); ``auth`` alone
#: is a whole lower-case word only (``useAuth`` names a switch, not a credential)
_CAMEL_WORDS = SECRET_WORDS - {"auth"}
_SECRET_PAIRS = re.compile(r"(" + "|".join(_KEY_PREFIXES) + r")[_-]?key", re.IGNORECASE)
_WORD_SPLIT_RE = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_key(name: str) -> bool:
    """True for config keys that look like they hold a credential (api_key, token, password, ...)."""
    if _SECRET_PAIRS.search(name):
        return True
    return any(part in SECRET_WORDS for part in re.split(r"[^a-z0-9]+", name.lower()))


def is_secret_name(name: str) -> bool:
    """True when ``name`` (an env var, config key or param key) looks like it holds a credential.

    :func:`is_secret_key`, plus camelCase names (``authToken``,
    ``apiKey``). A credential word must be a whole word, so that ``tokenizer_learning_rate`` or
    ``TOKENIZERS_PARALLELISM`` are not mistaken for secrets.
    """
    name = str(name)
    if is_secret_key(name):
        return True
    words = [w.lower() for w in _WORD_SPLIT_RE.split(name) if w]
    if any(w in _CAMEL_WORDS for w in words):
        return True
    return any(a in _KEY_PREFIXES and b == "key" for a, b in zip(words, words[1:]))


def uri_passwords(text: str) -> list[str]:
    """Passwords embedded in ``scheme://user:password@host`` URIs inside ``text``."""
    return [m.group("password") for m in _URI_PASSWORD_RE.finditer(text or "")]


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Current secret values from the environment, longest first, without duplicates (read on
    every call, so a key set after import is still caught).

    Includes ``COMET_API_KEY``, ``MLFLOW_TRACKING_PASSWORD``, ``MLFLOW_TRACKING_TOKEN``, every
    variable whose name looks like a credential (:func:`is_secret_name`), and the password of
    any ``scheme://user:password@host`` URI held by an env var (``MLFLOW_TRACKING_URI`` first of
    all). Values shorter than ``MIN_SECRET_LENGTH`` characters are ignored.
    """
    env = os.environ if environ is None else environ
    found: set[str] = set()
    for name, value in list(env.items()):
        if not value or name in _DIRECTORY_ENV_VARS:
            continue
        if name in SECRET_ENV_VARS or is_secret_name(name):
            found.add(value)
        if "://" in value and "@" in value:
            found.update(uri_passwords(value))
    return sorted((v for v in found if len(v) >= MIN_SECRET_LENGTH), key=lambda v: (-len(v), v))


def redact_uri(uri: str) -> str:
    """``https://user:pw@host/`` -> ``https://user:***@host/`` (every URI in the string)."""
    return _URI_PASSWORD_RE.sub(lambda m: m.group("prefix") + REDACTED, uri or "")


def redact(text: str, secrets: list[str] | None = None) -> str:
    """Replace every secret value (see :func:`secret_values`) and URI password with ``***``."""
    if not isinstance(text, str):
        text = str(text)
    if not text:
        return text
    values = secret_values() if secrets is None else secrets
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    if "://" in text and "@" in text:
        text = redact_uri(text)
    return text


def scrub_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``params`` without credential-named keys and with secret values redacted.

    Nested mappings are scrubbed recursively; strings are redacted; other scalars are kept as
    they are unless their text form contains a secret (then the redacted text replaces them).
    """
    values = secret_values()
    return _scrub(params, values)


def _scrub(params: Mapping[str, Any], values: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if is_secret_name(str(key)):
            continue
        if isinstance(value, Mapping):
            out[key] = _scrub(value, values)
        elif isinstance(value, str):
            out[key] = redact(value, values)
        elif isinstance(value, (list, tuple)):
            out[key] = type(value)(redact(v, values) if isinstance(v, str) else v for v in value)
        elif value is None or isinstance(value, (bool, int, float)):
            out[key] = value
        else:
            text = str(value)
            cleaned = redact(text, values)
            out[key] = value if cleaned == text else cleaned
    return out


class SecretFilter(logging.Filter):
    """Redacts secrets from each record's formatted message (and its exception text).

    Attach it to *handlers* (a filter on a logger only sees records logged on that very logger,
    not those propagated from child loggers); :func:`install_secret_filter` does that for the
    root logger's handlers.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        values = secret_values()
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to logging's own error handling
            return True
        cleaned = redact(message, values)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            # Format the traceback now so that it can be redacted too.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, values)
        return True


def install_secret_filter(logger: logging.Logger | None = None) -> SecretFilter:
    """Attach one :class:`SecretFilter` to ``logger`` (default: root) and to its handlers.

    Idempotent. Handlers added to the logger later are not covered.
    """
    logger = logging.getLogger() if logger is None else logger
    existing = next((f for f in logger.filters if isinstance(f, SecretFilter)), None)
    secret_filter = existing or SecretFilter()
    if existing is None:
        logger.addFilter(secret_filter)
    for handler in logger.handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(secret_filter)
    return secret_filter
