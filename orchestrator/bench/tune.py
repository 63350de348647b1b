"""`orchestrator tune`: a sweep over speculative settings, each deployed and benchmarked.

Candidates: `off` (no speculation) and the EAGLE3 settings of the grid, read from the `tune:`
mapping of the model profile (a playbook variable) or of `--grid FILE`:

    tune:
      baseline: true                 # measure `off` too (default)
      algorithm: EAGLE3
      grid:                          # every combination ...
        num_steps: [1, 2, 3]
        eagle_topk: [1]
      candidates:                    # ... and/or an explicit list
        - {num_steps: 3, eagle_topk: 4, num_draft_tokens: 8}

With eagle_topk 1, num_draft_tokens is num_steps + 1 (SGLang forces it; see FACTS.md). Each
candidate is deployed through the playbook's own stages with `speculative` (and, for `off`,
`min_accept_length`) overridden: its launch fingerprint differs, so sglang_server restarts the
server and wait_ready verifies it. Then `run_bench` measures it. TUNE_DIR/tune.json is rewritten
after every step; run again, tune skips the candidates already measured with the same workload.

Before anything is launched, every candidate goes through a dry run of the playbook (the
sglang_server preflight, against the host's installed release, checkpoints and GPUs): one the
preflight refuses is recorded `refused` with its reason and never deployed. On a bare box the
preflight waits for the venv and checkpoints (a dry run installs nothing), so the candidates
deployed after the first are screened again just before their own deploy; a deploy the
preflight refuses is recorded `refused` too, not `failed`.

At the end: the best candidate per concurrency (highest output tok/s, with its per-user tok/s,
1000 / median TPOT), where speculation stops paying (the lowest concurrency from which `off` is
best at every higher one measured), an override file (TUNE_DIR/speculative-override.yaml, for
`deploy --vars-file`) with the setting chosen for the load it names, and the report
(TUNE_DIR/report/). The load (`Target`): `--for-concurrency N` (the setting best at N, which must
be one of the concurrencies measured), `--min-user-tps X` (the setting and concurrency with the
highest output tok/s whose per-user tok/s is at least X; with N: at N), or by default the lowest
concurrency measured. A tune dir measured once can be re-targeted: run tune again with another
target, nothing is measured twice.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.bench.bench import BenchOptions, Progress, dumps, run_bench, spec_label
from orchestrator.config import load_all
from orchestrator.config.variables import host_variables
from orchestrator.deploy import DeployOutcome, deploy
from orchestrator.errors import ConfigError
from orchestrator.events import utc_now
from orchestrator.options import RunOptions
from orchestrator.plan import Selection, build_plan
from orchestrator.summary import from_json

TUNE_FILE = "tune.json"
OVERRIDE_FILE = "speculative-override.yaml"


@dataclass(frozen=True)
class Candidate:
    """One speculative setting: `off`, or an algorithm with steps, topk and draft tokens."""

    algorithm: str | None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None

    @property
    def key(self) -> str:
        """A stable name: off, eagle3-s3-k1-n4."""
        if not self.algorithm:
            return "off"
        return (f"{self.algorithm.lower()}-s{self.num_steps}-k{self.eagle_topk}"
                f"-n{self.num_draft_tokens}")

    @property
    def label(self) -> str:
        """The name in reports."""
        return spec_label(self.algorithm, self.num_steps, self.eagle_topk, self.num_draft_tokens)

    def variables(self) -> dict[str, Any]:
        """The playbook variables that deploy this candidate."""
        if not self.algorithm:
            return {"speculative": {"algorithm": None}, "min_accept_length": None}
        return {"speculative": {"algorithm": self.algorithm, "num_steps": self.num_steps,
                                "eagle_topk": self.eagle_topk,
                                "num_draft_tokens": self.num_draft_tokens}}


def _int_list(spec: dict[str, Any], name: str, default: list[Any]) -> list[Any]:
    value = spec.get(name, default)
    values = value if isinstance(value, list) else [value]
    for v in values:
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ConfigError(f"tune.grid.{name}: positive integers, got {v!r}")
    return values


def _make(algorithm: str, steps: Any, topk: Any, ndt: Any) -> Candidate:
    if not isinstance(steps, int) or not isinstance(topk, int):
        raise ConfigError("tune: every candidate needs num_steps and eagle_topk (integers)")
    if topk == 1:
        ndt = steps + 1  # SGLang forces it (speculative_hook.py:1254-1267 (0.5.23))
    elif not isinstance(ndt, int):
        raise ConfigError(f"tune: num_steps {steps}, eagle_topk {topk}: with eagle_topk > 1 "
                          "give num_draft_tokens")
    return Candidate(algorithm, steps, topk, ndt)


def candidates_from(spec: Any) -> list[Candidate]:
    """The candidates of a `tune:` mapping, `off` first, without duplicates."""
    if not isinstance(spec, dict):
        raise ConfigError("tune: expected a mapping with `grid:` and/or `candidates:` (see "
                          "`orchestrator tune --help`)")
    algorithm = str(spec.get("algorithm") or "EAGLE3").upper()
    out: list[Candidate] = [Candidate(None)] if spec.get("baseline", True) else []
    grid = spec.get("grid") or {}
    if grid:
        steps = _int_list(grid, "num_steps", [3])
        topks = _int_list(grid, "eagle_topk", [1])
        ndts = _int_list(grid, "num_draft_tokens", [None])
        for s, k, n in itertools.product(steps, topks, ndts):
            out.append(_make(algorithm, s, k, n))
    for item in spec.get("candidates") or []:
        if not isinstance(item, dict):
            raise ConfigError(f"tune.candidates: expected mappings, got {item!r}")
        out.append(_make(str(item.get("algorithm") or algorithm).upper(),
                         item.get("num_steps"), item.get("eagle_topk", 1),
                         item.get("num_draft_tokens")))
    unique = list(dict.fromkeys(out))
    if len(unique) < 2:
        raise ConfigError("tune: fewer than two candidates; add a grid or candidates")
    return unique


def _grid_spec(playbook: str, inventory: str, cli_vars: dict[str, Any],
               limit: Sequence[str] | None, grid_path: str | None) -> Any:
    if grid_path:
        try:
            doc = yaml.safe_load(Path(grid_path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--grid {grid_path}: {exc}") from None
        if not isinstance(doc, dict) or "tune" not in doc:
            raise ConfigError(f"--grid {grid_path}: expected a mapping with a `tune:` key")
        return doc["tune"]
    pb, inv = load_all(playbook, inventory, cli_vars)
    plan = build_plan(pb, inv, Selection.from_args(limit))
    spec = host_variables(pb, inv, plan.hosts[0], cli_vars).get("tune") if plan.hosts else None
    if spec is None:
        raise ConfigError(f"{playbook}: no `tune:` variable (add it to the model profile, or "
                          "pass --grid FILE)")
    return spec


@dataclass
class TuneEntry:
    """One candidate in tune.json: its setting, and the deploy and the bench that measured it."""

    key: str
    label: str
    settings: Candidate
    #: running, measured, failed, or refused (by the preflight: never launched)
    status: str = "running"
    started_at: str | None = None
    deploy_run: str | None = None
    deploy_exit: int | None = None
    bench_run: str | None = None
    #: the bench's results.json
    bench_results: str | None = None
    bench_exit: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class BestAt:
    """The candidate with the highest output tok/s at one concurrency, against `off`'s."""

    concurrency: int
    best: str
    label: str
    output_throughput: float
    speedup: float | None = None
    off: float | None = None
    #: the best candidate's per-user tok/s there (1000 / median TPOT)
    user_tps: float | None = None


@dataclass(frozen=True)
class Target:
    """The load the override is chosen for: a concurrency, a per-user tok/s floor, or both
    (neither: the lowest concurrency measured)."""

    concurrency: int | None = None
    min_user_tps: float | None = None

    def describe(self) -> str:
        """In words, for the override file and the summary."""
        parts = [f"concurrency {self.concurrency}"] if self.concurrency else []
        if self.min_user_tps is not None:
            parts.append(f"at least {self.min_user_tps:g} tok/s per user")
        return ", ".join(parts) or "the lowest concurrency measured"


@dataclass(frozen=True)
class Recommendation:
    """What a tune concludes (orchestrator.bench.recommend)."""

    per_concurrency: list[BestAt]
    stops_paying_from: int | None
    #: the candidate best at the lowest concurrency measured, and its setting
    best_low: str | None
    best_low_settings: Candidate | None
    summary: str
    #: the override's setting as a vars file (deploy --vars-file)
    override_file: str | None = None
    #: the load asked for, and the candidate chosen for it (its setting, the concurrency it was
    #: measured at, its output and per-user tok/s there); None: no candidate meets the target
    target: Target = field(default_factory=Target)
    choice: str | None = None
    choice_settings: Candidate | None = None
    choice_concurrency: int | None = None
    choice_output_tps: float | None = None
    choice_user_tps: float | None = None


@dataclass
class TuneState:
    """tune.json: the workload every candidate is measured with, each candidate, the advice."""

    playbook: str
    workload: BenchOptions
    created_at: str
    candidates: dict[str, TuneEntry] = field(default_factory=dict)
    recommendation: Recommendation | None = None
    finished_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        """tune.json's document (candidates as a list, in the order first measured)."""
        out = asdict(self)
        return {"kind": "orchestrator-tune", **out, "candidates": [*out["candidates"].values()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneState:
        """From tune.json's document."""
        data = {k: v for k, v in data.items() if k != "kind"}
        return from_json(cls, {**data, "candidates": {e["key"]: e for e in data["candidates"]}})


@dataclass
class TuneResult:
    """What a tune did: its tune.json, the report and override paths, a summary, exit code."""

    tune_dir: Path
    data: TuneState
    exit_code: int
    summary_text: str


def _save(tune_dir: Path, state: TuneState) -> None:
    tmp = tune_dir / (TUNE_FILE + ".tmp")
    tmp.write_text(dumps(state.to_json()) + "\n")
    os.replace(tmp, tune_dir / TUNE_FILE)


def _load_state(tune_dir: Path, workload: BenchOptions, playbook: str) -> TuneState:
    path = tune_dir / TUNE_FILE
    if not path.is_file():
        return TuneState(playbook, workload, utc_now())
    state = TuneState.from_json(json.loads(path.read_text()))
    if state.workload != workload:
        raise ConfigError(f"{path}: measured with another workload ({state.workload}); "
                          "results would not compare: use another --out, or the same options")
    return state


def _preflights(outcome: DeployOutcome) -> list[tuple[str, str, dict[str, Any]]]:
    """(host, stage id, facts) of every stage that ran the sglang_server preflight."""
    return [(name, stage_id, facts) for name, host in outcome.summary.hosts.items()
            for stage_id, facts in host.facts.items()
            if isinstance(facts, dict) and isinstance(facts.get("preflight"), dict)]


def preflight_refusal(outcome: DeployOutcome) -> str | None:
    """The preflight's refusal in a deploy (or dry run), or None: the sglang_server stage that
    failed after recording preflight rules, with its error (the problems and their fixes)."""
    for name, stage_id, facts in _preflights(outcome):
        stage = outcome.summary.hosts[name].stages.get(stage_id)
        if facts["preflight"].get("rules") and stage is not None and stage.error:
            problems = [ln.strip()[2:] for ln in stage.error.splitlines()
                        if ln.strip().startswith("- ")]
            return f"{name}: " + "; ".join(problems or [stage.error.strip()])
    return None


def _refuse(entry: TuneEntry, outcome: DeployOutcome, reason: str,
            say: Callable[[str], None]) -> None:
    entry.status, entry.error = "refused", reason
    entry.deploy_run, entry.deploy_exit = outcome.run_id, outcome.exit_code
    say(f"tune: {entry.key}: refused by the preflight, skipped (never launched): {reason}")


def _screen(c: Candidate, entry: TuneEntry, ctx: dict[str, Any],
            say: Callable[[str], None]) -> str:
    """A dry run of the candidate's deploy: "refused" (entry recorded), "passed", or
    "deferred" (no preflight ran: the venv or checkpoints are not there yet)."""
    outcome = deploy(ctx["playbook"], ctx["inventory"], cli_vars={**ctx["cli_vars"],
                                                                  **c.variables()},
                     selection=Selection.from_args(ctx["limit"]), run_dir=ctx["run_dir"],
                     options=RunOptions(dry_run=True))
    reason = preflight_refusal(outcome)
    if reason is not None:
        _refuse(entry, outcome, reason, say)
        return "refused"
    return "passed" if _preflights(outcome) else "deferred"


def _measure(c: Candidate, entry: TuneEntry, ctx: dict[str, Any],
             say: Callable[[str], None]) -> None:
    """Deploy one candidate, then benchmark it; `entry` records both."""
    cli_vars = {**ctx["cli_vars"], **c.variables()}
    say(f"tune: {c.key}: deploying ({c.label})")
    outcome = deploy(ctx["playbook"], ctx["inventory"], cli_vars=cli_vars,
                     selection=Selection.from_args(ctx["limit"]), run_dir=ctx["run_dir"])
    entry.deploy_run, entry.deploy_exit = outcome.run_id, outcome.exit_code
    reason = preflight_refusal(outcome) if outcome.exit_code != 0 else None
    if reason is not None:
        _refuse(entry, outcome, reason, say)
        return
    if outcome.exit_code != 0:
        entry.status = "failed"
        entry.error = f"deploy exit code {outcome.exit_code} (see {outcome.summary_path})"
        say(f"tune: {c.key}: deploy failed ({outcome.summary_path})")
        return
    say(f"tune: {c.key}: benchmarking")
    bench = run_bench(ctx["playbook"], ctx["inventory"], cli_vars=cli_vars, limit=ctx["limit"],
                      options=ctx["options"], run_dir=ctx["run_dir"], label=c.label,
                      deploy_run=outcome.run_id, progress=ctx["progress"])
    entry.bench_run, entry.bench_results = bench.run_id, str(bench.results_path)
    entry.bench_exit = bench.exit_code
    entry.status = "measured" if bench.exit_code == 0 else "failed"
    if bench.exit_code != 0:
        entry.error = "a benchmark run failed (see its results.json)"


def run_tune(playbook: str, inventory: str, *, cli_vars: dict[str, Any] | None = None,
             limit: Sequence[str] | None = None, options: BenchOptions | None = None,
             run_dir: str | os.PathLike[str] = "runs", grid_path: str | None = None,
             out: str | os.PathLike[str] | None = None,
             say: Callable[[str], None] = lambda m: None,
             progress: Progress | None = None, target: Target | None = None) -> TuneResult:
    """Measure every candidate not yet measured in the tune dir, then recommend (for `target`)
    and report."""
    cli_vars = dict(cli_vars or {})
    options = options or BenchOptions()
    options.check()
    target = target or Target()
    if target.concurrency is not None and target.concurrency not in options.concurrency:
        raise ConfigError(f"--for-concurrency {target.concurrency}: not one of the concurrencies "
                          f"measured ({','.join(map(str, options.concurrency))}); add it to "
                          "--concurrency")
    if target.min_user_tps is not None and target.min_user_tps <= 0:
        raise ConfigError("--min-user-tps: a positive number of tokens/s")
    cands = candidates_from(_grid_spec(playbook, inventory, cli_vars, limit, grid_path))
    tune_dir = Path(out) if out else Path(run_dir) / f"tune-{Path(playbook).stem}"
    tune_dir.mkdir(parents=True, exist_ok=True)
    state = _load_state(tune_dir, options, str(playbook))
    ctx = {"playbook": playbook, "inventory": inventory, "cli_vars": cli_vars, "limit": limit,
           "options": options, "run_dir": run_dir, "progress": progress}
    todo = []
    for c in cands:
        entry = state.candidates.get(c.key)
        if entry is not None and entry.status == "measured":
            say(f"tune: {c.key}: already measured (bench run {entry.bench_run}), skipped")
            continue
        entry = state.candidates[c.key] = TuneEntry(c.key, c.label, c, started_at=utc_now())
        screened = _screen(c, entry, ctx, say) if c.algorithm else "passed"
        _save(tune_dir, state)
        if screened != "refused":
            todo.append((c, entry, screened))
    for n, (c, entry, screened) in enumerate(todo):
        # a bare box: the first deploy installs what the preflight needs; screen the rest now
        if n and screened == "deferred" and _screen(c, entry, ctx, say) == "refused":
            _save(tune_dir, state)
            continue
        _measure(c, entry, ctx, say)
        _save(tune_dir, state)
    return _finish(tune_dir, state, cands, run_dir, target)


def _greedy_of(run_dir: str | os.PathLike[str], off: TuneEntry | None) -> dict[str, str] | None:
    """The greedy answers `off`'s deploy recorded at ready (wait_ready's fact `greedy`)."""
    if off is None or off.status != "measured" or not off.deploy_run:
        return None
    try:
        hosts = json.loads((Path(run_dir) / off.deploy_run / "summary.json").read_text())["hosts"]
    except (OSError, ValueError, KeyError):
        return None
    for host in hosts.values():
        for facts in (host.get("facts") or {}).values():
            greedy = facts.get("greedy") if isinstance(facts, dict) else None
            if isinstance(greedy, dict) and not greedy.get("speculative") and greedy.get(
                    "answers"):
                return dict(greedy["answers"])
    return None


def _finish(tune_dir: Path, state: TuneState, cands: list[Candidate],
            run_dir: str | os.PathLike[str], target: Target) -> TuneResult:
    from orchestrator.bench.recommend import recommend, summary_lines, write_override
    from orchestrator.bench.report import write_report

    keys = {c.key for c in cands}
    entries = [e for e in state.candidates.values() if e.key in keys]
    rec = recommend([e for e in entries if e.status == "measured"], target)
    (tune_dir / OVERRIDE_FILE).unlink(missing_ok=True)  # never one chosen for another target
    if rec.choice is not None:
        greedy = _greedy_of(run_dir, state.candidates.get("off"))
        rec = replace(rec, override_file=str(write_override(tune_dir / OVERRIDE_FILE, rec,
                                                            greedy)))
    state.recommendation = rec
    state.finished_at = utc_now()
    _save(tune_dir, state)
    report = write_report([str(tune_dir)], out=tune_dir / "report", run_dir=run_dir)
    failed = [e.key for e in entries if e.status not in ("measured", "refused")]
    lines = summary_lines(rec, failed, {e.key: e.error or "" for e in entries
                                        if e.status == "refused"})
    lines += ["", report.table, ""] + [f"plot: {p}" for p in report.pngs]
    lines += [f"report: {report.markdown}", f"tune state: {tune_dir / TUNE_FILE}"]
    return TuneResult(tune_dir, state, 1 if failed else 0, "\n".join(lines))
