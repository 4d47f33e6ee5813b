"""Structured logging set-up, once per process.

Every log line is a structlog event: JSON when the output is not a terminal (containers, CI),
a readable console rendering on a TTY. Lines about a claim carry ``claim_uid``,
``claim_namespace`` and ``claim_name`` (bind them with :func:`claim_logger`).

Libraries that log through the standard library (grpc, urllib3, kubernetes) go through the same
renderer, one event per record, so a JSON log stays one JSON object per line. An exception a
record carries becomes a field: the whole traceback for our own code's, only its type and
message for grpc's — grpc logs one for every undecodable request a client sends, which is the
client's fault, not a bug to trace.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any, Literal

import structlog

Format = Literal["auto", "json", "console"]
LEVELS = ("debug", "info", "warning", "error")


def configure(*, level: str = "info", fmt: Format = "auto") -> None:
    """Route structlog (and stdlib logging, e.g. grpc's) to stderr in the chosen format."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=colour(sys.stderr, os.environ))
    )
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_StderrLogger,
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, StdlibBridge):
            root.removeHandler(handler)
    root.addHandler(StdlibBridge())
    root.setLevel(numeric)


def colour(stream: Any, environ: Mapping[str, str]) -> bool:
    """Whether the console format colours its lines: only on a terminal, and never with
    ``NO_COLOR`` set to anything but the empty string (no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not environ.get("NO_COLOR")


# Loggers whose exceptions are about what a client sent (no traceback of ours in them).
_CLIENT_FAULT_LOGGERS = ("grpc",)


class StdlibBridge(logging.Handler):
    """Hands standard-library log records to structlog (one rendered event per record)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, object] = {}
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                if record.name.split(".", 1)[0] in _CLIENT_FAULT_LOGGERS:
                    fields["error"] = f"{type(exc).__name__}: {exc}"
                else:
                    fields["exception"] = "".join(traceback.format_exception(exc)).rstrip()
            logger = get(record.name)
            if record.levelno >= logging.ERROR:
                logger.error(record.getMessage(), **fields)
            elif record.levelno >= logging.WARNING:
                logger.warning(record.getMessage(), **fields)
            elif record.levelno >= logging.INFO:
                logger.info(record.getMessage(), **fields)
            else:
                logger.debug(record.getMessage(), **fields)
        except Exception:
            self.handleError(record)


class _StderrLogger:
    """Writes each rendered line to *whatever ``sys.stderr`` is now*.

    structlog's PrintLogger keeps the stream it was created with; loggers bound long ago (in
    servers, or across test cases that swap stderr) would then write to a closed file.
    """

    def __init__(self, *_args: object) -> None:
        pass

    def msg(self, message: str) -> None:
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = failure = msg


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger carrying ``logger=<name>``."""
    # get_logger(logger=...) collides with wrap_logger's own ``logger`` parameter, so build the
    # same lazy proxy get_logger returns, with the initial value given directly: it still
    # follows a configure() made after import.
    proxy_class = type(structlog.get_logger())
    logger: structlog.typing.FilteringBoundLogger = proxy_class(
        None, initial_values={"logger": name}
    )
    return logger


def claim_logger(
    base: structlog.typing.FilteringBoundLogger, *, uid: str, namespace: str, name: str
) -> structlog.typing.FilteringBoundLogger:
    """``base`` with the claim's identity bound, for every line about that claim."""
    return base.bind(claim_uid=uid, claim_namespace=namespace, claim_name=name)
