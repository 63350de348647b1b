"""SGLang's own online serving benchmark: which module, which flags, how to read its result block.

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
  accept length restarts there, so "Accept length" covers the measured requests only.
- Auth: env OPENAI_API_KEY gives `Authorization: Bearer KEY` (get_auth_headers, 0.5.9
  bench_serving.py:124-132; 0.5.23 benchmark/serving.py:131-139).
- Result block: a `" Serving Benchmark Result "` banner centred in 50 '=' and lines formatted
  `"{:<40} {:<10}"` / `"{:<40} {:<10.2f}"` (label, value), closed by 50 '=' (0.5.9
  bench_serving.py:2568-2661; 0.5.12 :1471-1573; 0.5.15 benchmark/serving.py:1547-1709; 0.5.19
  :1623-1785; 0.5.20 :1624-1786; 0.5.23 :1681-1845). The labels read here are printed by all of
  them: "Successful requests:", "Benchmark duration (s):", "Total input tokens:", "Total
  generated tokens:", "Request throughput (req/s):", "Output token throughput (tok/s):",
  "Concurrency:", "Mean/Median/P99 TTFT (ms):", "Mean/Median/P99 ITL (ms):", "Median E2E Latency
  (ms):" (0.5.9 :2569-2660; 0.5.23 :1682-1792). "Accept length:" is printed only when /server_info's
  internal_states[0].avg_spec_accept_length is truthy (0.5.9 :2628-2629; 0.5.23 :1747-1748).
- When the server is gone at the end of the run, the client's `requests.get(base_url +
  "/server_info")` (no exception handling: 0.5.9 bench_serving.py:2534-2536; 0.5.23
  benchmark/serving.py:1642-1645) raises before the block is printed: no block, exit 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.sglang.flags import at_least

BANNER = " Serving Benchmark Result "
#: result-block label -> results.json key (every one printed by 0.5.9 - 0.5.23, see above)
LABELS: dict[str, str] = {
    "Backend:": "backend",
    "Max request concurrency:": "max_concurrency",
    "Successful requests:": "completed",
    "Benchmark duration (s):": "duration_s",
    "Total input tokens:": "total_input_tokens",
    "Total generated tokens:": "total_output_tokens",
    "Request throughput (req/s):": "request_throughput",
    "Input token throughput (tok/s):": "input_throughput",
    "Output token throughput (tok/s):": "output_throughput",
    "Total token throughput (tok/s):": "total_throughput",
    "Concurrency:": "concurrency",
    "Accept length:": "accept_length",
    "Mean E2E Latency (ms):": "mean_e2e_latency_ms",
    "Median E2E Latency (ms):": "median_e2e_latency_ms",
    "Mean TTFT (ms):": "mean_ttft_ms",
    "Median TTFT (ms):": "median_ttft_ms",
    "P99 TTFT (ms):": "p99_ttft_ms",
    "Mean ITL (ms):": "mean_itl_ms",
    "Median ITL (ms):": "median_itl_ms",
    "P95 ITL (ms):": "p95_itl_ms",
    "P99 ITL (ms):": "p99_itl_ms",
    "Max ITL (ms):": "max_itl_ms",
}
_LINE = re.compile(r"^(?P<label>[A-Za-z0-9 ()/.,_-]+:)\s+(?P<value>\S.*?)\s*$")


def module_for(version: str | None) -> str:
    """The benchmark module of a release: sglang.benchmark.serving from 0.5.15, else
    sglang.bench_serving (which is a deprecated shim from 0.5.15 on)."""
    return "sglang.benchmark.serving" if at_least(version, 0, 5, 15) else "sglang.bench_serving"


@dataclass(frozen=True)
class BenchSpec:
    """One benchmark run: the workload at one concurrency."""

    base_url: str
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    dataset: str = "random-ids"
    dataset_path: str | None = None
    model: str | None = None
    tokenizer: str | None = None


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
    if spec.dataset_path:
        argv += ["--dataset-path", spec.dataset_path]
    if spec.dataset == "sharegpt":
        argv += ["--sharegpt-output-len", str(spec.output_len)]
    if spec.model:
        argv += ["--model", spec.model]
    if spec.tokenizer:
        argv += ["--tokenizer", spec.tokenizer]
    return argv


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def result_block(stdout: str) -> list[str] | None:
    """The lines of the result block (banner to the closing '=' line), or None if absent."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if BANNER in line and line.strip().startswith("="):
            block = [line]
            for rest in lines[i + 1:]:
                block.append(rest)
                if rest.strip() and set(rest.strip()) == {"="}:
                    return block
            return block
    return None


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The figures of the result block, keyed as in LABELS (unknown labels under `other`)."""
    block = result_block(stdout)
    if block is None:
        return None
    out: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for line in block[1:]:
        m = _LINE.match(line)
        if not m:
            continue
        label, value = m.group("label"), _number(m.group("value"))
        if label in LABELS:
            out[LABELS[label]] = value
        else:
            other[label.rstrip(":")] = value
    out["accept_length"] = out.get("accept_length")  # absent line: no accept length reported
    if other:
        out["other"] = other
    return out
