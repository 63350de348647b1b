"""Small helpers shared by the transport tests."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from tests.sshd import pids_matching, wait_until


def unique_sleep_arg() -> str:
    """A sleep duration string no other process on the box has on its command line."""
    return f"{300 + random.randint(0, 99)}.{random.randint(10**6, 10**7 - 1)}"


def gone(text: str, timeout: float = 5.0) -> bool:
    """True once no live process has `text` on its command line (waits up to `timeout`)."""
    return bool(wait_until(lambda: not pids_matching(text), timeout))


class Background:
    """Run a callable in a thread; keep its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def join(self, timeout: float = 10.0) -> Background:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background call did not finish"
        return self
