"""Durations as written in playbooks, inventories and flags: 30, 2.5, "30s", "10m", "1h", "500ms".

Its own module (stdlib only) so that the command line can read --wait-for-host without
importing the pydantic models of orchestrator.config.model, which use it too.
"""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Accept 30, 2.5, "30s", "10m", "1h", "500ms"; return seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30, '30s', '10m' or '1h'")
    if isinstance(value, (int, float)):
        if value != value:  # .nan: every comparison with it is false, so it would never expire
            raise ValueError("a duration must be a number of seconds, got .nan")
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ValueError(f"expected a duration such as 30, '30s', '10m' or '1h', got {value!r}")
