"""Keep credentials out of everything logged to MLflow: params, tags and text artifacts.

Two rules, applied together:

* a *name* is secret when one of its ``_``/``.``/``-`` separated words is a credential word (``token``,
  ``password``, ``secret``, ``key``, ...): ``MLFLOW_TRACKING_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
  ``tracking.api_key``. Whole words, so that ``tokenizer_path`` or ``train_tokens`` are not secret;
* a *value* is secret when it equals the value of an environment variable with a secret name (e.g. the
  password in ``MLFLOW_TRACKING_PASSWORD``): every occurrence of it in a logged string is masked, wherever
  it came from (a config field, a URI, a command line).

User info in URIs (``https://user:pw@host``) is removed as well.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
#: Words that make a name secret (lower case, compared against whole words of the name).
SECRET_WORDS = frozenset(
    {"token", "password", "passwd", "pwd", "secret", "key", "apikey", "credential", "credentials", "auth",
     "private", "passphrase", "cookie", "session"}
)
#: Environment values shorter than this are not scrubbed from text (masking "1" everywhere helps nobody).
MIN_SECRET_LEN = 4

_WORD_SPLIT = re.compile(r"[^0-9A-Za-z]+|(?<=[a-z])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """True when a word of ``name`` (split at non-alphanumerics and camelCase humps) is a credential word."""
    return any(word.lower() in SECRET_WORDS for word in _WORD_SPLIT.split(name) if word)


def secret_values(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Values of the environment variables with secret names, longest first (so masking is greedy)."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def strip_uri_userinfo(text: str) -> str:
    """``scheme://user:pw@host/path`` -> ``scheme://host/path``; other strings unchanged."""
    if "://" not in text or "@" not in text:
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if parts.username is None and parts.password is None:
        return text
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def scrub_text(text: str, values: Optional[list[str]] = None) -> str:
    """Mask every secret environment value in ``text`` and strip user info from URIs in it."""
    values = secret_values() if values is None else values
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+", lambda m: strip_uri_userinfo(m.group(0)), text)


def redact(obj: Any, values: Optional[list[str]] = None) -> Any:
    """A copy of a nested dict/list/scalar structure with secret-named keys masked and secret values scrubbed.

    Non-string scalars are returned unchanged; strings go through :func:`scrub_text`.
    """
    values = secret_values() if values is None else values
    if isinstance(obj, Mapping):
        return {
            k: (MASK if is_secret_name(str(k)) and obj[k] not in (None, "") else redact(obj[k], values))
            for k in obj
        }
    if isinstance(obj, (list, tuple)):
        return [redact(v, values) for v in obj]
    if isinstance(obj, str):
        return scrub_text(obj, values)
    return obj
