"""Turn SIGTERM/SIGINT into a threading.Event without a lock in the signal handler.

`signal.signal(SIGTERM, lambda *a: event.set())` can deadlock: Python runs the handler in the main
thread at the next bytecode, and if the main thread holds the event's own (non-reentrant) lock at
that moment, inside `event.wait()` just woken by a first signal when a second one arrives (a
supervisor forwarding the SIGTERM its process group also got), `set()` waits on itself forever.
Here the C-level handler only writes the signal number to a pipe (`signal.set_wakeup_fd`); a
thread reads it and sets the event.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable


def set_on_signals(event: threading.Event, signals: Iterable[int]) -> None:
    """Set EVENT when one of SIGNALS arrives (call from the main thread)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    for sig in signals:
        signal.signal(sig, lambda *_: None)
    signal.set_wakeup_fd(w)

    def watch() -> None:
        while not os.read(r, 64):
            pass
        event.set()

    threading.Thread(target=watch, name="signals", daemon=True).start()
