"""`orchestrator bench`: SGLang's own serving benchmark on each host, against the deployed server.

Where the server is comes from the playbook's `sglang_server` stage, rendered for each host
(python of the venv, state dir, address, API key, served model name, model path), exactly as a
deploy would render it. Per host: the server must be running and healthy (the `server_status`
fact); its launch fingerprint (STATE_DIR/fingerprint.json: exact arguments, SGLang version, model
and drafter identity) and /server_info are recorded; then one benchmark run per concurrency,
`PYTHON -m sglang.bench_serving|sglang.benchmark.serving ...` ON the host (see
orchestrator.sglang.benchmark), the API key in the command's environment. Every figure in
results.json is the benchmark's own, read from the JSON line it appends to `--output-file` (a
fresh file in a private temporary directory on the host, removed after the runs: the line's
`server_info` may carry the API key); nothing is computed here but per-user tok/s
(1000 / median TPOT, `BenchRun.user_tps`).

results.json (`BenchResults.to_json`) is strict JSON (`json.loads(..., parse_constant=...)`
raising on Infinity/NaN accepts it): a figure SGLang wrote as Infinity or NaN is null there, with
its text in the run's `nonfinite` ({"request_rate": "inf"}). It is rewritten after every run, so
a server that dies midway leaves the runs already measured; the failed run records the
benchmark's exit code and last lines, and the host's remaining concurrencies are skipped once
the server is found gone.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orchestrator.stages  # noqa: F401 - hands the stage kinds to config
from orchestrator.config import load_all
from orchestrator.config.model import HostSpec
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.events import new_run_id, utc_now
from orchestrator.facts.http import HttpAnswer
from orchestrator.facts.server import ServerStatus
from orchestrator.host import Host
from orchestrator.plan import Selection, build_plan, render_plan
from orchestrator.redact import REDACTOR
from orchestrator.sglang import benchmark
from orchestrator.sglang.api import local_url
from orchestrator.summary import from_json
from orchestrator.transports import make_transport

RESULTS_KIND = "orchestrator-bench"
#: 2: figures from the benchmark's --output-file line (1: from its printed banner)
RESULTS_VERSION = 2
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32)

#: (host, concurrency, run) after each run; run.ok says whether it produced figures
Progress = Callable[[str, int, "BenchRun"], None]


@dataclass(frozen=True)
class BenchOptions:
    """The workload: the same for every concurrency, so runs compare."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    input_len: int = 1024
    output_len: int = 1024
    #: requests per run; None: 4 x concurrency, at least 8
    num_prompts: int | None = None
    dataset: str = "random-ids"
    dataset_path: str | None = None
    #: seconds one benchmark run may take
    run_timeout: float = 3600.0

    def prompts_for(self, concurrency: int) -> int:
        """Requests of the run at this concurrency."""
        return self.num_prompts or max(8, 4 * concurrency)

    def check(self) -> None:
        """ConfigError for a workload SGLang's benchmark would refuse or cannot run here."""
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ConfigError("--concurrency: positive integers, e.g. 1,2,4,8")
        if self.input_len < 1 or self.output_len < 1:
            raise ConfigError("--input-len and --output-len must be >= 1")
        if self.dataset not in ("random-ids", "sharegpt"):
            raise ConfigError(f"--dataset {self.dataset!r}: random-ids or sharegpt")
        if self.dataset == "sharegpt" and not self.dataset_path:
            raise ConfigError("--dataset sharegpt needs --dataset-path (a copy of the ShareGPT "
                              "JSON on the host): the host may not reach the Hugging Face hub")


@dataclass
class ServerTarget:
    """One host's deployed server, as the playbook's sglang_server stage renders it."""

    host: str
    spec: HostSpec
    stage: str
    python: str
    state_dir: str
    api_host: str
    port: int
    served_model_name: str | None
    model_path: str
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The API as seen on the host."""
        return local_url(self.api_host, self.port)

    def auth(self) -> dict[str, str]:
        """Headers for /server_info."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def resolve_servers(playbook: str | os.PathLike[str], inventory: str | os.PathLike[str],
                    cli_vars: dict[str, Any] | None = None,
                    limit: Sequence[str] | None = None) -> list[ServerTarget]:
    """The server of each selected host, from the playbook's sglang_server stage."""
    pb, inv = load_all(str(playbook), str(inventory), dict(cli_vars or {}))
    stages = [s.id for s in pb.stages if s.kind == "sglang_server"]
    if len(stages) != 1:
        raise ConfigError(f"{playbook}: bench needs exactly one sglang_server stage, found "
                          f"{len(stages)}")
    plan = build_plan(pb, inv, Selection.from_args(limit, [stages[0]]))
    rendered = render_plan(plan, dict(cli_vars or {}), REDACTOR)
    out = []
    for host in plan.hosts:
        node = rendered.nodes.get(host, {}).get(stages[0])
        if node is None or node.params is None:
            continue
        p = node.params
        out.append(ServerTarget(
            host=host, spec=inv.hosts[host], stage=stages[0], python=p.python,
            state_dir=p.state_dir, api_host=p.host or "127.0.0.1", port=int(p.port or 30000),
            served_model_name=p.served_model_name, model_path=p.model_path,
            api_key=p.api_key or None))
    if not out:
        raise ConfigError(f"{playbook}: no selected host runs the {stages[0]!r} stage")
    return out


@dataclass(frozen=True)
class BenchRun:
    """One benchmark run at one concurrency: its figures, or why there are none."""

    concurrency: int
    num_prompts: int
    exit_code: int
    wall_s: float
    #: the benchmark's command line (redacted), without the interpreter
    command: str
    ok: bool
    #: the benchmark's --output-file line (orchestrator.sglang.benchmark.read_output)
    result: dict[str, Any] | None = None
    #: figures of that line that were not finite (null in `result`): key -> "inf" / "nan"
    nonfinite: dict[str, str] | None = None
    error: str | None = None
    #: the last lines of a failed run's output
    tail: str | None = None

    def figure(self, key: str) -> float | None:
        """A figure of a run that produced them (None when not measured)."""
        v = (self.result or {}).get(key) if self.ok else None
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    @property
    def user_tps(self) -> float | None:
        """One user's decode tokens/s: 1000 / the median TPOT (ms), None without one."""
        return benchmark.user_tps(self.figure("median_tpot_ms"))

    def thin(self, key: str) -> int | None:
        """The requests behind a percentile figure when too few for it (p99 from < 100)."""
        return benchmark.thin_percentile(key, (self.result or {}).get("completed"))


@dataclass(frozen=True)
class BenchServer:
    """What identifies the server benchmarked: fingerprint, exact arguments, versions."""

    fingerprint: str | None = None
    args: list[str] | None = None
    python: str | None = None
    sglang_version: str | None = None
    model: str | None = None
    drafter: str | None = None
    pid: int | None = None
    #: /server_info's speculative settings (and max_running_requests)
    speculative: dict[str, Any] = field(default_factory=dict)
    #: baseline, or the speculative settings (the name in reports)
    label: str | None = None


@dataclass
class HostBench:
    """One host's section of results.json: its server, its runs, or why it has none."""

    url: str | None = None
    state_dir: str | None = None
    runs: list[BenchRun] = field(default_factory=list)
    server: BenchServer | None = None
    #: the benchmark module run (sglang.bench_serving or sglang.benchmark.serving)
    module: str | None = None
    error: str | None = None


@dataclass
class BenchResults:
    """results.json: the workload, and each host's server and runs."""

    run_id: str
    playbook: str
    inventory: str
    options: BenchOptions
    #: the configuration's name in reports (default: the servers' own label, or "mixed")
    label: str | None = None
    #: the deploy run that started the server (tune), for its pin file
    deploy_run: str | None = None
    created_at: str = ""
    hosts: dict[str, HostBench] = field(default_factory=dict)
    finished_at: str | None = None
    exit_code: int | None = None
    #: the file it was read from (not written)
    path: str | None = field(default=None, compare=False)

    def measured_all(self) -> bool:
        """Every host measured every concurrency."""
        want = len(self.options.concurrency)
        return all(not h.error and len(h.runs) == want and all(r.ok for r in h.runs)
                   for h in self.hosts.values())

    def to_json(self) -> dict[str, Any]:
        """results.json's document (fields that are None left out; strict JSON: any number
        that is not finite is null)."""
        out = asdict(self, dict_factory=lambda kv: {k: v for k, v in kv if v is not None})
        out.pop("path", None)
        return strict({"kind": RESULTS_KIND, "version": RESULTS_VERSION, **out})

    @classmethod
    def from_json(cls, data: dict[str, Any], path: str | None = None) -> BenchResults:
        """From results.json's document (version 1's banner figures read as they were)."""
        if data.get("version") == 1:
            data = _from_v1(data)
        data = {k: v for k, v in data.items() if k not in ("kind", "version")}
        return from_json(cls, {**data, "path": path})


def strict(value: Any) -> Any:
    """VALUE with every float that is not finite replaced by None (JSON has no Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(doc: Any) -> str:
    """Strict JSON text of a document (non-finite numbers as null)."""
    return json.dumps(strict(doc), indent=1, sort_keys=True, default=str, allow_nan=False)


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 results.json (figures read from the printed banner) in version 2's shape:
    the printed block dropped, `duration_s` as the benchmark's `duration`."""
    hosts = {}
    for name, h in (data.get("hosts") or {}).items():
        runs = []
        for r in h.get("runs") or []:
            r = {k: v for k, v in r.items() if k != "lines"}
            if isinstance(r.get("result"), dict):
                res = {k: v for k, v in r["result"].items() if k not in ("other", "duration_s")}
                res["duration"] = r["result"].get("duration_s")
                r["result"] = res
            runs.append(r)
        hosts[name] = {**h, "runs": runs}
    return {**data, "hosts": hosts}


@dataclass
class BenchOutcome:
    """What a bench did: its exit code, its results and where it wrote."""

    run_id: str
    exit_code: int
    results: BenchResults
    run_dir: Path

    @property
    def results_path(self) -> Path:
        """runs/<id>/bench/results.json"""
        return self.run_dir / "bench" / "results.json"


class _Writer:
    """results.json, rewritten atomically after every change (threads share it)."""

    def __init__(self, path: Path, results: BenchResults) -> None:
        self.path = path
        self.results = results
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.flush()

    def flush(self) -> None:
        with self.lock:
            text = dumps(REDACTOR.redact(self.results.to_json()))
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, self.path)


def spec_label(algorithm: str | None, steps: Any, topk: Any, draft_tokens: Any) -> str:
    """A configuration's name in reports: baseline, or the speculative settings."""
    if not algorithm:
        return "baseline"
    return f"{algorithm} steps={steps} topk={topk} draft_tokens={draft_tokens}"


def _server_record(st: ServerStatus, info: dict[str, Any] | None) -> BenchServer:
    """What identifies the server benchmarked: fingerprint, exact arguments, versions."""
    fp = st.fingerprint or {}
    parts = fp.get("parts") if isinstance(fp.get("parts"), dict) else {}
    info = info or {}
    spec_keys = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                 "speculative_num_draft_tokens", "max_running_requests")
    return BenchServer(
        fingerprint=fp.get("fingerprint"), args=parts.get("args"), python=parts.get("python"),
        sglang_version=info.get("version") or parts.get("sglang"), model=parts.get("model"),
        drafter=parts.get("drafter"), pid=st.process.pid,
        speculative={k: info.get(k) for k in spec_keys},
        label=spec_label(*(info.get(k) for k in spec_keys[:4])))


def _open(target: ServerTarget, budget: float) -> Host:
    t = make_transport(target.spec)
    t.connect(budget=budget)
    return Host(target.spec, t, dict(target.spec.vars))


def _status(host: Host, target: ServerTarget) -> ServerStatus:
    return host.fact(ServerStatus, state_dir=target.state_dir, host=target.api_host,
                     port=target.port)


def _scratch(host: Host) -> str:
    """A private temporary directory on the host for the runs' --output-file."""
    res = host.run("mktemp -d -t orchestrator-bench.XXXXXX", timeout=30)
    path = res.stdout.strip()
    if not res.ok or not path.startswith("/"):
        raise OrchestratorError(f"mktemp -d on the host failed: {res.tail(3)}")
    return path


def _one_run(host: Host, target: ServerTarget, version: str | None, options: BenchOptions,
             concurrency: int, scratch: str) -> BenchRun:
    """One benchmark run at one concurrency: its figures, or why there are none."""
    out_file = f"{scratch}/c{concurrency}.jsonl"
    spec = benchmark.BenchSpec(
        base_url=target.url, concurrency=concurrency,
        num_prompts=options.prompts_for(concurrency), input_len=options.input_len,
        output_len=options.output_len, dataset=options.dataset,
        dataset_path=options.dataset_path, model=target.served_model_name,
        tokenizer=target.model_path, output_file=out_file)
    argv = benchmark.bench_argv(target.python, version, spec)
    env = {"OPENAI_API_KEY": target.api_key} if target.api_key else None
    res = host.run_argv(argv, env=env, timeout=options.run_timeout)
    out = benchmark.read_output(host.read_text(out_file))
    run = partial(BenchRun, concurrency, spec.num_prompts, res.exit_code, round(res.duration, 3),
                  REDACTOR.redact(" ".join(argv[1:])))
    if res.ok and out is not None and out.result.get("completed"):
        return run(ok=True, result=out.result, nonfinite=out.nonfinite or None)
    why = "timed out" if res.timed_out else f"exit code {res.exit_code}"
    if out is not None and not out.result.get("completed"):
        why = "no request succeeded"
    elif out is None and res.ok:
        why = f"no result line in {out_file}"
    return run(ok=False, error=why, tail=REDACTOR.redact(res.tail(15)))


def _bench_host(target: ServerTarget, options: BenchOptions, writer: _Writer,
                progress: Progress | None, budget: float) -> None:
    """Every run of one host; its section of results.json is kept current."""
    rec = writer.results.hosts[target.host] = HostBench(target.url, target.state_dir)
    host = _open(target, budget)
    try:
        st = _status(host, target)
        if not st.running or st.health is None or not st.health.ok:
            rec.error = f"no running, healthy SGLang server in {target.state_dir} (deploy first)"
            return
        answer = host.fact(HttpAnswer, url=target.url + "/server_info", headers=target.auth(),
                           timeout=10)
        info = answer.json_if_ok()
        rec.server = _server_record(st, info if isinstance(info, dict) else None)
        rec.module = benchmark.module_for(rec.server.sglang_version)
        writer.flush()
        scratch = _scratch(host)
        try:
            _runs(host, target, options, writer, progress, rec, scratch)
        finally:
            try:
                host.run(f"rm -rf {shlex.quote(scratch)}", timeout=30)
            except OrchestratorError:
                pass  # the run's own error (or Ctrl-C) is what to report
    finally:
        host.transport.close()


def _runs(host: Host, target: ServerTarget, options: BenchOptions, writer: _Writer,
          progress: Progress | None, rec: HostBench, scratch: str) -> None:
    """One run per concurrency; stops when the server is found gone."""
    version = rec.server.sglang_version if rec.server else None
    for c in options.concurrency:
        run = _one_run(host, target, version, options, c, scratch)
        rec.runs.append(run)
        if not run.ok and not _status(host, target).running:
            rec.error = (f"the server died during the run at concurrency {c}; "
                         f"{len(rec.runs) - 1} run(s) measured before it kept")
        writer.flush()
        if progress is not None:
            progress(target.host, c, run)
        if rec.error:
            return


def run_bench(playbook: str | os.PathLike[str], inventory: str | os.PathLike[str], *,
              cli_vars: dict[str, Any] | None = None, limit: Sequence[str] | None = None,
              options: BenchOptions | None = None, run_dir: str | os.PathLike[str] = "runs",
              label: str | None = None, deploy_run: str | None = None,
              progress: Progress | None = None, budget: float = 10.0) -> BenchOutcome:
    """Benchmark every selected host's server; exit code 0 when every run produced figures."""
    options = options or BenchOptions()
    options.check()
    targets = resolve_servers(playbook, inventory, cli_vars, limit)
    run_id = new_run_id()
    out_dir = Path(run_dir) / run_id
    results = BenchResults(run_id, str(playbook), str(inventory), options, label, deploy_run,
                           created_at=utc_now())
    writer = _Writer(out_dir / "bench" / "results.json", results)

    def one(target: ServerTarget) -> None:
        try:
            _bench_host(target, options, writer, progress, budget)
        except OrchestratorError as exc:
            results.hosts.setdefault(target.host, HostBench()).error = exc.render()

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as ex:
        list(ex.map(one, targets))
    results.finished_at = utc_now()
    results.exit_code = 0 if results.measured_all() else 1
    if results.label is None:
        labels = {h.server.label for h in results.hosts.values() if h.server} - {None}
        results.label = labels.pop() if len(labels) == 1 else "mixed"
    writer.flush()
    return BenchOutcome(run_id, results.exit_code, results, out_dir)


def load_results(path: str | os.PathLike[str]) -> BenchResults:
    """A results.json (a run dir, its bench/ dir, or the file); ConfigError if it is not one."""
    p = Path(path)
    for candidate in (p, p / "results.json", p / "bench" / "results.json"):
        if candidate.is_file():
            try:
                data = json.loads(candidate.read_text())
            except ValueError as exc:
                raise ConfigError(f"{candidate}: not JSON: {exc}") from None
            if isinstance(data, dict) and data.get("kind") == RESULTS_KIND:
                return BenchResults.from_json(data, str(candidate))
            raise ConfigError(f"{candidate}: not an orchestrator bench results file")
    raise ConfigError(f"{path}: no bench results (runs/<id>/bench/results.json) there")
