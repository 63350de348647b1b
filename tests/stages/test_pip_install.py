"""pip_install on a local host: a real venv, real pip, the simulated package index on loopback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pydantic
import pytest

from orchestrator.errors import CommandFailed, StageError
from orchestrator.stages.base import Converged, Needed
from orchestrator.stages.pip_install import PipInstallStage, mask_url
from tests.sim.conftest_index import clean_env
from tests.stages.conftest import fast_venv

PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "NO_PROXY": "127.0.0.1,localhost",
           "PIP_NO_CACHE_DIR": "1"}
CANARY = "s3cr3t-canary-pw"


def installed(python: Path, dist: str) -> str | None:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    r = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    return r.stdout.strip() if r.returncode == 0 else None


def make(python: Path | str, requirements: list[str], **kw: object) -> PipInstallStage:
    params = {"python": str(python), "requirements": requirements, "env": PIP_ENV, **kw}
    return PipInstallStage(PipInstallStage.Params.model_validate(params))


def with_password(url: str) -> str:
    return url.replace("http://", f"http://deploy:{CANARY}@", 1)



def test_upgrades_an_old_compressed_tensors_then_converged(tmp_path, sim_index, local_host,
                                                           commands, stage_ctx, converge):
    py = fast_venv(tmp_path / "v")
    r = subprocess.run([str(py), "-m", "pip", "install", "--index-url", sim_index.url,
                        "compressed-tensors==0.8.1"], env=clean_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    stage = make(py, ["compressed-tensors>=0.10.0", "packaging-not-needed==1; "
                      "sys_platform == 'win32'"], index_url=with_password(sim_index.url))
    ctx = stage_ctx("packages")
    verdict = stage.check(local_host, ctx)
    assert verdict == Needed("compressed-tensors 0.8.1 does not satisfy >=0.10.0")
    assert ctx.facts["versions"]["compressed-tensors"] == "0.8.1"
    assert not any(" pip " in c.command for c in commands)  # the check does not use pip
    status, _ = converge(stage, local_host, ctx)
    assert status == "changed"
    new = installed(py, "compressed-tensors")
    assert new is not None and tuple(map(int, new.split("."))) >= (0, 10, 0)
    assert ctx.facts["versions"]["compressed-tensors"] == new
    assert ctx.facts["installed"] == ["compressed-tensors>=0.10.0"]  # only the unsatisfied one
    # the index password went through the environment, never argv, never the record
    pip_runs = [c for c in commands if " -m pip install " in c.command]
    assert len(pip_runs) == 1 and "'compressed-tensors>=0.10.0'" in pip_runs[0].command
    assert all(CANARY not in c.command for c in commands)
    assert CANARY not in repr(ctx.facts) and ctx.facts["index_url"].startswith("http://***@")
    assert CANARY not in pip_runs[0].stdout + pip_runs[0].stderr  # pip masks it too
    again = stage_ctx("packages")
    before = len(commands)
    verdict = stage.check(local_host, again)
    assert isinstance(verdict, Converged) and f"compressed-tensors {new}" in verdict.reason
    assert len(commands) == before  # converged: read from the venv's files, no interpreter

    # downgraded behind our back: the files say so, still without starting the venv's python
    r = subprocess.run([str(py), "-m", "pip", "install", "--index-url", sim_index.url,
                        "compressed-tensors==0.8.1"], env=clean_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    verdict = stage.check(local_host, stage_ctx("packages"))
    assert verdict == Needed("compressed-tensors 0.8.1 does not satisfy >=0.10.0")
    assert len(commands) == before


def test_installs_missing_distributions_with_their_dependencies(tmp_path, sim_index, local_host,
                                                                stage_ctx, converge):
    py = fast_venv(tmp_path / "v")
    stage = make(py, ["sglang==0.5.23", "compressed_tensors"], index_url=sim_index.url)
    ctx = stage_ctx("packages")
    reason = stage.check(local_host, ctx).reason
    assert "sglang is not installed" in reason and "compressed_tensors is not installed" in reason
    assert converge(stage, local_host, ctx)[0] == "changed"
    assert ctx.facts["versions"] == {"compressed_tensors": "0.18.0", "sglang": "0.5.23"}
    assert any(m.startswith(("Installing", "Successfully")) for m in ctx.progress_messages)
    assert isinstance(stage.check(local_host, stage_ctx()), Converged)


def test_no_matching_distribution_names_the_index(tmp_path, sim_index, local_host, stage_ctx):
    py = fast_venv(tmp_path / "v")
    stage = make(py, ["compressed-tensors>=99"], index_url=with_password(sim_index.url))
    ctx = stage_ctx("packages")
    assert stage.check(local_host, ctx).reason == "compressed-tensors is not installed"
    with pytest.raises(CommandFailed) as err:
        stage.apply(local_host, ctx)
    text = err.value.render()
    assert "No matching distribution found for compressed-tensors>=99" in text
    assert "no release matching the requirement was found on http://***@127.0.0.1" in text
    assert CANARY not in text
    with pytest.raises(StageError, match="still not satisfied: compressed-tensors is not"):
        stage.verify(local_host, ctx)


def test_missing_python_is_needed_in_check_and_explained_in_apply(tmp_path, local_host,
                                                                  stage_ctx):
    stage = make(tmp_path / "nowhere/bin/python", ["sglang==0.5.23"])
    verdict = stage.check(local_host, stage_ctx())
    assert isinstance(verdict, Needed) and "does not run yet" in verdict.reason
    with pytest.raises(StageError, match="does not run") as err:
        stage.apply(local_host, stage_ctx())
    assert "python_venv" in err.value.hint


def test_params_reject_bad_requirements_and_unknown_keys():
    with pytest.raises(pydantic.ValidationError, match="not a PEP 508 requirement"):
        make("python3", ["sglang>>1"])
    with pytest.raises(pydantic.ValidationError, match="extra"):
        make("python3", ["sglang"], indexurl="x")
    assert mask_url("https://user:pw@host/simple") == "https://***@host/simple"
    assert mask_url("https://host/simple") == "https://host/simple"
