"""How a shipped program (orchestrator/remote/) answers: one JSON line, the last of stdout."""

from __future__ import annotations

import json
from typing import Any


def last_json_line(stdout: str) -> Any:
    """The JSON value on the last line of stdout, or None when there is none."""
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def marked_result(stdout: str, mark: str = "ORCH_RESULT ") -> Any:
    """The JSON after `mark` on the last stdout line that starts with it, or None.

    A line that starts with the mark but is not JSON raises ValueError, as before.
    """
    for line in reversed(stdout.splitlines()):
        if line.startswith(mark):
            return json.loads(line[len(mark):])
    return None
