"""Logging configuration. Only the CLI configures logging; library code only calls structlog.

Shared processors (contextvars, level, ISO time, redaction) feed the run's event bus, so a log
line from a stage or a transport lands in events.jsonl beside the runner's events and, at warning
level and above, on the console. Outside a run (no bus), logs go to stderr at warning level.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from orchestrator.events import EventBus
from orchestrator.redact import REDACTOR

_bus: EventBus | None = None


def _redact(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return REDACTOR.redact(event_dict)


def _to_bus(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    bus = _bus
    if bus is None:
        return event_dict
    name = str(event_dict.pop("event", "log"))
    event_dict.pop("timestamp", None)
    event_dict.pop("run_id", None)
    bus.publish(name, **event_dict)
    raise structlog.DropEvent


def configure(bus: EventBus | None = None, verbose: bool = False) -> None:
    """Route structlog into `bus` (or stderr when None); quiet paramiko's stdlib logging."""
    global _bus
    _bus = bus
    level = logging.DEBUG if verbose else logging.INFO
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            _to_bus,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            level if bus is not None else logging.WARNING
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # paramiko and invoke log through stdlib logging: never let them print tracebacks to the
    # console; our transport translates their errors.
    for name in ("paramiko", "invoke", "fabric"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
