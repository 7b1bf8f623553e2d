"""The process's log: one JSON object per line on stdout, whoever logs.

The proxy's own structured lines (the access line, `upstream_check`, `stream_form_mismatch` …) are JSON objects
already and go out as they are. Every other line — a plain message of the proxy's (`upstream ds: its model list
answered HTTP 404`), uvicorn's (`Started server process`, `Waiting for application shutdown`), a library's warning
(asyncio, aiohttp) — becomes `{"level": …, "logger": …, "message": …}`, with `"exception"` holding a traceback, so that
a log pipeline parses one format (docs/observability.md "Logs, `/readyz` and `/metrics`").
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final

import orjson

__all__ = ["JsonLines", "configure_logging", "uvicorn_log_config"]

_OWN: Final = "dialect_proxy"  # the proxy's loggers: their JSON lines pass as they are


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if (record.exc_info is None and record.name.startswith(_OWN) and message.startswith("{")
                and message.endswith("}")):
            return message  # a structured line of the proxy's (orjson.dumps of an object)
        line: dict[str, Any] = {"level": record.levelname.lower(), "logger": record.name, "message": message}
        if record.exc_info is not None:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def _handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonLines())
    return handler


def configure_logging(level: str) -> None:
    """The proxy's loggers at `level`; anything else that reaches the root logger (a library's warning) in the same
    format, rather than Python's plain last-resort line on stderr."""
    own = logging.getLogger(_OWN)
    if not own.handlers:
        own.addHandler(_handler())
        own.propagate = False
    own.setLevel(level.upper())
    root = logging.getLogger()  # (its level stays Python's default, WARNING)
    if not any(isinstance(h.formatter, JsonLines) for h in root.handlers):
        root.addHandler(_handler())


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's `log_config`: its loggers (`uvicorn.error`: start-up, shutdown, its protocol's errors) in the same
    format; their level is the server's `log_level`, which uvicorn sets from its own setting."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonLines}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"}},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["json"], "level": "INFO", "propagate": False},
        },
    }
