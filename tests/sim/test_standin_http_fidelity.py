"""The SGLang stand-in's HTTP surface per release, against the real source (file:line in the
stand-in's comments): /ready and its auth exemption, the accept length of /server_info (decode-log
interval, cumulative, reset by /flush_cache), per-request speculation fields of /generate and the
OpenAI API, info routes, the launch and bench entrypoints' warnings.

One server per release and module (time scaled by 1/1000); other releases are pip-installed
from the simulated index into PYTHONPATH overlays. Raw HTTP (urllib) and the `openai` client.
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.sglang.benchmark import result_keys
from tests.sglang.simhost import K2_CONFIG
from tests.sim.conftest_index import Venv, clean_env
from tests.sim.test_sglang_standin import (
    API_KEY,
    DRAFTER_CONFIG,
    K26_CONFIG,
    Launcher,
    Server,
    _model,
)

SERVED = "kimi-k2.6"
DECODE_LINE = re.compile(
    r"Decode batch, #running-req: \d+, #token: \d+, token usage: \d+\.\d\d, "
    r"accept len: (\d+\.\d\d), accept rate: (\d+\.\d\d), cuda graph: (True|False), "
    r"gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$"
)
ENTRYPOINT_WARNING = ("UserWarning: 'python -m sglang.launch_server' is still supported, but "
                      "'sglang serve' is the recommended entrypoint.")
SHIM_WARNING = ("FutureWarning: `sglang.bench_serving` is deprecated and will be removed in a "
                "future release; use `sglang.benchmark.serving` instead (e.g. `python -m "
                "sglang.benchmark.serving`).")
SPEC_DETAIL_KEYS = {
    "spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
    "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
    "spec_correct_drafts_histogram", "spec_cap_lens_histogram",
}


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def launcher(standin_venv: Venv, simhw_double: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launch = Launcher(standin_venv, simhw_double, tmp_path_factory.mktemp("fidelity"))
    try:
        yield launch
    finally:
        launch.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {"k26": _model(root, "kimi-k2.6", K26_CONFIG), "k2": _model(root, "kimi-k2", K2_CONFIG),
            "drafter": _model(root, "kimi-k2.6-eagle3", DRAFTER_CONFIG)}


@pytest.fixture(scope="module")
def release(standin_venv: Venv, tmp_path_factory: pytest.TempPathFactory):
    """release("0.5.19") -> the PYTHONPATH overlays of that release ("0.5.23": the venv's own)."""
    root = tmp_path_factory.mktemp("releases")

    def overlay(version: str) -> tuple[Path, ...]:
        if version == "0.5.23":
            return ()
        return (standin_venv.target(f"sglang=={version}", root / version),)

    return overlay


def _spec_args(models: dict[str, str], target: str = "k26") -> list[str]:
    return ["--model-path", models[target], "--tp", "8", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", models["drafter"]]


@pytest.fixture(scope="module")
def servers(launcher: Launcher, models, release) -> Iterator[dict[str, Server]]:
    """Started lazily, once per module: servers["0.5.19"] etc."""
    configs = {
        # --api-key, EAGLE3, a small decode-log interval
        "0.5.23": [*_spec_args(models), "--api-key", API_KEY, "--served-model-name", SERVED,
                   "--decode-log-interval", "10"],
        # the default interval (40)
        "0.5.19": [*_spec_args(models), "--api-key", API_KEY, "--served-model-name", SERVED],
        "0.5.20": ["--model-path", models["k26"], "--tp", "8", "--api-key", API_KEY],
        "0.5.15": _spec_args(models),
        "0.5.9": _spec_args(models, "k2"),  # K2.6 + EAGLE3 needs >= 0.5.10
    }

    class Lazy(dict):
        def __missing__(self, version: str) -> Server:
            server = launcher.start(configs[version], overlays=release(version))
            server.wait_ready(key=API_KEY)
            self[version] = server
            return server

    lazy = Lazy()
    try:
        yield lazy
    finally:
        for server in lazy.values():
            if server.proc.poll() is None:
                server.stop()


def _call(server: Server, method: str, path: str, body=None, key: str | None = None,
          headers: dict | None = None) -> tuple[int, bytes]:
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if key:
        hdrs["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.base + path, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(server: Server, path: str, body: dict, key: str | None = API_KEY) -> dict:
    status, raw = _call(server, "POST", path, body, key=key)
    assert status == 200, raw
    return json.loads(raw)


def _stream(server: Server, path: str, body: dict, key: str | None = API_KEY) -> list:
    """The `data:` payloads of an SSE answer, [DONE] included."""
    status, raw = _call(server, "POST", path, {**body, "stream": True}, key=key)
    assert status == 200, raw
    return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
            for line in raw.decode().splitlines() if line.startswith("data: ")]


def _state(server: Server, key: str | None = API_KEY) -> dict:
    status, raw = _call(server, "GET", "/server_info", key=key)
    assert status == 200, raw
    return json.loads(raw)["internal_states"][0]


def _generate(server: Server, tokens: int, key: str | None = API_KEY, text: str = "hi") -> dict:
    return _post(server, "/generate", {"text": text, "sampling_params": {
        "max_new_tokens": tokens}}, key=key)["meta_info"]


def _decode_lines(server: Server) -> list[str]:
    return [line for line in server.text().splitlines() if "Decode batch" in line]


def _flush(server: Server, key: str | None = API_KEY) -> None:
    assert _call(server, "POST", "/flush_cache", {}, key=key)[0] == 200


# ----------------------------------------------------------------------------- /ready, auth


def test_ready_exists_and_skips_auth_only_from_0_5_20(servers, launcher, models, release) -> None:
    old, new = servers["0.5.19"], servers["0.5.20"]
    # 0.5.19: no /ready, and not exempt: 401 without the key, 404 with it
    assert _call(old, "GET", "/ready") == (401, b'{"error":"Unauthorized"}')
    assert _call(old, "GET", "/ready", key=API_KEY) == (404, b'{"detail":"Not Found"}')
    # 0.5.20: 200 with an empty body, with or without the key
    assert _call(new, "GET", "/ready") == (200, b"")
    assert _call(new, "GET", "/ready", key=API_KEY) == (200, b"")
    for server in (old, new):
        assert _call(server, "GET", "/health")[0] == 200  # /health* and /metrics* are exempt
        assert _call(server, "GET", "/metrics")[0] == 404  # exempt, but no --enable-metrics
        assert _call(server, "GET", "/health_generate")[0] == 200
        assert _call(server, "GET", "/v1/models")[0] == 401
        assert _call(server, "GET", "/v1/models", headers={"Authorization": f"bearer {API_KEY}"}
                     )[0] == 200  # "bearer" in any case
        assert _call(server, "GET", "/v1/models", headers={"Authorization": API_KEY})[0] == 401
        assert _call(server, "OPTIONS", "/v1/models")[0] == 405  # OPTIONS passes auth
        assert _call(server, "GET", "/no_such_route") == (401, b'{"error":"Unauthorized"}')

    # /ready answers 503 (empty) while warming up, then 200
    server = launcher.start(["--model-path", models["k26"], "--tp", "8"],
                            overlays=release("0.5.20"), SGLANG_SIM_WARMUP_SECONDS="1500")
    seen: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while not seen or seen[-1][0] != 200:
        assert time.monotonic() < deadline and server.proc.poll() is None, server.text()
        try:
            seen.append(_call(server, "GET", "/ready"))
        except urllib.error.URLError:
            pass
        time.sleep(0.02)
    assert (503, b"") in seen and seen[-1] == (200, b"")
    assert server.stop() == 0


# ----------------------------------------------------------------------------- accept length


def test_accept_length_waits_for_the_40th_decode_batch(servers) -> None:
    server = servers["0.5.19"]  # default --decode-log-interval 40
    state = _state(server)
    # the warm-up's few decode steps count, but 40 are not reached yet: no key, no decode log
    assert "avg_spec_accept_length" not in state and not _decode_lines(server)
    assert "last_gen_throughput" in state
    steps = before = 0
    while not _decode_lines(server):
        before = steps
        steps += _generate(server, 25)["spec_verify_ct"]
        if not _decode_lines(server):
            assert "avg_spec_accept_length" not in _state(server)
    # the warm-up (8 tokens: 1 to 7 decode steps) counts: the log came at the 40th batch
    assert before + 1 < 40 <= steps + 7
    accept = _state(server)["avg_spec_accept_length"]
    assert 2.3 <= accept <= 2.7  # ~2.61 per verify step, less where a request ends
    line = _decode_lines(server)[0]
    match = DECODE_LINE.search(line)
    assert match, line
    assert float(match.group(1)) == pytest.approx(accept, abs=0.005)
    # 0.5.12+ accept rate: correct drafts / (steps x (num_draft_tokens - 1))
    assert float(match.group(2)) == pytest.approx((accept - 1) / 3, abs=0.01)
    info = json.loads(_call(server, "GET", "/server_info", key=API_KEY)[1])
    assert "launch_command" not in info and "last_gen_throughput" not in info  # < 0.5.20
    assert "avg_spec_accept_length" not in info and info["version"] == "0.5.19"


def test_accept_length_is_cumulative_at_decode_logs_and_reset_by_flush(servers) -> None:
    server = servers["0.5.23"]  # --decode-log-interval 10
    assert _call(server, "POST", "/flush_cache", {})[0] == 401  # admin-optional: the api key
    _flush(server)
    assert "avg_spec_accept_length" not in _state(server)
    logs = len(_decode_lines(server))
    steps = 0
    while len(_decode_lines(server)) == logs:
        assert "avg_spec_accept_length" not in _state(server)
        steps += _generate(server, 7)["spec_verify_ct"]
    assert steps >= 10
    first = _state(server)["avg_spec_accept_length"]
    # 7-token requests: 1 prefill token + 3 verify steps of 2, 3 and (clipped) 1 tokens
    assert first == pytest.approx(2.0)
    assert float(DECODE_LINE.search(_decode_lines(server)[-1]).group(1)) == pytest.approx(first)
    # requests that end before the next decode log do not move it: it is summed only there
    logs = len(_decode_lines(server))
    while steps + 3 < 20:
        steps += _generate(server, 7)["spec_verify_ct"]
        if len(_decode_lines(server)) == logs:
            assert _state(server)["avg_spec_accept_length"] == first
    # cumulative over every decode log since the flush
    while len(_decode_lines(server)) < logs + 3:
        _generate(server, 60)
    windows = [float(DECODE_LINE.search(line).group(1))
               for line in _decode_lines(server)[logs - 1:]]
    assert _state(server)["avg_spec_accept_length"] == pytest.approx(
        sum(windows) / len(windows), abs=0.01)
    # /flush_cache resets the totals: the key is gone until the next decode log
    _flush(server)
    assert "avg_spec_accept_length" not in _state(server)
    assert "Cache flushed successfully!" in server.text()


def test_flush_cache_refuses_while_a_request_runs(servers) -> None:
    server = servers["0.5.23"]
    body = json.dumps({"text": "long", "stream": True,
                       "sampling_params": {"max_new_tokens": 8000}}).encode()
    req = urllib.request.Request(server.base + "/generate", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.readline().startswith(b"data: ")  # running now
        assert _call(server, "POST", "/flush_cache", {}, key=API_KEY) == (
            400, b"Flush cache failed.\n")
        resp.read()
    assert "Cache not flushed because there are pending requests." in server.text()
    _flush(server)


# ----------------------------------------------------------------------------- per request


def _check_spec(meta: dict, num_draft_tokens: int = 4) -> None:
    verify = meta["spec_verify_ct"]
    assert verify >= 1
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / verify)
    assert 2.0 <= meta["spec_accept_length"] <= 3.0


def test_generate_meta_info_per_release(servers) -> None:
    meta = _generate(servers["0.5.23"], 120)
    _check_spec(meta)
    assert meta["completion_tokens"] == 120
    correct = meta["spec_num_correct_drafts"]
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 3
    assert meta["spec_accept_rate"] == pytest.approx(correct / meta["spec_num_proposed_drafts"])
    histogram = meta["spec_correct_drafts_histogram"]
    assert sum(histogram) == meta["spec_verify_ct"]
    assert sum(k * n for k, n in enumerate(histogram)) == correct
    # one verify step per decode step: every token but the prefill's comes from one
    assert correct + meta["spec_verify_ct"] == 120 - 1
    assert not {"spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"} & set(meta)

    meta = _generate(servers["0.5.19"], 50)  # 0.5.12-0.5.20: with the aliases
    _check_spec(meta)
    assert meta["spec_accepted_drafts"] == meta["spec_num_correct_drafts"]
    assert meta["spec_proposed_drafts"] == meta["spec_num_proposed_drafts"]
    assert meta["spec_accept_histogram"] == meta["spec_correct_drafts_histogram"]

    meta = _generate(servers["0.5.9"], 50, key=None)  # 0.5.9/0.5.10's names
    _check_spec(meta)
    assert {"spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram",
            "spec_accept_rate"} <= set(meta)
    assert "spec_num_correct_drafts" not in meta
    assert meta["spec_draft_token_num"] == meta["spec_verify_ct"] * 3

    # a request that never verified (1 token, from the prefill) has no speculation fields
    assert not [k for k in _generate(servers["0.5.23"], 1) if k.startswith("spec_")]
    # streaming: only the final chunk carries them
    chunks = _stream(servers["0.5.23"], "/generate", {"text": "s", "sampling_params": {
        "max_new_tokens": 30}})
    assert chunks[-1] == "[DONE]"
    metas = [c["meta_info"] for c in chunks[:-1]]
    assert metas[-1]["finish_reason"] == {"type": "length", "length": 30}
    _check_spec(metas[-1])
    assert not [m for m in metas[:-1] if "spec_verify_ct" in m]


def test_openai_spec_tokens_details_from_0_5_19(servers) -> None:
    chat = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
            "return_spec_tokens_details": True}
    for version in ("0.5.23", "0.5.19"):
        reply = _post(servers[version], "/v1/chat/completions", chat)
        details = reply["sglext"]["spec_tokens_details"]  # response level, an object for n=1
        assert set(details) == SPEC_DETAIL_KEYS
        assert details["spec_accept_length"] == pytest.approx(
            reply["usage"]["completion_tokens"] / details["spec_verify_ct"])
        assert "meta_info" not in reply["choices"][0]
    # streaming: one more chunk with choices [] and sglext, after the finish chunk, before usage
    chunks = _stream(servers["0.5.23"], "/v1/chat/completions",
                     {**chat, "stream_options": {"include_usage": True}})
    finish, extra, usage, done = chunks[-4:]
    assert finish["choices"][0]["finish_reason"] == "length" and done == "[DONE]"
    assert extra["choices"] == [] and set(extra["sglext"]["spec_tokens_details"]) == \
        SPEC_DETAIL_KEYS
    assert usage["usage"]["completion_tokens"] == 40 and "sglext" not in usage
    reply = _post(servers["0.5.23"], "/v1/completions", {
        "model": SERVED, "prompt": "x", "max_tokens": 20, "return_spec_tokens_details": True})
    assert reply["sglext"]["spec_tokens_details"]["spec_verify_ct"] >= 1
    # the real client: the extension rides in model_extra
    import openai  # here, not at the top: its import costs every worker ~0.5 s

    client = openai.OpenAI(base_url=servers["0.5.23"].base + "/v1", api_key=API_KEY,
                           max_retries=0)
    reply = client.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=30,
        extra_body={"return_spec_tokens_details": True})
    assert reply.model_extra["sglext"]["spec_tokens_details"]["spec_accept_length"] > 2
    # not asked, or 0.5.15 (an unknown field, ignored like pydantic's extra="ignore"): no sglext
    assert "sglext" not in _post(servers["0.5.23"], "/v1/chat/completions",
                                 {**chat, "return_spec_tokens_details": False})
    assert "sglext" not in _post(servers["0.5.15"], "/v1/chat/completions", chat, key=None)


def test_openai_return_meta_info_from_0_5_15(servers) -> None:
    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30,
            "return_meta_info": True}
    for version, key in (("0.5.23", API_KEY), ("0.5.15", None)):
        reply = _post(servers[version], "/v1/chat/completions", chat, key=key)
        meta = reply["choices"][0]["meta_info"]
        _check_spec(meta)
        assert meta["completion_tokens"] == reply["usage"]["completion_tokens"] == 30
        status, raw = _call(servers[version], "POST", "/v1/chat/completions",
                            {**chat, "stream": True}, key=key)
        assert status == 400
        assert json.loads(raw) == {
            "object": "error", "type": "BadRequest", "param": None, "code": 400,
            "message": "return_meta_info is not supported with streaming. Please set "
                       "stream=false when using return_meta_info=true."}
    # 0.5.9 does not know the field: ignored, streaming too
    assert "meta_info" not in _post(servers["0.5.9"], "/v1/chat/completions", chat,
                                    key=None)["choices"][0]
    assert _stream(servers["0.5.9"], "/v1/chat/completions", chat, key=None)[-1] == "[DONE]"


# ----------------------------------------------------------------------------- info routes


def test_info_routes_per_release(servers, models) -> None:
    new, old = servers["0.5.23"], servers["0.5.19"]
    info = json.loads(_call(new, "GET", "/model_info", key=API_KEY)[1])
    assert info["served_model_name"] == SERVED and info["disaggregation_mode"] == "null"
    assert {"load_format", "reasoning_parser", "tool_call_parser"} <= set(info)
    info = json.loads(_call(old, "GET", "/model_info", key=API_KEY)[1])
    assert info["served_model_name"] == SERVED and "disaggregation_mode" not in info
    info = json.loads(_call(servers["0.5.15"], "GET", "/model_info")[1])
    assert not {"served_model_name", "load_format", "tool_call_parser"} & set(info)
    assert info["architectures"] == ["KimiK25ForConditionalGeneration"]

    info = json.loads(_call(servers["0.5.20"], "GET", "/server_info", key=API_KEY)[1])
    assert info["launch_command"].startswith("--model-path " + models["k26"] + " --tp 8")
    assert "startup_time" in info and "launch_command" not in info["internal_states"][0]
    assert "avg_spec_accept_length" not in info["internal_states"][0]  # no speculation
    info = json.loads(_call(new, "GET", "/server_info", key=API_KEY)[1])
    assert info["frontend"] == "python" and "--decode-log-interval 10" in info["launch_command"]

    # deprecated aliases answer and log, in every release
    for server, key in ((new, API_KEY), (servers["0.5.9"], None)):
        for route in ("server_info", "model_info"):
            status, raw = _call(server, "GET", f"/get_{route}", key=key)
            assert status == 200 and json.loads(raw)["model_path"]
            assert (f"Endpoint '/get_{route}' is deprecated and will be removed in a future "
                    f"version. Please use '/{route}' instead.") in server.text()

    cards = json.loads(_call(new, "GET", "/v1/models", key=API_KEY)[1])
    assert cards["object"] == "list"
    (card,) = cards["data"]
    assert {k: card[k] for k in ("id", "root", "owned_by", "parent", "max_model_len")} == {
        "id": SERVED, "root": SERVED, "owned_by": "sglang", "parent": None,
        "max_model_len": 262144}
    (card,) = json.loads(_call(servers["0.5.15"], "GET", "/v1/models")[1])["data"]
    assert card["id"] == card["root"] == models["k26"]  # served_model_name = model path
    status, raw = _call(new, "GET", "/v1/models/other", key=API_KEY)
    assert status == 404 and json.loads(raw)["error"]["code"] == "model_not_found"
    assert _call(new, "GET", f"/v1/models/{SERVED}", key=API_KEY)[0] == 200


# ----------------------------------------------------------------------------- entrypoints


def test_launch_server_warns_from_0_5_10(servers) -> None:
    assert "UserWarning" not in servers["0.5.9"].text()
    for version, line in (("0.5.15", 51), ("0.5.23", 71)):
        lines = servers[version].text().splitlines()
        assert lines[0].endswith(f"/sglang/launch_server.py:{line}: {ENTRYPOINT_WARNING}")
        assert lines[1:3] == ["  Example: sglang serve --model-path <model> [options]",
                              "  warnings.warn("]


def _bench(launcher: Launcher, server: Server, module: str, overlays=(), flush: bool = False,
           output_len: int = 60, out: Path | None = None,
           **env: str) -> subprocess.CompletedProcess:
    args = [str(launcher.venv.python), "-m", module, "--backend", "sglang", "--base-url",
            server.base, "--dataset-name", "random-ids", "--num-prompts", "2",
            "--random-input-len", "8", "--random-output-len", str(output_len),
            "--random-range-ratio", "1", "--warmup-requests", "0"]
    if flush:
        args.append("--flush-cache")
    if out is not None:
        args += ["--output-file", str(out)]
    pythonpath = ":".join(str(p) for p in overlays)
    # without --output-file SGLang appends to a file named from the flags in the working
    # directory (0.5.9 bench_serving.py:2723-2735): a temporary one here
    return subprocess.run(args, env=clean_env(PYTHONPATH=pythonpath, **env),
                          capture_output=True, text=True, timeout=60, cwd=launcher.tmp)


def _result_line(path: Path) -> dict:
    """The last line SGLang appended, read as SGLang's json writes it (Infinity, NaN)."""
    return json.loads(path.read_text().splitlines()[-1])


def test_bench_module_and_accept_length_per_release(servers, launcher, release) -> None:
    server = servers["0.5.23"]  # interval 10
    # 0.5.15+: sglang.benchmark.serving is the implementation, sglang.bench_serving a shim
    proc = _bench(launcher, server, "sglang.benchmark.serving", flush=True, output_len=4,
                  OPENAI_API_KEY=API_KEY)
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr
    assert re.search(r"^Successful requests:\s+2\s*$", proc.stdout, re.M)
    assert "Accept length:" not in proc.stdout  # flushed, then < 10 decode batches: no value
    out = launcher.tmp / "bench-0.5.23.jsonl"
    proc = _bench(launcher, server, "sglang.bench_serving", out=out, OPENAI_API_KEY=API_KEY)
    assert proc.returncode == 0, proc.stderr
    assert f"/sglang/bench_serving.py:13: {SHIM_WARNING}" in proc.stderr
    match = re.search(r"^Accept length:\s+([\d.]+)", proc.stdout, re.M)
    assert match and 2.3 <= float(match.group(1)) <= 2.8, proc.stdout
    # the result line: 0.5.23's keys in its order, the figures the block printed rounded
    line = _result_line(out)
    assert set(line) == set(result_keys("0.5.23")) and len(line) == 49
    assert line["request_rate"] == float("inf") and line["completed"] == 2
    assert f"{line['accept_length']:.2f}" == match.group(1)
    assert line["server_info"]["version"] == "0.5.23"
    assert re.search(rf"^Median TPOT \(ms\):\s+{line['median_tpot_ms']:.2f}", proc.stdout, re.M)
    assert float(match.group(1)) == pytest.approx(_state(server)["avg_spec_accept_length"],
                                                  abs=0.005)
    # API_KEY is sent without "Bearer": every request gets 401
    proc = _bench(launcher, server, "sglang.bench_serving", API_KEY=API_KEY)
    assert proc.returncode == 1 and "Accept length:" not in proc.stdout

    # 0.5.9: bench_serving is the implementation and reads the deprecated /get_server_info
    old = servers["0.5.9"]
    overlays = release("0.5.9")
    out = launcher.tmp / "bench-0.5.9.jsonl"
    proc = _bench(launcher, old, "sglang.bench_serving", overlays, output_len=120, out=out)
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr
    assert tuple(_result_line(out)) == result_keys("0.5.9")  # 43 keys, in 0.5.9's order
    assert re.search(r"^Accept length:\s+2\.[4-7]\d", proc.stdout, re.M), proc.stdout
    assert "Endpoint '/get_server_info' is deprecated" in old.text()
    proc = _bench(launcher, old, "sglang.benchmark.serving", overlays)
    assert proc.returncode == 1
    assert "No module named 'sglang.benchmark'" in proc.stderr


def test_decode_log_lines_per_release(servers) -> None:
    """0.5.9's accept rate is accepted-with-bonus / (steps x num_draft_tokens)."""
    server = servers["0.5.9"]
    while not _decode_lines(server):
        _generate(server, 60, key=None)
    for line in _decode_lines(server):
        match = DECODE_LINE.search(line)
        assert match, line
        assert float(match.group(2)) == pytest.approx(float(match.group(1)) / 4, abs=0.01)


def test_concurrent_flushes_are_each_answered(servers) -> None:
    """Flushes run on the scheduler thread between batches; each caller gets its answer."""
    server = servers["0.5.15"]
    results: list[int] = []

    def flush() -> None:
        results.append(_call(server, "POST", "/flush_cache", {})[0])

    threads = [threading.Thread(target=flush) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == [200] * 4
