"""python_venv against real hosts: a local host (real venv/ensurepip/pip) and a simulated host
with the `no-pip` fault (Debian without python3-venv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import StageError
from orchestrator.stages.base import Converged, Needed
from orchestrator.stages.python_venv import PythonVenvStage
from tests.stages.conftest import fast_venv

PY = sys.executable
BASE_PY = getattr(sys, "_base_executable", None) or sys.executable

# A host-environment double (loaded through PYTHONPATH by every python the stage starts):
# like Debian without python3-venv and, optionally, without any pip wheel or host pip.
DEBIAN_SITE = r'''
import os, sys

class _Block:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top == "ensurepip":
            raise ModuleNotFoundError("No module named %r" % name, name=name)
        if (top == "pip" and os.environ.get("TEST_NO_HOST_PIP")
                and sys.prefix == getattr(sys, "base_prefix", sys.prefix)):
            raise ModuleNotFoundError("No module named %r" % name, name=name)
        return None

sys.meta_path.insert(0, _Block())
argv = list(getattr(sys, "orig_argv", []))
if "venv" in argv and "--without-pip" not in argv:
    import venv
    def _setup_pip(self, context):
        print("The virtual environment was not created successfully because ensurepip is not\n"
              "available.  On Debian/Ubuntu systems, you need to install the python3-venv\n"
              "package using the following command.")
        raise SystemExit(1)
    venv.EnvBuilder._setup_pip = _setup_pip
if os.environ.get("TEST_NO_PIP_WHEELS"):
    import glob
    _real_glob = glob.glob
    glob.glob = lambda pattern, *a, **k: [
        p for p in _real_glob(pattern, *a, **k) if not os.path.basename(p).startswith("pip-")]
'''


def make(path: Path | str, **kw: object) -> PythonVenvStage:
    return PythonVenvStage(PythonVenvStage.Params.model_validate({"path": str(path), **kw}))


def pip_works(venv: Path) -> bool:
    return subprocess.run([str(venv / "bin/python"), "-m", "pip", "--version"],
                          capture_output=True, timeout=60).returncode == 0


@pytest.fixture
def debian_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "debian-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DEBIAN_SITE)
    return {"PYTHONPATH": str(site), "PIP_CONFIG_FILE": os.devnull}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory):
    """One venv made by the stage (shared: creating a venv with pip takes seconds)."""
    from orchestrator.config.model import HostSpec
    from orchestrator.host import Host
    from orchestrator.transports import LocalTransport
    from tests.stages.conftest import _converge, _new_ctx

    venv = tmp_path_factory.mktemp("made") / "v"
    spec = HostSpec(name="localhost", connection="local")
    transport = LocalTransport(spec)
    transport.connect()
    try:
        host = Host(spec, transport, {})
        stage = make(venv, python=PY)
        ctx = _new_ctx("venv")
        before = stage.check(host, ctx)
        existed = venv.exists()
        status, _ = _converge(stage, host, ctx)
    finally:
        transport.close()
    return venv, before, existed, status, ctx.facts


def test_creates_then_converged(made, local_host, stage_ctx, converge):
    venv, before, existed, status, facts = made
    assert isinstance(before, Needed) and "does not exist" in before.reason
    assert not existed  # check is read-only
    assert status == "changed" and pip_works(venv)
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["pip"] and "pip_repair" not in facts
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    mtime = (venv / "pyvenv.cfg").stat().st_mtime_ns
    again = stage_ctx("venv")
    status, reason = converge(make(venv, python=PY), local_host, again)
    assert status == "ok" and "pip" in reason and again.facts["pip"] == facts["pip"]
    assert (venv / "pyvenv.cfg").stat().st_mtime_ns == mtime  # nothing touched


def test_system_site_packages_is_switched_in_place(made, local_host, stage_ctx, converge):
    venv = made[0]
    (venv / "marker").write_text("kept")
    for flag, word in ((True, "on"), (False, "off")):
        stage = make(venv, python=PY, system_site_packages=flag)
        status, reason = converge(stage, local_host, stage_ctx())
        assert status == "changed" and f"system_site_packages should be {word}" in reason
        assert f"include-system-site-packages = {str(flag).lower()}" in (
            venv / "pyvenv.cfg").read_text()
        assert (venv / "marker").exists() and pip_works(venv)
        assert converge(stage, local_host, stage_ctx())[0] == "ok"


def test_venv_without_pip_is_repaired_with_ensurepip(tmp_path, local_host, stage_ctx, converge):
    venv = tmp_path / "nopip"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (venv / "marker").write_text("kept")
    ctx = stage_ctx("venv")
    status, reason = converge(make(venv, python=PY), local_host, ctx)
    assert status == "changed" and "no working pip" in reason
    assert ctx.facts["pip_repair"] == "ensurepip"
    assert pip_works(venv) and (venv / "marker").read_text() == "kept"  # repaired, not recreated


def test_refuses_to_overwrite_what_is_not_a_venv(tmp_path, local_host, stage_ctx):
    data = tmp_path / "data"
    data.mkdir()
    (data / "precious.txt").write_text("keep me")
    ctx = stage_ctx("venv")
    stage = make(data, python=PY)
    assert "not a virtual environment" in stage.check(local_host, ctx).reason
    with pytest.raises(StageError, match="not a virtual environment") as err:
        stage.apply(local_host, ctx)
    assert "precious.txt" in err.value.message and "another `path`" in err.value.hint
    assert (data / "precious.txt").read_text() == "keep me" and len(list(data.iterdir())) == 1
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(StageError, match="is not a directory"):
        make(afile, python=PY).apply(local_host, ctx)
    assert afile.read_text() == "x"
    with pytest.raises(StageError, match="interpreter 'python9.99' was not found") as err:
        make(tmp_path / "new", python="python9.99").apply(local_host, ctx)
    assert "set `python`" in err.value.hint


def test_debian_without_venv_or_wheels_uses_the_host_pip(tmp_path, local_host, stage_ctx,
                                                         converge, debian_env):
    # The host pip installs pip from an index (here: a loopback PEP 503 index holding pip).
    from orchestrator_sim.pkgindex import PackageIndex

    bundled = sorted((Path(sys.base_prefix) / "lib").glob("python3*/ensurepip/_bundled/pip-*"))
    if not bundled or subprocess.run([BASE_PY, "-m", "pip", "--version"],
                                     capture_output=True).returncode != 0:
        pytest.skip("needs a base interpreter with pip and a bundled pip wheel")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / bundled[-1].name).write_bytes(bundled[-1].read_bytes())
    index = PackageIndex([wheels])
    index.start()
    try:
        env = {**debian_env, "TEST_NO_PIP_WHEELS": "1", "NO_PROXY": "127.0.0.1"}
        ctx = stage_ctx("venv", env=env)
        stage = make(tmp_path / "v", python=BASE_PY, pip_index_url=index.url)
        status, _ = converge(stage, local_host, ctx)
    finally:
        index.stop()
    assert status == "changed" and ctx.facts["pip_repair"].startswith("host pip ")
    assert pip_works(tmp_path / "v")


def test_broken_venv_is_recreated_and_a_pip_nobody_can_install_names_the_package(
        tmp_path, local_host, stage_ctx, debian_env):
    # a venv whose interpreter was removed, on a Debian host without python3-venv, pip wheels
    # or a host pip: the venv is recreated, then the error says which package to install
    venv = tmp_path / "v"
    subprocess.run([BASE_PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    for name in ("python", "python3"):
        (venv / "bin" / name).unlink()
        (venv / "bin" / name).symlink_to(tmp_path / "gone" / "python3")
    env = {**debian_env, "TEST_NO_PIP_WHEELS": "1", "TEST_NO_HOST_PIP": "1"}
    ctx = stage_ctx("venv", env=env)
    stage = make(venv, python=BASE_PY)
    verdict = stage.check(local_host, ctx)
    assert isinstance(verdict, Needed) and "python is broken" in verdict.reason
    with pytest.raises(StageError) as err:
        stage.apply(local_host, ctx)
    assert "does not exist" in ctx.facts["recreated"]
    assert subprocess.run([str(venv / "bin/python"), "-c", "pass"], timeout=60).returncode == 0
    major, minor = sys.version_info[:2]
    assert "has no pip and it could not be installed" in err.value.message
    assert "ensurepip" in err.value.message and "none found" in err.value.message
    assert f"apt install python{major}.{minor}-venv" in err.value.hint
    with pytest.raises(StageError, match="still not usable: the venv has no working pip"):
        stage.verify(local_host, ctx)


def test_sim_host_with_no_pip_fault_and_half_created_venv(sim_factory, sim_host, stage_ctx,
                                                           converge):
    fleet = sim_factory("nopip", hosts=1, hypervisor=False)
    fleet.fault("gpu-1", "no-pip")
    host = sim_host(fleet, "gpu-1")
    path = host.vars["base_dir"] + "/venvs/sglang"
    # a creation interrupted before pyvenv.cfg was written: only bin/ and lib/ exist
    assert host.run_argv(["mkdir", "-p", path + "/bin", path + "/lib"]).ok
    stage = make(path)
    ctx = stage_ctx("venv")
    status, reason = converge(stage, host, ctx)
    assert status == "changed" and "python is broken" in reason
    assert ctx.facts["recreated"]
    assert ctx.facts["pip_repair"].startswith("wheel ")  # ensurepip is gone on that host
    assert host.run_argv([path + "/bin/python", "-m", "pip", "--version"]).ok
    assert isinstance(stage.check(host, stage_ctx("venv")), Converged)


def test_pip_removed_behind_our_back_is_noticed(tmp_path, local_host, stage_ctx, commands):
    venv = tmp_path / "v"
    fast_venv(venv)
    stage = make(venv, python=BASE_PY)
    ok = stage.check(local_host, stage_ctx("venv"))
    assert isinstance(ok, Converged) and commands == []  # files only: no python ran
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "uninstall", "-y", "-q", "pip"],
                   check=True, timeout=120, capture_output=True)
    verdict = stage.check(local_host, stage_ctx("venv"))
    assert isinstance(verdict, Needed) and "no working pip" in verdict.reason, verdict
    # (the repair itself: test_venv_without_pip_is_repaired_with_ensurepip)
