"""results.json and tune.json read back as the dataclasses that wrote them (report and a
resumed tune read them), with the keys the files have always had."""

from __future__ import annotations

import json

from orchestrator.bench.bench import (
    BenchOptions,
    BenchResults,
    BenchRun,
    BenchServer,
    HostBench,
    dumps,
)
from orchestrator.bench.tune import BestAt, Candidate, Recommendation, TuneEntry, TuneState

OPTIONS = BenchOptions(concurrency=(1, 32), input_len=16, output_len=48)


def test_bench_results_read_back_and_leave_out_what_a_run_did_not_produce() -> None:
    ok = BenchRun(1, 8, 0, 1.5, "-m sglang.benchmark.serving", True,
                  result={"completed": 8, "output_throughput": 42.0, "request_rate": None,
                          "median_tpot_ms": 25.0, "p99_ttft_ms": float("inf")},
                  nonfinite={"request_rate": "inf"})
    failed = BenchRun(32, 128, 1, 0.5, "-m sglang.benchmark.serving", False,
                      error="exit code 1", tail="Error")
    host = HostBench("http://127.0.0.1:30000", "/opt/run", [ok, failed],
                     BenchServer(fingerprint="ab", args=["--port", "30000"], pid=7,
                                 speculative={"speculative_eagle_topk": 4}, label="baseline"),
                     "sglang.benchmark.serving", "the server died")
    results = BenchResults("r1", "pb.yaml", "inv.yaml", OPTIONS, hosts={"gpu-1": host,
                                                                          "gpu-2": HostBench()})
    text = dumps(results.to_json())
    data = json.loads(text, parse_constant=_refuse)  # strict: no Infinity, no NaN
    assert data["kind"] == "orchestrator-bench" and data["version"] == 2 and "path" not in data
    assert data["options"]["concurrency"] == [1, 32]
    runs = data["hosts"]["gpu-1"]["runs"]
    assert set(runs[0]) == {"concurrency", "num_prompts", "exit_code", "wall_s", "command", "ok",
                            "result", "nonfinite"}
    assert set(runs[1]) == {"concurrency", "num_prompts", "exit_code", "wall_s", "command", "ok",
                            "error", "tail"}
    assert data["hosts"]["gpu-2"] == {"runs": []}
    assert runs[0]["result"]["p99_ttft_ms"] is None  # a stray inf is null, never Infinity
    back = BenchResults.from_json(data, "x/results.json")
    assert back.path == "x/results.json" and back.hosts["gpu-1"].runs[1] == failed
    assert ok.figure("output_throughput") == 42.0 and failed.figure("output_throughput") is None
    assert ok.user_tps == 40.0 and ok.thin("p99_ttft_ms") == 8 and ok.thin("p90_ttft_ms") == 8
    assert not back.measured_all()


def _refuse(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def test_version_1_results_from_the_banner_still_read() -> None:
    v1 = {"kind": "orchestrator-bench", "version": 1, "run_id": "r0", "playbook": "p",
          "inventory": "i", "options": {"concurrency": [1]}, "hosts": {"gpu-1": {"runs": [
              {"concurrency": 1, "num_prompts": 8, "exit_code": 0, "wall_s": 1.0,
               "command": "x", "ok": True, "lines": ["=="],
               "result": {"completed": 8, "duration_s": 2.5, "output_throughput": 9.0,
                          "other": {"Traffic request rate": float("inf")}}}]}}}
    run = BenchResults.from_json(json.loads(json.dumps(v1))).hosts["gpu-1"].runs[0]
    assert run.result == {"completed": 8, "duration": 2.5, "output_throughput": 9.0}
    assert run.user_tps is None


def test_tune_state_reads_back_with_its_recommendation() -> None:
    wide = Candidate("EAGLE3", 3, 4, 8)
    state = TuneState("pb.yaml", OPTIONS, "t0", {
        "off": TuneEntry("off", "baseline", Candidate(None), "measured", bench_run="b1"),
        wide.key: TuneEntry(wide.key, wide.label, wide, "failed", error="deploy exit code 1")})
    state.recommendation = Recommendation(
        [BestAt(1, "off", "baseline", 26.3, None, 26.3)], 1, "off", Candidate(None),
        "speculation stops paying from concurrency 1", override_file="o.yaml")
    data = json.loads(json.dumps(state.to_json()))
    assert data["kind"] == "orchestrator-tune"
    assert [e["key"] for e in data["candidates"]] == ["off", wide.key]
    assert data["candidates"][1]["settings"] == {"algorithm": "EAGLE3", "num_steps": 3,
                                                 "eagle_topk": 4, "num_draft_tokens": 8}
    assert data["recommendation"]["per_concurrency"][0]["best"] == "off"
    assert TuneState.from_json(data) == state
