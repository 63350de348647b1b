"""`orchestrator report`: Markdown and PNG plots from bench results, tune dirs and deploy runs.

Inputs, each a path: a bench run (runs/<id>, its bench/ dir or results.json), a tune dir (its
tune.json names the bench run of every candidate) or a deploy run (runs/<id> with events.jsonl
and no bench/: drawn as a Gantt chart, see gantt.py).

Bench plots (matplotlib, Agg backend): output tok/s vs concurrency, one line per configuration;
output tok/s vs per-user tok/s (where speculation stops paying ringed); speedup over the
baseline (the configuration labelled `baseline`, or --baseline); TTFT and ITL p50/p99; accept
length. The Markdown holds the same figures as tables, and each configuration's exact launch
arguments and versions: from the server's launch fingerprint recorded by bench, and the pin
file (deploy.lock.json) of the deploy that started that server, when it is found. Every figure
is the benchmark's own; the report divides throughputs for speedups and 1000 by the median TPOT
for per-user tok/s. A percentile from too few requests (p99 from fewer than 100, p95 from fewer
than 20, p90 from fewer than 10) is marked: the slowest request alone sets it.

The title says what was reported: "Deploy report" (deploy runs only), "Benchmark report",
"Tune report", or both kinds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bench.bench import BenchResults, BenchRun, BenchServer, load_results
from orchestrator.bench.gantt import draw_gantt
from orchestrator.bench.tune import TUNE_FILE, Recommendation, TuneState
from orchestrator.errors import ConfigError
from orchestrator.events import new_run_id, utc_now
from orchestrator.summary import RunSummary


@dataclass
class Series:
    """One configuration on one host: its runs by concurrency, and where it came from."""

    label: str
    host: str
    run_id: str
    path: str
    server: BenchServer
    #: the runs that produced figures, by concurrency
    points: dict[int, BenchRun]
    failures: list[BenchRun] = field(default_factory=list)
    host_error: str | None = None
    pin: dict[str, Any] | None = None
    pin_path: str | None = None

    def value(self, c: int, key: str) -> float | None:
        """A figure of the run at concurrency c (None when not measured)."""
        run = self.points.get(c)
        return run.figure(key) if run is not None else None


@dataclass
class Report:
    """What write_report produced."""

    out_dir: Path
    markdown: Path
    pngs: list[Path]
    table: str
    series: list[Series]


def find_pin(runs_dir: Path, fingerprint: str | None,
             deploy_run: str | None = None) -> tuple[Path | None, dict[str, Any] | None]:
    """The pin file of the deploy that started the server with this fingerprint (newest)."""
    candidates: list[Path] = []
    if deploy_run:
        candidates.append(runs_dir / deploy_run)
    if fingerprint:
        candidates += sorted((p for p in runs_dir.glob("*") if p.is_dir()), reverse=True)
    for run in candidates:
        lock, summary = run / "deploy.lock.json", run / "summary.json"
        if not lock.is_file() or not summary.is_file():
            continue
        try:
            record = RunSummary.read(summary)
        except (ValueError, TypeError, KeyError):  # not JSON, or not a summary
            continue
        if run.name != deploy_run and not _started(record, fingerprint or ""):
            continue
        try:
            return lock, json.loads(lock.read_text())
        except ValueError:
            continue
    return None, None


def _started(summary: RunSummary, fingerprint: str) -> bool:
    fps = (facts.get("fingerprint") for h in summary.hosts.values() for facts in h.facts.values())
    return any(isinstance(fp, str) and fp and fingerprint.startswith(fp) for fp in fps)


def series_of(results: BenchResults) -> list[Series]:
    """One Series per host of one bench results file."""
    path = Path(results.path or ".")
    runs_dir = path.parents[2] if len(path.parents) > 2 else Path(".")
    multi = len(results.hosts) > 1
    out = []
    for host, h in results.hosts.items():
        server = h.server or BenchServer()
        label = str(results.label or server.label or "?")
        pin_path, pin = find_pin(runs_dir, server.fingerprint, results.deploy_run)
        out.append(Series(
            label=f"{label} @{host}" if multi else label, host=host, run_id=results.run_id,
            path=str(path), server=server, points={r.concurrency: r for r in h.runs if r.ok},
            failures=[r for r in h.runs if not r.ok], host_error=h.error, pin=pin,
            pin_path=str(pin_path) if pin_path else None))
    return out


def _classify(paths: Sequence[str]) -> tuple[list[BenchResults], list[Path],
                                             list[tuple[Path, TuneState]]]:
    """(bench results, deploy events.jsonl paths, tune dirs and their tune.json) from the
    inputs."""
    benches: list[BenchResults] = []
    deploys: list[Path] = []
    tunes: list[tuple[Path, TuneState]] = []
    for raw in paths:
        p = Path(raw)
        if (p / TUNE_FILE).is_file():
            state = TuneState.from_json(json.loads((p / TUNE_FILE).read_text()))
            tunes.append((p, state))
            benches += [load_results(e.bench_results) for e in state.candidates.values()
                        if e.bench_results]
        elif (p / "events.jsonl").is_file() and not (p / "bench").is_dir():
            deploys.append(p / "events.jsonl")
        elif p.is_file() and p.name == "events.jsonl":
            deploys.append(p)
        else:
            benches.append(load_results(p))
    return benches, deploys, tunes


def write_report(paths: Sequence[str], *, out: str | os.PathLike[str] | None = None,
                 baseline: str | None = None, run_dir: str | os.PathLike[str] = "runs") -> Report:
    """Write report.md and the PNGs into `out` (default RUN_DIR/report-<id>)."""
    from orchestrator.bench import plots

    benches, deploys, tunes = _classify(paths)
    if not benches and not deploys:
        raise ConfigError("nothing to report: give bench runs, a tune dir or deploy runs")
    out_dir = Path(out) if out else Path(run_dir) / f"report-{new_run_id()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    series = _distinct([s for r in benches for s in series_of(r)])
    base = _baseline(series, baseline)
    pngs: list[Path] = []
    if any(s.points for s in series):
        pngs += plots.bench_plots(series, base, out_dir)
    for ev in deploys:
        pngs.append(draw_gantt(ev, out_dir / f"deploy-{ev.parent.name}.png"))
    table = throughput_table(series, base) if series else ""
    md = _markdown(series, base, table, pngs, deploys, tunes, out_dir)
    (out_dir / "report.md").write_text(md)
    return Report(out_dir, out_dir / "report.md", pngs, table, series)


def _baseline(series: list[Series], wanted: str | None) -> Series | None:
    if wanted:
        for s in series:
            if wanted in (s.run_id, s.label) or Path(s.path).is_relative_to(Path(wanted)):
                return s
        raise ConfigError(f"--baseline {wanted}: not one of the runs reported")
    return next((s for s in series if is_baseline(s)), None)


def is_baseline(s: Series) -> bool:
    """The configuration without speculation (its label, less host and run suffixes)."""
    return s.label.split(" @")[0].split(" [run ")[0] == "baseline"


def _distinct(series: list[Series]) -> list[Series]:
    """Two series with one label (the same setting benched twice) get their run id in it: a
    legend must tell its lines apart."""
    seen: dict[str, int] = {}
    for s in series:
        seen[s.label] = seen.get(s.label, 0) + 1
    for s in series:
        if seen[s.label] > 1:
            s.label = f"{s.label} [run {s.run_id}]"
    return series


def concurrencies(series: list[Series]) -> list[int]:
    """Every concurrency measured by any series, ascending."""
    return sorted({c for s in series for c in s.points})


def _cell(s: Series, base: Series | None, c: int) -> str:
    tps = s.value(c, "output_throughput")
    if tps is None:
        return "-"
    ref = base.value(c, "output_throughput") if base is not None and base is not s else None
    return f"{tps:.1f} ({tps / ref:.2f}x)" if ref else f"{tps:.1f}"


def best_at(series: list[Series], c: int) -> Series | None:
    """The series with the highest output throughput at concurrency c."""
    have = [s for s in series if s.value(c, "output_throughput") is not None]
    return max(have, key=lambda s: s.value(c, "output_throughput") or 0.0) if have else None


def throughput_table(series: list[Series], base: Series | None) -> str:
    """Markdown table: output tok/s (speedup over the baseline) per concurrency."""
    head = ["concurrency", *[s.label for s in series], "best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in concurrencies(series):
        best = best_at(series, c)
        cells = [str(c), *[_cell(s, base, c) for s in series], best.label if best else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def user_table(series: list[Series]) -> str:
    """Markdown table: per-user tok/s (1000 / median TPOT) per concurrency."""
    head = ["concurrency", *[s.label for s in series]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in concurrencies(series):
        cells = [str(c)]
        for s in series:
            run = s.points.get(c)
            v = run.user_tps if run is not None else None
            cells.append("-" if v is None else f"{v:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: a run's columns in a configuration's table: (results key, heading); percentiles are marked
#: when too few requests stand behind them
LATENCY_COLUMNS = (("output_throughput", "tok/s"), ("user_tps", "user tok/s"),
                   ("median_ttft_ms", "TTFT p50 ms"), ("p99_ttft_ms", "TTFT p99 ms"),
                   ("median_tpot_ms", "TPOT p50 ms"), ("p99_tpot_ms", "TPOT p99 ms"),
                   ("median_itl_ms", "ITL p50 ms"), ("p99_itl_ms", "ITL p99 ms"),
                   ("accept_length", "accept length"), ("completed", "requests"),
                   ("duration", "duration s"))
THIN = "†"


def _latency_table(s: Series) -> list[str]:
    keys = LATENCY_COLUMNS
    lines = ["| concurrency | " + " | ".join(k[1] for k in keys) + " |",
             "|" + "---|" * (len(keys) + 1)]
    thin: dict[int, int] = {}
    for c in sorted(s.points):
        run, vals = s.points[c], []
        for key, _ in keys:
            v = run.user_tps if key == "user_tps" else s.value(c, key)
            cell = "-" if v is None else (f"{v:.0f}" if key == "completed" else f"{v:.2f}")
            few = run.thin(key)
            if v is not None and few is not None:
                cell += f" {THIN}"
                thin[c] = few
            vals.append(cell)
        lines.append(f"| {c} | " + " | ".join(vals) + " |")
    if thin:
        lines += ["", f"{THIN} p99 from fewer than 100 requests (" + ", ".join(
            f"{n} at concurrency {c}" for c, n in sorted(thin.items())) + "): a few requests "
            "(or one) set it, not a tail estimate; run more (--num-prompts) for one."]
    odd = sorted({f"{k}={v}" for r in s.points.values() for k, v in (r.nonfinite or {}).items()})
    if odd:
        why = (" (request_rate=inf is SGLang's default: every request sent at once, "
               "`--max-concurrency` alone paces them)" if "request_rate=inf" in odd else "")
        lines += ["", "Written by SGLang as Infinity/NaN, null in results.json: "
                  + ", ".join(odd) + why + "."]
    return lines


def _config_section(s: Series) -> list[str]:
    sv = s.server
    lines = [f"### {s.label}", "",
             f"- bench run `{s.run_id}` on `{s.host}` ({s.path})",
             f"- SGLang {sv.sglang_version}, python `{sv.python}`",
             f"- launch fingerprint `{sv.fingerprint}`; model `{sv.model}`, "
             f"drafter `{sv.drafter}`",
             f"- speculative: `{json.dumps(sv.speculative, sort_keys=True)}`"]
    if s.pin is not None:
        pkgs = ((s.pin.get("stages") or {}).get("packages") or {}).get("versions") or {}
        lines.append(f"- pin file `{s.pin_path}` (deploy run `{s.pin.get('run_id')}`); "
                     "packages: " + ", ".join(f"{k}=={v}" for k, v in sorted(pkgs.items())))
    else:
        lines.append("- pin file: not found (the deploy that started this server is not in "
                     "the runs dir)")
    lines += ["", "Launch arguments (exact, as the server was started):", "", "```",
              " ".join(str(a) for a in sv.args or []), "```", ""]
    lines += _latency_table(s)
    for f in s.failures:
        lines += ["", f"- FAILED at concurrency {f.concurrency}: {f.error}", "",
                  "```", str(f.tail or ""), "```"]
    if s.host_error:
        lines += ["", f"- **{s.host_error}**"]
    return lines + [""]


def _choice_words(rec: Recommendation) -> str:
    """Which load the override was chosen for, and what was chosen."""
    target = rec.target.describe()
    if rec.target.concurrency is None and rec.target.min_user_tps is None:
        target = "the lowest concurrency measured (tune --for-concurrency N for another load)"
    if rec.choice is None:
        return f"Override: none; no setting meets the target ({target})."
    return (f"Override tuned for {target}: `{rec.choice}` at concurrency "
            f"{rec.choice_concurrency}.")


def _tune_section(tunes: list[tuple[Path, TuneState]]) -> list[str]:
    lines: list[str] = []
    for tune_dir, t in tunes:
        rec = t.recommendation
        lines += ["## Tune: best setting per concurrency", "",
                  f"Tune dir `{tune_dir}`; override file `{rec and rec.override_file}`.", "",
                  "| concurrency | best | tok/s | vs baseline | user tok/s |",
                  "|---|---|---|---|---|"]
        for row in rec.per_concurrency if rec else []:
            user = f"{row.user_tps:.1f}" if row.user_tps else "-"
            lines.append(f"| {row.concurrency} | {row.best} | "
                         f"{row.output_throughput:.1f} | {row.speedup or '-'} | {user} |")
        lines += ["", rec.summary if rec else "", ""]
        if rec is not None:
            lines += [_choice_words(rec), ""]
    return lines


def title(series: list[Series], deploys: list[Path], tunes: list[tuple[Path, TuneState]]) -> str:
    """What the report is of: a deploy report is not called a benchmark report."""
    kinds = ["Tune" if tunes else "Benchmark"] if series or tunes else []
    if deploys:
        kinds.append("deploy" if kinds else "Deploy")
    return " and ".join(kinds) + " report"


def _markdown(series: list[Series], base: Series | None, table: str, pngs: list[Path],
              deploys: list[Path], tunes: list[tuple[Path, TuneState]], out_dir: Path) -> str:
    lines = [f"# {title(series, deploys, tunes)}", "",
             f"Generated {utc_now()} by `orchestrator report`.", ""]
    if series:
        lines += ["## Output throughput (tok/s), speedup vs "
                  + (f"`{base.label}`" if base else "(no baseline run)"), "", table, ""]
        lines += ["## Per-user decode speed (tok/s = 1000 / median TPOT)", "",
                  "What one request sees while the others run; the tradeoff plot sets it "
                  "against the total above.", "", user_table(series), ""]
    lines += _tune_section(tunes)
    for png in pngs:
        lines += [f"![{png.stem}]({os.path.relpath(png, out_dir)})", ""]
    if series:
        lines += ["## Configurations", ""]
        for s in series:
            lines += _config_section(s)
    for ev in deploys:
        lines += [f"## Deploy {ev.parent.name}", "", f"Stage timeline from `{ev}` in "
                  f"`deploy-{ev.parent.name}.png`.", ""]
    return "\n".join(lines)
