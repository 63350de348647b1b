"""Console rendering: a live progress view of a run (an event and log handler) and the summary.

On a terminal: one live line per host with the running stage, its elapsed time and the latest
message (rich). Otherwise (CI, pipes): plain lines, one per finished stage, plus throttled progress.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.events import (
    EventHandler,
    HostConnected,
    HostFinished,
    HostLockHeld,
    HostLockTakenOver,
    HostRebooted,
    HostStarted,
    HostUnreachable,
    HostWaiting,
    Record,
    ReplicaRoll,
    RunFinished,
    RunInterrupted,
    RunStarted,
    StageCheckRetry,
    StageFinished,
    StageProgress,
    StageRetry,
    StageStarted,
)
from orchestrator.status import Status
from orchestrator.summary import HostSummary, RunSummary

E = TypeVar("E")

STYLE: dict[str, str] = {
    Status.OK: "green",
    Status.CHANGED: "yellow",
    Status.WOULD_CHANGE: "cyan",
    Status.FAILED: "bold red",
    Status.SKIPPED: "dim",
    Status.UNREACHABLE: "bold red",
    Status.INTERRUPTED: "magenta",
}


class _HostLine:
    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.running: dict[str, float] = {}
        self.message = ""
        self.state = "connecting"
        self.counts: dict[str, int] = {}


def _locked(method: Callable[[ConsoleView, E], None]) -> Callable[[ConsoleView, E], None]:
    """Run a handler method under the view's lock (events, log lines and close() race)."""

    @functools.wraps(method)
    def wrapper(self: ConsoleView, e: E) -> None:
        with self._lock:
            method(self, e)

    return wrapper


class ConsoleView(EventHandler):
    """Event and log handler that shows progress; `close()` stops the live display."""

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

    def _line(self, host: str) -> _HostLine:
        return self.hosts.setdefault(host, _HostLine(0))

    # -- run ---------------------------------------------------------------------------------

    @_locked
    def on_run_started(self, e: RunStarted) -> None:
        if self.live_mode:
            self._live = Live(self, console=self.console, refresh_per_second=4, transient=True)
            self._live.start()

    @_locked
    def on_run_interrupted(self, e: RunInterrupted) -> None:
        self._print("interrupted: stopping remote commands...", style="magenta")

    @_locked
    def on_run_finished(self, e: RunFinished) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- hosts -------------------------------------------------------------------------------

    @_locked
    def on_host_started(self, e: HostStarted) -> None:
        self._line(e.host).total = len(e.stages)
        self._say(e.host, "connecting")

    @_locked
    def on_host_connected(self, e: HostConnected) -> None:
        self._line(e.host).state = "running"
        self._say(e.host, f"connected in {e.duration_s:.1f}s")

    @_locked
    def on_host_waiting(self, e: HostWaiting) -> None:
        line = self._line(e.host)
        line.state = "waiting for SSH"
        line.message = f"attempt {e.attempt}, {e.elapsed_s}s: {e.error}"
        self._say(e.host, f"waiting for SSH ({line.message})")

    @_locked
    def on_host_unreachable(self, e: HostUnreachable) -> None:
        self._line(e.host).state = Status.UNREACHABLE
        self._say(e.host, f"UNREACHABLE: {e.error}", style="bold red")

    @_locked
    def on_host_rebooted(self, e: HostRebooted) -> None:
        self._say(e.host, "the host rebooted during this run: running its stages again "
                  f"(pass {e.next_pass})", style="yellow")

    @_locked
    def on_host_lock_held(self, e: HostLockHeld) -> None:
        self._line(e.host).state = Status.LOCKED
        self._say(e.host, f"LOCKED: {e.error}", style="bold red")

    @_locked
    def on_host_lock_taken_over(self, e: HostLockTakenOver) -> None:
        prev = e.previous or {}
        self._say(e.host, f"took over the deploy lock left by run {prev.get('run_id')} "
                  f"({prev.get('user')}@{prev.get('operator')}), which is gone", style="yellow")

    @_locked
    def on_host_finished(self, e: HostFinished) -> None:
        self._line(e.host).state = e.status

    @_locked
    def on_replica_roll(self, e: ReplicaRoll) -> None:
        took = f" ({e.duration_s:.1f}s)" if e.duration_s is not None else ""
        detail = f": {e.detail}" if e.detail else ""
        self._say(e.host, f"rolling: {e.step}{detail}{took}",
                  style="bold red" if e.step == "failed" else "cyan")

    # -- stages ------------------------------------------------------------------------------

    @_locked
    def on_stage_started(self, e: StageStarted) -> None:
        self._line(e.host).running[e.stage] = time.monotonic()

    @_locked
    def on_stage_progress(self, e: StageProgress) -> None:
        line = self._line(e.host)
        line.message = e.message
        key = (e.host, e.stage)
        now = time.monotonic()
        if not self.live_mode and now - self._last_progress.get(key, 0) >= self.progress_every:
            self._last_progress[key] = now
            started = line.running.get(e.stage, now)
            self._say(e.host, f"{e.stage} ({now - started:.0f}s) {line.message}", style="dim")

    @_locked
    def on_stage_retry(self, e: StageRetry) -> None:
        self._say(e.host, f"{e.stage} attempt {e.attempt} failed ({e.error}); retrying in "
                  f"{e.sleep_s}s", style="yellow")

    @_locked
    def on_stage_check_retry(self, e: StageCheckRetry) -> None:
        self._say(e.host, f"{e.stage} check cut ({e.error}); asking again", style="yellow")

    @_locked
    def on_stage_finished(self, e: StageFinished) -> None:
        line = self._line(e.host)
        line.running.pop(e.stage, None)
        line.done += 1
        line.counts[e.status] = line.counts.get(e.status, 0) + 1
        said = stage_words(e.status, e.reason, e.facts)
        text = f"[{e.host}] {e.stage:<24} {e.status:<12} {e.duration_s:7.2f}s  {said}"
        self._print(text.rstrip(), style=STYLE.get(e.status))
        if e.error:
            self._print(_indent(str(e.error)), style="red")

    # -- log lines ---------------------------------------------------------------------------

    @_locked
    def on_log(self, record: Record) -> None:
        """Log lines at warning level and above, and the transport's retired agents."""
        kind, host = record["event"], record.get("host")
        if host is not None:
            self._line(host)
        if kind == "transport.agent_retired":
            self._print(f"[{host}] ended the agent of the dropped connection "
                        f"(pid {record.get('pid')}) and what it still ran"
                        + ("" if record.get("exited") else
                           f": it did not exit ({record.get('error')})"), style="yellow")
        elif kind in ("waiting for host", "connection lost, retrying"):
            pass  # shown by host.waiting / the stage's own outcome
        elif record.get("level") in ("warning", "error", "critical"):
            skip = {"event", "run_id", "ts", "host", "stage", "attempt", "level"}
            extra = " ".join(f"{k}={v}" for k, v in record.items() if k not in skip)
            if "message" in record:  # StageContext.warn: the sentence says it all
                kind, extra = "", str(record["message"])
            stage = record.get("stage")
            where = f"[{host}] {stage}: " if stage else (f"[{host}] " if host else "")
            self._print(f"{where}{record['level']}: {kind} {extra}".replace(":  ", ": ").rstrip(),
                        style="yellow")

    def _say(self, host: str, text: str, style: str | None = None) -> None:
        """A line about HOST (which gets a row in the live view)."""
        self._line(host)
        self._print(f"[{host}] {text}", style)

    def _print(self, text: str, style: str | None = None) -> None:
        # the live display (when running) prints through the same console, above its rows
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


#: an absolute path of five or more parts (shown as its last three; the run record keeps it)
_LONG_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/:;,()'\"`]+/){4,}[^\s/:;,()'\"`]*")


def short_paths(text: str) -> str:
    """Long absolute paths cut to "…/" and their last three parts (the console only)."""
    def cut(m: re.Match[str]) -> str:
        parts = [p for p in m.group(0).split("/") if p]
        return "…/" + "/".join(parts[-3:])

    return _LONG_PATH.sub(cut, text)


def _done(facts: dict[str, Any]) -> str | None:
    """What a stage that changed something did, from the facts it recorded."""
    if "ready_after_s" in facts:
        accept = facts.get("accept_length")
        return f"ready after {facts['ready_after_s']:.1f}s" + (
            f", accept length {accept:.2f}" if isinstance(accept, (int, float)) else "")
    if "pid" in facts and "fingerprint" in facts:
        pool = facts.get("kv_pool")
        tokens = f"; predicted KV pool {pool['tokens']:,} tokens per rank" if isinstance(
            pool, dict) and isinstance(pool.get("tokens"), int) else ""
        return f"started pid {facts['pid']} ({facts.get('managed_by', 'supervised')}){tokens}"
    if facts.get("installed"):
        return "installed " + ", ".join(map(str, facts["installed"]))
    fix = facts.get("uvm_fix")
    if isinstance(fix, dict):
        return (f"repaired through hypervisor {fix.get('hypervisor')}: nvidia-uvm allowed at "
                f"major {fix.get('major')} in {fix.get('conf')}, container {fix.get('ctid')} "
                "restarted")
    if facts.get("commit") and isinstance(facts.get("files"), int):
        size = facts.get("bytes")
        mib = f" ({size / 2**20:.1f} MiB)" if isinstance(size, int) else ""
        return f"downloaded {facts['files']} files{mib} at {str(facts['commit'])[:12]}"
    if "python" in facts and "pip" in facts:
        return f"python {facts['python']} with pip {facts['pip']}"
    return None


def stage_words(status: str, reason: str | None, facts: dict[str, Any] | None) -> str:
    """A stage line's words: for `changed`, what was done (else what the check had found,
    marked as before); paths shortened. The events and the run record keep both in full."""
    text = reason or ""
    if status == "changed":
        done = _done(facts or {})
        text = done if done else (f"(was: {text})" if text else "")
    return short_paths(text)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + ln for ln in text.splitlines())


#: more hosts than this: the closing table counts statuses per stage instead of a column per host
WIDE = 6


def _stage_ids(summary: RunSummary) -> list[str]:
    return list(dict.fromkeys(s for h in summary.hosts.values() for s in h.stages))


def fleet_table(summary: RunSummary) -> Table:
    """Stage x status counts, with the hosts that are not ok named (for many hosts)."""
    stages, hosts = _stage_ids(summary), summary.hosts
    statuses = sorted({st.status for h in hosts.values() for st in h.stages.values()})
    table = Table(show_lines=False, title=f"{len(hosts)} hosts")
    table.add_column("stage")
    for status in statuses:
        table.add_column(status, justify="right", style=STYLE.get(status, ""))
    table.add_column("not ok (host: status)")
    for s in stages:
        got = {name: h.stages[s].status for name, h in hosts.items() if s in h.stages}
        odd = [f"{n}: {st}" for n, st in got.items() if st not in (Status.OK, Status.CHANGED)]
        shown = ", ".join(odd[:6]) + (f" and {len(odd) - 6} more" if len(odd) > 6 else "")
        table.add_row(s, *[str(sum(1 for v in got.values() if v == status))
                           for status in statuses], shown)
    return table


def summary_table(summary: RunSummary) -> Table:
    """Host x stage table of statuses and durations (for more than WIDE hosts: `fleet_table`)."""
    if len(summary.hosts) > WIDE:
        return fleet_table(summary)
    table = Table(show_lines=False)
    table.add_column("stage")
    for host in summary.hosts:
        table.add_column(host)
    for s in _stage_ids(summary):
        cells = []
        for h in summary.hosts.values():
            st = h.stages.get(s)
            cells.append(Text("-", style="dim") if st is None else
                         Text(f"{st.status} {st.duration_s:.2f}s", style=STYLE.get(st.status, "")))
        table.add_row(s, *cells)
    return table


#: facts worth a line in the closing summary, by key, with how to show them
HIGHLIGHTS: dict[str, str] = {
    "ready_after_s": "ready after {:.1f}s",
    "accept_length": "accept length {:.2f}",
    "version": "SGLang {}",
    "model": "model {}",
}


def _host_highlights(h: HostSummary) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for facts in h.facts.values():
        for key in HIGHLIGHTS:
            if facts.get(key) is not None:
                found.setdefault(key, facts[key])
    return found


def _shown(key: str, value: Any) -> str:
    try:
        return HIGHLIGHTS[key].format(value)
    except (ValueError, TypeError):
        return f"{key} {value}"


def highlights(summary: RunSummary) -> list[str]:
    """The headline facts (readiness time, accept length, ...): one line per host, or for more
    than WIDE hosts one line for all (numbers as min-max, other values each once)."""
    per_host = {host: _host_highlights(h) for host, h in summary.hosts.items()}
    per_host = {host: f for host, f in per_host.items() if f}
    if len(summary.hosts) <= WIDE:
        return [f"{host}: " + ", ".join(_shown(k, v) for k, v in f.items())
                for host, f in per_host.items()]
    if not per_host:
        return []
    parts = []
    for key in HIGHLIGHTS:
        values = [f[key] for f in per_host.values() if key in f]
        if not values:
            continue
        if all(isinstance(v, (int, float)) for v in values) and min(values) != max(values):
            low, high = _shown(key, min(values)), _shown(key, max(values)).split()[-1]
            parts.append(f"{low}-{high}")
        else:
            parts.append(" / ".join(dict.fromkeys(_shown(key, v) for v in values)))
    return [f"{len(per_host)} of {len(summary.hosts)} hosts: " + ", ".join(parts)]


#: the statuses of a node that was not converged: what `--diff` lists
NOT_CONVERGED = (Status.WOULD_CHANGE, Status.CHANGED)


def diff_lines(summary: RunSummary) -> list[str]:
    """`--diff`: each (host, stage) that was not converged, with the reason its check gave, in
    stage order; hosts with the same stage and reason share a line ("  stage on a, b: reason")."""
    found: dict[tuple[str, str], list[str]] = {}
    for s in _stage_ids(summary):
        for host, h in summary.hosts.items():
            st = h.stages.get(s)
            if st is not None and st.status in NOT_CONVERGED:
                reason = " / ".join((st.reason or "no reason given").splitlines())
                found.setdefault((s, reason), []).append(host)
    verb = "would change" if summary.dry_run else "changed"
    if not found:
        return [f"diff: nothing {verb}"]
    runs = sum(len(hosts) for hosts in found.values())
    lines = [f"diff: {runs} stage run(s) {verb}:"]
    for (s, reason), hosts in found.items():
        shown = ", ".join(hosts[:6]) + (f" and {len(hosts) - 6} more" if len(hosts) > 6 else "")
        lines.append(f"  {s} on {shown}: {reason}")
    return lines
