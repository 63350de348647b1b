# ruff: noqa: E501  (the log samples are real lines, kept whole)
"""The load timeline read from SGLang's log lines, in the formats of the releases we support
(the strings are the real ones: orchestrator/sglang/timeline.py cites each file:line)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from orchestrator.sglang import timeline
from orchestrator.sglang.launch import kernel_cache_dir

# 0.5.9: no milliseconds (SGLANG_LOG_MS unset), every TP rank logs with its prefix
LOG_059 = """\
[2026-12-04 10:00:00] server_args=ServerArgs(model_path='/models/k26', tp_size=8)
[2026-12-04 10:00:07 TP0] Load weight begin. avail mem=94.10 GB
[2026-12-04 10:00:07 TP1] Load weight begin. avail mem=94.10 GB
[2026-12-04 10:13:07 TP1] Load weight end. elapsed=780.00 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, avail mem=25.60 GB, mem usage=68.50 GB.
[2026-12-04 10:13:08 TP0] Load weight end. elapsed=781.00 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, avail mem=25.60 GB, mem usage=68.50 GB.
[2026-12-04 10:13:09 TP0] KV Cache is allocated. #tokens: 412000, KV size: 11.20 GB
[2026-12-04 10:13:10 TP0] Load weight begin. avail mem=14.40 GB
[2026-12-04 10:13:20 TP0] Load weight end. elapsed=10.00 s, type=LlamaForCausalLMEagle3, dtype=torch.bfloat16, avail mem=12.40 GB, mem usage=2.00 GB.
[2026-12-04 10:13:21 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=12.40 GB
[2026-12-04 10:13:21 TP3] Capture cuda graph begin. This can take up to several minutes. avail mem=12.40 GB
[2026-12-04 10:18:21 TP0] Capture cuda graph end. Time elapsed: 300.00 s. mem usage=1.20 GB. avail mem=11.20 GB.
[2026-12-04 10:18:40] The server is fired up and ready to roll!
"""

# 0.5.23 with SGLANG_LOG_MS=1: target-verify and draft graphs captured separately
LOG_0523 = """\
[2026-12-04 10:00:00.250] server_args=ServerArgs(model_path='/models/k26', tp_size=8)
[2026-12-04 10:00:05.500 TP0] Load weight begin. avail mem=94.10 GB
[2026-12-04 10:12:05.500 TP0] Load weight end. elapsed=720.00 s, type=KimiK25ForConditionalGeneration, quant=compressed-tensors, avail mem=25.60 GB, mem usage=68.50 GB.
[2026-12-04 10:12:06.000 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 398000, KV size: 10.90 GB
[2026-12-04 10:12:06.100 TP0] Load weight begin. avail mem=14.40 GB
[2026-12-04 10:12:14.100 TP0] Load weight end. elapsed=8.00 s, type=LlamaForCausalLMEagle3, avail mem=12.40 GB, mem usage=2.00 GB.
[2026-12-04 10:12:15.000 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=12.40 GB
[2026-12-04 10:12:45.000 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4], elapsed=30.00 s, mem usage=0.80 GB, avail mem=11.60 GB.
[2026-12-04 10:12:45.500 TP0] Capture draft CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=11.60 GB
[2026-12-04 10:12:55.500 TP0] Capture draft CUDA graph end. bs=[1, 2, 4], elapsed=10.00 s, mem usage=0.40 GB, avail mem=11.20 GB.
[2026-12-04 10:13:00.000] The server is fired up and ready to roll!
"""


def durations(phases: list[timeline.Phase]) -> dict[str, float]:
    return {p.phase: round(p.end - p.start, 3) for p in phases}


def test_a_059_log_gives_the_phases_of_rank_0() -> None:
    phases = timeline.parse(LOG_059.splitlines())
    assert durations(phases) == {"process start": 7, "target weights": 781, "kv pool": 1,
                                 "draft weights": 10, "cuda graph capture": 300,
                                 "first ready": 19}
    detail = {p.phase: p.detail for p in phases}
    assert detail["target weights"] == "68.50 GB, 781.00 s"  # TP0's line, not TP1's
    assert detail["kv pool"] == "412,000 tokens"
    assert detail["cuda graph capture"] == "300.00 s"
    # contiguous: each phase starts where the previous one ended (the capture has its own start)
    assert all(a.end <= b.start + 1 for a, b in zip(phases, phases[1:], strict=False))


def test_a_0523_log_sums_the_target_and_draft_captures() -> None:
    phases = timeline.parse(LOG_0523.splitlines())
    assert [p.phase for p in phases] == ["process start", "target weights", "kv pool",
                                         "draft weights", "cuda graph capture", "first ready"]
    d = durations(phases)
    assert d["process start"] == 5.25 and d["target weights"] == 720
    assert d["cuda graph capture"] == 40.5  # first begin to last end
    assert {p.phase: p.detail for p in phases}["cuda graph capture"] == "40.00 s"
    assert d["first ready"] == 4.5


def test_only_the_last_run_of_a_restarted_server_counts() -> None:
    crashed = LOG_059.splitlines()[:4] + [
        "orchestrator-supervisor: server pid 4242 exited with signal 9 (SIGKILL); restarting"]
    phases = timeline.parse(crashed + LOG_0523.splitlines())
    assert durations(phases)["target weights"] == 720  # the restarted run's, not the first
    # a run still capturing: the phase is open, and the console says what it is doing
    lines = LOG_0523.splitlines()[:8]
    assert timeline.parse(lines)[-1].phase == "cuda graph capture"
    assert timeline.current(lines) == "capturing CUDA graphs (JIT compiles)"
    assert timeline.current(lines[:7]) == timeline.current(lines)
    assert timeline.current(LOG_0523.splitlines()) == "first ready done"
    assert timeline.current(LOG_059.splitlines()[:3]) == "loading target weights"
    assert timeline.current(LOG_059.splitlines()[:7]) == "loading draft weights"
    assert timeline.current(["no stamp here"]) is None


@pytest.mark.parametrize("tz_hours", [0, 5.5, -8])
def test_anchored_puts_host_local_stamps_on_the_epoch_clock(tz_hours: float) -> None:
    """The log's clock is the host's local time; the pid record's start time is epoch."""
    phases = timeline.parse(LOG_0523.splitlines())
    local_start = datetime(2026, 12, 4, 10, 0, 0, 250000, tzinfo=timezone.utc).timestamp()
    epoch_start = local_start - tz_hours * 3600 - 0.4  # the supervisor starts 0.4 s earlier
    out = timeline.anchored(phases, epoch_start)
    assert abs(out[1].start - (local_start - tz_hours * 3600 + 5.25)) < 1e-6  # weights begin
    assert out[0].start == epoch_start  # the process start counts from the spawn
    assert durations(out)["process start"] == durations(phases)["process start"] + 0.4
    assert durations(out)["target weights"] == durations(phases)["target weights"]
    assert timeline.anchored(phases, None) == phases
    assert "target weights 720.0s (68.50 GB, 720.00 s)" in timeline.summary(out)


def test_the_kernel_caches_live_beside_the_venv_one_folder_per_release() -> None:
    assert kernel_cache_dir("/opt/venv/bin/python", "/opt/run/cache", "0.5.23") == \
        "/opt/kernel-cache/sglang-0.5.23"
    assert kernel_cache_dir("/opt/venv/bin/python", "/opt/run/cache", "0.5.9") != \
        kernel_cache_dir("/opt/venv/bin/python", "/opt/run/cache", "0.5.23")
    # not a venv's python: the state dir's cache folder
    assert kernel_cache_dir("python3", "/opt/run/cache/", None) == \
        "/opt/run/cache/sglang-unknown"
