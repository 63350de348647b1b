"""wait_ready against the SGLang stand-in on a simulated host: ready, converged, and each failure.

Servers are launched by the real sglang_server stage (some with preflight off, to let the
stand-in fail the way SGLang does); wait_ready polls from the host through the agent.
"""
# ruff: noqa: F811 - pytest fixtures imported from tests.sglang.simhost

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.errors import StageError
from orchestrator.stages.base import Converged, Needed, Stage, stage_kinds
from tests.sglang.simhost import (  # noqa: F401 - fixtures
    API_KEY,
    SGLangSim,
    sglang_sim,
    stop_servers_after,
)


def make(kind: str, params: dict[str, Any]) -> Stage:
    cls = stage_kinds()[kind]
    return cls(cls.Params.model_validate(params))


def launch(sim: SGLangSim, stage_ctx, converge, state_dir: str, **overrides: Any) -> dict:
    ctx = stage_ctx("server", kind="sglang_server")
    status, _ = converge(make("sglang_server", sim.server_params(state_dir, **overrides)),
                         sim.connect(), ctx)
    assert status == "changed"
    return ctx.facts


def test_ready_with_accept_length_then_converged_fast(sglang_sim: SGLangSim, stage_ctx,
                                                      converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("ready")
    launch(sim, stage_ctx, converge, sd)
    host = sim.connect()
    ctx = stage_ctx("ready", kind="wait_ready")
    with capture_logs() as logs:
        status, reason = converge(make("wait_ready", sim.ready_params(sd)), host, ctx)
    assert status == "changed", reason
    facts = ctx.facts
    assert facts["model"] == "kimi-k2.6"
    assert facts["version"] == "0.5.23"
    assert facts["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert 2.3 < facts["accept_length"] < 2.8  # EAGLE-3, 3 steps, matched drafter: ~2.6
    # 0.5.23 reports it per chat request (return_spec_tokens_details, 0.5.19+)
    assert facts["accept_length_source"] == "per request (4 requests)"
    assert facts["ready_after_s"] >= 0 and facts["smoke_reply"]
    assert any(m.startswith("waiting for http://") for m in ctx.progress_messages) or \
        facts["ready_after_s"] < 0.2
    assert API_KEY not in json.dumps([facts, ctx.progress_messages, logs], default=str)

    t0 = time.monotonic()
    verdict = make("wait_ready", sim.ready_params(sd)).check(host, stage_ctx("ready"))
    elapsed = time.monotonic() - t0
    assert isinstance(verdict, Converged), verdict
    assert "accept length" in verdict.reason and elapsed < 10, (verdict, elapsed)

    # both stages of a re-run: converged, each well under a second
    t0 = time.monotonic()
    v1 = make("sglang_server", sim.server_params(sd)).check(host, stage_ctx("server"))
    v2 = make("wait_ready", sim.ready_params(sd)).check(host, stage_ctx("ready"))
    assert isinstance(v1, Converged) and isinstance(v2, Converged)
    assert time.monotonic() - t0 < 15


def test_accept_length_of_a_release_without_chat_details(sglang_sim: SGLangSim, stage_ctx,
                                                         converge) -> None:
    """0.5.15 has no return_spec_tokens_details: /generate's meta_info gives it per request,
    long before the decode log (every 40 decode batches) publishes it in /server_info."""
    sim = sglang_sim
    python = sim.venv("v0515", "sglang==0.5.15", "compressed-tensors==0.18.0")
    sd = sim.state_dir("ready-0515")
    launch(sim, stage_ctx, converge, sd, python=python)
    ctx = stage_ctx("ready", kind="wait_ready")
    status, reason = converge(make("wait_ready", sim.ready_params(sd, accept_requests=1,
                                                                  smoke_max_tokens=8)),
                              sim.connect(), ctx)
    assert status == "changed", reason
    assert ctx.facts["version"] == "0.5.15"
    assert ctx.facts["accept_length_source"] == "per request (1 request)"
    assert 1.5 < ctx.facts["accept_length"] < 3.0


def test_waits_through_loading_and_shows_progress(sglang_sim: SGLangSim, stage_ctx,
                                                  converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("slow-load")
    launch(sim, stage_ctx, converge, sd, env={"SGLANG_SIM_LOAD_SECONDS": "1500"})
    ctx = stage_ctx("ready", kind="wait_ready")
    status, _ = converge(make("wait_ready", sim.ready_params(sd)), sim.connect(), ctx)
    assert status == "changed"
    waiting = [m for m in ctx.progress_messages if m.startswith("waiting for")]
    assert waiting, ctx.progress_messages
    assert any("loading (port closed)" in m for m in waiting)
    assert any("Loading safetensors checkpoint shards" in m for m in waiting)
    assert ctx.facts["ready_after_s"] >= 0.5


def test_server_killed_while_loading_fails_within_one_poll(sglang_sim: SGLangSim, stage_ctx,
                                                           converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("killed")
    facts = launch(sim, stage_ctx, converge, sd, env={"SGLANG_SIM_LOAD_SECONDS": "60000"})
    pid = facts["pid"]
    killer = threading.Timer(1.0, os.kill, args=(pid, signal.SIGKILL))
    killer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(StageError) as err:
            make("wait_ready", sim.ready_params(sd, timeout=60, poll_interval=0.5)).apply(
                sim.connect(), stage_ctx("ready", kind="wait_ready"))
    finally:
        killer.cancel()
    elapsed = time.monotonic() - t0
    assert elapsed < 30, elapsed  # reported at once, not at the 60 s timeout (figures: make bench)
    msg = err.value.render()
    assert f"(pid {pid}) was killed by signal 9" in msg
    assert "Loading safetensors checkpoint shards" in msg  # the log tail
    assert "server.log" in msg


def test_checkpoint_load_failure_is_reported_at_once(sglang_sim: SGLangSim, stage_ctx,
                                                     converge) -> None:
    """compressed-tensors 0.8.1 with preflight off: the stand-in dies the way SGLang does."""
    sim = sglang_sim
    python = sim.venv("ct081", "sglang==0.5.23", "compressed-tensors==0.8.1", no_deps=True)
    sd = sim.state_dir("ct081")
    launch(sim, stage_ctx, converge, sd, python=python, preflight="off", verify_window=0)
    t0 = time.monotonic()
    with pytest.raises(StageError) as err:
        make("wait_ready", sim.ready_params(sd, timeout=60)).apply(
            sim.connect(), stage_ctx("ready", kind="wait_ready"))
    assert time.monotonic() - t0 < 30  # not the 60 s timeout
    msg = err.value.render()
    assert "exited with code 1" in msg
    assert "AttributeError: nvfp4_pack_quantized" in msg


def test_a_post_load_failure_costs_the_whole_load_that_preflight_saves(
        sglang_sim: SGLangSim, stage_ctx, converge) -> None:
    """fa3 on sm_120, launched anyway (preflight off): the stand-in, like SGLang, finds it only
    when the attention backend is created, after the full weight load; the preflight refuses
    the same launch before anything starts."""
    sim = sglang_sim
    sd = sim.state_dir("fa3-after-load")
    launch(sim, stage_ctx, converge, sd, preflight="off", attention_backend="fa3",
           verify_window=0, env={"SGLANG_SIM_LOAD_SECONDS": "960"})
    with pytest.raises(StageError) as err:
        make("wait_ready", sim.ready_params(sd, timeout=60)).apply(
            sim.connect(), stage_ctx("ready", kind="wait_ready"))
    msg = err.value.render()
    assert "FlashAttention v3 Backend requires SM>=80 and SM<=90" in msg
    log = Path(sd, "server.log").read_text()
    loaded = log.index("Loading safetensors checkpoint shards: 100% Completed")
    assert loaded < log.index("FlashAttention v3 Backend requires"), log  # after the 16 minutes
    t0 = time.monotonic()
    with pytest.raises(StageError, match="fa3 needs sm_90"):
        make("sglang_server", sim.server_params(sim.state_dir("fa3-refused"),
                                                attention_backend="fa3")).check(
            sim.connect(), stage_ctx("server", kind="sglang_server"))
    assert time.monotonic() - t0 < 10


def test_silently_disabled_speculator_fails_the_deploy(sglang_sim: SGLangSim, stage_ctx,
                                                       converge) -> None:
    """EAGLE with an EAGLE-3 drafter starts fine and accepts nothing (preflight off)."""
    sim = sglang_sim
    sd = sim.state_dir("eagle")
    launch(sim, stage_ctx, converge, sd, preflight="off",
           speculative={"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1,
                        "num_draft_tokens": 4})
    host = sim.connect()
    with pytest.raises(StageError) as err:
        make("wait_ready", sim.ready_params(sd)).apply(host, stage_ctx("ready", kind="wait_ready"))
    msg = err.value.render()
    # per request: completion tokens / verify steps; the first token comes from the prefill
    assert re.search(r"accept length 1\.0\d, required > 1\.2 \(measured over 4 requests\)",
                     msg), msg
    assert "speculative_algorithm is EAGLE but the drafter is an EAGLE-3 model" in msg
    assert "Set speculative.algorithm: EAGLE3" in msg
    verdict = make("wait_ready", sim.ready_params(sd)).check(host, stage_ctx("ready"))
    assert isinstance(verdict, Needed) and "has not been verified yet" in verdict.reason
    verdict = make("wait_ready", {**sim.ready_params(sd), "state_dir": None}).check(
        host, stage_ctx("ready"))
    assert isinstance(verdict, Needed) and "accept length 1.00 is not above 1.2" in verdict.reason


def test_timeout_and_wrong_model(sglang_sim: SGLangSim, stage_ctx, converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("timeout")
    launch(sim, stage_ctx, converge, sd, env={"SGLANG_SIM_LOAD_SECONDS": "60000"})
    host = sim.connect()
    with pytest.raises(StageError) as err:
        make("wait_ready", sim.ready_params(sd, timeout=1)).apply(host, stage_ctx("ready"))
    msg = err.value.render()
    assert "was not ready after 1s (loading (port closed))" in msg
    assert "Loading safetensors checkpoint shards" in msg

    sim.stop_all()
    sd2 = sim.state_dir("wrong-model")
    launch(sim, stage_ctx, converge, sd2, model_path=sim.models["k2"],
           draft_model_path=None, speculative=None)
    with pytest.raises(StageError) as err:
        make("wait_ready", sim.ready_params(sd2, min_accept_length=None)).apply(
            host, stage_ctx("ready"))
    msg = err.value.render()
    assert "serves architectures ['DeepseekV3ForCausalLM']" in msg
    assert "expected ['KimiK25ForConditionalGeneration']" in msg

    with pytest.raises(StageError, match="401 Unauthorized"):
        make("wait_ready", sim.ready_params(sd2, api_key="sk-wrong-0000", min_accept_length=None)
             ).apply(host, stage_ctx("ready"))


def test_no_server_started(sglang_sim: SGLangSim, stage_ctx) -> None:
    sim = sglang_sim
    sd = sim.state_dir("never")
    Path(sd).mkdir(parents=True, exist_ok=True)
    host = sim.connect()
    verdict = make("wait_ready", sim.ready_params(sd)).check(host, stage_ctx("ready"))
    assert isinstance(verdict, Needed) and "connection refused" in verdict.reason
    with pytest.raises(StageError, match="no server was started from"):
        make("wait_ready", sim.ready_params(sd)).apply(host, stage_ctx("ready"))


# --- silent failures behind a healthy /health (the stand-in's SGLANG_SIM_FAULT)


def _ready_fails(sim: SGLangSim, stage_ctx, sd: str, **params: Any) -> tuple[str, float]:
    t0 = time.monotonic()
    with pytest.raises(StageError) as err:
        make("wait_ready", sim.ready_params(sd, **params)).apply(
            sim.connect(), stage_ctx("ready", kind="wait_ready"))
    return err.value.render(), time.monotonic() - t0


def test_greedy_answers_must_be_the_targets_own(sglang_sim: SGLangSim, stage_ctx,
                                                converge) -> None:
    """Recorded without speculation, then required of the speculative server: equal when the
    drafter is sound, a named failure when the draft corrupts the output (accept length high)."""
    sim = sglang_sim
    sd = sim.state_dir("greedy")
    launch(sim, stage_ctx, converge, sd, speculative={"algorithm": None})
    ctx = stage_ctx("ready", kind="wait_ready")
    status, reason = converge(make("wait_ready", sim.ready_params(sd, min_accept_length=None)),
                              sim.connect(), ctx)
    assert status == "changed", reason
    greedy = ctx.facts["greedy"]
    assert greedy["speculative"] is None and len(greedy["answers"]) == 3
    assert all(greedy["answers"].values())
    reference = greedy["answers"]

    launch(sim, stage_ctx, converge, sd)  # EAGLE-3, sound drafter: the same answers
    ctx = stage_ctx("ready", kind="wait_ready")
    status, reason = converge(make("wait_ready", sim.ready_params(
        sd, greedy_reference=reference)), sim.connect(), ctx)
    assert status == "changed", reason
    assert ctx.facts["greedy"]["answers"] == reference
    assert ctx.facts["greedy"]["speculative"] == "EAGLE3"

    launch(sim, stage_ctx, converge, sd, env={"SGLANG_SIM_FAULT": "wrong-draft"})
    msg, took = _ready_fails(sim, stage_ctx, sd, greedy_reference=reference)
    assert "speculative decoding changes the output: 3 of 3 greedy answers differ" in msg
    assert "'The capital of France is': expected" in msg
    assert "vocabulary map" in msg and took < 30


def test_zero_acceptance_is_named(sglang_sim: SGLangSim, stage_ctx, converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("zero-accept")
    launch(sim, stage_ctx, converge, sd, env={"SGLANG_SIM_FAULT": "zero-accept"})
    msg, took = _ready_fails(sim, stage_ctx, sd)
    assert re.search(r"accept length 1\.0\d, required > 1\.2", msg), msg
    assert "every draft is rejected (0% acceptance" in msg and "vllm#54997" in msg
    assert took < 30


def test_dead_scheduler_behind_a_healthy_health_is_caught(sglang_sim: SGLangSim, stage_ctx,
                                                          converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("scheduler-dead")
    launch(sim, stage_ctx, converge, sd, env={"SGLANG_SIM_FAULT": "scheduler-dead"})
    msg, took = _ready_fails(sim, stage_ctx, sd, first_token_timeout=2)
    assert "answers /health 200 but produced no token within 2s" in msg
    assert "scheduler is dead or hung behind a healthy /health (sglang#6624)" in msg
    assert 2 <= took < 30


def test_first_token_stall_is_warmed_up_and_named(sglang_sim: SGLangSim, stage_ctx,
                                                  converge) -> None:
    """A 20 s JIT stall on the first request after ready (here 1 s real at the test's time
    scale): ready waits it out, asks again until requests are fast, and warns with the cause."""
    sim = sglang_sim
    sd = sim.state_dir("stall")
    launch(sim, stage_ctx, converge, sd, env={"SGLANG_SIM_FAULT": "first-token-stall",
                                             "SGLANG_SIM_FIRST_TOKEN_STALL_S": "1000"})
    ctx = stage_ctx("ready", kind="wait_ready")
    status, reason = converge(make("wait_ready", sim.ready_params(
        sd, first_token_stall=0.5, first_token_timeout=10)), sim.connect(), ctx)
    assert status == "changed", reason
    assert ctx.facts["first_token_s"] >= 0.9
    (warning,) = ctx.facts["warnings"]
    assert "the first request after ready took" in warning and "sglang#7339" in warning
    assert "warmed up before ready" in warning


@pytest.mark.soak
def test_200_healthy_boots_raise_no_false_alarm(sglang_sim: SGLangSim, stage_ctx,
                                                converge) -> None:
    """Every new check of ready (first token, greedy answers against the reference, accept
    length) on 200 healthy boots: none fails, none warns (`make soak`)."""
    sim = sglang_sim
    sd = sim.state_dir("boots")
    reference = None
    alarms = []
    for boot in range(200):
        # a new launch each time: the fingerprint changes with the boot number
        launch(sim, stage_ctx, converge, sd, env={"BOOT": str(boot)})
        ctx = stage_ctx("ready", kind="wait_ready")
        status, reason = converge(make("wait_ready", sim.ready_params(
            sd, greedy_reference=reference)), sim.connect(), ctx)
        if status != "changed" or ctx.facts.get("warnings"):
            alarms.append((boot, status, reason, ctx.facts.get("warnings")))
        reference = reference or ctx.facts["greedy"]["answers"]
    assert not alarms, alarms[:5]
