"""Secret redaction: one registry of secret values, applied to everything we render or write.

Secrets are: vars marked secret in a playbook or inventory, and the values of environment
variables whose NAME contains TOKEN, KEY, SECRET or PASSWORD. Every console line, event, summary,
pin file and error message passes through `Redactor.redact` before it leaves the process.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
_MIN_LEN = 4  # shorter values would mask ordinary text


def is_secret_name(name: str) -> bool:
    """True for names like HF_TOKEN, api_key, DB_PASSWORD."""
    return bool(SECRET_NAME.search(name))


class Redactor:
    """A thread-safe set of secret values and the function that masks them."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*values)

    def add(self, *values: Any) -> None:
        """Register secret values (non-strings and very short strings are ignored)."""
        with self._lock:
            for v in values:
                if isinstance(v, str) and len(v) >= _MIN_LEN:
                    self._values.add(v)
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def add_env(self, env: Mapping[str, str]) -> None:
        """Register values of env vars whose names look secret."""
        self.add(*(v for k, v in env.items() if is_secret_name(k)))

    @property
    def values(self) -> frozenset[str]:
        """The registered secret values."""
        with self._lock:
            return frozenset(self._values)

    def redact(self, obj: Any) -> Any:
        """Return `obj` with every secret value masked (str, bytes, dict, list, tuple)."""
        pattern = self._pattern
        if pattern is None:
            return obj
        return _walk(obj, pattern)


def _walk(obj: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(obj, str):
        return pattern.sub(MASK, obj)
    if isinstance(obj, bytes):
        return pattern.sub(MASK, obj.decode("utf-8", "replace")).encode()
    if isinstance(obj, Mapping):
        return {
            k: (MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v
                else _walk(v, pattern))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return type(obj)(_walk(v, pattern) for v in obj)
    return obj


#: The process-wide redactor. The CLI registers secrets in it; renderers apply it.
REDACTOR = Redactor()
