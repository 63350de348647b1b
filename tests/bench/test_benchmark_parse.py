"""SGLang's benchmark as the product drives and reads it: module per release, argv, result block.

The block below is printed with the exact format strings of sglang 0.5.23
benchmark/serving.py:1681-1845 (and the same labels of 0.5.9 bench_serving.py:2568-2661).
"""

from __future__ import annotations

import pytest

from orchestrator.sglang.benchmark import BenchSpec, bench_argv, module_for, parse_result


def _block(accept: float | None) -> str:
    out = ["Starting warmup with 1 sequences...", ""]
    out.append("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    out.append("{:<40} {:<10}".format("Backend:", "sglang"))
    out.append("{:<40} {:<10}".format("Max request concurrency:", 4))
    out.append("{:<40} {:<10}".format("Successful requests:", 16))
    out.append("{:<40} {:<10.2f}".format("Benchmark duration (s):", 12.345))
    out.append("{:<40} {:<10}".format("Total generated tokens:", 4096))
    out.append("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", 331.78))
    out.append("{:<40} {:<10}".format("Peak concurrent requests:", 4))
    if accept:
        out.append("{:<40} {:<10.2f}".format("Accept length:", accept))
    out.append("{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"))
    out.append("{:<40} {:<10.2f}".format("Median TTFT (ms):", 83.06))
    out.append("{:<40} {:<10.2f}".format("P99 TTFT (ms):", 179.5))
    out.append("{s:{c}^{n}}".format(s="Inter-Token Latency", n=50, c="-"))
    out.append("{:<40} {:<10.2f}".format("Median ITL (ms):", 60.88))
    out.append("{:<40} {:<10.2f}".format("P99 ITL (ms):", 107.09))
    out.append("{:<40} {:.1f}%".format("Cache hit rate:", 12.5))
    out.append("=" * 50)
    out.append("Some trailing line: 3")
    return "\n".join(out) + "\n"


def test_result_block_figures_are_read_by_label() -> None:
    r = parse_result(_block(2.61))
    assert r is not None
    assert (r["completed"], r["output_throughput"], r["accept_length"]) == (16, 331.78, 2.61)
    assert (r["median_ttft_ms"], r["p99_ttft_ms"], r["median_itl_ms"], r["p99_itl_ms"]) == \
        (83.06, 179.5, 60.88, 107.09)
    assert r["max_concurrency"] == 4 and r["duration_s"] == 12.35
    # labels not mapped are kept, and nothing after the closing line is read
    assert r["other"] == {"Peak concurrent requests": 4, "Cache hit rate": "12.5%"}


def test_no_accept_line_means_no_accept_length_and_no_block_means_none() -> None:
    assert parse_result(_block(None))["accept_length"] is None
    traceback = "Traceback (most recent call last):\nrequests.exceptions.ConnectionError: x\n"
    assert parse_result(traceback) is None


@pytest.mark.parametrize(("version", "module"), [
    ("0.5.9", "sglang.bench_serving"), ("0.5.12", "sglang.bench_serving"),
    ("0.5.15", "sglang.benchmark.serving"), ("0.5.23", "sglang.benchmark.serving"),
    (None, "sglang.bench_serving"),
])
def test_module_per_release(version: str | None, module: str) -> None:
    assert module_for(version) == module


def test_argv_fixes_the_workload_and_keeps_the_key_off_it() -> None:
    spec = BenchSpec("http://127.0.0.1:30000", concurrency=8, num_prompts=32, input_len=128,
                     output_len=256, model="kimi-k2.6", tokenizer="/m/k26")
    argv = bench_argv("/v/bin/python", "0.5.23", spec)
    assert argv[:3] == ["/v/bin/python", "-m", "sglang.benchmark.serving"]
    pairs = dict(zip(argv[3::1], argv[4::1], strict=False))
    assert pairs["--max-concurrency"] == "8" and pairs["--num-prompts"] == "32"
    assert pairs["--random-range-ratio"] == "1" and pairs["--dataset-name"] == "random-ids"
    assert "--flush-cache" in argv and "--tokenizer" in argv
    assert not any("key" in a.lower() for a in argv)
