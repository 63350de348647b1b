"""What a tune concludes from its measured candidates (pure: bench results in, advice out).

- best per concurrency: the candidate with the highest output tok/s (the benchmark's figure);
- where speculation stops paying: the lowest concurrency C measured such that `off` is best at
  C and at every higher concurrency measured (None when some speculative setting wins at the
  highest concurrency measured, or when `off` was not measured);
- the override: the setting best at the lowest concurrency measured, written as a vars file
  (`speculative:` mapping) for `orchestrator deploy --vars-file`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.bench.bench import load_results
from orchestrator.bench.tune import BestAt, Candidate, Recommendation, TuneEntry


def _throughputs(entry: TuneEntry) -> dict[int, float]:
    """concurrency -> output tok/s of a measured candidate (first host's runs)."""
    out: dict[int, float] = {}
    for h in load_results(str(entry.bench_results)).hosts.values():
        for run in h.runs:
            value = run.figure("output_throughput")
            if value is not None:
                out.setdefault(run.concurrency, value)
    return out


def recommend(measured: list[TuneEntry]) -> Recommendation:
    """Best candidate per concurrency, where speculation stops paying, the override."""
    table = {e.key: _throughputs(e) for e in measured}
    entries = {e.key: e for e in measured}
    cs = sorted({c for t in table.values() for c in t})
    rows = []
    for c in cs:
        have = {k: t[c] for k, t in table.items() if c in t}
        best = max(have, key=lambda k: have[k])
        off = table.get("off", {}).get(c)
        rows.append(BestAt(c, best, entries[best].label, have[best],
                           round(have[best] / off, 3) if off else None, off))
    stops = None
    if "off" in table:
        for row in reversed(rows):
            if row.best != "off":
                break
            stops = row.concurrency
    best_low = rows[0].best if rows else None
    summary = (f"speculation stops paying from concurrency {stops}" if stops is not None else
               "speculation pays at every concurrency measured" if "off" in table else
               "`off` not measured: cannot say where speculation stops paying")
    return Recommendation(rows, stops, best_low,
                          entries[best_low].settings if best_low else None, summary)


def write_override(path: Path, rec: Recommendation,
                   greedy: dict[str, str] | None = None) -> Path:
    """The vars file of the setting best at the lowest concurrency measured, with the greedy
    answers `off` gave (`greedy_reference`: a speculative deploy must answer the same)."""
    rows = rec.per_concurrency
    head = [f"# Written by `orchestrator tune`: the speculative setting best at concurrency "
            f"{rows[0].concurrency if rows else '?'}.",
            "# Use it: orchestrator deploy PLAYBOOK -i INVENTORY --vars-file THIS_FILE",
            "# Best per concurrency (output tok/s, speedup vs off):"]
    head += [f"#   {r.concurrency:>4}: {r.label} {r.output_throughput:.1f}"
             + (f" ({r.speedup:.2f}x)" if r.speedup else "") for r in rows]
    head.append(f"# {rec.summary}.")
    doc = (rec.best_low_settings or Candidate(None)).variables()
    if greedy:
        head.append("# greedy_reference: what the target answered without speculation.")
        doc["greedy_reference"] = greedy
    body = yaml.safe_dump(doc, sort_keys=False)
    path.write_text("\n".join(head) + "\n" + body)
    return path


def summary_lines(rec: Recommendation, failed: list[str],
                  refused: dict[str, str] | None = None) -> list[str]:
    """The lines tune prints at the end."""
    lines = ["tune: best setting per concurrency (output tok/s, speedup vs off):"]
    for r in rec.per_concurrency:
        speed = f" ({r.speedup:.2f}x)" if r.speedup else ""
        lines.append(f"  {r.concurrency:>4}  {r.label:<40} {r.output_throughput:>9.1f}{speed}")
    lines.append(f"tune: {rec.summary}")
    if rec.override_file:
        lines.append(f"tune: override file {rec.override_file} (deploy --vars-file)")
    if failed:
        lines.append(f"tune: not measured: {', '.join(failed)} (run tune again to retry)")
    for key, reason in (refused or {}).items():
        lines.append(f"tune: refused by the preflight (never launched): {key}: {reason}")
    return lines
