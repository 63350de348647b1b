"""host_health against a simulated GPU box over SSH (strict host keys): a healthy host, the
nvidia-uvm cgroup fault and a reboot repaired through the Proxmox hypervisor (directly and
through the real CLI), and each failure it must explain. Plus the conf rewrite as pure code."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator.config.loader import load_inventory
from orchestrator.config.model import StageSpec
from orchestrator.errors import StageError
from orchestrator.host import Host
from orchestrator.stages.base import Converged, Needed, StageContext
from orchestrator.stages.host_health import (
    HostHealthStage,
    plan_uvm_allow,
    version_less,
)
from orchestrator.transports import make_transport
from orchestrator_sim.fleet import SimFleet
from tests.runner.helpers import cli, write_yaml
from tests.sim.conftest import assert_nothing_left, pid_alive

SCALE = 0.001
PARAMS: dict[str, Any] = {
    "gpus": 8, "min_gpu_memory_gib": 90, "min_driver": "570.26", "compute_capability": "12.0",
    "require_cuda": True, "min_shm_gib": 16, "disk_needed_gib": 1, "restart_wait": "30s",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    simdir = tmp_path_factory.mktemp("host_health") / "sim"
    f = SimFleet.up(simdir, hosts=1, time_scale=SCALE, index=False, hub=False)
    yield f
    pid = f.info().get("pid")
    f.down()
    assert_nothing_left(simdir, pid)


class Rig:
    """The simulated gpu-1 as a Host, and StageContexts that can open its hypervisor."""

    def __init__(self, fleet: SimFleet, run_id: str) -> None:
        self.fleet = fleet
        self.run_id = run_id
        inv = load_inventory(fleet.inventory_path)
        self.specs = {n: h.model_copy(update={"name": n}) for n, h in inv.hosts.items()}
        self.opened: list[Host] = []
        self.host = self.open("gpu-1")
        self.conf = fleet.simdir / "hosts/pve-1/root/etc/pve/lxc/101.conf"

    def open(self, name: str) -> Host:
        spec = self.specs[name]
        transport = make_transport(spec)
        transport.connect(budget=30)
        host = Host(spec, transport, dict(spec.vars))
        self.opened.append(host)
        return host

    def ctx(self, *, hypervisor: bool = True, ctid: int | None = None) -> StageContext:
        specs = dict(self.specs)
        if not hypervisor:
            specs["gpu-1"] = specs["gpu-1"].model_copy(update={"hypervisor": None})
        elif ctid is not None:
            hv = specs["gpu-1"].hypervisor.model_copy(update={"ctid": ctid})
            specs["gpu-1"] = specs["gpu-1"].model_copy(update={"hypervisor": hv})
        messages: list[str] = []
        ctx = StageContext(
            spec=StageSpec.model_validate({"id": "health", "uses": "host_health"}),
            run_id=self.run_id, log=structlog.get_logger("stage.host_health"),
            progress=messages.append, open_host=self.open, inventory_hosts=specs)
        ctx.progress_messages = messages  # type: ignore[attr-defined]
        return ctx

    def stage(self, **overrides: Any) -> HostHealthStage:
        params = dict(PARAMS, disk_path=f"{self.host.vars['base_dir']}/models", **overrides)
        return HostHealthStage(HostHealthStage.Params.model_validate(params))

    def close(self) -> None:
        for h in self.opened:
            h.transport.close()


@pytest.fixture
def rig(fleet: SimFleet, request: pytest.FixtureRequest) -> Iterator[Rig]:
    r = Rig(fleet, run_id=f"t-{request.node.name}")
    yield r
    r.close()


def failure(stage: HostHealthStage, rig: Rig, **ctx_kw: Any) -> str:
    with pytest.raises(StageError) as err:
        stage.check(rig.host, rig.ctx(**ctx_kw))
    return err.value.render()


def backups(rig: Rig) -> list[Path]:
    return sorted(rig.conf.parent.glob("101.conf.orchestrator-*.bak"))


# --------------------------------------------------------------------------- converged


def test_healthy_host_is_ok_and_every_fact_is_recorded(rig: Rig) -> None:
    ctx = rig.ctx()
    conf_before = rig.conf.read_text()
    verdict = rig.stage().check(rig.host, ctx)
    assert isinstance(verdict, Converged), verdict
    assert "8 x NVIDIA RTX PRO 6000 Blackwell Server Edition" in verdict.reason
    f = ctx.facts
    assert set(f) == {"gpus", "uvm", "shm", "disk", "xid"}
    g = f["gpus"]
    assert g["source"] == "nvml" and g["count"] == 8 and g["error"] is None
    assert g["driver_version"] == "580.95.05" and g["cuda_driver_version"] == "13.0"
    assert {d["compute_capability"] for d in g["devices"]} == {"12.0"}
    assert {d["memory_total_mib"] for d in g["devices"]} == {97887}
    assert all(d["ecc_uncorrected"] == 0 and d["pcie_gen"] == 5 for d in g["devices"])
    assert g["processes"] == []
    u = f["uvm"]
    assert u["cuda_init"]["code"] == 0 and u["cuda_init"]["source"] == "simhw"
    assert u["node"]["major"] == u["proc_major"] and u["open"]["ok"] and u["major_match"]
    # cgroup v2 (the simulator's default): no devices.list, so no rule to read
    assert u["cgroup"]["version"] != 1 and u["cgroup"]["allows_uvm"] is None
    assert f["shm"]["size"] == 128 * 1024**3
    assert f["disk"]["free"] > 10**9 and f["disk"]["needed"] == 1024**3
    assert f["xid"]["codes"] == []
    assert rig.conf.read_text() == conf_before  # check never touches the hypervisor


# --------------------------------------------------------------------------- uvm repair


def test_uvm_cgroup_fault_is_repaired_through_the_hypervisor(rig: Rig) -> None:
    fleet = rig.fleet
    original = rig.conf.read_text()
    fleet.fault("gpu-1", "uvm-cgroup")
    faulted = rig.conf.read_text()
    sleeper = int(fleet.ssh("gpu-1", "setsid sleep 317.5 >/dev/null 2>&1 </dev/null & "
                                     "echo $!").stdout.strip())
    stage, ctx = rig.stage(), rig.ctx()
    verdict = stage.check(rig.host, ctx)
    assert isinstance(verdict, Needed), verdict
    major = ctx.facts["uvm"]["proc_major"]
    assert ctx.facts["uvm"]["open"]["errno"] == "EPERM"
    assert ctx.facts["uvm"]["cuda_init"]["code"] == 999
    line = f"lxc.cgroup2.devices.allow: c {major}:* rwm"
    assert f"add '{line}' as line" in verdict.reason and "/etc/pve/lxc/101.conf" in verdict.reason
    assert "pct stop 101 && pct start 101" in verdict.reason
    assert rig.conf.read_text() == faulted  # the check is read-only
    assert verdict.plan.hv.ctid == 101 and verdict.plan.problem.key == "uvm"

    opened = len(rig.opened)
    stage.apply(rig.host, ctx, verdict.plan)  # as the runner does: check's plan, its connection
    assert len(rig.opened) == opened
    stage.verify(rig.host, ctx)
    conf = rig.conf.read_text()
    assert line in conf.splitlines()
    assert conf.replace(line + "\n", "") == faulted  # the 195 line and the rest untouched
    fix = ctx.facts["uvm_fix"]
    assert fix["action"] == "added" and fix["major"] == major and fix["ctid"] == 101
    backup = Path(str(rig.conf) + f".orchestrator-{rig.run_id}.bak")
    assert fix["backup"] == f"/etc/pve/lxc/101.conf.orchestrator-{rig.run_id}.bak"
    assert backup.read_text() == faulted
    assert ctx.facts["uvm_after"]["cuda_init"]["code"] == 0
    assert any("restarting container 101" in m for m in ctx.progress_messages)
    assert not pid_alive(sleeper)  # the container restart stopped its processes
    assert rig.host.run("echo back").stdout.strip() == "back"  # transport reconnected
    again = rig.stage().check(rig.host, rig.ctx())
    assert isinstance(again, Converged), again
    assert sorted(conf.splitlines()) == sorted(original.splitlines())


def test_reboot_rerolls_the_major_and_the_cli_repairs_it(fleet: SimFleet, tmp_path: Path) -> None:
    conf_path = fleet.simdir / "hosts/pve-1/root/etc/pve/lxc/101.conf"
    old = int(re.findall(r"c (\d+):\* rwm", conf_path.read_text())[-1])
    fleet.fault("gpu-1", "reboot", down_seconds=0.5)
    deadline = time.monotonic() + 20
    while fleet.ssh("gpu-1", "true", timeout=10).returncode != 0:
        assert time.monotonic() < deadline, "gpu-1 did not come back after the reboot"
        time.sleep(0.1)
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "health", "stages": [{
        "id": "health", "uses": "host_health",
        "with": dict(PARAMS, disk_path="{{ base_dir }}/models")}]})
    args = ("deploy", str(pb), "-i", str(fleet.inventory_path), "--limit", "gpu-1")
    before = conf_path.read_text()
    old_backups = set(conf_path.parent.glob("*.bak"))

    dry = cli(*args, "--dry-run", runs=tmp_path / "runs")
    assert dry.code == 0, dry.stdout + dry.stderr
    assert dry.statuses("gpu-1") == {"health": "would-change"}
    rec = dry.summary["hosts"]["gpu-1"]["stages"]["health"]
    new = dry.summary["hosts"]["gpu-1"]["facts"]["health"]["uvm"]["proc_major"]
    assert new != old
    assert (f"line 14 of /etc/pve/lxc/101.conf: 'lxc.cgroup2.devices.allow: c {old}:* rwm' -> "
            f"'lxc.cgroup2.devices.allow: c {new}:* rwm'") in rec["reason"]
    assert conf_path.read_text() == before
    assert set(conf_path.parent.glob("*.bak")) == old_backups

    run = cli(*args, runs=tmp_path / "runs")
    assert run.code == 0, run.stdout + run.stderr
    assert run.statuses("gpu-1") == {"health": "changed"}
    facts = run.summary["hosts"]["gpu-1"]["facts"]["health"]
    assert facts["uvm_fix"]["action"] == "replaced"
    assert facts["uvm_fix"]["changes"] == [[14, f"lxc.cgroup2.devices.allow: c {old}:* rwm",
                                            f"lxc.cgroup2.devices.allow: c {new}:* rwm"]]
    assert facts["uvm_after"]["cuda_init"]["code"] == 0
    assert conf_path.read_text() == before.replace(f"c {old}:* rwm", f"c {new}:* rwm")
    (backup,) = set(conf_path.parent.glob("101.conf.orchestrator-*.bak")) - old_backups
    assert backup.read_text() == before

    again = cli(*args, runs=tmp_path / "runs")
    assert again.code == 0 and again.statuses("gpu-1") == {"health": "ok"}, again.stdout


# --------------------------------------------------------------------------- failures


def test_without_a_hypervisor_the_error_gives_the_exact_line_and_commands(rig: Rig) -> None:
    rig.fleet.fault("gpu-1", "uvm-cgroup")
    try:
        conf, old_backups = rig.conf.read_text(), backups(rig)
        ctx = rig.ctx(hypervisor=False)
        with pytest.raises(StageError) as err:
            rig.stage().check(rig.host, ctx)
        msg = err.value.render()
        major = ctx.facts["uvm"]["proc_major"]
        assert f"`lxc.cgroup2.devices.allow: c {major}:* rwm`" in msg
        assert "/etc/pve/lxc/<CTID>.conf" in msg
        assert "`nvidia-modprobe -u -c=0`" in msg
        assert "`pct stop <CTID> && pct start <CTID>`" in msg
        assert "EPERM" in msg and "999" in msg
        # a hypervisor is known but fix_uvm is off: same advice, with the real CTID
        msg = failure(rig.stage(fix_uvm=False), rig)
        assert "/etc/pve/lxc/101.conf" in msg and "`pct stop 101 && pct start 101`" in msg
        assert rig.conf.read_text() == conf and backups(rig) == old_backups
    finally:
        rig.fleet.fault("gpu-1", "uvm-cgroup", on=False)


def test_a_wrong_ctid_is_refused_before_anything_is_restarted(rig: Rig) -> None:
    rig.fleet.fault("gpu-1", "uvm-cgroup")
    try:
        conf, old_backups = rig.conf.read_text(), backups(rig)
        stage, ctx = rig.stage(), rig.ctx(ctid=999)
        verdict = stage.check(rig.host, ctx)
        assert isinstance(verdict, Needed)
        assert "/etc/pve/lxc/999.conf does not exist" in verdict.reason
        with pytest.raises(StageError) as err:
            stage.apply(rig.host, ctx)
        assert "container 999 is not on this hypervisor" in err.value.message
        assert "pct list" in (err.value.hint or "")
        assert rig.conf.read_text() == conf and backups(rig) == old_backups
        assert rig.host.run("echo still-here").stdout.strip() == "still-here"  # no restart
    finally:
        rig.fleet.fault("gpu-1", "uvm-cgroup", on=False)


def test_gpu_missing_names_the_count_and_the_xid_79_line(rig: Rig) -> None:
    rig.fleet.fault("gpu-1", "gpu-missing")
    try:
        msg = failure(rig.stage(), rig)
    finally:
        rig.fleet.fault("gpu-1", "gpu-missing", on=False)
    assert "found 7 GPUs, expected 8" in msg
    assert re.search(r"NVRM: Xid \(PCI:0000:db:00\): 79, .*GPU has fallen off the bus", msg)
    assert "power-cycle the host" in msg
    assert "1 problem" in msg  # nothing else is wrong with the box


def test_shm_small_and_disk_full_are_reported_together_with_numbers(rig: Rig) -> None:
    rig.fleet.fault("gpu-1", "shm-small")
    rig.fleet.fault("gpu-1", "disk-full")
    try:
        msg = failure(rig.stage(disk_needed_gib=600), rig)
    finally:
        rig.fleet.fault("gpu-1", "shm-small", on=False)
        rig.fleet.fault("gpu-1", "disk-full", on=False)
    assert "2 problems" in msg
    assert "/dev/shm is 64 MiB, need >= 16 GiB" in msg and "ncclShmOpen" in msg
    assert "size=16G" in msg and "--shm-size=16g" in msg
    assert re.search(r"needs 600\.0 GiB in total: 0\.0 GiB already there, only 0\.1 GiB free",
                     msg)
    assert "short by 599.9 GiB" in msg


def test_old_driver_names_the_sm120_minimum(rig: Rig) -> None:
    rig.fleet.fault("gpu-1", "driver-old")
    try:
        msg = failure(rig.stage(), rig)
    finally:
        rig.fleet.fault("gpu-1", "driver-old", on=False)
    assert "NVIDIA driver 550.54.15 is older than 570.26" in msg and "sm_120" in msg
    assert "CUDA init returns 35 (CUDA_ERROR_INSUFFICIENT_DRIVER)" in msg


def test_busy_gpus_name_the_host_pids_unless_allowed(rig: Rig) -> None:
    rec = rig.fleet.fault("gpu-1", "stale-server", mib=50000)
    try:
        msg = failure(rig.stage(), rig)
        assert f"PID {rec['pid']} " in msg and "holds 400000 MiB on GPU 0-7" in msg
        assert f"`kill {rec['pid']}`" in msg and "HOST pids" in msg
        ctx = rig.ctx()
        verdict = rig.stage(allow_busy_gpus=True).check(rig.host, ctx)
        assert isinstance(verdict, Converged)
        assert {p["pid"] for p in ctx.facts["gpus"]["processes"]} == {rec["pid"]}
    finally:
        rig.fleet.fault("gpu-1", "stale-server", on=False)


def test_without_nvml_the_facts_come_from_nvidia_smi(rig: Rig) -> None:
    rig.fleet.fault("gpu-1", "nvml-absent")
    try:
        ctx = rig.ctx()
        verdict = rig.stage().check(rig.host, ctx)
    finally:
        rig.fleet.fault("gpu-1", "nvml-absent", on=False)
    assert isinstance(verdict, Converged), verdict
    g = ctx.facts["gpus"]
    assert g["source"] == "nvidia-smi" and "Not Found" in g["nvml"]["error"]
    assert g["count"] == 8 and g["driver_version"] == "580.95.05"
    assert g["cuda_driver_version"] == "13.0"
    d = g["devices"][0]
    assert d["compute_capability"] == "12.0" and d["memory_total_mib"] == 97887
    assert d["ecc_uncorrected"] == 0 and d["pcie_width"] == 16 and d["persistence_mode"]
    assert d["uuid"].startswith("GPU-")


# --------------------------------------------------------------------------- pure code

CONF = """\
arch: amd64
hostname: gpu-1
unprivileged: 1
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 509:0 rw
lxc.cgroup2.devices.allow: c 509:1 rwm
lxc.cgroup2.devices.allow: c 226:* rwm
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file

[before-upgrade]
lxc.cgroup2.devices.allow: c 509:0 rw
"""


def test_plan_replaces_the_stale_uvm_lines_only_in_the_main_section() -> None:
    edit = plan_uvm_allow(CONF, 237, {195: "nvidia-frontend", 226: "drm", 237: "nvidia-uvm"})
    assert edit.action == "replaced"
    assert edit.changes == [
        (5, "lxc.cgroup2.devices.allow: c 509:0 rw", "lxc.cgroup2.devices.allow: c 237:0 rw"),
        (6, "lxc.cgroup2.devices.allow: c 509:1 rwm", "lxc.cgroup2.devices.allow: c 237:1 rwm"),
    ]
    assert edit.text == CONF.replace("c 509:0 rw\nlxc", "c 237:0 rw\nlxc").replace(
        "c 509:1", "c 237:1")
    assert edit.text.endswith("[before-upgrade]\nlxc.cgroup2.devices.allow: c 509:0 rw\n")
    # already right: nothing to do, whatever the other lines say
    assert plan_uvm_allow(edit.text, 237, {}).action == "present"


def test_plan_adds_a_line_when_none_is_stale_and_keeps_the_key_spelling() -> None:
    v1 = "lxc.cgroup.devices.allow = c 195:* rwm\nlxc.cgroup.devices.allow = c 226:* rwm\nx: 1"
    edit = plan_uvm_allow(v1, 511, {195: "nvidia-frontend", 226: "drm"})
    assert edit.action == "added"
    assert edit.text == ("lxc.cgroup.devices.allow = c 195:* rwm\n"
                         "lxc.cgroup.devices.allow = c 226:* rwm\n"
                         "lxc.cgroup.devices.allow = c 511:* rwm\nx: 1")
    assert edit.changes == [(3, "", "lxc.cgroup.devices.allow = c 511:* rwm")]
    bare = plan_uvm_allow("arch: amd64", 511, {})
    assert bare.text == "arch: amd64\nlxc.cgroup2.devices.allow: c 511:* rwm\n"
    passthrough = "dev0: /dev/nvidia0\ndev1: /dev/nvidia-uvm,mode=0666\n"
    assert plan_uvm_allow(passthrough, 511, {}).action == "passthrough"
    # a line whose major another driver registers now is not taken for the uvm one
    edit = plan_uvm_allow("lxc.cgroup2.devices.allow: c 238:* rwm\n", 511, {238: "nvidia-caps"})
    assert edit.action == "added"


def test_params() -> None:
    p = HostHealthStage.Params.model_validate({"restart_wait": "5m", "compute_capability": 12})
    assert p.restart_wait == 300 and p.compute_capability == "12.0" and p.fix_uvm
    assert p.require_cuda and p.max_ecc_errors == 0 and not p.allow_busy_gpus
    assert HostHealthStage.Params.model_validate({"min_driver": 570.26}).min_driver == "570.26"
    for bad in ({"min_driver": "latest"}, {"disk_needed_gib": 5}, {"gpu": 8},
                {"restart_wait": "soon"}):
        with pytest.raises(ValueError):
            HostHealthStage.Params.model_validate(bad)
    assert version_less("550.54.15", "570.26") and not version_less("580.95.05", "570.26")
    assert not version_less("570.26", "570.26.00")

