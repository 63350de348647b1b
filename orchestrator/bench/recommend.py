"""What a tune concludes from its measured candidates (pure: bench results in, advice out).

- best per concurrency: the candidate with the highest output tok/s (the benchmark's figure);
- where speculation stops paying: the lowest concurrency C measured such that `off` is best at
  C and at every higher concurrency measured (None when some speculative setting wins at the
  highest concurrency measured, or when `off` was not measured);
- the override: the setting chosen for the target load (tune.Target: the best at
  `--for-concurrency N`; the highest output tok/s whose per-user tok/s, 1000 / median TPOT, is
  at least `--min-user-tps X`, at N or at any concurrency; by default the best at the lowest
  concurrency measured), written as a vars file (`speculative:` mapping) for
  `orchestrator deploy --vars-file`, its head naming the load it was chosen for.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.bench.bench import load_results
from orchestrator.bench.tune import (
    BestAt,
    Candidate,
    Recommendation,
    Target,
    TuneEntry,
)


def _figures(entry: TuneEntry) -> dict[int, tuple[float, float | None]]:
    """concurrency -> (output tok/s, per-user tok/s) of a measured candidate (first host's
    runs)."""
    out: dict[int, tuple[float, float | None]] = {}
    for h in load_results(str(entry.bench_results)).hosts.values():
        for run in h.runs:
            value = run.figure("output_throughput")
            if value is not None:
                out.setdefault(run.concurrency, (value, run.user_tps))
    return out


def _choose(table: dict[str, dict[int, tuple[float, float | None]]], rows: list[BestAt],
            target: Target) -> tuple[str, int] | None:
    """(candidate, concurrency) for the target, or None when none meets it."""
    if target.min_user_tps is None:
        at = target.concurrency if target.concurrency is not None else (
            rows[0].concurrency if rows else None)
        row = next((r for r in rows if r.concurrency == at), None)
        return (row.best, row.concurrency) if row else None
    fits = [(fig[0], key, c) for key, t in table.items() for c, fig in t.items()
            if fig[1] is not None and fig[1] >= target.min_user_tps
            and target.concurrency in (None, c)]
    if not fits:
        return None
    _, key, c = max(fits, key=lambda f: (f[0], -f[2]))
    return key, c


def recommend(measured: list[TuneEntry], target: Target | None = None) -> Recommendation:
    """Best candidate per concurrency, where speculation stops paying, the override's choice."""
    target = target or Target()
    table = {e.key: _figures(e) for e in measured}
    entries = {e.key: e for e in measured}
    cs = sorted({c for t in table.values() for c in t})
    rows = []
    for c in cs:
        have = {k: t[c][0] for k, t in table.items() if c in t}
        best = max(have, key=lambda k: have[k])
        off = table.get("off", {}).get(c, (None,))[0]
        rows.append(BestAt(c, best, entries[best].label, have[best],
                           round(have[best] / off, 3) if off else None, off,
                           table[best][c][1]))
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
    chosen = _choose(table, rows, target)
    if chosen is None:
        return Recommendation(rows, stops, best_low,
                              entries[best_low].settings if best_low else None, summary,
                              target=target)
    key, at = chosen
    return Recommendation(rows, stops, best_low,
                          entries[best_low].settings if best_low else None, summary,
                          target=target, choice=key, choice_settings=entries[key].settings,
                          choice_concurrency=at, choice_output_tps=table[key][at][0],
                          choice_user_tps=table[key][at][1])


def write_override(path: Path, rec: Recommendation,
                   greedy: dict[str, str] | None = None) -> Path:
    """The vars file of the setting chosen for the target load, saying which load that is, with
    the greedy answers `off` gave (`greedy_reference`: a speculative deploy must answer the
    same)."""
    rows = rec.per_concurrency
    user = f", {rec.choice_user_tps:.1f} tok/s per user" if rec.choice_user_tps else ""
    head = [f"# Written by `orchestrator tune`: tuned for {_target_words(rec)}.",
            f"# Chosen: {rec.choice} at concurrency {rec.choice_concurrency} "
            f"({rec.choice_output_tps or 0:.1f} output tok/s{user}).",
            "# Another load: orchestrator tune ... --for-concurrency N [--min-user-tps X]",
            "# Use it: orchestrator deploy PLAYBOOK -i INVENTORY --vars-file THIS_FILE",
            "# Best per concurrency (output tok/s, speedup vs off, per-user tok/s):"]
    head += [f"#   {r.concurrency:>4}: {r.label} {r.output_throughput:.1f}"
             + (f" ({r.speedup:.2f}x)" if r.speedup else "")
             + (f", {r.user_tps:.1f}/user" if r.user_tps else "") for r in rows]
    head.append(f"# {rec.summary}.")
    doc = (rec.choice_settings or Candidate(None)).variables()
    if greedy:
        head.append("# greedy_reference: what the target answered without speculation.")
        doc["greedy_reference"] = greedy
    body = yaml.safe_dump(doc, sort_keys=False)
    path.write_text("\n".join(head) + "\n" + body)
    return path


def _target_words(rec: Recommendation) -> str:
    words = rec.target.describe()
    if rec.target.concurrency is None and rec.target.min_user_tps is None and rec.per_concurrency:
        words = f"concurrency {rec.per_concurrency[0].concurrency} (the lowest measured)"
    return words


def summary_lines(rec: Recommendation, failed: list[str],
                  refused: dict[str, str] | None = None) -> list[str]:
    """The lines tune prints at the end."""
    lines = ["tune: best setting per concurrency (output tok/s, speedup vs off, per-user tok/s):"]
    for r in rec.per_concurrency:
        speed = f" ({r.speedup:.2f}x)" if r.speedup else ""
        user = f"  {r.user_tps:.1f}/user" if r.user_tps else ""
        lines.append(f"  {r.concurrency:>4}  {r.label:<40} {r.output_throughput:>9.1f}{speed}"
                     f"{user}")
    lines.append(f"tune: {rec.summary}")
    if rec.choice is None:
        lines.append(f"tune: no setting meets the target ({_target_words(rec)}): no override "
                     "written")
    else:
        lines.append(f"tune: for {_target_words(rec)}: {rec.choice} at concurrency "
                     f"{rec.choice_concurrency}")
    if rec.override_file:
        lines.append(f"tune: override file {rec.override_file} (deploy --vars-file)")
    if failed:
        lines.append(f"tune: not measured: {', '.join(failed)} (run tune again to retry)")
    for key, reason in (refused or {}).items():
        lines.append(f"tune: refused by the preflight (never launched): {key}: {reason}")
    return lines
