"""Nothing secret leaves the operator: what it writes to Events, logs and status passes :func:`redact`.

The operator quotes other people's words: the API server's (which echoes an invalid value), a
role's last line, the database driver's, and the fields of a child someone edited (an environment
variable holding a connection string). Any of them may carry a credential, so every text it
writes out is scrubbed, whatever it came from:

- every value the operator read from a Secret (:func:`remember`, called by the Secret reader),
  wherever it appears, and the password inside it when it is a URL;
- the password of any URL (``scheme://user:PASSWORD@host``) and ``password=``-style settings
  (a libpq keyword DSN, a URL's query), whoever they belong to;
- the value of an environment variable whose name says it is secret (``DB_PASSWORD``,
  ``API_TOKEN``, ``..._DSN``) in the differences of a child (:func:`difference`).

Each becomes ``***``. :func:`redact_tree` scrubs every string of a status; :class:`RedactFilter`
scrubs log records (installed on the operator's log handlers and on Kopf's per-object logger, whose
WARNING lines Kopf posts as Events).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from judgequeue.core.base.logs import STANDARD_ATTRIBUTES

from .diff import MISSING, Difference

HIDDEN = "***"
#: A remembered password is hidden wherever it appears only from this length on: a short one would
#: turn every word that contains it into stars (it is still hidden in its URL and ``password=`` forms).
MIN_BARE_SECRET = 6

_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s/@:'\"]*):([^\s@'\"/]+)@")
_SETTING = re.compile(
    r"(?i)\b((?:sentinel_)?password|passwd|pwd|secret|token|api_?key|access_?key)(\s*=\s*)([^\s&'\",;]+)")
_JSON_SETTING = re.compile(
    r'(?i)("(?:sentinel_)?(?:password|passwd|secret|token|api_?key|access_?key)"\s*:\s*")([^"]*)(")')
_SECRET_NAME = re.compile(r"(?i)(pass(word|wd)?|secret|token|credential|private|api_?key|access_?key|auth|dsn"
                          r"|cookie|session)")
_ENV_PATH = re.compile(r"\.env\[([^\]]+)\]")

_known: set[str] = set()
_lock = threading.Lock()


def remember(value: str) -> None:
    """Hide ``value`` (read from a Secret) from now on, and the password in it if it is a URL."""
    found = {value} if len(value) >= MIN_BARE_SECRET else set()
    try:
        password = urlsplit(value).password
    except ValueError:
        password = None
    if password:
        found |= {p for p in (password, unquote(password)) if len(p) >= MIN_BARE_SECRET}
    if found - _known:
        with _lock:
            _known.update(found)


def secret_name(name: str) -> bool:
    """True for an environment variable name that says its value is secret."""
    return bool(_SECRET_NAME.search(name))


def redact(text: str) -> str:
    """``text`` with every secret it holds replaced by ``***`` (see the module docstring)."""
    if not text:
        return text
    for known in sorted(_known, key=len, reverse=True):
        if known in text:
            text = text.replace(known, HIDDEN)
    text = _URL_PASSWORD.sub(rf"\1:{HIDDEN}@", text)
    text = _SETTING.sub(rf"\1\2{HIDDEN}", text)
    return _JSON_SETTING.sub(rf"\1{HIDDEN}\3", text)


def redact_tree(value: Any) -> Any:
    """``value`` (a status, an Event, a log field) with :func:`redact` applied to every string in it,
    and the ``value`` of every ``{"name": <secret name>, "value": ...}`` (an environment variable) hidden."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        out = {k: redact_tree(v) for k, v in value.items()}
        if isinstance(out.get("name"), str) and "value" in out and secret_name(out["name"]):
            out["value"] = HIDDEN
        return out
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return value


def difference(diff: Difference) -> Difference:
    """``diff`` as it may be shown: values scrubbed, and both sides hidden where the path is inside an
    environment variable with a secret name (``...env[DB_PASSWORD].value``)."""
    if any(secret_name(name) for name in _ENV_PATH.findall(diff.path)):
        return Difference(diff.path, HIDDEN if diff.live is not MISSING else MISSING,
                          HIDDEN if diff.desired is not MISSING else MISSING)
    return Difference(diff.path, diff.live if diff.live is MISSING else redact_tree(diff.live),
                      diff.desired if diff.desired is MISSING else redact_tree(diff.desired))


class RedactFilter(logging.Filter):
    """Scrubs a record's message, its ``extra`` fields and its exception text (kept as ``exc``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        record.msg, record.args = redact(message), None
        for key, value in list(vars(record).items()):
            if key not in STANDARD_ATTRIBUTES and not key.startswith("_"):
                setattr(record, key, redact_tree(value))
        if record.exc_info and record.exc_info[0] is not None:
            record.exc = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info, record.exc_text = None, None
        return True
