"""JSON-lines logging: one event per line with ``ts``, ``level``, ``logger``, ``msg`` and extra fields.

Extra fields come from ``logger.info("msg", extra={"queue": q})``. Exceptions are rendered into an
``exc`` field on the same line, so a log shipper never splits one event across lines.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return str(value)


def log_event(record: logging.LogRecord) -> dict[str, Any]:
    """The JSON object one record becomes (pure apart from reading the record)."""
    event: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname,
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in STANDARD_ATTRIBUTES and not key.startswith("_") and key not in event:
            event[key] = _jsonable(value)
    if record.exc_info and record.exc_info[0] is not None:
        event["exc"] = logging.Formatter().formatException(record.exc_info)
    return event


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(log_event(record), ensure_ascii=False, separators=(",", ":"))


_original_make_record = logging.Logger.makeRecord


def _tolerant_make_record(self: logging.Logger, *args: Any, **kwargs: Any) -> logging.LogRecord:
    """``makeRecord`` that keeps an ``extra`` key clashing with a record attribute (e.g. ``name``)
    as ``<key>_`` instead of raising KeyError: a log call must never crash a role."""
    try:
        return _original_make_record(self, *args, **kwargs)
    except KeyError:
        args_list = list(args)
        extra = kwargs.get("extra") if "extra" in kwargs else (args_list[8] if len(args_list) > 8 else None)
        if not extra:
            raise
        renamed = {(f"{k}_" if k in STANDARD_ATTRIBUTES else k): v for k, v in extra.items()}
        if "extra" in kwargs:
            kwargs["extra"] = renamed
        else:
            args_list[8] = renamed
        return _original_make_record(self, *args_list, **kwargs)


def setup_logging(level: str = "INFO", stream: IO[str] | None = None) -> None:
    """Route every logger to one JSON-lines handler on ``stream`` (stderr by default)."""
    logging.Logger.makeRecord = _tolerant_make_record  # type: ignore[method-assign]
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Libraries chatter at INFO about things an operator does not act on (Kopf's per-object logger
    # reports every handler and timer run); at DEBUG everything goes through. What the operator
    # itself does is logged at INFO by its own logger (judgequeue.operator), which is not capped.
    for noisy in ("asyncio", "kopf.objects", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(root.level if root.level <= logging.DEBUG else max(logging.WARNING,
                                                                                                root.level))
