"""SGLANG_SIM_FAULT: the SGLang stand-in's silent serving failures, seen over real HTTP.

Each fault leaves the server up with /health at 200; what it serves is wrong, slow or nothing.
A healthy control shows that without the fault the same probes pass. Servers run from the
stand-in venv on 127.0.0.1 (time scaled by 1/1000 unless a test needs real-time margins), each
with its own simulated GPU state so that a test may run two side by side.
"""
# ruff: noqa: F811 - the launcher fixture, imported from tests.sim.test_sglang_standin
from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.sim.test_sglang_standin import (  # noqa: F401 - launcher: the fixture, shared
    DRAFTER_CONFIG,
    K26_CONFIG,
    Launcher,
    Server,
    _model,
    launcher,
)

STALL_S = 20.0  # sglang/srt/sim_faults.py FIRST_TOKEN_STALL_S, nominal seconds
PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {"k26": _model(root, "kimi-k2.6", K26_CONFIG),
            "drafter": _model(root, "kimi-k2.6-eagle3", DRAFTER_CONFIG)}


def _args(models: dict[str, str], spec: bool) -> list[str]:
    args = ["--model-path", models["k26"], "--tp", "8", "--enable-metrics",
            "--decode-log-interval", "8"]
    if spec:
        args += ["--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model-path", models["drafter"]]
    return args


def _start(launcher: Launcher, models: dict[str, str], spec: bool, fault: str = "",
           extra: tuple[str, ...] = (), **env: str) -> Server:
    """A ready server; its own GPU-state file, so that servers may run side by side."""
    n = len(launcher.procs)
    if fault:
        env["SGLANG_SIM_FAULT"] = fault
    server = launcher.start([*_args(models, spec), *extra],
                            SIMHW_TEST_STATE=str(launcher.tmp / f"gpu-state-{n}.json"), **env)
    server.wait_ready()
    return server


def _generate(server: Server, prompt: str = PROMPT, max_new: int = 32,
              timeout: float = 30.0) -> dict:
    """POST /generate, greedy (temperature 0); the answer plus `latency` (real seconds)."""
    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new}}
    req = urllib.request.Request(server.base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.status == 200
        out = json.loads(resp.read())
    out["latency"] = time.monotonic() - started
    return out


def _avg_accept(server: Server):
    info = json.loads(server.get("/server_info")[1])
    return info["internal_states"][0].get("avg_spec_accept_length")


def _gauge(server: Server, name: str) -> float:
    text = server.get("/metrics")[1].decode()
    match = re.search(rf"^sglang:{name}\{{.*\}} (\S+)$", text, re.M)
    assert match, text
    return float(match.group(1))


def _prefill_lines(server: Server) -> int:
    return server.text().count("Prefill batch")


# ----------------------------------------------------------------------------- control


def test_healthy_control_speculation_serves_what_plain_decoding_serves(launcher, models):
    plain = _start(launcher, models, spec=False)
    spec = _start(launcher, models, spec=True)
    expected = _generate(plain)["text"]
    first = _generate(spec)
    second = _generate(spec)
    assert first["text"] == second["text"] == expected and len(expected.split()) == 32
    meta = first["meta_info"]
    assert meta["spec_accept_length"] > 2.0 and meta["spec_num_correct_drafts"] > 0
    assert 2.4 <= _avg_accept(spec) <= 2.7
    assert _gauge(spec, "spec_accept_length") > 2.0
    assert first["latency"] < 1.0 and meta["e2e_latency"] < STALL_S / 4
    for server in (plain, spec):
        assert server.get("/health")[0] == 200 and server.get("/health_generate")[0] == 200
        assert "DeepGEMM" not in server.text()
        assert server.stop() == 0


# ----------------------------------------------------------------------------- faults


def test_wrong_draft_changes_greedy_text_from_the_second_token_not_the_accept_length(
        launcher, models):
    plain = _start(launcher, models, spec=False)
    wrong = _start(launcher, models, spec=True, fault="wrong-draft")
    expected = _generate(plain)["text"].split()
    got = _generate(wrong)
    words = got["text"].split()
    assert len(words) == len(expected) == 32
    assert words[0] == expected[0]
    assert all(a != b for a, b in zip(words[1:], expected[1:], strict=True)), (words, expected)
    assert _generate(wrong)["text"].split() == words  # deterministic
    assert got["meta_info"]["spec_accept_length"] > 2.0  # speculation looks healthy
    assert 2.4 <= _avg_accept(wrong) <= 2.7
    assert wrong.get("/health")[0] == 200
    # without speculation the fault does nothing
    plain_fault = _start(launcher, models, spec=False, fault="wrong-draft")
    assert _generate(plain_fault)["text"].split() == expected


def test_zero_accept_reports_accept_length_one_with_correct_text(launcher, models):
    plain = _start(launcher, models, spec=False)
    zero = _start(launcher, models, spec=True, fault="zero-accept")
    expected = _generate(plain, max_new=64)["text"]
    got = _generate(zero, max_new=64)
    assert got["text"] == expected
    meta = got["meta_info"]
    assert meta["spec_num_correct_drafts"] == 0 and meta["spec_accept_rate"] == 0.0
    # completion_tokens / spec_verify_ct as real SGLang (the first token is the prefill's)
    assert meta["spec_verify_ct"] == 63
    assert meta["spec_accept_length"] == pytest.approx(64 / 63) and meta["spec_accept_length"] < 1.1
    assert meta["spec_correct_drafts_histogram"] == [63]
    assert _avg_accept(zero) == 1.0
    assert _gauge(zero, "spec_accept_length") == 1.0
    assert _gauge(zero, "spec_accept_rate") == 0.0
    decode = [line for line in zero.text().splitlines() if "Decode batch" in line]
    assert decode and all("accept len: 1.00, accept rate: 0.00" in line for line in decode)
    assert zero.get("/health")[0] == 200


def test_scheduler_dead_hangs_generation_while_health_stays_200(launcher, models):
    dead = _start(launcher, models, spec=False, fault="scheduler-dead")
    assert dead.get("/health")[0] == 200 and dead.get("/health_generate")[0] == 200
    before = dead.text()
    outcome: dict = {}

    def client() -> None:  # gives up after 3 s, as a readiness probe would
        started = time.monotonic()
        try:
            outcome["reply"] = _generate(dead, timeout=3.0)
        except (TimeoutError, urllib.error.URLError) as exc:
            outcome["error"] = exc
        outcome["waited"] = time.monotonic() - started

    thread = threading.Thread(target=client)
    thread.start()
    deadline = time.monotonic() + 2.0
    while _gauge(dead, "num_queue_reqs") < 1.0:  # the request reached the scheduler, parked
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # the false positive: a request is stuck, yet every health probe passes
    for path in ("/health", "/health_generate", "/health"):
        assert dead.get(path)[0] == 200
    thread.join(timeout=10)
    assert "reply" not in outcome and outcome["waited"] >= 3.0, outcome
    error = outcome["error"]
    if isinstance(error, urllib.error.URLError):
        assert isinstance(error.reason, TimeoutError), error
    assert dead.get("/health")[0] == 200 and dead.proc.poll() is None
    after = dead.text()[len(before):]  # a hang logs nothing
    assert "Prefill batch" not in after and "Traceback" not in after and "ERROR" not in after
    assert "POST /generate" not in after
    assert dead.stop() == 0


def test_first_token_stall_delays_the_first_request_after_ready_only(launcher, models):
    scale = 0.02  # the stall is 0.4 s of real time, a decode step under 1 ms
    server = _start(launcher, models, spec=True, fault="first-token-stall",
                    extra=("--disable-cuda-graph",), SIMHW_TEST_TIME_SCALE=str(scale),
                    SGLANG_SIM_LOAD_SECONDS="5")
    # health checks neither wait for the stall nor use it up
    for _ in range(3):
        started = time.monotonic()
        assert server.get("/health")[0] == 200
        assert time.monotonic() - started < STALL_S * scale / 2
    assert "DeepGEMM" not in server.text()
    first = _generate(server, max_new=8)
    second = _generate(server, max_new=8)
    assert first["latency"] >= STALL_S * scale
    assert first["meta_info"]["e2e_latency"] >= STALL_S  # simulated clock
    assert second["latency"] < STALL_S * scale / 2
    assert second["meta_info"]["e2e_latency"] < 2.0
    assert first["text"] == second["text"]
    assert server.text().count("Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16>") == 1


# ----------------------------------------------------------------------------- knobs


def test_health_endpoint_generation_false_answers_health_without_generating(launcher, models):
    server = _start(launcher, models, spec=False,
                    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION="false")
    before = _prefill_lines(server)
    assert server.get("/health")[0] == 200
    assert _prefill_lines(server) == before
    assert server.get("/health_generate")[0] == 200  # still generates one token
    assert _prefill_lines(server) == before + 1


def test_unknown_fault_name_refuses_to_start(launcher, models):
    proc = launcher.run(_args(models, spec=False), SGLANG_SIM_FAULT="zero-accept,wrong-drafts")
    assert proc.returncode == 2
    assert "SGLANG_SIM_FAULT: unknown fault 'wrong-drafts'" in proc.stdout
    assert "Load weight begin" not in proc.stdout
