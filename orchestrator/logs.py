"""Logging configuration: the CLI and the deploy session (orchestrator.deploy) configure it; library
code only calls structlog.

Shared processors (contextvars, level, ISO time, redaction) feed the run's log sink (an
`orchestrator.events.RunLog`), so a log line from a stage or a transport lands in events.jsonl
beside the runner's events and, at warning level and above, on the console. Logs never travel
through the event bus. Outside a run (no sink), logs go to stderr at warning level.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog

from orchestrator.redact import REDACTOR

#: receives each log line's event dict during a run (None: render to stderr)
LogSink = Callable[[dict[str, Any]], None]
_sink: LogSink | None = None


def _redact(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return REDACTOR.redact(event_dict)


def _to_sink(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    sink = _sink
    if sink is None:
        return event_dict
    sink(event_dict)
    raise structlog.DropEvent


def configure(sink: LogSink | None = None, verbose: bool = False) -> None:
    """Route structlog into `sink` (or stderr when None); quiet paramiko's stdlib logging."""
    global _sink
    _sink = sink
    level = logging.DEBUG if verbose else logging.INFO
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            _to_sink,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            level if sink is not None else logging.WARNING
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # paramiko and invoke log through stdlib logging: never let them print tracebacks to the
    # console; our transport translates their errors.
    for name in ("paramiko", "invoke", "fabric"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
