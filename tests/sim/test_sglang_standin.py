"""The SGLang stand-in, pip-installed from the simulated index into a real venv and run as
`python -m sglang.launch_server` with a test double of `simhw` on PYTHONPATH.

Real clients only: raw HTTP (urllib) and the `openai` package. Time is scaled by 1/1000.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator_sim.hubrepos import eagle3_config
from tests.sglang.simhost import K2_CONFIG
from tests.sim.conftest_index import Venv, clean_env

API_KEY = "sk-sim-test-key"
DECODE_LINE = re.compile(  # 0.5.23 managers/scheduler_components/metrics_reporter.py:963-1043
    r"Decode batch, #running-req: \d+, #token: \d+, token usage: \d+\.\d\d, "
    r"accept len: \d+\.\d\d, accept rate: \d+\.\d\d, cuda graph: (True|False), "
    r"gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$"
)
K26_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 7168,
        "vocab_size": 163840,
        "num_hidden_layers": 61,
        "max_position_embeddings": 262144,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"format": "nvfp4-pack-quantized"}},
        },
    },
}
DRAFTER_CONFIG = eagle3_config()  # FACTS.md: the lightseekorg/kimi-k2.6-eagle3 family


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(root: Path, name: str, config: dict) -> str:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {
        "k26": _model(root, "kimi-k2.6", K26_CONFIG),
        "k2": _model(root, "kimi-k2", K2_CONFIG),
        "drafter": _model(root, "kimi-k2.6-eagle3", DRAFTER_CONFIG),
        "drafter_2layer": _model(root, "eagle3-2layer", {**DRAFTER_CONFIG, "num_hidden_layers": 2}),
        "drafter_small": _model(root, "eagle3-4096", {**DRAFTER_CONFIG, "hidden_size": 4096}),
        "no_config": str(root / "empty"),
    }


class Launcher:
    """Runs the stand-in from the venv; cleans up every process it started."""

    def __init__(self, venv: Venv, simhw: Path, tmp: Path) -> None:
        self.venv = venv
        self.simhw = simhw
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def env(self, overlays: tuple[Path, ...] = (), simhw: bool = True, **extra: str) -> dict:
        paths = [str(p) for p in overlays] + ([str(self.simhw)] if simhw else [])
        values = {
            "PYTHONPATH": os.pathsep.join(paths),
            "SIMHW_TEST_STATE": str(self.tmp / "gpu-state.json"),
            "SGLANG_SIM_WARMUP_SECONDS": "0",
        }
        values.update(extra)
        return clean_env(**values)

    def run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        """Run to completion (for start-up failures); stdout+stderr merged."""
        return subprocess.run(
            [str(self.venv.python), "-m", "sglang.launch_server", *args],
            env=self.env(**kw), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=60,
        )

    def start(self, args: list[str], **kw) -> Server:
        port = _free_port()
        log = self.tmp / f"server-{port}.log"
        fh = log.open("w")
        proc = subprocess.Popen(
            [str(self.venv.python), "-m", "sglang.launch_server", *args, "--port", str(port)],
            env=self.env(**kw), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
        fh.close()
        self.procs.append(proc)
        return Server(proc, port, log)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def gpu_state(self) -> dict:
        path = self.tmp / "gpu-state.json"
        return json.loads(path.read_text()) if path.exists() else {}


class Server:
    """One running stand-in."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.base = f"http://127.0.0.1:{port}"

    def text(self) -> str:
        return self.log.read_text()

    def get(self, path: str, key: str | None = None, body: dict | None = None):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout: float = 30.0, key: str | None = None) -> list[int]:
        """Poll /health until 200; return the statuses seen (connection refused = 0)."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.text()}")
            try:
                status, _ = self.get("/health", key)
            except (urllib.error.URLError, ConnectionError):
                status = 0
            seen.append(status)
            if status == 200:
                return seen
            time.sleep(0.02)
        raise AssertionError(f"not ready after {timeout}s; statuses {seen[-5:]}:\n{self.text()}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


@pytest.fixture
def launcher(standin_venv: Venv, simhw_double: Path, tmp_path: Path) -> Iterator[Launcher]:
    launch = Launcher(standin_venv, simhw_double, tmp_path)
    try:
        yield launch
    finally:
        launch.close()


@pytest.fixture(scope="module")
def overlays(standin_venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Other releases, pip-installed from the index into PYTHONPATH overlay folders."""
    root = tmp_path_factory.mktemp("overlays")
    return {
        "sglang059": standin_venv.target("sglang==0.5.9", root / "sglang059"),
        "ct081": standin_venv.target("compressed-tensors==0.8.1", root / "ct081"),
    }


def _eagle3(models: dict[str, str], drafter: str = "drafter") -> list[str]:
    return ["--model-path", models["k26"], "--tp", "8", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", models[drafter]]


# ----------------------------------------------------------------------------- happy path


def test_serves_like_sglang_from_load_to_shutdown(launcher: Launcher, models) -> None:
    server = launcher.start(
        [*_eagle3(models), "--api-key", API_KEY, "--enable-metrics",
         "--served-model-name", "kimi-k2.6", "--trust-remote-code"],
        SIMHW_TEST_LOAD_SECONDS="1500",  # 1.5 s of real time at scale 1/1000
        SGLANG_SIM_WARMUP_SECONDS="800",
    )
    # while the weights load the port is closed
    deadline = time.monotonic() + 20
    while "Load weight begin" not in server.text():
        assert time.monotonic() < deadline and server.proc.poll() is None, server.text()
        time.sleep(0.02)
    with pytest.raises(urllib.error.URLError) as refused:
        server.get("/health")
    assert isinstance(refused.value.reason, ConnectionRefusedError)
    pid = str(server.proc.pid)
    # the release's default static fraction: (97887 - 16384 reserved MiB) / 97887 = 0.833 at
    # tp 8 for an MLA model (arg_groups/memory_hook.py:282-345 and :359-400 (0.5.23))
    assert launcher.gpu_state()[pid] == {"mib": int(97887 * 0.833), "gpus": list(range(8))}

    seen = server.wait_ready()
    assert 0 in seen and 503 in seen and seen[-1] == 200
    assert seen.index(503) > seen.index(0)  # closed, then warming up (503), then ready
    log = server.text()
    assert log.index("Load weight end") < log.index("Uvicorn running on")
    assert log.index("Uvicorn running on") < log.index("The server is fired up and ready to roll!")

    # --api-key: everything but /health*, /metrics* and (0.5.20+) /ready needs the bearer token
    assert server.get("/health_generate")[0] == 200
    assert server.get("/metrics")[0] == 200
    assert server.get("/v1/models") == (401, b'{"error":"Unauthorized"}')  # ORJSONResponse
    assert server.get("/v1/models", key="wrong")[0] == 401
    status, body = server.get("/v1/models", key=API_KEY)
    card = json.loads(body)["data"][0]
    assert status == 200
    assert card["id"] == "kimi-k2.6" and card["owned_by"] == "sglang"
    assert card["max_model_len"] == 262144
    status, body = server.get("/model_info", key=API_KEY)
    info = json.loads(body)
    assert info["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert info["model_path"] == models["k26"] and info["is_generation"] is True
    assert server.get("/ready", key=API_KEY)[0] == 200  # 0.5.23 has /ready

    import openai  # here, not at the top: its import costs every worker ~0.5 s

    client = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)
    reply = client.chat.completions.create(
        model="kimi-k2.6", messages=[{"role": "user", "content": "Say hello"}], max_tokens=200)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 200
    assert len(reply.choices[0].message.content.split()) == 200
    stream = client.chat.completions.create(
        model="kimi-k2.6", messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=120, stream=True, stream_options={"include_usage": True})
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert finish == "length" and usage.completion_tokens == 120
    assert len("".join(pieces).split()) == 120
    completion = client.completions.create(model="kimi-k2.6", prompt="Once upon", max_tokens=7)
    assert completion.usage.completion_tokens == 7 and completion.choices[0].text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base + "/v1", api_key="nope", max_retries=0).models.list()

    status, body = server.get("/generate", key=API_KEY,
                              body={"text": "hi", "sampling_params": {"max_new_tokens": 5}})
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 5

    # speculation: a matched EAGLE-3 drafter accepts ~2.6 tokens per step
    status, body = server.get("/server_info", key=API_KEY)
    info = json.loads(body)
    assert info["version"] == "0.5.23" and info["tp_size"] == 8
    assert info["speculative_algorithm"] == "EAGLE3" and info["max_running_requests"] == 48
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == (3, 1, 4)
    accept = info["internal_states"][0]["avg_spec_accept_length"]
    assert 2.45 <= accept <= 2.65
    single = info["internal_states"][0]["last_gen_throughput"]
    assert 26.3 * 1.55 <= single <= 26.3 * 1.75  # 1.6-1.7x of 26.3 tok/s
    metrics = server.get("/metrics")[1].decode()
    assert re.search(r"^sglang:spec_accept_length\{.*\} 2\.[56]\d*$", metrics, re.M)
    # 0.5.12+: correct drafts / (steps x (num_draft_tokens - 1)) = (2.6 - 1) / 3
    assert re.search(r"^sglang:spec_accept_rate\{.*\} 0\.5\d*$", metrics, re.M)

    # the benchmark client reads the same figures (simulated clock, accept length)
    bench = subprocess.run(
        [str(launcher.venv.python), "-m", "sglang.bench_serving", "--backend", "sglang",
         "--base-url", server.base, "--dataset-name", "random-ids", "--num-prompts", "3",
         "--max-concurrency", "1", "--random-input-len", "16", "--random-output-len", "80",
         "--random-range-ratio", "1"],
        env=clean_env(OPENAI_API_KEY=API_KEY), capture_output=True, text=True, timeout=60,
        cwd=launcher.tmp,  # no --output-file: the result line goes to a file named there
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert re.search(r"^Successful requests:\s+3\s*$", bench.stdout, re.M)
    out_tps = float(re.search(r"^Output token throughput \(tok/s\):\s+([\d.]+)", bench.stdout,
                              re.M).group(1))
    assert 26.3 * 1.4 <= out_tps <= 26.3 * 1.75, bench.stdout
    assert re.search(r"^Accept length:\s+2\.[56]\d", bench.stdout, re.M), bench.stdout
    assert re.search(r"^Median ITL \(ms\):\s+[\d.]+", bench.stdout, re.M)

    decode = [line for line in server.text().splitlines() if "Decode batch" in line]
    assert decode and all(DECODE_LINE.search(line) for line in decode), decode

    # SIGTERM: graceful exit, GPU memory released
    assert server.stop() == 0
    assert pid not in launcher.gpu_state()
    assert "Finished server process" in server.text()


def test_eagle_with_an_eagle3_drafter_accepts_nothing(launcher: Launcher, models) -> None:
    args = _eagle3(models)
    args[args.index("EAGLE3")] = "EAGLE"
    server = launcher.start(args)
    server.wait_ready()
    status, body = server.get("/generate", body={"text": "x",
                                                 "sampling_params": {"max_new_tokens": 60}})
    assert status == 200
    info = json.loads(server.get("/server_info")[1])
    assert info["internal_states"][0]["avg_spec_accept_length"] == 1.0
    assert server.get("/ready")[0] == 200 and server.get("/metrics")[0] == 404  # no metrics flag
    assert server.stop() == 0


def test_aggregate_throughput_without_speculation(launcher: Launcher, models) -> None:
    # a coarser time scale so that 32 HTTP requests overlap: one decode step = 2 ms real, so
    # 1500 tokens keep each request decoding ~3 s, long enough for all 32 to arrive on a busy box
    server = launcher.start(["--model-path", models["k26"], "--tp-size", "8",
                             "--decode-log-interval", "10", "--disable-cuda-graph"],
                            SIMHW_TEST_TIME_SCALE="0.05", SIMHW_TEST_LOAD_SECONDS="1")
    server.wait_ready()

    def one(i: int) -> int:
        status, _ = server.get("/generate", body={"text": f"q{i}",
                                                  "sampling_params": {"max_new_tokens": 1500}})
        return status

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        assert set(pool.map(one, range(32))) == {200}
    lines = [line for line in server.text().splitlines() if "#running-req: 32," in line]
    assert lines, server.text()[-2000:]
    rate = max(float(re.search(r"gen throughput \(token/s\): ([\d.]+)", line).group(1))
               for line in lines)
    assert 780 <= rate <= 830  # ~807 tok/s aggregate at 32 concurrent (FACTS)
    # no speculation: no accept part in the line at all (scheduler_metrics_mixin.py 0.5.9:368-390)
    assert all("accept len" not in line and "cuda graph: False" in line for line in lines)
    assert server.stop() == 0


# ----------------------------------------------------------------------------- failures


def test_removed_and_prefix_flags_behave_like_argparse(launcher: Launcher, models,
                                                       overlays) -> None:
    proc = launcher.run(["--model-path", models["k26"], "--cuda-graph-max-bs", "8"])
    assert proc.returncode == 2
    # after the UserWarning of `python -m sglang.launch_server` (launch_server.py 0.5.23:71-77)
    assert proc.stdout.split("  warnings.warn(\n", 1)[-1].startswith("usage: ")
    assert ("error: ambiguous option: --cuda-graph-max-bs could match "
            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill") in proc.stdout
    proc = launcher.run(["--model-path", models["k26"], "--no-such-flag"])
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stdout
    # 0.5.9 still has the flag and a fixed list of algorithms
    old = (overlays["sglang059"],)
    proc = launcher.run(["--model-path", models["k26"], "--speculative-algorithm", "eagle3"],
                        overlays=old)
    assert proc.returncode == 2
    assert "argument --speculative-algorithm: invalid choice" in proc.stdout
    proc = launcher.run(["--model-path", models["k26"], "--speculative-algorithm", "MEDUSA"])
    assert proc.returncode == 1
    assert proc.stdout.rstrip().endswith("ValueError: Unknown speculative algorithm name: MEDUSA")
    proc = launcher.run(["--model-path", models["k26"], "--served-model-name", "kimi:k2"])
    assert ("AssertionError: served_model_name cannot contain a colon (':') character."
            in proc.stdout)
    proc = launcher.run(["--model-path", models["k26"], "--tp", "3", "--nnodes", "2",
                         "--dist-init-addr", "10.0.0.1:5000"])
    assert proc.stdout.rstrip().endswith("AssertionError: tp_size must be divisible by number "
                                         "of nodes")


def test_speculative_validation_rules(launcher: Launcher, models, overlays) -> None:
    proc = launcher.run([*_eagle3(models), "--speculative-eagle-topk", "1"])
    assert proc.returncode == 1
    assert proc.stdout.rstrip().splitlines()[-1] == "AssertionError"  # bare assert
    old = (overlays["sglang059"],)
    proc = launcher.run([*_eagle3(models), "--speculative-num-steps", "3",
                         "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"],
                        overlays=old, SGLANG_ENABLE_SPEC_V2="1")
    assert proc.stdout.rstrip().endswith(
        "ValueError: Spec v2 currently only supports topk = 1 for speculative decoding.")
    proc = launcher.run(_eagle3(models), overlays=old)  # K2.6 + EAGLE3 needs >= 0.5.10
    assert proc.returncode == 1
    assert proc.stdout.rstrip().endswith(  # after the load (models/kimi_k25.py:648 (0.5.9))
        "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute "
        "'set_eagle3_layers_to_capture'")
    assert "Loading safetensors checkpoint shards: 100% Completed" in proc.stdout
    proc = launcher.run(["--model-path", models["k2"], "--speculative-algorithm", "EAGLE3",
                         "--speculative-draft-model-path", models["drafter_2layer"]],
                        overlays=old)
    assert proc.stdout.rstrip().endswith("ValueError: EAGLE3 currently only supports 1 layer")
    proc = launcher.run(_eagle3(models, "drafter_small"))
    assert proc.stdout.rstrip().endswith(
        "AssertionError: Attempted to load weight (torch.Size([163840, 7168])) into parameter "
        "(torch.Size([163840, 4096]))")


def test_k2_eagle3_without_drafter_silently_drafts_with_the_target(launcher: Launcher,
                                                                   models) -> None:
    server = launcher.start(["--model-path", models["k2"], "--speculative-algorithm", "EAGLE3",
                             "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                             "--speculative-num-draft-tokens", "7"])
    server.wait_ready()
    # 40 tokens: with the warm-up's 7 decode steps, past the first decode log (interval 40)
    server.get("/generate", body={"text": "x", "sampling_params": {"max_new_tokens": 40}})
    info = json.loads(server.get("/server_info")[1])
    assert info["speculative_draft_model_path"] == models["k2"]
    assert info["speculative_num_draft_tokens"] == 3  # topk 1 forces steps + 1
    assert info["internal_states"][0]["avg_spec_accept_length"] == 1.0
    assert "speculative_num_draft_tokens is adjusted" in server.text()
    assert server.stop() == 0


def test_host_and_checkpoint_failures(launcher: Launcher, models, overlays) -> None:
    proc = launcher.run(["--model-path", models["k26"], "--tp", "8"],
                        overlays=(overlays["ct081"],))
    assert proc.returncode == 1
    assert proc.stdout.rstrip().splitlines()[-1].startswith(
        "AttributeError: nvfp4_pack_quantized")
    proc = launcher.run(["--model-path", models["k26"], "--tp", "8"], SIMHW_TEST_CUDA_INIT="999")
    assert "CUDA unknown error - this may be due to an incorrectly set up environment" \
        in proc.stdout
    assert re.search(r"^RuntimeError: CUDA error: .*\(999\)$", proc.stdout, re.M)
    proc = launcher.run(["--model-path", models["k26"], "--tp", "8"], simhw=False)
    assert "RuntimeError: Found no NVIDIA driver on your system" in proc.stdout
    proc = launcher.run(["--model-path", models["k26"], "--tp", "8"], SIMHW_TEST_GPUS="4")
    assert "RuntimeError: CUDA error: invalid device ordinal" in proc.stdout
    proc = launcher.run(["--model-path", models["k26"], "--tp", "8"],
                        SIMHW_TEST_FREE_MIB="2000")
    assert "torch.OutOfMemoryError: CUDA out of memory" in proc.stdout
    assert "occupied" in proc.stdout
    proc = launcher.run(["--model-path", models["k26"], "--attention-backend", "fa3"])
    assert proc.stdout.rstrip().endswith(
        "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
        "Please use `--attention-backend flashinfer`.")
    proc = launcher.run(["--model-path", models["k26"], "--attention-backend", "trtllm_mha"])
    # 0.5.23 accepts it on sm_120 at start; the registry refuses it for MLA after the load
    assert proc.stdout.rstrip().endswith(
        "ValueError: trtllm_mha backend can only be used with non-MLA models.")
    proc = launcher.run(["--model-path", models["no_config"]])
    assert f"OSError: Can't load the configuration of '{models['no_config']}'" in proc.stdout
    assert launcher.gpu_state() == {}  # every failed start gave its memory back


def test_busy_port_fails_after_loading(launcher: Launcher, models) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = launcher.run(["--model-path", models["k26"], "--port", str(port)])
    assert proc.returncode == 1
    out = proc.stdout
    assert out.index("Load weight end") < out.index("error while attempting to bind")
    assert f"('127.0.0.1', {port}): address already in use" in out
    assert launcher.gpu_state() == {}


def test_sigterm_while_loading_releases_the_gpus(launcher: Launcher, models) -> None:
    server = launcher.start(["--model-path", models["k26"], "--tp", "8"],
                            SIMHW_TEST_LOAD_SECONDS="60000")  # a minute of real time
    deadline = time.monotonic() + 20
    while "Load weight begin" not in server.text():
        assert time.monotonic() < deadline and server.proc.poll() is None, server.text()
        time.sleep(0.02)
    assert str(server.proc.pid) in launcher.gpu_state()
    started = time.monotonic()
    assert server.stop() == 143
    assert time.monotonic() - started < 20  # stops loading at once, not after the load
    assert launcher.gpu_state() == {}


def _group_log_has(server: Server, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.text():
        assert time.monotonic() < deadline, server.text()
        time.sleep(0.02)


def test_multinode_group_waits_for_every_rank_and_ends_with_one(launcher: Launcher,
                                                                models) -> None:
    """TP 8 over 2 nodes: rank 0 serves the API, rank 1 a dummy /health; they wait for each
    other at init; rank 1 ignores SIGTERM (0.5.23); one rank dying ends the other."""
    addr = f"127.0.0.1:{_free_port()}"
    group = ["--model-path", models["k26"], "--tp", "8", "--nnodes", "2",
             "--dist-init-addr", addr]
    for victim in (0, 1):
        rank0 = launcher.start([*group, "--node-rank", "0"])
        _group_log_has(rank0, "Init torch distributed begin")
        time.sleep(0.3)  # 300 s nominal: rank 0 alone neither loads nor listens
        assert "Load weight begin" not in rank0.text() and rank0.proc.poll() is None
        rank1 = launcher.start([*group, "--node-rank", "1", "--base-gpu-id", "4"])
        rank1.wait_ready()
        rank0.wait_ready()
        assert rank0.get("/v1/models")[0] == 200
        assert rank1.get("/v1/models")[0] == 404 and rank1.get("/health_generate")[0] == 200
        gpus = launcher.gpu_state()
        assert gpus[str(rank0.proc.pid)]["gpus"] == [0, 1, 2, 3]  # tp 8 over 2 nodes
        assert gpus[str(rank1.proc.pid)]["gpus"] == [4, 5, 6, 7]
        if victim == 1:
            rank1.proc.send_signal(signal.SIGTERM)  # ignored: rank 0 stops every rank
            _group_log_has(rank1, "waiting for the rank-0 ShutdownReq broadcast")
            assert rank1.proc.poll() is None
        dead, survivor = (rank0, rank1) if victim == 0 else (rank1, rank0)
        os.killpg(dead.proc.pid, signal.SIGKILL)  # its box rebooted
        assert survivor.proc.wait(timeout=20) == -signal.SIGKILL  # kill_process_tree
        assert "Scheduler hit an exception" in survivor.text()
        dead.proc.wait(timeout=10)
        assert str(survivor.proc.pid) not in launcher.gpu_state()  # it gave its GPUs back
