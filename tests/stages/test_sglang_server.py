"""sglang_server on a simulated 8-GPU host over SSH: launch, converge, restart, refuse, stale port.

The SGLang stand-in is pip-installed from the simulator's index into real venvs on the host and
started through the stage; nothing of ours is mocked. Time is scaled by 1/1000.
"""
# ruff: noqa: F811 - pytest fixtures imported from tests.sglang.simhost

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.errors import PreflightError, StageError
from orchestrator.stages.base import Converged, Needed, Stage, stage_kinds
from tests.runner.helpers import cli
from tests.sglang.simhost import (  # noqa: F401 - fixture
    API_KEY,
    SGLangSim,
    cmdlines_with,
    sglang_sim,
    stop_servers_after,
    wait_for,
)
from tests.sim.conftest import pid_alive


def make(kind: str, params: dict[str, Any]) -> Stage:
    cls = stage_kinds()[kind]
    return cls(cls.Params.model_validate(params))


def health(sim: SGLangSim) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{sim.address}:{sim.port}/health", timeout=2) as r:
            return r.status
    except OSError:
        return None




def assert_nothing_started(sim: SGLangSim, state_dir: str) -> None:
    assert not Path(state_dir, "server.pid").exists()
    assert not Path(state_dir, "launch.json").exists()
    assert sim.server_pids() == []
    assert not sim.port_open()


def test_launch_converge_and_restart_on_change(sglang_sim: SGLangSim, stage_ctx,
                                               converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("basic")
    host = sim.connect()
    ctx = stage_ctx("server", kind="sglang_server")
    with capture_logs() as logs:
        status, reason = converge(make("sglang_server", sim.server_params(sd)), host, ctx)
    assert (status, reason) == ("changed", "not running")
    pid = ctx.facts["pid"]
    assert ctx.facts["managed_by"] == "background"
    assert ctx.facts["sglang_version"] == "0.5.23"
    assert ctx.facts["flags_source"] == "release"  # generated from the release's wheel
    assert ctx.facts["preflight"]["native"] == "ok"  # SGLang's own validation ran and passed
    assert pid in sim.server_pids()
    assert wait_for(lambda: health(sim) == 200, timeout=15), Path(sd, "server.log").read_text()

    # the server got the key (its /v1 routes want it) but nobody can see it
    req = urllib.request.Request(f"http://{sim.address}:{sim.port}/v1/models")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 401
    req.add_header("Authorization", f"Bearer {API_KEY}")
    with urllib.request.urlopen(req, timeout=5) as r:
        assert json.loads(r.read())["data"][0]["id"] == "kimi-k2.6"
    assert cmdlines_with(API_KEY) == []
    log = Path(sd, "server.log").read_text()
    assert "server_args=" in log and "api_key='***'" in log and API_KEY not in log
    assert oct(os.stat(Path(sd, "api_key")).st_mode & 0o777) == "0o600"
    everything = json.dumps([ctx.facts, ctx.progress_messages, logs], default=str)
    assert API_KEY not in everything
    argv = json.loads(Path(sd, "launch.json").read_text())["argv"]
    assert "--tp-size" in argv and "--tp" not in argv and API_KEY not in argv

    # a second run changes nothing, and quickly
    ctx2 = stage_ctx("server", kind="sglang_server")
    t0 = time.monotonic()
    verdict = make("sglang_server", sim.server_params(sd)).check(host, ctx2)
    elapsed = time.monotonic() - t0
    assert isinstance(verdict, Converged), verdict
    assert "same launch fingerprint" in verdict.reason and "/health 200" in verdict.reason
    assert elapsed < 10, f"converged check took {elapsed:.2f}s"  # figures: make bench
    assert sim.server_pids() == [pid]

    # a changed parameter restarts it (gracefully: the old process group is gone)
    changed = sim.server_params(sd, mem_fraction_static=0.85)
    ctx3 = stage_ctx("server", kind="sglang_server")
    verdict = make("sglang_server", changed).check(host, ctx3)
    assert isinstance(verdict, Needed)
    assert "running with a different launch fingerprint" in verdict.reason
    assert "--mem-fraction-static 0.88 -> 0.85" in verdict.reason
    status, _ = converge(make("sglang_server", changed), host, ctx3)
    assert status == "changed"
    assert ctx3.facts["stopped_previous"]["pid"] == pid
    assert ctx3.facts["pid"] != pid and not pid_alive(pid)
    assert sim.server_pids() == [ctx3.facts["pid"]]
    assert Path(sd, "server.log.1").exists()  # the previous run's log, rotated
    assert API_KEY not in Path(sd, "server.log.1").read_text()

    # a changed API key restarts it too, and says so without showing either key
    verdict = make("sglang_server", {**changed, "api_key": "sk-other-key-123456"}).check(
        host, stage_ctx("server", kind="sglang_server"))
    assert isinstance(verdict, Needed) and "api key changed" in verdict.reason
    assert "sk-other" not in verdict.reason


REFUSALS = [
    pytest.param(
        "main", {"speculative": {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1,
                                 "num_draft_tokens": 4}},
        ["EAGLE with an EAGLE-3 drafter (LlamaForCausalLMEagle3)", "accept length 1.00",
         "Set speculative.algorithm: EAGLE3"], id="eagle-with-eagle3-drafter"),
    pytest.param(
        "main", {"speculative": {"algorithm": "EAGLE3", "eagle_topk": 1,
                                 "num_draft_tokens": 4}},
        ["eagle_topk and num_draft_tokens set without speculative.num_steps",
         "bare AssertionError"], id="topk-without-steps"),
    pytest.param(
        "main", {"extra_args": ["--cuda-graph-max-bs", "64"]},
        ["--cuda-graph-max-bs is not a flag of sglang 0.5.23",
         "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
         "--cuda-graph-max-bs-prefill"], id="removed-flag"),
    pytest.param(
        "ct081", {},
        ["compressed-tensors 0.8.1 does not know nvfp4_pack_quantized; install "
         "compressed-tensors>=0.10.0 (the pip stage)"], id="old-compressed-tensors"),
    pytest.param(
        "main", {"attention_backend": "fa3"},
        ["--attention-backend fa3 needs sm_90", "sm_120", "flashinfer or triton",
         "[real SGLang: only after the weights load]"],
        id="fa3-on-sm120"),
    pytest.param(
        "v059", {},
        ["EAGLE3 on a Kimi K2.5/K2.6 target (KimiK25ForConditionalGeneration) needs sglang "
         ">= 0.5.10", "installed: 0.5.9"], id="k26-eagle3-on-0.5.9"),
]

VENVS = {
    "main": ("sglang==0.5.23", "compressed-tensors"),
    "ct081": ("sglang==0.5.23", "compressed-tensors==0.8.1"),  # --no-deps: 0.5.23 pins 0.18.0
    "v059": ("sglang==0.5.9", "compressed-tensors==0.10.0"),
}


@pytest.mark.parametrize("venv,overrides,expected", REFUSALS)
def test_preflight_refuses_before_launching(sglang_sim: SGLangSim, stage_ctx, venv: str,
                                            overrides: dict[str, Any],
                                            expected: list[str]) -> None:
    sim = sglang_sim
    python = sim.venv(venv, *VENVS[venv], no_deps=venv == "ct081")
    sd = sim.state_dir(f"refuse-{venv}-{len(os.listdir(sim.base))}-{time.monotonic_ns()}")
    stage = make("sglang_server", sim.server_params(sd, python=python, **overrides))
    ctx = stage_ctx("server", kind="sglang_server")
    t0 = time.monotonic()
    with pytest.raises(PreflightError) as err:
        stage.check(sim.connect(), ctx)
    message = err.value.render()
    for text in expected:
        assert text in message, message
    assert "before launching anything" in message
    assert time.monotonic() - t0 < 10
    assert_nothing_started(sim, sd)
    assert API_KEY not in message


def test_all_problems_are_reported_together(sglang_sim: SGLangSim, stage_ctx) -> None:
    sim = sglang_sim
    sd = sim.state_dir("many-problems")
    params = sim.server_params(
        sd, served_model_name="kimi:k2.6", attention_backend="trtllm_mla",
        speculative={"algorithm": "EAGLE", "num_draft_tokens": 4},
        extra_args=["--tp", "8", "--cuda-graph-max-bs=64", "--api-key", "sk-leak-123456"])
    with pytest.raises(PreflightError) as err:
        make("sglang_server", params).check(sim.connect(), stage_ctx("s", kind="sglang_server"))
    msg = err.value.render()
    assert "7 problems found before launching anything" in msg, msg
    for text in ("contains ':'", "inherits attention backend trtllm_mla",
                 "without speculative.num_steps", "EAGLE with an EAGLE-3 drafter",
                 "--cuda-graph-max-bs is not a flag", "extra_args sets --api-key",
                 "SGLang's own validation also refuses it (argparse): sglang serve: error: "
                 "ambiguous option: --cuda-graph-max-bs=64 could match"):
        assert text in msg
    assert_nothing_started(sim, sd)


def test_stand_in_fails_as_the_rule_predicts_when_preflight_is_off(sglang_sim: SGLangSim,
                                                                  stage_ctx,
                                                                  converge) -> None:
    """The removed-flag rule is right: launched anyway, SGLang stops at argument parsing."""
    sim = sglang_sim
    sd = sim.state_dir("preflight-off")
    params = sim.server_params(sd, extra_args=["--cuda-graph-max-bs", "64"], preflight="off",
                               verify_window=2)
    with pytest.raises(StageError) as err:
        converge(make("sglang_server", params), sim.connect(),
                 stage_ctx("server", kind="sglang_server"))
    msg = err.value.render()
    assert "exited right after its start (exit code 2)" in msg
    assert "ambiguous option: --cuda-graph-max-bs could match" in msg
    assert API_KEY not in msg


def test_dry_run_runs_preflight_and_changes_nothing(sglang_sim: SGLangSim, stage_ctx) -> None:
    sim = sglang_sim
    host = sim.connect()
    sd = sim.state_dir("dry")
    ctx = stage_ctx("server", kind="sglang_server")
    ctx.dry_run = True
    verdict = make("sglang_server", sim.server_params(sd)).check(host, ctx)
    assert isinstance(verdict, Needed) and verdict.reason == "not running"
    bad = sim.server_params(sd, attention_backend="fa3")
    with pytest.raises(PreflightError, match="fa3 needs sm_90"):
        make("sglang_server", bad).check(host, ctx)
    # before the venv exists (a fresh host), the dry run says so instead of failing
    fresh = sim.server_params(sd, python=str(sim.base / "venvs" / "not-yet" / "bin" / "python"))
    verdict = make("sglang_server", fresh).check(host, ctx)
    assert isinstance(verdict, Needed) and "preflight deferred" in verdict.reason
    assert not Path(sd).exists()  # nothing written
    assert_nothing_started(sim, sd)


def test_crash_at_start_is_reported_with_the_log_tail(sglang_sim: SGLangSim, stage_ctx,
                                                      converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("cuda999")
    sim.fleet.fault("gpu-1", "uvm-cgroup")
    try:
        with pytest.raises(StageError) as err:
            converge(make("sglang_server", sim.server_params(sd, verify_window=3)),
                     sim.connect(), stage_ctx("server", kind="sglang_server"))
    finally:
        sim.fleet.fault("gpu-1", "uvm-cgroup", on=False)
    msg = err.value.render()
    assert "exited right after its start (exit code 1)" in msg
    assert "CUDA unknown error" in msg and "server.log" in msg
    assert sim.server_pids() == []


def test_stale_server_on_the_port(sglang_sim: SGLangSim, stage_ctx, converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("stale")
    host = sim.connect()
    stale = sim.fleet.fault("gpu-1", "stale-server")
    try:
        with pytest.raises(StageError) as err:
            make("sglang_server", sim.server_params(sd)).check(
                host, stage_ctx("server", kind="sglang_server"))
        msg = err.value.render()
        assert f"a process not started by us (pid {stale['pid']}, cmdline " in msg
        assert "sglang.launch_server" in msg and f"holds {sim.address}:{sim.port}" in msg
        assert "MiB on 8 GPU(s)" in msg and "stop_stale: true" in msg
        assert pid_alive(stale["pid"])

        ctx = stage_ctx("server", kind="sglang_server")
        status, reason = converge(make("sglang_server", sim.server_params(sd, stop_stale=True)),
                                  host, ctx)
        assert status == "changed"
        assert "it will be stopped (stop_stale)" in reason
        assert "GPU memory held by other processes" in reason
        assert ctx.facts["stopped_stale"]["pid"] == stale["pid"]
        assert not pid_alive(stale["pid"])
        assert wait_for(lambda: health(sim) == 200, timeout=15), Path(sd, "server.log").read_text()
        assert sim.server_pids() == [ctx.facts["pid"]]
    finally:
        sim.fleet.fault("gpu-1", "stale-server", on=False)


def test_restart_on_failure_brings_a_killed_server_back(sglang_sim: SGLangSim, stage_ctx,
                                                        converge) -> None:
    sim = sglang_sim
    sd = sim.state_dir("restart")
    host = sim.connect()
    params = sim.server_params(sd)  # restart on failure is on by default
    status, _ = converge(make("sglang_server", params), host, stage_ctx("s", kind="sglang_server"))
    assert status == "changed"
    spec = json.loads(Path(sd, "launch.json").read_text())
    assert spec["restart"] == {"max": 5, "window_s": 300, "backoff_s": 1, "backoff_max_s": 30}
    first = json.loads(Path(sd, "server.pid").read_text())
    assert wait_for(lambda: health(sim) == 200, timeout=15)
    os.kill(first["pid"], 9)
    assert wait_for(lambda: json.loads(Path(sd, "server.pid").read_text()).get("restarts") == 1,
                    timeout=15)
    second = json.loads(Path(sd, "server.pid").read_text())
    assert second["pid"] != first["pid"] and pid_alive(second["pid"])
    assert wait_for(lambda: health(sim) == 200, timeout=15), Path(sd, "server.log").read_text()
    verdict = make("sglang_server", params).check(host, stage_ctx("s", kind="sglang_server"))
    assert isinstance(verdict, Converged), verdict  # the new pid, same fingerprint: ours
    assert (f"pid {second['pid']}, restarted 1x by its supervisor (last exit: killed by "
            "signal 9 (SIGKILL))") in verdict.reason
    # without it the fingerprint differs (the restart policy is part of it)
    plain = make("sglang_server", sim.server_params(sd, restart_on_failure=False)).check(
        host, stage_ctx("s"))
    assert isinstance(plain, Needed) and "restart on failure" in plain.reason


def test_a_crash_loop_stops_at_the_limit_and_status_names_the_cause(
        sglang_sim: SGLangSim, stage_ctx, converge, tmp_path: Path) -> None:
    sim = sglang_sim
    sd = sim.state_dir("crashloop")
    host = sim.connect()
    crash = "CUDA error: an illegal memory access was encountered"
    params = sim.server_params(sd, env={"SGLANG_SIM_CRASH": crash},
                               restart_on_failure={"max": 2, "window": "60s",
                                                   "backoff": "0.2s", "backoff_max": "0.4s"})
    with pytest.raises(StageError):  # verify sees it die
        converge(make("sglang_server", params), host, stage_ctx("s", kind="sglang_server"))
    exit_file = Path(sd, "server.exit")
    assert wait_for(lambda: exit_file.exists() and json.loads(exit_file.read_text())
                    .get("gave_up"), timeout=30), Path(sd, "server.log").read_text()
    rec = json.loads(exit_file.read_text())
    assert rec["restarts"] == 2 and rec["cause"] == f"RuntimeError: {crash}"
    assert [e["cause"] for e in rec["exits"]] == [f"RuntimeError: {crash}"] * 3
    r = cli("status", "-i", str(sim.fleet.inventory_path), "--limit", "gpu-1", "--state-dir",
            sd, runs=tmp_path / "runs")
    assert r.code == 1
    assert "gave up after 2 restart(s)" in r.stdout and crash in r.stdout, r.stdout
