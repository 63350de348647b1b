"""The stage timeline of a deploy run, per host, as a Gantt chart (PNG) drawn from events.jsonl.

One row per (host, stage), seconds since the run started on the x axis. A bar spans
`stage.start` to `stage.end`, coloured by the status; marked on it: each failed attempt that was
retried (`stage.retry`, a red tick, with the back-off sleep hatched), checks asked again after a
dropped connection (`stage.check_retry`), and the stage's failure. A grey hatched bar on a
host's first row is the wait for the host's SSH (`host.start` to `host.connected`, with
`host.waiting` events); an unreachable host is written on its row. A stage that recorded the
fact "load_timeline" (wait_ready: the server's own load phases, orchestrator.sglang.timeline)
gets them as thin sub-bars under its bar, from the server's process start (during the server
stage) to its first ready.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

#: the load phases' colours (orchestrator.sglang.timeline's names)
PHASE_COLOURS = {
    "process start": "#c7c7c7", "target weights": "#6a51a3", "draft weights": "#9e9ac8",
    "kv pool": "#fdae6b", "cuda graph capture": "#e6550d", "first ready": "#31a354",
}
STATUS_COLOURS = {
    "ok": "#9bbf85", "changed": "#3f7fbf", "failed": "#d1495b", "would-change": "#e8a33d",
    "skipped": "#d9d9d9", "cancelled": "#a0a0a0", "unreachable": "#a0a0a0",
}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class StageBar:
    """One (host, stage) node on the timeline."""

    host: str
    stage: str
    start: float | None = None
    end: float | None = None
    status: str = "pending"
    attempts: int = 1
    retries: list[tuple[float, float, str]] = field(default_factory=list)  # (t, sleep, error)
    check_retries: list[float] = field(default_factory=list)
    error: str | None = None
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start, end)


@dataclass
class HostLine:
    """A host's own marks: the wait for SSH and whether it was reachable."""

    start: float | None = None
    connected: float | None = None
    waits: int = 0
    unreachable: str | None = None


@dataclass
class Timeline:
    """Everything the chart draws, read from one events.jsonl."""

    run_id: str
    t0: float
    hosts: dict[str, HostLine]
    bars: list[StageBar]
    exit_code: int | None

    @property
    def duration(self) -> float:
        """Seconds from the first to the last stage end."""
        ends = [b.end for b in self.bars if b.end is not None]
        return max(ends, default=0.0)


def _bar(bars: dict[tuple[str, str], StageBar], e: dict[str, Any]) -> StageBar:
    key = (e["host"], e["stage"])
    return bars.setdefault(key, StageBar(*key))


def _host_event(hosts: dict[str, HostLine], name: str, e: dict[str, Any], t: float) -> None:
    line = hosts.setdefault(e["host"], HostLine())
    if name == "host.start":
        line.start = t
    elif name == "host.connected":
        line.connected = t
    elif name == "host.waiting":
        line.waits += 1
    elif name == "host.unreachable":
        line.unreachable = str(e.get("error") or "unreachable")


def _phases(facts: Any, t0: float) -> list[tuple[str, float, float]]:
    """The fact "load_timeline" (epoch seconds) relative to the run's start."""
    load = facts.get("load_timeline") if isinstance(facts, dict) else None
    return [(str(p["phase"]), float(p["start"]) - t0, float(p["end"]) - t0)
            for p in load or [] if isinstance(p, dict) and {"phase", "start", "end"} <= set(p)]


def _stage_event(bar: StageBar, name: str, e: dict[str, Any], t: float, t0: float) -> None:
    if name == "stage.start":
        bar.start = t
    elif name == "stage.end":
        bar.phases = _phases(e.get("facts"), t0)
        bar.end, bar.status = t, str(e.get("status") or "?")
        bar.attempts = int(e.get("attempts") or 1)
        bar.error = e.get("error")
        if bar.start is None:  # skipped nodes end without starting
            bar.start = t - float(e.get("duration_s") or 0.0)
    elif name == "stage.retry":
        bar.retries.append((t, float(e.get("sleep_s") or 0.0), str(e.get("error") or "")))
    elif name == "stage.check_retry":
        bar.check_retries.append(t)


def read_timeline(events_path: str | Path) -> Timeline:
    """Parse events.jsonl into bars; times relative to run.start."""
    events = [json.loads(line) for line in Path(events_path).read_text().splitlines()
              if line.strip()]
    start = next((e for e in events if e.get("event") == "run.start"), events[0] if events
                 else None)
    if start is None:
        raise ValueError(f"{events_path}: no events")
    t0 = _ts(start["ts"])
    hosts: dict[str, HostLine] = {h: HostLine() for h in start.get("hosts") or []}
    bars: dict[tuple[str, str], StageBar] = {}
    exit_code = None
    for e in events:
        name = e.get("event", "")
        t = _ts(e["ts"]) - t0 if "ts" in e else 0.0
        if name.startswith("host.") and "host" in e:
            _host_event(hosts, name, e, t)
        elif name.startswith("stage.") and "stage" in e and "host" in e:
            _stage_event(_bar(bars, e), name, e, t, t0)
        elif name == "run.end":
            exit_code = e.get("exit_code")
    order = {h: i for i, h in enumerate(hosts)}
    stage_order = {s: i for i, s in enumerate(start.get("stages") or [])}
    ordered = sorted(bars.values(), key=lambda b: (order.get(b.host, 99),
                                                   stage_order.get(b.stage, 99), b.start or 0))
    return Timeline(str(start.get("run_id", "")), t0, hosts, ordered, exit_code)


def _draw_bars(ax: Any, tl: Timeline, rows: dict[tuple[str, str], int]) -> None:
    for b in tl.bars:
        y = rows[(b.host, b.stage)]
        start, end = b.start or 0.0, b.end if b.end is not None else tl.duration
        width = max(end - start, tl.duration * 0.003)
        ax.barh(y, width, left=start, height=0.6,
                color=STATUS_COLOURS.get(b.status, "#bbbbbb"), edgecolor="#333333", lw=0.5)
        for t, sleep, _err in b.retries:
            ax.barh(y, max(sleep, tl.duration * 0.002), left=t, height=0.6, color="white",
                    hatch="////", edgecolor="#d1495b", lw=0.5)
            ax.plot([t, t], [y - 0.42, y + 0.42], color="#d1495b", lw=2.2)
        for t in b.check_retries:
            ax.plot(t, y, marker="o", ms=5, color="#e8a33d", mec="#333333")
        for phase, p0, p1 in b.phases:  # the server's own load phases, under the bar
            ax.barh(y + 0.38, max(p1 - p0, tl.duration * 0.002), left=p0, height=0.16,
                    color=PHASE_COLOURS.get(phase, "#bbbbbb"), lw=0)
        label = b.status + (f", {b.attempts} attempts" if b.attempts > 1 else "")
        gap = 0.02 if b.status == "failed" else 0.006  # clear of the failure mark
        ax.text(end + tl.duration * gap, y, label, va="center", fontsize=8)
        if b.status == "failed":
            ax.plot(end, y, marker="X", ms=10, color="#d1495b", mec="black")


def _draw_hosts(ax: Any, tl: Timeline, first_row: dict[str, int]) -> None:
    for host, line in tl.hosts.items():
        if host not in first_row:
            continue
        y = first_row[host] - 0.5
        if line.start is not None and line.connected is not None and \
                (line.waits or line.connected - line.start > tl.duration * 0.03):
            ax.barh(y, line.connected - line.start, left=line.start, height=0.35,
                    color="#eeeeee", hatch="..", edgecolor="#777777", lw=0.5)
            what = f"waited for SSH ({line.waits} tries)" if line.waits else "connecting"
            ax.text(line.connected + tl.duration * 0.006, y, what, va="center", fontsize=7)
        if line.unreachable:
            ax.text(0, y, f"{host}: unreachable - {line.unreachable[:80]}", va="center",
                    fontsize=7, color="#d1495b")


def draw_gantt(events_path: str | Path, out_png: str | Path) -> Path:
    """Draw the timeline of one deploy run into `out_png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl = read_timeline(events_path)
    labels = [f"{b.host}  {b.stage}" for b in tl.bars]
    rows = {(b.host, b.stage): i for i, b in enumerate(tl.bars)}
    first_row: dict[str, int] = {}
    for b in tl.bars:
        first_row.setdefault(b.host, rows[(b.host, b.stage)])
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.38 * max(1, len(labels))))
    _draw_bars(ax, tl, rows)
    _draw_hosts(ax, tl, first_row)
    for row in list(first_row.values())[1:]:
        ax.axhline(row - 0.5, color="#555555", lw=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.set_ylim(len(labels) - 0.4, -0.9)
    ax.set_xlim(0, tl.duration * 1.16 + 0.01)
    ax.set_xlabel("seconds since the run started")
    ax.grid(axis="x", alpha=0.3)
    outcome = "" if tl.exit_code is None else f", exit code {tl.exit_code}"
    ax.set_title(f"deploy {tl.run_id}: stage timeline per host{outcome}")
    seen = sorted({b.status for b in tl.bars})
    handles = [Patch(color=STATUS_COLOURS.get(s, "#bbbbbb"), label=s) for s in seen]
    handles.append(Patch(facecolor="white", hatch="////", edgecolor="#d1495b",
                         label="failed attempt + back-off (retried)"))
    phases = dict.fromkeys(ph for b in tl.bars for ph, _, _ in b.phases)
    handles += [Patch(color=PHASE_COLOURS.get(ph, "#bbbbbb"), label=f"load: {ph}")
                for ph in phases]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1 - 2.0 / (
        4 + len(labels))), ncol=min(len(handles), 6), fontsize=8, frameon=False)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
