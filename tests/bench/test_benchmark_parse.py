"""SGLang's benchmark as the product drives and reads it: module per release, argv, the result
line it appends to --output-file.

The line below is what sglang 0.5.23 benchmark/serving.py:1855-1908, 1961-1966 writes (the keys of
0.5.9 bench_serving.py:2671-2718 plus six percentiles), through json.dumps: the default
--request-rate inf is `Infinity`, E2E figures of a run without a completed request are `NaN`.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.sglang.benchmark import (
    ADDED_0_5_15,
    RESULT_KEYS,
    BenchSpec,
    bench_argv,
    module_for,
    read_output,
    result_keys,
    thin_percentile,
    user_tps,
)


def _line(**over: object) -> str:
    doc = {k: 1.5 for k in result_keys("0.5.23")}
    doc.update(tag=None, backend="sglang", dataset_name="random-ids", request_rate=float("inf"),
               max_concurrency=4, completed=16, accept_length=2.61, median_tpot_ms=20.0,
               server_info={"api_key": "sk-secret", "internal_states": [{}]})
    doc.update(over)
    return json.dumps(doc)


def test_the_result_line_is_read_whole_and_made_strict() -> None:
    out = read_output("old run\n" + _line(completed=3) + "\n" + _line() + "\n\n")
    assert out is not None
    r = out.result
    assert (r["completed"], r["accept_length"], r["max_concurrency"]) == (16, 2.61, 4)
    assert set(r) == set(result_keys("0.5.23")) - {"server_info"}  # the API key stays behind
    assert r["request_rate"] is None and out.nonfinite == {"request_rate": "inf"}
    json.loads(json.dumps(r), parse_constant=_refuse)  # strict JSON now
    nan = read_output(_line(completed=0, mean_e2e_latency_ms=float("nan")))
    assert nan.nonfinite == {"request_rate": "inf", "mean_e2e_latency_ms": "nan"}
    assert read_output("") is None and read_output("Traceback ...") is None


def _refuse(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def test_keys_per_release_and_what_is_derived() -> None:
    assert len(RESULT_KEYS) == 43 and len(result_keys("0.5.12")) == 43
    assert result_keys("0.5.15") == RESULT_KEYS + ADDED_0_5_15
    assert "max_itl_ms" not in result_keys("0.5.23")  # printed, never written
    assert user_tps(20.0) == 50.0 and user_tps(0.0) is None and user_tps(None) is None
    assert thin_percentile("p99_ttft_ms", 64) == 64 and thin_percentile("p99_ttft_ms", 100) is None
    assert thin_percentile("p95_itl_ms", 19) == 19 and thin_percentile("median_ttft_ms", 2) is None


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
    assert "--flush-cache" in argv and "--tokenizer" in argv and "--output-file" not in argv
    argv = bench_argv("/v/bin/python", "0.5.9", BenchSpec(
        "http://h:1", 1, 8, 16, 16, output_file="/tmp/o/c1.jsonl"))
    assert argv[2] == "sglang.bench_serving" and argv[argv.index("--output-file") + 1] == \
        "/tmp/o/c1.jsonl"
    assert not any("key" in a.lower() for a in argv)
