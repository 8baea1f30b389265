"""Keep credentials out of everything logged to MLflow: params, tags and text artifacts.

Two rules, applied together:

* a *name* is secret when one of its ``_``/``.``/``-``/camelCase words is a credential word (``password``,
  ``secret``, ``credentials``, ...) or when its last word is ``token``, ``key``, ``auth``... and it does not
  name one of a tokenizer's special tokens: ``MLFLOW_TRACKING_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
  ``tracking.api_key`` are secret; ``tokenizer_path``, ``train_tokens``, ``pad_token_id``, ``mask_token``
  are not (whole words only);
* a *value* is secret when it equals the value of an environment variable with a secret name (e.g. the
  password in ``MLFLOW_TRACKING_PASSWORD``) and has at least `MIN_SECRET_LEN` characters: every occurrence
  of it in a logged string is masked, wherever it came from (a config field, a URI, a command line). A
  value that is a file path (``GOOGLE_APPLICATION_CREDENTIALS=/etc/creds.json``) names where a secret is,
  not the secret, and is left alone, as are ``PWD``/``OLDPWD`` (the working directory: "pwd" is the shell
  command, not a password).

User info in URIs (``https://user:pw@host``) is removed as well, and so are object-store credentials that can
turn up in text without a variable naming them: AWS access key ids (``AKIA``/``ASIA`` + 16 characters, the
format AWS documents) and the signature/credential/token parameters of presigned S3 and GCS URLs
(``X-Amz-Signature=``, ``X-Goog-Credential=``...). The object-store variables the word rules miss are named in
`KNOWN_SECRET_NAMES` (``AWS_ACCESS_KEY_ID``: its last word is "id").
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
#: Words that make a name secret wherever they appear (lower case, whole words of the name).
SECRET_WORDS = frozenset({"password", "passwd", "secret", "apikey", "credential", "credentials",
                          "passphrase"})
#: Words that make a name secret when they end it (``hf_token``, ``api_key``), not in ``pad_token_id``.
SECRET_LAST_WORDS = frozenset({"token", "key", "auth", "cookie"})
#: Credentials whose names the word rules above do not catch.
KNOWN_SECRET_NAMES = frozenset({"MLFLOW_TRACKING_USERNAME", "DATABRICKS_USERNAME", "AWS_ACCESS_KEY_ID",
                                "GS_ACCESS_KEY_ID", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY"})
#: Credentials recognised by their form in any text: AWS access key ids (long-term AKIA, temporary ASIA) and the
#: signing parameters of presigned S3 (SigV4) and GCS (V4) URLs.
_AWS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
_SIGNED_PARAM = re.compile(r"((?:X-Amz|X-Goog)-(?:Signature|Credential|Security-Token)=)[^&\s'\"]+", re.IGNORECASE)
#: First words of tokenizer special-token names (``pad_token``, ``cls_token``...), never secrets.
SPECIAL_TOKEN_WORDS = frozenset({"pad", "cls", "sep", "mask", "unk", "bos", "eos"})
#: Environment values shorter than this are not scrubbed from text: a short value ("1", "true", "prod")
#: occurs everywhere by chance, and masking it would garble every tag and config that contains it.
MIN_SECRET_LEN = 8
#: Text artifacts scrubbed before upload (binary files are uploaded as they are).
TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".toml", ".sh", ".log")

_WORD_SPLIT = re.compile(r"[^0-9A-Za-z]+|(?<=[a-z])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """True when ``name`` (a dotted key or an environment variable) names a credential (module docstring)."""
    if name.upper() in KNOWN_SECRET_NAMES:
        return True
    words = [w.lower() for w in _WORD_SPLIT.split(name.rsplit(".", 1)[-1]) if w]
    if not words:
        return False
    if any(w in SECRET_WORDS for w in words):
        return True
    return words[-1] in SECRET_LAST_WORDS and words[0] not in SPECIAL_TOKEN_WORDS


def secret_values(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Values of the environment variables with secret names, longest first (so masking is greedy)."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items()
              if is_secret_name(k) and len(v) >= MIN_SECRET_LEN and not v.startswith(("/", "~", "./"))}
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
    text = _SIGNED_PARAM.sub(lambda m: m.group(1) + MASK, _AWS_KEY_ID.sub(MASK, text))
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


def scrub_file(path: str, redact_keys: bool = True) -> None:
    """Rewrite a text artifact with secrets masked (a fresh file, so a hard-linked original is untouched)."""
    if not path.endswith(TEXT_SUFFIXES):
        return
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError):
        return
    scrubbed = scrub_text(text)
    if redact_keys and path.endswith((".json", ".yaml", ".yml")):
        import yaml  # JSON is YAML; the key rules need the parsed mapping

        try:
            data = redact(yaml.safe_load(text))
            scrubbed = json.dumps(data, indent=2) if path.endswith(".json") else yaml.safe_dump(data, sort_keys=False)
        except yaml.YAMLError:
            pass
    if scrubbed != text:
        os.remove(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(scrubbed)
