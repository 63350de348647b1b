"""The load timeline, from SGLang's own log lines: where a server's start went.

Every line SGLang logs is `[%(asctime)s{.msecs}{prefix}] %(message)s` with asctime
`%Y-%m-%d %H:%M:%S` in the host's local time, milliseconds only with SGLANG_LOG_MS=1
(sglang 0.5.9 srt/utils/common.py:1227-1232, 0.5.23 :2629-2637). The lines read here, and the
releases whose source they were read from (the same words in both; the capture line changed):

- `Load weight begin. avail mem=...` / `Load weight end. elapsed=S s, type=..., ...,
  mem usage=G GB.` (0.5.9 model_executor/model_runner.py:1041-1047; 0.5.23
  model_runner.py:1274, :1373-1379): the first pair is the target's, the second the EAGLE
  draft worker's (its own ModelRunner);
- `KV Cache is allocated. #tokens: N, ...` (0.5.9 mem_cache/memory_pool.py:652, :658; 0.5.23
  :2089, :2097, with `dtype: ..., ` before #tokens) and 0.5.23's post-capture resize `Post-capture
  KV sizing: KV cache allocated. ... #tokens: N` (model_runner_components/kv_pool_runtime.py:195);
- `Capture cuda graph begin. ...` / `Capture cuda graph end. Time elapsed: S s. ...` (0.5.9
  model_runner.py:2146-2161) and `Capture target verify CUDA graph begin. ...` / `... end.
  bs=..., elapsed=S s, ...` (0.5.23 model_runner_components/cuda_graph_setup.py:684-700,
  :758-791; draft graphs likewise, eagle_worker_v2.py:515, :634): from the first begin to the
  last end, where Triton/FlashInfer/DeepGEMM JIT compiles happen (the kernel caches' saving);
- `The server is fired up and ready to roll!` (0.5.9 entrypoints/http_server.py:1836, 0.5.23
  :2600), after the warm-up request.

Only rank 0's lines count (every TP rank logs the same phases with its own prefix).
Phases: "process start" (first line -> weights begin), "target weights", "draft weights",
"kv pool", "cuda graph capture", "first ready". Only the lines after the supervisor's last
`orchestrator-supervisor: server pid N exited` line count (the log keeps a restarted server's
earlier runs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d{3})?([^\]]*)\] (.*)$")
#: every rank logs (prefix " TP3", " DP0 TP1 EP1", ...: scheduler.py:6279-6291 (0.5.23)); rank 0's
#: lines are the timeline
_OTHER_RANK = re.compile(r"\b(?:DP|PP|ATTN_CP|MOE_DP|TP|EP)[1-9]\d*\b")
_ELAPSED = re.compile(r"(?:Time elapsed: |elapsed=)([\d.]+) s")
_MEM = re.compile(r"mem usage=([\d.]+) GB")
_KV = re.compile(r"KV [Cc]ache (?:is )?allocated\..*?#tokens: (\d+)")
_CAPTURE = re.compile(r"^Capture (?:[\w ]+ )?(?:cuda|CUDA) graph (begin|end)\b")
READY = "The server is fired up and ready to roll!"
SUPERVISOR_EXIT = "orchestrator-supervisor: server pid "
#: a time zone offset is a multiple of 15 minutes
_TZ_STEP = 900.0


@dataclass(frozen=True)
class Phase:
    """One phase of a load: [start, end] in seconds (host-local clock read as UTC until
    `anchored`), and what it did."""

    phase: str
    start: float
    end: float
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        """The run record's form (the stage fact "load_timeline")."""
        return {"phase": self.phase, "start": round(self.start, 3), "end": round(self.end, 3),
                "detail": self.detail}


def _stamp(date: str, ms: str | None) -> float:
    t = datetime.strptime(date, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return t + (float(ms) if ms else 0.0)


def _events(lines: Iterable[str]) -> list[tuple[float, str]]:
    """(time, message) of the timestamped lines of the last server run."""
    out: list[tuple[float, str]] = []
    for line in lines:
        if line.startswith(SUPERVISOR_EXIT):
            out = []
            continue
        m = _LINE.match(line)
        if m and not _OTHER_RANK.search(m.group(3)):
            out.append((_stamp(m.group(1), m.group(2)), m.group(4)))
    return out


class _Builder:
    """Phases from the (time, message) events, in order."""

    def __init__(self, first: float) -> None:
        self.phases: list[Phase] = []
        self.cursor = first
        self.weights: list[float] = []  # begin times not yet ended
        self.capture: tuple[float, float, float] | None = None  # first begin, last end, s
        self.kv_done = False

    def close(self, name: str, end: float, detail: str = "", start: float | None = None) -> None:
        begin = self.cursor if start is None else start
        self.phases.append(Phase(name, begin, max(begin, end), detail))
        self.cursor = max(self.cursor, end)

    def feed(self, t: float, msg: str) -> None:
        if msg.startswith("Load weight begin"):
            if not self.phases:
                self.close("process start", t)
            self.weights.append(t)
        elif msg.startswith("Load weight end"):
            start = self.weights.pop() if self.weights else self.cursor
            name = "target weights" if not any(p.phase == "target weights"
                                               for p in self.phases) else "draft weights"
            gb, secs = _MEM.search(msg), _ELAPSED.search(msg)
            detail = ", ".join(x for x in (f"{gb.group(1)} GB" if gb else "",
                                           f"{secs.group(1)} s" if secs else "") if x)
            self.close(name, t, detail, start=start)
        elif (m := _KV.search(msg)) and not self.kv_done:
            self.kv_done = True
            self.close("kv pool", t, f"{int(m.group(1)):,} tokens")
        elif m := _CAPTURE.match(msg):
            first, last, secs = self.capture or (t, t, 0.0)
            took = _ELAPSED.search(msg)
            secs += float(took.group(1)) if took and m.group(1) == "end" else 0.0
            self.capture = (first, t if m.group(1) == "end" else last, secs)
        elif msg.startswith(READY):
            if self.capture is not None:
                first, last, secs = self.capture
                self.close("cuda graph capture", last, f"{secs:.2f} s", start=first)
                self.capture = None
            self.close("first ready", t, "warm-up done")


def parse(lines: Iterable[str]) -> list[Phase]:
    """The phases the log's last server run got through (host-local clock, as UTC)."""
    events = _events(lines)
    if not events:
        return []
    b = _Builder(events[0][0])
    for t, msg in events:
        b.feed(t, msg)
    if b.capture is not None:  # still capturing (or no ready line yet)
        first, last, secs = b.capture
        b.close("cuda graph capture", last, f"{secs:.2f} s so far", start=first)
    return b.phases


def anchored(phases: list[Phase], started_at: float | None) -> list[Phase]:
    """PHASES on the epoch clock: the host's time zone offset is the 15-minute step nearest to
    the supervisor's start time (epoch, pid record) minus the first phase's local start; the
    process start phase begins at that start time (Python and torch imports before the first
    log line are the engine's time too)."""
    if not phases or started_at is None:
        return phases
    offset = round((started_at - phases[0].start) / _TZ_STEP) * _TZ_STEP
    out = [Phase(p.phase, p.start + offset, p.end + offset, p.detail) for p in phases]
    first = out[0]
    if first.phase == "process start" and started_at < first.start:  # the imports count too
        out[0] = Phase(first.phase, started_at, first.end, first.detail)
    return out


def summary(phases: list[Phase]) -> str:
    """One line: each phase, its length and what it did ("" when nothing is known yet)."""
    return "; ".join(f"{p.phase} {p.end - p.start:.1f}s" + (f" ({p.detail})" if p.detail else "")
                     for p in phases)


def current(lines: Iterable[str]) -> str | None:
    """What the loading server is doing now, from its log's last lines (console progress)."""
    lines = list(lines)
    phases, events = parse(lines), _events(lines)
    if not events:
        return None
    last = events[-1][1]
    if last.startswith("Load weight begin"):
        return "loading " + ("draft" if any(p.phase == "target weights" for p in phases)
                             else "target") + " weights"
    if _CAPTURE.match(last):  # an end may be followed by the draft's begin
        return "capturing CUDA graphs (JIT compiles)"
    return phases[-1].phase + " done" if phases else None
