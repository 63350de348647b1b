"""Console rendering: a live progress view of a run (a subscriber of the event bus) and the summary.

On a terminal: one live line per host with the running stage, its elapsed time and the latest
message (rich). Otherwise (CI, pipes): plain lines, one per finished stage, plus throttled progress.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.events import Event

STYLE = {
    "ok": "green",
    "changed": "yellow",
    "would-change": "cyan",
    "failed": "bold red",
    "skipped": "dim",
    "unreachable": "bold red",
    "interrupted": "magenta",
}


class _HostLine:
    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.running: dict[str, float] = {}
        self.message = ""
        self.state = "connecting"
        self.counts: dict[str, int] = {}


class ConsoleView:
    """Bus subscriber that shows progress; `close()` stops the live display."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None,
                 progress_every: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.console = Console(file=self.stream, highlight=False, soft_wrap=True)
        self.live_mode = self.console.is_terminal if live is None else live
        self.hosts: dict[str, _HostLine] = {}
        self.progress_every = progress_every
        self._last_progress: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None

    # -- subscriber --------------------------------------------------------------------------

    def __call__(self, e: Event) -> None:
        with self._lock:
            self._handle(e)

    def _handle(self, e: Event) -> None:
        kind = e["event"]
        host = e.get("host")
        if kind == "run.start" and self.live_mode:
            self._live = Live(self, console=self.console, refresh_per_second=4, transient=True)
            self._live.start()
        if host is not None:
            line = self.hosts.setdefault(host, _HostLine(0))
        if kind == "host.start":
            line.total = len(e.get("stages", []))
            self._print(f"[{host}] connecting")
        elif kind == "host.connected":
            line.state = "running"
            self._print(f"[{host}] connected in {e.get('duration_s', 0):.1f}s")
        elif kind == "host.waiting":
            line.state = "waiting for SSH"
            line.message = f"attempt {e.get('attempt')}, {e.get('elapsed_s')}s: {e.get('error')}"
            self._print(f"[{host}] waiting for SSH ({line.message})")
        elif kind == "host.unreachable":
            line.state = "unreachable"
            self._print(f"[{host}] UNREACHABLE: {e.get('error')}", style="bold red")
        elif kind == "host.rebooted":
            self._print(f"[{host}] the host rebooted during this run: running its stages again "
                        f"(pass {e.get('next_pass')})", style="yellow")
        elif kind == "host.lock_held":
            line.state = "locked"
            self._print(f"[{host}] LOCKED: {e.get('error')}", style="bold red")
        elif kind == "host.lock_takeover":
            prev = e.get("previous") or {}
            self._print(f"[{host}] took over the deploy lock left by run {prev.get('run_id')} "
                        f"({prev.get('user')}@{prev.get('operator')}), which is gone",
                        style="yellow")
        elif kind == "transport.agent_retired":
            self._print(f"[{host}] ended the agent of the dropped connection (pid {e.get('pid')}) "
                        "and what it still ran" + ("" if e.get("exited") else
                                                   f": it did not exit ({e.get('error')})"),
                        style="yellow")
        elif kind == "stage.start":
            line.running[e["stage"]] = time.monotonic()
        elif kind == "stage.progress":
            line.message = e.get("message", "")
            key = (host, e["stage"])
            now = time.monotonic()
            if not self.live_mode and now - self._last_progress.get(key, 0) >= self.progress_every:
                self._last_progress[key] = now
                started = line.running.get(e["stage"], now)
                self._print(f"[{host}] {e['stage']} ({now - started:.0f}s) {line.message}",
                            style="dim")
        elif kind == "stage.retry":
            self._print(f"[{host}] {e['stage']} attempt {e.get('attempt')} failed "
                        f"({e.get('error')}); retrying in {e.get('sleep_s')}s", style="yellow")
        elif kind == "stage.check_retry":
            self._print(f"[{host}] {e['stage']} check cut ({e.get('error')}); asking again",
                        style="yellow")
        elif kind == "stage.end":
            line.running.pop(e["stage"], None)
            line.done += 1
            status = e["status"]
            line.counts[status] = line.counts.get(status, 0) + 1
            detail = e.get("reason") or ""
            took = e.get("duration_s", 0)
            text = f"[{host}] {e['stage']:<24} {status:<12} {took:7.2f}s  {detail}"
            self._print(text.rstrip(), style=STYLE.get(status))
            if e.get("error"):
                self._print(_indent(str(e["error"])), style="red")
        elif kind == "host.end":
            line.state = e.get("status", "done")
        elif kind == "run.interrupted":
            self._print("interrupted: stopping remote commands...", style="magenta")
        elif kind in ("waiting for host", "connection lost, retrying"):
            pass  # shown by host.waiting / the stage's own outcome
        elif e.get("level") in ("warning", "error", "critical"):
            skip = {"event", "run_id", "ts", "host", "stage", "attempt", "level"}
            extra = " ".join(f"{k}={v}" for k, v in e.items() if k not in skip)
            where = f"[{host}] {e['stage']}: " if e.get("stage") else (f"[{host}] " if host else "")
            self._print(f"{where}{e['level']}: {kind} {extra}".rstrip(), style="yellow")
        elif kind == "run.end" and self._live is not None:
            self._live.stop()
            self._live = None

    def _print(self, text: str, style: str | None = None) -> None:
        if self._live is not None:
            self._live.console.print(Text(text, style=style or ""))
        else:
            self.console.print(Text(text, style=style or ""))

    # -- live renderable ---------------------------------------------------------------------

    def __rich__(self) -> Group:
        rows = []
        now = time.monotonic()
        for name, line in self.hosts.items():
            if line.running:
                stage, started = next(iter(line.running.items()))
                what = f"{stage} {now - started:5.0f}s"
            else:
                what = line.state
            msg = line.message[-80:]
            rows.append(Text(f"{name:<16} [{line.done}/{line.total}] {what:<32} {msg}"))
        return Group(*rows)

    def close(self) -> None:
        """Stop the live display if it is running."""
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + ln for ln in text.splitlines())


def summary_table(record: dict[str, Any]) -> Table:
    """Host x stage table of statuses and durations, from summary.json data."""
    stages: list[str] = []
    for h in record["hosts"].values():
        for s in h["stages"]:
            if s not in stages:
                stages.append(s)
    table = Table(show_lines=False)
    table.add_column("stage")
    for host in record["hosts"]:
        table.add_column(host)
    for s in stages:
        cells = []
        for h in record["hosts"].values():
            st = h["stages"].get(s)
            if st is None:
                cells.append(Text("-", style="dim"))
            else:
                status = st.get("status", "?")
                cells.append(Text(f"{status} {st.get('duration_s', 0):.2f}s",
                                  style=STYLE.get(status, "")))
        table.add_row(s, *cells)
    return table


#: facts worth a line in the closing summary, by key, with how to show them
HIGHLIGHTS: dict[str, str] = {
    "ready_after_s": "ready after {:.1f}s",
    "accept_length": "accept length {:.2f}",
    "version": "SGLang {}",
    "model": "model {}",
}


def highlights(record: dict[str, Any]) -> list[str]:
    """One line per host with the headline facts (readiness time, accept length, ...)."""
    lines = []
    for host, h in record["hosts"].items():
        parts = []
        for facts in h.get("facts", {}).values():
            if not isinstance(facts, dict):
                continue
            for key, fmt in HIGHLIGHTS.items():
                value = facts.get(key)
                if value is not None:
                    try:
                        parts.append(fmt.format(value))
                    except (ValueError, TypeError):
                        parts.append(f"{key} {value}")
        if parts:
            lines.append(f"{host}: " + ", ".join(parts))
    return lines
