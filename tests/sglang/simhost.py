"""A simulated GPU host prepared for SGLang server tests (import the fixture explicitly).

    from tests.sglang.simhost import sglang_sim  # noqa: F401  (module-scoped fixture)

`sglang_sim` starts ONE simulator per test module (one 8-GPU RTX PRO 6000 box, its package index,
time scaled by 1/1000), and gives:

  .fleet / .spec / .vars / .base      the SimFleet, the gpu-1 HostSpec, its vars, BASE_DIR
  .venv(name, *requirements)          a REAL venv on the host (python -m venv --without-pip, then
                                      the host python's pip installs from the sim's index),
                                      built once per module; returns its python
  .models                             checkpoint dirs with config.json: k26 (the hub's
                                      Kimi-K2.6 config), k2 (DeepseekV3ForCausalLM), drafter
                                      (the kimi-k2.6-eagle3 config)
  .connect()                          a Host over SSH (strict host keys), shared by the module
  .server_pids()                      live `sglang.launch_server` processes of this simulator
  .state_dir(name)                    a fresh state dir on the host; its server is stopped at
                                      the end of the module

Venvs and model dirs are made with the simulator's host python directly (the pip_install and
hf_download kinds are other tests' business).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.loader import load_inventory
from orchestrator.host import Host
from orchestrator.transports import make_transport
from orchestrator_sim.fleet import SimFleet, dir_hash
from orchestrator_sim.hubrepos import eagle3_config, kimi_files
from tests.sim.conftest import assert_nothing_left

TIME_SCALE = 0.001
LOAD_SECONDS = 300.0  # nominal; 0.3 s real at this time scale
API_KEY = "sk-canary-9f3c61d2b7a4e5"

K2_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "vocab_size": 163840,
    "num_hidden_layers": 61,
    "max_position_embeddings": 131072,
}


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "VIRTUAL_ENV", "SIM_")) and k.lower() not in (
               "http_proxy", "https_proxy", "all_proxy", "pythonpath")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               NO_PROXY="127.0.0.1,localhost")
    return env


class SGLangSim:
    """One simulated host with venvs and model dirs for SGLang server tests."""

    def __init__(self, fleet: SimFleet) -> None:
        self.fleet = fleet
        info = fleet.info()
        self.host_python = info["python"]
        self.index_url = info["index_url"]
        inv = load_inventory(fleet.inventory_path)
        self.spec = inv.hosts["gpu-1"].model_copy(update={"name": "gpu-1"})
        self.vars = dict(self.spec.vars)
        self.base = Path(self.vars["base_dir"])
        self.address = str(self.vars["sglang_host"])
        self.port = int(self.vars["sglang_port"])
        self._venvs: dict[str, str] = {}
        self._hosts: list[Host] = []
        self._state_dirs: list[str] = []
        self.models = self._models()

    # -- setup ---------------------------------------------------------------------------
    def _models(self) -> dict[str, str]:
        root = self.base / "models"
        out = {}
        for name, data in {
            "k26": kimi_files()["config.json"],
            "k2": json.dumps(K2_CONFIG).encode(),
            "drafter": json.dumps(eagle3_config()).encode(),
        }.items():
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_bytes(data)
            out[name] = str(folder)
        return out

    def venv(self, name: str, *requirements: str, no_deps: bool = False) -> str:
        """Create (once) a venv on the host with `requirements` from the sim index."""
        if name in self._venvs:
            return self._venvs[name]
        root = self.base / "venvs" / name
        env = _pip_env()
        subprocess.run([self.host_python, "-m", "venv", "--without-pip", str(root)], check=True,
                       env=env, capture_output=True, timeout=120)
        cmd = [self.host_python, "-m", "pip", "-q", "--python", str(root / "bin" / "python"),
               "install", "--no-cache-dir", "--index-url", self.index_url, *requirements]
        if no_deps:
            cmd.insert(cmd.index("install") + 1, "--no-deps")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
        self._venvs[name] = str(root / "bin" / "python")
        return self._venvs[name]

    @property
    def python(self) -> str:
        """The main venv: sglang 0.5.23 + compressed-tensors (0.18.0, its pin)."""
        return self.venv("main", "sglang==0.5.23", "compressed-tensors")

    def connect(self, fresh: bool = False) -> Host:
        """A Host over SSH: the module's shared connection, or a new one with `fresh`."""
        if self._hosts and not fresh:
            return self._hosts[0]
        t = make_transport(self.spec)
        t.connect(budget=30)
        host = Host(self.spec, t, dict(self.vars))
        self._hosts.append(host)
        return host

    def state_dir(self, name: str) -> str:
        path = str(self.base / "state" / name)
        self._state_dirs.append(path)
        return path

    def server_params(self, state_dir: str, **overrides: Any) -> dict[str, Any]:
        """sglang_server params of the playbook (K2.6 + EAGLE-3, TP 8), test-sized timings."""
        params: dict[str, Any] = {
            "python": self.python, "model_path": self.models["k26"],
            "draft_model_path": self.models["drafter"], "tp": 8,
            "speculative": {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                            "num_draft_tokens": 4},
            "host": self.address, "port": self.port, "served_model_name": "kimi-k2.6",
            "tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2",
            "mem_fraction_static": 0.88, "api_key": API_KEY,
            "env": {"NCCL_P2P_LEVEL": "SYS"}, "state_dir": state_dir,
            "verify_window": 0.3, "stop_timeout": 5,
        }
        params.update(overrides)
        return params

    def ready_params(self, state_dir: str, **overrides: Any) -> dict[str, Any]:
        """wait_ready params of the playbook, polling fast."""
        params: dict[str, Any] = {
            "url": f"http://{self.address}:{self.port}", "api_key": API_KEY, "timeout": 20,
            "poll_interval": 0.1, "state_dir": state_dir,
            "expect_architectures": ["KimiK25ForConditionalGeneration"],
            "min_accept_length": 1.2,
        }
        params.update(overrides)
        return params

    # -- inspection ----------------------------------------------------------------------
    def server_pids(self) -> list[int]:
        """Live processes of this simulator running sglang.launch_server (ours or stale)."""
        marker = b"SIM_HOST_ID=" + dir_hash(self.fleet.simdir).encode() + b":"
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                env = Path(f"/proc/{entry}/environ").read_bytes()
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            if stat.rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X"):
                continue
            if b"sglang.launch_server" in cmd and any(
                    e.startswith(marker) for e in env.split(b"\0")):
                out.append(int(entry))
        return out

    def port_open(self) -> bool:
        import socket

        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((self.address, self.port)) == 0

    def stop_all(self) -> None:
        """Stop every server a test started (its state dir's), and wait for the port."""
        if not self._state_dirs:
            return
        host = self.connect()
        for sd in self._state_dirs:
            host.act("server_stop", state_dir=sd, grace=5)
        self._state_dirs.clear()
        deadline = time.monotonic() + 10
        while self.port_open() and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.stop_all()
        for h in self._hosts:
            h.transport.close()
        self._hosts.clear()


def cmdlines_with(text: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of every live process whose command line contains `text`."""
    me = os.getpid()
    out = []
    needle = text.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd:
            out.append((int(entry), cmd.replace(b"\0", b" ").decode(errors="replace")))
    return out


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@pytest.fixture(scope="module")
def sglang_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangSim]:
    simdir = tmp_path_factory.mktemp("sglang-sim") / "sim"
    fleet = SimFleet.up(simdir, hosts=1, time_scale=TIME_SCALE, index=True, hub=False,
                        load_seconds=LOAD_SECONDS)
    sim = None
    try:
        sim = SGLangSim(fleet)
        yield sim
    finally:
        if sim is not None:
            try:
                sim.close()
            except Exception:  # noqa: BLE001 - the fleet is torn down below anyway
                pass
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(simdir, pid)


@pytest.fixture(autouse=True)
def stop_servers_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """Autouse (when imported): after each test, stop the servers of its state dirs."""
    yield
    if "sglang_sim" in request.fixturenames:
        request.getfixturevalue("sglang_sim").stop_all()
