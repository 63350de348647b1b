"""orchestrator.logs: loggers that import structlog on first use, and the hold that keeps what
is logged before a run's log exists."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from orchestrator import logs


def test_a_logger_imports_structlog_when_first_used_not_when_made() -> None:
    code = ("import sys\nfrom orchestrator.logs import get_logger\nlog = get_logger('x')\n"
            "print('structlog' in sys.modules)\nlog.warning('hello', n=1)\n"
            "print('structlog' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[0] == "False"
    assert "hello" in p.stdout and "n=1" in p.stdout  # structlog's defaults print on stdout
    assert p.stdout.split()[-1] == "True"


def test_held_lines_go_to_the_sink_configure_sets_at_its_level() -> None:
    log = logs.get_logger("test.hold")
    lines: list[dict[str, Any]] = []
    logs.hold()
    try:
        log.debug("early debug")
        log.info("early info", host="h1")
        logs.configure(lines.append)
        log.info("later")
    finally:
        logs.configure(None)
    assert [(x["event"], x["level"]) for x in lines] == [
        ("early info", "info"), ("later", "info")]
    assert lines[0]["host"] == "h1" and "timestamp" in lines[0]


def test_a_released_hold_prints_its_warnings_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    log = logs.get_logger("test.release")
    logs.hold()
    log.info("not shown")
    log.warning("waiting for host", host="h1")
    logs.release()
    log.warning("after")
    logs.release()  # nothing held any more: no-op
    out, err = capsys.readouterr()
    assert out == ""
    assert "waiting for host" in err and "host=h1" in err and "after" in err
    assert "not shown" not in err
