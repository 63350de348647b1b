"""Small helpers shared by the stand-in: version checks, SGLang-style log lines."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from sglang.version import __version__

_print_lock = threading.Lock()


def version_tuple(text: str = __version__) -> tuple:
    """(0, 5, 23) for "0.5.23" (a local label or suffix is ignored)."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts)


def at_least(*version: int) -> bool:
    """True when this stand-in's release is at least `version`."""
    return version_tuple() >= tuple(version)


def _stamp() -> str:
    """asctime as SGLang's logger writes it, `.mmm` added with SGLANG_LOG_MS=1
    (configure_logger: srt/utils/common.py:1227-1232 (0.5.9), :2629-2637 (0.5.23))."""
    now = time.time()
    ms = f".{int(now * 1000) % 1000:03d}" if os.environ.get("SGLANG_LOG_MS", "").lower() in (
        "1", "true", "yes") else ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + ms


def log(message: str, rank: str = "") -> None:
    """Print one SGLang-style log line: `[2025-01-01 12:00:00 TP0] message`.

    SGLang logs through Python logging's default handler, i.e. to stderr.
    """
    prefix = "[" + _stamp() + (" " + rank if rank else "") + "] "
    with _print_lock:
        sys.stderr.write(prefix + message + "\n")
        sys.stderr.flush()


def uvicorn(level: str, message: str, access: bool = False) -> None:
    """A uvicorn-style line: `INFO:     message` (access lines on stdout, the rest on stderr)."""
    out = sys.stdout if access else sys.stderr
    with _print_lock:
        out.write((level + ":").ljust(10) + message + "\n")
        out.flush()


def set_on_signals(event: threading.Event, signals) -> None:
    """Set EVENT when one of SIGNALS arrives, with no lock taken in the signal handler.

    `event.set()` in a Python handler deadlocks when the main thread holds the event's own lock
    at that moment (inside `event.wait()`, just woken by a first SIGTERM when the supervisor
    forwards a second). The C-level handler writes to a pipe instead; a thread sets the event.
    (The same as orchestrator_sim.signals: this package runs on the host, without orchestrator.)
    """
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
