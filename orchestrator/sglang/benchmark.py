"""SGLang's own online serving benchmark: which module, which flags, how to read its result.

Read from the real source of 0.5.9 - 0.5.23 (paths under sglang/):

- Module: `python -m sglang.bench_serving` is the implementation up to 0.5.12 (bench_serving.py,
  3415 lines in 0.5.9); from 0.5.15 the implementation is `sglang.benchmark.serving`
  (benchmark/serving.py, 2673 lines in 0.5.15) and bench_serving.py is a 22-line shim that emits a
  FutureWarning (bench_serving.py:1-22 in 0.5.15 - 0.5.23). 0.5.10/0.5.12 have a
  `sglang/benchmark/` package without serving.py.
- Flags used here exist in every release with the same meaning (0.5.9 bench_serving.py:
  3005 --backend, 3012 --base-url, 3026 --dataset-name (choices include random-ids, :3034),
  3043 --dataset-path, 3046 --model, 3056 --tokenizer, 3061 --num-prompts, 3079/3085
  --random-input-len/--random-output-len, 3091 --random-range-ratio (default 0.0: random lengths),
  3143 --max-concurrency, 3155 --output-file, 3165 --disable-tqdm, 3301 --flush-cache,
  3306 --warmup-requests; 0.5.23 benchmark/serving.py: 2301, 2308, 2328 (:2337), 2348, 2379,
  2389, 2394, 2412/2418, 2424, 2478, 2490, 2510, 2697, 2708).
- `--flush-cache` flushes AFTER the warmup and before the measured requests (0.5.9
  bench_serving.py:2417-2421; 0.5.23 benchmark/serving.py:1516-1525); the server's cumulative
  accept length restarts there, so "accept_length" covers the measured requests only.
- Auth: env OPENAI_API_KEY gives `Authorization: Bearer KEY` (get_auth_headers, 0.5.9
  bench_serving.py:124-132; 0.5.23 benchmark/serving.py:131-139).
- The result is read from the JSON line every release appends to `--output-file` (open(...,
  "a"), `json.dumps(result)` + "\\n"): the `result` dict, then the write, per release:
  0.5.9 bench_serving.py:2671-2718, 2751-2756; 0.5.10 :1549-1596, 1629-1634; 0.5.12 :1583-1630,
  1663-1668; 0.5.15 benchmark/serving.py:1719-1772, 1822-1827; 0.5.19 :1795-1848, 1898-1903;
  0.5.20 :1796-1849, 1899-1904; 0.5.21 and 0.5.22 :1842-1895, 1945-1950; 0.5.23 :1855-1908,
  1961-1966. Its keys: RESULT_KEYS (43, every release) and ADDED_0_5_15 (6 more percentiles
  from 0.5.15). The printed banner is not read: every supported release writes the file, and
  the file has figures the banner rounds to 2 decimals or does not print. "Max ITL" is printed
  but not in the file (0.5.9 :2660 vs the dict; 0.5.23 :1792).
- The line is not strict JSON: `--request-rate` defaults to float("inf") (0.5.9 :3131-3133;
  0.5.23 :2466-2468) and json.dumps writes `Infinity`; with no request completed the E2E figures
  are np.mean/np.percentile of [] = NaN (0.5.9 :2248-2252; 0.5.23 :1299-1304). read_output turns
  every non-finite number into None and says which it was (`nonfinite`).
- `server_info` (the whole /server_info answer) is left out: in 0.5.9 it is
  dataclasses.asdict(server_args) (srt/entrypoints/http_server.py:605-610), the API key
  included; bench records the server's settings itself.
- TPOT is per request, (latency - ttft) / (output_len - 1) for output_len > 1 (0.5.9 :2125-2126;
  0.5.23 :1171-1172); median_tpot_ms is np.median of those (0.5.9 :2239; 0.5.23 :1287). A
  user's decode speed is 1000 / median_tpot_ms tokens/s (user_tps). Percentiles are
  np.percentile over the completed requests (TTFT, TPOT, E2E) or over every streamed chunk gap
  of them (ITL): `completed` says how many requests stand behind them.
- "accept_length" is /server_info's internal_states[0].avg_spec_accept_length, None when the
  server reports none (0.5.9 :2534-2554; 0.5.23 :1642-1662).
- When the server is gone at the end of the run, the client's `requests.get(base_url +
  "/server_info")` (no exception handling: 0.5.9 bench_serving.py:2534-2536; 0.5.23
  benchmark/serving.py:1642-1645) raises before anything is written: no line, exit 1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.sglang.flags import at_least

#: the keys of the --output-file line in every release, in its order (0.5.9 bench_serving.py:
#: 2671-2718 = 0.5.10 :1549-1596 = 0.5.12 :1583-1630)
RESULT_KEYS: tuple[str, ...] = (
    "tag", "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len",
    "random_input_len", "random_output_len", "random_range_ratio", "server_info", "duration",
    "completed", "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens",
    "total_output_tokens", "total_output_tokens_retokenized", "request_throughput",
    "input_throughput", "output_throughput", "total_throughput", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms", "p99_e2e_latency_ms",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
    "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
    "std_itl_ms", "p95_itl_ms", "p99_itl_ms", "concurrency", "accept_length",
    "max_output_tokens_per_s", "max_concurrent_requests",
)
#: added from 0.5.15 (benchmark/serving.py:1748, 1753-1754, 1759-1760, 1765 in 0.5.15; the same
#: dict through 0.5.23 :1855-1908)
ADDED_0_5_15: tuple[str, ...] = ("p95_e2e_latency_ms", "p90_ttft_ms", "p95_ttft_ms",
                                 "p90_tpot_ms", "p95_tpot_ms", "p90_itl_ms")
#: keys of the line not kept in results.json (see the module docstring)
DROPPED = ("server_info",)
#: a pXX figure is flagged when fewer requests than this stand behind it: with fewer than
#: 100/(100-XX) of them, the single slowest request sets it
MIN_REQUESTS = {"p90": 10, "p95": 20, "p99": 100}


def result_keys(version: str | None) -> tuple[str, ...]:
    """The keys of a release's --output-file line."""
    return RESULT_KEYS + (ADDED_0_5_15 if at_least(version, 0, 5, 15) else ())


def module_for(version: str | None) -> str:
    """The benchmark module of a release: sglang.benchmark.serving from 0.5.15, else
    sglang.bench_serving (which is a deprecated shim from 0.5.15 on)."""
    return "sglang.benchmark.serving" if at_least(version, 0, 5, 15) else "sglang.bench_serving"


@dataclass(frozen=True)
class BenchSpec:
    """One benchmark run: the workload at one concurrency, and where its result line goes."""

    base_url: str
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    dataset: str = "random-ids"
    dataset_path: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    #: the --output-file on the host (a fresh path: the benchmark appends to it)
    output_file: str | None = None


def bench_argv(python: str, version: str | None, spec: BenchSpec) -> list[str]:
    """`PYTHON -m MODULE ...` for one run (the API key goes in OPENAI_API_KEY, not here).

    Fixed lengths (`--random-range-ratio 1`) and `--flush-cache` so that every run measures the
    same workload and its own accept length.
    """
    argv = [python, "-m", module_for(version), "--backend", "sglang",
            "--base-url", spec.base_url, "--dataset-name", spec.dataset,
            "--num-prompts", str(spec.num_prompts), "--max-concurrency", str(spec.concurrency),
            "--random-input-len", str(spec.input_len),
            "--random-output-len", str(spec.output_len), "--random-range-ratio", "1",
            "--flush-cache", "--disable-tqdm"]
    if spec.output_file:
        argv += ["--output-file", spec.output_file]
    if spec.dataset_path:
        argv += ["--dataset-path", spec.dataset_path]
    if spec.dataset == "sharegpt":
        argv += ["--sharegpt-output-len", str(spec.output_len)]
    if spec.model:
        argv += ["--model", spec.model]
    if spec.tokenizer:
        argv += ["--tokenizer", spec.tokenizer]
    return argv


@dataclass(frozen=True)
class Output:
    """The benchmark's result line, made strict: every key but DROPPED, non-finite numbers as
    None with their text in `nonfinite` ({"request_rate": "inf"})."""

    result: dict[str, Any]
    nonfinite: dict[str, str] = field(default_factory=dict)


def _finite(value: Any, path: str, notes: dict[str, str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        notes[path] = str(value)
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{path}.{k}", notes) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, f"{path}[{i}]", notes) for i, v in enumerate(value)]
    return value


def read_output(text: str | None) -> Output | None:
    """The last JSON line of an --output-file (SGLang appends one per run), or None when there
    is none (the run ended before writing it)."""
    for line in reversed((text or "").splitlines()):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)  # Python's json reads SGLang's Infinity / NaN
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        notes: dict[str, str] = {}
        result = {k: _finite(v, k, notes) for k, v in doc.items() if k not in DROPPED}
        return Output(result, notes)
    return None


def user_tps(median_tpot_ms: Any) -> float | None:
    """One user's decode speed, tokens/s: 1000 / the median TPOT in ms (None without one)."""
    if isinstance(median_tpot_ms, (int, float)) and median_tpot_ms > 0:
        return 1000.0 / float(median_tpot_ms)
    return None


def thin_percentile(key: str, completed: Any) -> int | None:
    """The number of requests behind a percentile figure (p90/p95/p99_*) when it is too few for
    that percentile to mean more than the slowest request; else None."""
    need = MIN_REQUESTS.get(key.split("_", 1)[0])
    if need is None or not isinstance(completed, int):
        return None
    return completed if completed < need else None
