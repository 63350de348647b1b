"""Session fixtures for the package-index and SGLang stand-in tests, and their helpers.

tests/conftest.py imports the fixtures, so that every module shares ONE of each per session
(per xdist worker). Do not import a fixture into a test module: pytest would register a second
definition there and build the session fixture again for that module (the stand-in venv alone
costs seconds of CPU). Import only the helpers (`Venv`, `clean_env`, `SIMHW_DOUBLE`).

sim_wheels    folder with the stand-in wheels (built once per session)
sim_index     a started PackageIndex over sim_wheels (loopback, free port)
standin_venv  a REAL venv (python -m venv --without-pip, then the bundled pip and setuptools
              wheels unpacked) with `sglang==0.5.23` pip-installed from sim_index;
              `.pip(...)` runs its pip against the index only, `.target(spec)` pip-installs a
              distribution into a separate folder for PYTHONPATH overlays
simhw_double  folder holding a test double of the simulator's `simhw` module (SIMHW_TEST_*
              variables configure it; SIMHW_TEST_STATE names a JSON file of allocations)
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator_sim.pkgindex import PackageIndex
from orchestrator_sim.wheels import build_standin_wheels

SIMHW_DOUBLE = '''
"""Test double of the simulator's simhw module (configured by SIMHW_TEST_* variables)."""
import contextlib
import fcntl
import json
import os


class OutOfMemory(Exception):
    """A GPU lacks free memory."""


def _env(name, default):
    return os.environ.get("SIMHW_TEST_" + name, default)


def _read():
    path = _env("STATE", "")
    if path and os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    return {}


def _write(state):
    path = _env("STATE", "")
    if path:
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w") as fh:
            json.dump(state, fh)
        os.replace(tmp, path)


@contextlib.contextmanager
def _state():
    """The allocations, read and written back under a lock: the ranks of a multi-node group
    allocate at the same moment (unlocked, one lost the other's entry or its temp file)."""
    path = _env("STATE", "")
    with contextlib.ExitStack() as stack:
        if path:
            lock = stack.enter_context(open(path + ".lock", "a"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        state = _read()
        yield state
        _write(state)


def cuda_init():
    return int(_env("CUDA_INIT", "0"))


def device_count():
    return int(_env("GPUS", "8"))


def gpu_info():
    total = int(_env("MEM_MIB", "97887"))
    cc = [int(x) for x in _env("CC", "12.0").split(".")]
    return [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
             "memory_total_mib": total, "memory_used_mib": 0, "uuid": "GPU-%08d" % i,
             "compute_capability": cc} for i in range(device_count())]


def allocate(pid, mib, gpus):
    free = int(_env("FREE_MIB", _env("MEM_MIB", "97887")))
    if mib > free:
        raise OutOfMemory("CUDA out of memory. Tried to allocate %d MiB. GPU %d has a total "
                          "capacity of %s MiB of which %d MiB is free."
                          % (mib, gpus[0], _env("MEM_MIB", "97887"), free))
    with _state() as state:
        state[str(pid)] = {"mib": mib, "gpus": list(gpus)}


def release(pid):
    with _state() as state:
        state.pop(str(pid), None)


def time_scale():
    return float(_env("TIME_SCALE", "0.001"))


def load_seconds():
    return float(_env("LOAD_SECONDS", "50"))
'''


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without pip configuration, proxies or PYTHONPATH, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "SIMHW_", "SGLANG_", "NCCL_"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "pythonpath")
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,  # ignore /etc/xdg/pip and ~/.config/pip (extra indexes)
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    env.update(extra)
    return env


class Venv:
    """A real virtual environment driven through its own pip."""

    def __init__(self, root: Path, index: PackageIndex) -> None:
        self.root = root
        self.index = index
        self.python = root / "bin" / "python"

    def pip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.python), "-m", "pip", *args, "--no-cache-dir",
               "--index-url", self.index.url]
        proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def target(self, spec: str, folder: Path) -> Path:
        """pip install --no-deps `spec` into `folder` (a PYTHONPATH overlay)."""
        if not folder.exists():
            self.pip("install", "--no-deps", "--target", str(folder), spec)
        return folder

    def version(self, dist: str, pythonpath: str = "") -> str:
        code = f"import importlib.metadata as m; print(m.version({dist!r}))"
        env = clean_env(PYTHONPATH=pythonpath) if pythonpath else clean_env()
        out = subprocess.run([str(self.python), "-c", code], env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        return out.stdout.strip()


@pytest.fixture(scope="session")
def sim_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    build_standin_wheels(out)
    return out


@pytest.fixture(scope="session")
def sim_index(sim_wheels: Path) -> Iterator[PackageIndex]:
    index = PackageIndex([sim_wheels])
    index.start()
    try:
        yield index
    finally:
        index.stop()


def make_venv(root: Path) -> None:
    """What `python -m venv ROOT` makes, without its ensurepip step, which has pip install and
    byte-compile the bundled pip and setuptools wheels (~5 s of CPU): the same wheels are
    unpacked into site-packages instead. Where Python has no bundled wheels: plain venv."""
    import ensurepip

    bundled = sorted(Path(ensurepip.__file__).parent.glob("_bundled/*.whl"))
    if not any(w.name.startswith("pip-") for w in bundled):
        subprocess.run([sys.executable, "-m", "venv", str(root)], env=clean_env(), check=True,
                       timeout=120, capture_output=True)
        return
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], env=clean_env(),
                   check=True, timeout=120, capture_output=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    for wheel in bundled:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)


@pytest.fixture(scope="session")
def standin_venv(tmp_path_factory: pytest.TempPathFactory, sim_index: PackageIndex) -> Venv:
    root = tmp_path_factory.mktemp("standin") / "venv"
    make_venv(root)
    venv = Venv(root, sim_index)
    venv.pip("install", "sglang==0.5.23")
    return venv


@pytest.fixture(scope="session")
def simhw_double(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("simhw")
    (folder / "simhw.py").write_text(SIMHW_DOUBLE)
    return folder
