"""Logging configuration: the CLI and the deploy session (orchestrator.deploy) configure it; library
code only calls structlog.

Shared processors (contextvars, level, ISO time, redaction) feed the run's log sink (an
`orchestrator.events.RunLog`), so a log line from a stage or a transport lands in events.jsonl
beside the runner's events and, at warning level and above, on the console. Logs never travel
through the event bus. Outside a run (no sink), logs go to stderr at warning level.

structlog itself (~50 ms of imports: its dev renderer brings rich.traceback) is imported when
a line is first logged or logging is configured: the modules a deploy needs before its first
connection make their loggers with `get_logger` below, which imports nothing.

A deploy starts connecting (orchestrator.preconnect) before its run exists; what those
connections log meanwhile is held (`hold`) and handed to the run's sink when `configure` sets
it, as if the run had been there all along (or to stderr, warnings and worse, when the deploy
ends before it: `release`).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from orchestrator.redact import REDACTOR

#: receives each log line's event dict during a run (None: render to stderr)
LogSink = Callable[[dict[str, Any]], None]
_sink: LogSink | None = None

_lock = threading.Lock()
#: the lines logged while held (`hold`), None when not holding
_held: list[dict[str, Any]] | None = None
#: structlog routes into _held (it is set up when it is first used during the hold)
_held_routed = False
#: structlog's level names (processors.add_log_level) -> logging levels
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}


class _Logger:
    """`structlog.get_logger(name)`, made on first use (see `get_logger`)."""

    __slots__ = ("_name", "_logger")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        logger = self._logger
        if logger is None:
            import structlog

            _route_held()
            logger = self._logger = structlog.get_logger(self._name)
        return getattr(logger, attr)


def get_logger(name: str) -> Any:
    """A logger that behaves as `structlog.get_logger(name)` (log.info(...), log.bind(...)) but
    imports structlog only when it is first used, not when the module that makes it loads."""
    return _Logger(name)


def hold() -> None:
    """Keep the lines logged from now on (every level) until `configure` hands them to its sink,
    or `release` to stderr. Nothing happens when a run's sink is set already; structlog is not
    imported for it (the first `get_logger` logger used is)."""
    global _held
    with _lock:
        if _held is not None or _sink is not None:
            return
        _held = []
    if "structlog" in sys.modules:
        _route_held()


def release() -> None:
    """End a hold that no `configure` ended: logging goes to stderr as outside a run, and so do
    the lines held (warnings and worse)."""
    with _lock:
        if _held is None:
            return
    configure(None)


def _route_held() -> None:
    """Route structlog into the held lines, if a hold waits for it."""
    global _held_routed
    with _lock:
        if _held is None or _held_routed:
            return
        _held_routed = True
        _setup(_held.append, logging.DEBUG)


def _redact(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return REDACTOR.redact(event_dict)


def _to_sink(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    sink = _sink
    if sink is None:
        return event_dict
    sink(event_dict)
    import structlog

    raise structlog.DropEvent


def configure(sink: LogSink | None = None, verbose: bool = False) -> None:
    """Route structlog into `sink` (or stderr when None); quiet paramiko's stdlib logging.

    Lines held (`hold`) go there first, those of the levels it takes."""
    global _held, _held_routed
    import structlog  # noqa: F401 - imported before the lock is taken (_setup needs it)

    level = logging.DEBUG if verbose else logging.INFO
    level = level if sink is not None else logging.WARNING
    with _lock:
        held, _held, _held_routed = _held, None, False
        _setup(sink, level)
    if held is None:
        return
    # a line logged just before the switch may still be appended while this loop runs
    for event_dict in held:
        if _LEVELS.get(str(event_dict.get("level")), logging.INFO) >= level:
            _replay(event_dict, sink)


def _replay(event_dict: dict[str, Any], sink: LogSink | None) -> None:
    if sink is not None:
        sink(event_dict)
        return
    import structlog

    renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    print(renderer(None, str(event_dict.get("level")), dict(event_dict)), file=sys.stderr)


def _setup(sink: LogSink | None, level: int) -> None:
    """structlog into SINK at LEVEL (called with the lock held)."""
    import structlog

    global _sink
    _sink = sink
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            _to_sink,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # paramiko and invoke log through stdlib logging: never let them print tracebacks to the
    # console; our transport translates their errors.
    for name in ("paramiko", "invoke", "fabric"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
