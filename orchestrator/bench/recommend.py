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
from typing import Any

import yaml

from orchestrator.bench.bench import load_results


def _throughputs(entry: dict[str, Any]) -> dict[int, float]:
    """concurrency -> output tok/s of a measured candidate (first host's runs)."""
    results = load_results(entry["bench_results"])
    out: dict[int, float] = {}
    for h in (results.get("hosts") or {}).values():
        for run in h.get("runs") or []:
            value = (run.get("result") or {}).get("output_throughput")
            if run.get("ok") and isinstance(value, (int, float)):
                out.setdefault(int(run["concurrency"]), float(value))
    return out


def recommend(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """Best candidate per concurrency, where speculation stops paying, the override."""
    table = {e["key"]: _throughputs(e) for e in measured}
    settings = {e["key"]: e.get("settings") or {} for e in measured}
    labels = {e["key"]: e.get("label", e["key"]) for e in measured}
    cs = sorted({c for t in table.values() for c in t})
    rows = []
    for c in cs:
        have = {k: t[c] for k, t in table.items() if c in t}
        best = max(have, key=lambda k: have[k])
        off = table.get("off", {}).get(c)
        rows.append({"concurrency": c, "best": best, "label": labels[best],
                     "output_throughput": have[best],
                     "speedup": round(have[best] / off, 3) if off else None,
                     "off": off})
    stops = None
    if "off" in table:
        for row in reversed(rows):
            if row["best"] != "off":
                break
            stops = row["concurrency"]
    best_low = rows[0]["best"] if rows else None
    summary = (f"speculation stops paying from concurrency {stops}" if stops is not None else
               "speculation pays at every concurrency measured" if "off" in table else
               "`off` not measured: cannot say where speculation stops paying")
    return {"per_concurrency": rows, "stops_paying_from": stops, "best_low": best_low,
            "best_low_settings": settings.get(best_low) if best_low else None,
            "summary": summary}


def write_override(path: Path, rec: dict[str, Any]) -> Path:
    """The vars file of the setting best at the lowest concurrency measured."""
    s = rec.get("best_low_settings") or {}
    rows = rec.get("per_concurrency") or []
    if not s.get("algorithm"):
        spec: dict[str, Any] = {"algorithm": None}
        extra: dict[str, Any] = {"min_accept_length": None}
    else:
        spec = {k: s[k] for k in ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens")}
        extra = {}
    head = [f"# Written by `orchestrator tune`: the speculative setting best at concurrency "
            f"{rows[0]['concurrency'] if rows else '?'}.",
            "# Use it: orchestrator deploy PLAYBOOK -i INVENTORY --vars-file THIS_FILE",
            "# Best per concurrency (output tok/s, speedup vs off):"]
    head += [f"#   {r['concurrency']:>4}: {r['label']} {r['output_throughput']:.1f}"
             + (f" ({r['speedup']:.2f}x)" if r.get("speedup") else "") for r in rows]
    head.append(f"# {rec.get('summary')}.")
    body = yaml.safe_dump({"speculative": spec, **extra}, sort_keys=False)
    path.write_text("\n".join(head) + "\n" + body)
    return path


def summary_lines(rec: dict[str, Any], failed: list[str]) -> list[str]:
    """The lines tune prints at the end."""
    lines = ["tune: best setting per concurrency (output tok/s, speedup vs off):"]
    for r in rec.get("per_concurrency") or []:
        speed = f" ({r['speedup']:.2f}x)" if r.get("speedup") else ""
        lines.append(f"  {r['concurrency']:>4}  {r['label']:<40} "
                     f"{r['output_throughput']:>9.1f}{speed}")
    lines.append(f"tune: {rec.get('summary')}")
    if rec.get("override_file"):
        lines.append(f"tune: override file {rec['override_file']} (deploy --vars-file)")
    if failed:
        lines.append(f"tune: not measured: {', '.join(failed)} (run tune again to retry)")
    return lines
