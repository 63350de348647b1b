"""Pin files (deploy.lock.json) without a host: build_pin over run records, load_pin errors,
the typed pins handed to the stages, the drift section, the launch normalization of
sglang_server and pip_install's pinning under --locked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator.config.model import StageSpec
from orchestrator.errors import ConfigError, PreflightError
from orchestrator.pinfile import (
    PIN_VERSION,
    NoPin,
    PinFile,
    StagePin,
    build_pin,
    drift_lines,
    load_pin,
    write_pin,
)
from orchestrator.stages.base import Needed, StageContext
from orchestrator.stages.gateway import GatewayPin
from orchestrator.stages.hf_download.rules import HfPin
from orchestrator.stages.pin import arg_changes, bind_scope, pinned, placeholders, refuse
from orchestrator.stages.pip_install import PipInstallParams, PipInstallStage, PipPin
from orchestrator.stages.python_venv import VenvPin
from orchestrator.stages.sglang_server.rules import ServerPin, launch_pin
from orchestrator.summary import RunSummary

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def _host(stages: dict[str, tuple[str, dict[str, Any] | None]]) -> dict[str, Any]:
    return {
        "status": "ok",
        "stages": {sid: {"status": status} for sid, (status, _) in stages.items()},
        "facts": {sid: ({"pin": pin, "other": 1} if pin is not None else {"other": 1})
                  for sid, (_, pin) in stages.items()},
    }


def _record(**hosts: dict[str, Any]) -> RunSummary:
    return RunSummary.from_json(
        {"run_id": "r1", "playbook": "pb.yaml", "inventory": "inv.yaml", "hosts": hosts})


def test_build_pin_keeps_what_every_host_agreed_on() -> None:
    drafter = {"repo": "o/d", "commit": COMMIT_A, "files": 6, "bytes": 10}
    venv = {"python": "3.11.7"}
    rec = _record(**{
        "gpu-1": _host({"drafter": ("changed", drafter), "venv": ("ok", venv),
                        "health": ("ok", None)}),
        "gpu-2": _host({"drafter": ("ok", dict(drafter)), "venv": ("changed", venv)}),
    })
    lock = build_pin(rec).to_json()
    assert lock["lock_version"] == PIN_VERSION and lock["run_id"] == "r1"
    assert lock["stages"] == {"drafter": drafter, "venv": venv}
    assert lock["disagreements"] == []
    assert set(lock["hosts"]) == {"gpu-1", "gpu-2"}
    assert "health" not in lock["hosts"]["gpu-1"]  # recorded no lock


def test_build_pin_lists_disagreements_and_locks_none_of_them() -> None:
    rec = _record(**{
        "gpu-1": _host({"drafter": ("ok", {"repo": "o/d", "commit": COMMIT_A}),
                        "venv": ("ok", {"python": "3.11.7"})}),
        "gpu-2": _host({"drafter": ("ok", {"repo": "o/d", "commit": COMMIT_B}),
                        "venv": ("ok", {"python": "3.11.7"})}),
    })
    lock = build_pin(rec).to_json()
    assert lock["disagreements"] == ["drafter"]
    assert "drafter" not in lock["stages"] and lock["stages"]["venv"] == {"python": "3.11.7"}
    assert lock["hosts"]["gpu-2"]["drafter"]["commit"] == COMMIT_B  # still shown per host


def test_build_pin_ignores_stages_that_did_not_converge() -> None:
    rec = _record(**{"gpu-1": _host({
        "drafter": ("failed", {"repo": "o/d", "commit": COMMIT_A}),
        "target": ("would-change", {"repo": "o/t", "commit": COMMIT_B}),
        "venv": ("ok", {"python": "3.11.7"}),
    })})
    assert build_pin(rec).stages == {"venv": {"python": "3.11.7"}}


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    lock = build_pin(_record(**{"gpu-1": _host({"venv": ("ok", {"python": "3.11.7"})})}))
    path = tmp_path / "run" / "deploy.lock.json"
    write_pin(lock.to_json(), path)
    assert json.loads(path.read_text()) == lock.to_json()
    assert load_pin(path) == lock


def test_each_stage_gets_its_entry_as_its_kinds_pin() -> None:
    """The runner hands a stage its entry typed by its kind's Pin; NoPin when the file has
    none (the kind refuses it), None for a kind that pins nothing."""
    server = launch_pin(["--model-path", "/m", "--host", "0.0.0.0"], {"A": "1"}, {}, "0.5.23")
    pins: list[StagePin] = [VenvPin("3.11.7"), PipPin({"sglang": "0.5.23"}), server,
                            HfPin("o/d", COMMIT_A, 6, 10),
                            GatewayPin("1.13.0", "round_robin", ("--x",), "all")]
    pin = PinFile(stages={str(i): json.loads(json.dumps(p.to_json())) for i, p in
                          enumerate(pins)})
    for i, want in enumerate(pins):
        assert pin.entry(str(i), type(want)) == want  # through JSON and back: the same value
    assert pin.entry("missing", VenvPin) == NoPin()
    assert pin.entry("0", None) is None
    assert server.to_json()["env"]["names"] == ["A"] and server.bind == "all"
    old = ServerPin.from_json({"args": ["--tp-size", "8"]})  # missing keys read as nothing
    assert (old.sglang_version, old.args, old.bind, old.env_names) == (None, ("--tp-size", "8"),
                                                                      None, ())


def test_pinned_refuses_a_stage_the_pin_file_has_no_entry_for() -> None:
    assert pinned(_ctx(None), VenvPin) is None
    assert pinned(_ctx(VenvPin("3.11.7")), VenvPin) == VenvPin("3.11.7")
    verdict = pinned(_ctx(NoPin(), dry_run=True), VenvPin)
    assert isinstance(verdict, Needed) and "no entry for this stage" in verdict.reason
    with pytest.raises(PreflightError, match="no entry for this stage"):
        pinned(_ctx(NoPin()), VenvPin)


@pytest.mark.parametrize(("content", "message"), [
    (None, "pin file not found"),
    ("{not json", "not a readable JSON pin file"),
    ('{"lock_version": 99, "stages": {}}', "not a pin file"),
    ('["a list"]', "not a pin file"),
])
def test_load_pin_refuses_what_is_not_a_lock(tmp_path: Path, content: str | None,
                                              message: str) -> None:
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_pin(path)
    assert err.value.exit_code == 2
    assert message in err.value.render()


def test_drift_lines_list_each_drifting_stage() -> None:
    rec = _record(**{"gpu-2": {"stages": {
        "drafter": {"status": "would-change", "reason": "drift: revision 'v1' is commit x"},
        "target": {"status": "would-change", "reason": "no manifest"},
        "venv": {"status": "ok", "reason": "python 3.11.7"},
    }}})
    assert drift_lines(rec, "L.json") == ["drift against L.json (1):",
                                          "  gpu-2 drafter: revision 'v1' is commit x"]
    assert drift_lines(_record(), "L.json") == ["no drift against L.json"]


# -------------------------------------------------------------- sglang launch normalization

def _launch(base: str, address: str) -> dict[str, Any]:
    args = ["--model-path", f"{base}/models/K", "--tp-size", "8", "--host", address,
            "--port", "30000", "--speculative-draft-model-path", f"{base}/models/K-eagle3",
            "--extra-thing", f"{base}/run/cache/x.json"]
    env = {"TRITON_CACHE_DIR": f"{base}/run/cache/triton", "NCCL_P2P_LEVEL": "SYS"}
    paths = {"model_path": f"{base}/models/K", "draft_model_path": f"{base}/models/K-eagle3",
             "state_dir": f"{base}/run", "cache_dir": f"{base}/run/cache",
             "python": f"{base}/venv/bin/python"}
    return launch_pin(args, env, paths, "0.5.23").to_json()


def test_launch_pin_is_the_same_on_hosts_with_other_base_dirs_and_addresses() -> None:
    staging, prod = _launch("/srv/a", "127.0.1.1"), _launch("/opt/orchestrator", "127.0.0.1")
    assert staging == prod
    assert staging["args"][:6] == ["--model-path", "<model_path>", "--tp-size", "8",
                                   "--host", "<host>"]
    assert "<draft_model_path>" in staging["args"]  # not <model_path>-eagle3
    assert "<cache_dir>/x.json" in staging["args"]  # the longest path wins
    assert staging["bind"] == "loopback"
    assert staging["env"]["names"] == ["NCCL_P2P_LEVEL", "TRITON_CACHE_DIR"]
    assert "SYS" not in json.dumps(staging)  # env values are hashed, never stored


def test_launch_pin_of_a_multinode_rank_keeps_the_port_not_node0s_address() -> None:
    def rank1(node0: str, port: int) -> list[str]:
        args = ["--model-path", "/m", "--nnodes", "2", "--node-rank", "1",
                "--dist-init-addr", f"{node0}:{port}"]
        return list(launch_pin(args, {}, {}, "0.5.23").args)

    assert rank1("10.0.0.21", 20000) == rank1("10.1.0.21", 20000)
    assert rank1("10.0.0.21", 20000)[-1] == "<node0>:20000"
    assert rank1("10.0.0.21", 20000) != rank1("10.0.0.21", 29500)


def test_launch_pin_sees_exposure_and_env_values() -> None:
    base = _launch("/srv/a", "127.0.0.1")
    assert _launch("/srv/a", "0.0.0.0")["bind"] == "all"
    other = launch_pin(["--model-path", "/m"], {"NCCL_P2P_LEVEL": "NVL"}, {}, "0.5.23").to_json()
    same = launch_pin(["--model-path", "/m"], {"NCCL_P2P_LEVEL": "SYS"}, {}, "0.5.23").to_json()
    assert other["env"]["names"] == same["env"]["names"]
    assert other["env"]["sha256"] != same["env"]["sha256"]
    assert base["env"]["sha256"] != same["env"]["sha256"]


def test_helpers() -> None:
    assert bind_scope("::1") == "loopback" and bind_scope("::") == "all"
    assert bind_scope("10.0.0.5") == "address" and bind_scope("gpu-box") == "address"
    assert placeholders({"m": "/a/K"}, ["/a/K", "/a/K/x", "/a/K2", "--p=/a/K"]) == \
        ["<m>", "<m>/x", "/a/K2", "--p=<m>"]
    assert arg_changes(["--a", "1", "--b"], ["--a", "2", "--c", "x"]) == \
        ["--a 1 -> 2", "--b (set) -> (unset)", "--c (unset) -> x"]
    assert arg_changes(["--a", "1"], ["--a", "1"]) == []


# -------------------------------------------------------------- pip_install under --locked

def _pip(*requirements: str) -> PipInstallStage:
    return PipInstallStage(PipInstallParams(python="/venv/bin/python",
                                            requirements=list(requirements)))


def _ctx(pin: StagePin | None, dry_run: bool = False) -> StageContext:
    return StageContext(spec=StageSpec(id="packages", uses="pip_install"), run_id="t",
                        log=structlog.get_logger(), dry_run=dry_run, pin=pin)


def test_pip_pins_every_requirement_to_its_locked_version() -> None:
    stage = _pip("sglang[all]>=0.5.10", "compressed_tensors>=0.10.0",
                 "uvloop; sys_platform == 'linux'")
    lock = PipPin({"sglang": "0.5.23", "compressed-tensors": "0.18.0", "uvloop": "0.21.0"})
    requirements, refusals = stage._pinned_requirements(lock)
    assert refusals == []
    assert requirements == ["sglang[all]==0.5.23", "compressed_tensors==0.18.0",
                      'uvloop==0.21.0; sys_platform == "linux"']


def test_pip_refuses_what_the_lock_cannot_give() -> None:
    stage = _pip("sglang==0.5.22", "huggingface_hub==2.4.0")
    lock = PipPin({"sglang": "0.5.23", "compressed-tensors": "0.18.0"})
    with pytest.raises(PreflightError) as err:
        stage._requirements(_ctx(lock))
    text = err.value.render()
    assert "'packages' refused by --locked" in text
    assert "'sglang==0.5.22' does not admit the locked version sglang 0.5.23" in text
    assert "huggingface_hub is required" in text and "no version of it" in text
    assert "the pin has compressed-tensors 0.18.0 but no requirement asks for it" in text
    assert "deploy without --locked" in text and "promote the new pin" in text
    # a dry run reports the same as drift instead of raising
    requirements, refusals = stage._pinned_requirements(lock)
    assert len(refusals) == 3 and requirements == []
    assert stage._requirements(_ctx(lock, dry_run=True)) == []


def test_a_stage_missing_from_the_lock_is_refused() -> None:
    with pytest.raises(PreflightError, match="no entry for this stage"):
        _pip("sglang==0.5.23")._requirements(_ctx(NoPin()))
    stage = _pip("sglang==0.5.23")
    assert stage._requirements(_ctx(None)) == ["sglang==0.5.23"]


def test_drift_reason_under_a_dry_run() -> None:
    verdict = refuse(_ctx(PipPin({}), dry_run=True), "x differs")
    assert isinstance(verdict, Needed)
    assert verdict.reason == "drift: x differs (deploy --locked refuses this)"
