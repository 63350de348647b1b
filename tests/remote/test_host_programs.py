"""The programs other pythons run on the host, imported and run here: pyinfo (python_venv),
distributions (pip_install) and cuda_init (uvm_facts). Each also runs as `python -c TEXT`, the
way it is shipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from orchestrator.remote import cuda_init, distributions, pyinfo, source


def run_program(name: str, *args: str, env: dict[str, str] | None = None) -> object:
    r = subprocess.run([sys.executable, "-c", source(name), *args], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- pyinfo


def test_pyinfo_info() -> None:
    got = pyinfo.info()
    assert got["version"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert got["prefix"] == sys.prefix and got["base_prefix"] == sys.base_prefix
    assert run_program("pyinfo", "info") == got


def test_pyinfo_info_pip_reports_pip_or_none() -> None:
    got = run_program("pyinfo", "info_pip")
    assert got["version"] == pyinfo.info()["version"]
    assert got["pip"] is None or isinstance(got["pip"], str)


def test_pyinfo_find_wheels_newest_first(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for d, name in ((a, "pip-9.0.1-py2.py3-none-any.whl"), (a, "pip-23.0-py3-none-any.whl"),
                    (b, "pip-24.2-py3-none-any.whl"), (b, "setuptools-1-py3-none-any.whl")):
        (d / name).write_bytes(b"")
    got = pyinfo.find_wheels([str(a), str(b), str(tmp_path / "absent")])
    assert [Path(p).name for p in got] == [
        "pip-24.2-py3-none-any.whl", "pip-23.0-py3-none-any.whl",
        "pip-9.0.1-py2.py3-none-any.whl"]
    assert isinstance(run_program("pyinfo", "find_wheels"), list)


# ---------------------------------------------------------------- distributions


def test_distributions_versions_by_name_and_normalized_name() -> None:
    import importlib.metadata as md

    want = md.version("packaging")
    got = distributions.versions(["packaging", "PACKAGING", "no-such-dist-xyz"])
    assert got == {"packaging": want, "PACKAGING": want, "no-such-dist-xyz": None}
    assert distributions.norm("Foo_bar.baz") == "foo-bar-baz"


def test_distributions_program_prints_versions_and_markers() -> None:
    got = run_program("distributions", json.dumps(["packaging"]))
    assert got["versions"]["packaging"]
    env = got["env"]
    assert env["python_version"] == "{}.{}".format(*sys.version_info[:2])
    assert env["sys_platform"] == sys.platform and env["os_name"] == "posix"
    assert set(env) == set(distributions.marker_env())


# ---------------------------------------------------------------- cuda_init


class FakeCuda:
    """libcuda's three calls, with the answers a test gives."""

    def __init__(self, code: int) -> None:
        self.code = code

    def cuInit(self, flags: int) -> int:  # noqa: N802 - libcuda's name
        return self.code

    def cuDeviceGetCount(self, ref: object) -> int:  # noqa: N802
        ref._obj.value = 8  # type: ignore[attr-defined]
        return 0

    def cuDriverGetVersion(self, ref: object) -> int:  # noqa: N802
        ref._obj.value = 12080  # type: ignore[attr-defined]
        return 0


def test_cuda_init_reads_libcuda() -> None:
    out: dict = {}
    cuda_init._libcuda(FakeCuda(0), out)
    assert out == {"source": "libcuda", "code": 0, "devices": 8, "driver_version_int": 12080}
    out = {}
    cuda_init._libcuda(FakeCuda(999), out)
    assert out == {"source": "libcuda", "code": 999}


def test_cuda_init_asks_the_simulated_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "simhw", types.SimpleNamespace(cuda_init=lambda: 999))
    monkeypatch.setenv("SIM_HOST_STATE", "/tmp/state")
    assert cuda_init.check() == {"code": 999, "source": "simhw", "error": None}


def test_cuda_init_program_without_libcuda_is_unknown() -> None:
    env = {"PATH": "/usr/bin:/bin"}
    got = run_program("cuda_init", env=env)
    if got["source"] == "libcuda":  # pragma: no cover - a machine with a driver
        assert isinstance(got["code"], int)
    else:
        assert got == {"code": None, "source": "unknown", "error": got["error"]}
        assert "libcuda.so.1 not loadable" in got["error"]


# ---------------------------------------------------------------- bootstrap

FAKE_AGENT = b"import sys\nsys.stdout.write(__name__ + ' ' + str(len(AGENT_SOURCE)))\n"


def _boot(python: str, stdin: bytes, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", source("bootstrap")], input=stdin,
                          capture_output=True, timeout=60, env=env)


def test_bootstrap_runs_the_source_it_reads() -> None:
    from orchestrator.remote.agent import encode_source

    r = _boot(sys.executable, encode_source(FAKE_AGENT))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == f"__orchestrator_agent__ {len(FAKE_AGENT)}"


def test_the_agent_is_compiled_once_per_host(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap reads the agent's code from the cache the agent keeps (under the key of
    bootstrap.cache_path); a cache entry that went bad is compiled and written again."""
    from orchestrator.remote.agent import encode_source, pack
    from orchestrator.remote.bootstrap import AGENT_FILE, cache_path
    from orchestrator.transports.agent_client import agent_source, shipped_modules

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env = dict(os.environ)
    src = agent_source()
    entry = Path(cache_path(src, AGENT_FILE))
    init = pack({"op": "init", "modules": [list(m) for m in shipped_modules()]})
    # the agent starts, gets its init, finds no request (stdin ends) and exits; its code is kept
    _boot(sys.executable, encode_source(src) + init, env)
    assert entry.is_file() and entry.parent == tmp_path / "orchestrator-agent"
    kept = entry.read_bytes()
    entry.write_bytes(b"not marshal data")
    _boot(sys.executable, encode_source(src) + init, env)
    assert entry.read_bytes() == kept  # compiled again, and kept again
    stamp = entry.stat().st_mtime_ns
    _boot(sys.executable, encode_source(src) + init, env)
    assert entry.stat().st_mtime_ns == stamp  # read from the cache: not written
    # a program that is not the agent runs too (nothing is kept for it)
    r = _boot(sys.executable, encode_source(FAKE_AGENT), env)
    assert r.stdout.decode() == f"__orchestrator_agent__ {len(FAKE_AGENT)}"


def test_bootstrap_without_source_exits_4() -> None:
    from orchestrator.remote import bootstrap

    assert _boot(sys.executable, b"0000000").returncode == bootstrap.EXIT_NO_SOURCE == 4


@pytest.mark.parametrize("version", ["2.7", "3.6", "3.7"])
def test_bootstrap_explains_an_old_python(version: str) -> None:
    import shutil

    var = f"ORCH_TEST_PYTHON{version.replace('.', '')}"
    python = os.environ.get(var) or shutil.which(f"python{version}")
    # a pyenv shim of a version that is not active exits 127: not an interpreter
    if not python or subprocess.run([python, "-c", "pass"], capture_output=True,
                                    timeout=30).returncode != 0:
        pytest.skip(f"no Python {version} here (set {var} to one)")
    r = _boot(python, b"")
    assert r.returncode == 3
    assert b"the agent needs Python >= 3.8 on the host, found " + version.encode() in r.stderr


def test_bootstrap_text_is_safe_inside_shell_quotes() -> None:
    text = source("bootstrap")
    assert "'" not in text and "!" not in text
