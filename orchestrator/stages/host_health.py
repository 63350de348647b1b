"""The `host_health` stage kind: is this GPU host fit to serve, and fix nvidia-uvm if not.

Example: playbooks/kimi-k2.6-eagle3.yaml; every param is described in its Params model.

`check` reads the host through typed facts (orchestrator.facts.hardware), records every one
(`gpus`, `uvm`, `shm`, `disk`, `xid`) and collects EVERY problem with the pure rules of
orchestrator.stages.host_health_rules. Problems it cannot fix raise one StageError listing
each with what to do. The one problem it can fix is nvidia-uvm in an LXC
container (FACTS.md): the uvm device major is dynamic, and the container's device cgroup
(`lxc.cgroup2.devices.allow` in /etc/pve/lxc/<ctid>.conf on the hypervisor) still names an old
one, or none; `nvidia-smi` works but cuInit returns 999. When `fix_uvm` is on and the inventory
gives the host a `hypervisor: {host, ctid}`, check answers Needed (its plan: a `UvmRepair`)
and `apply` gets that plan:

  1. runs `nvidia-modprobe -u -c=0` on the hypervisor (module loaded, nodes created);
  2. reads the CURRENT uvm major from the hypervisor's /proc/devices;
  3. reads /etc/pve/lxc/<ctid>.conf, writes a backup next to it
     (<ctid>.conf.orchestrator-<run_id>.bak, recorded as `uvm_fix.backup`), and rewrites the
     stale uvm allow line to the current major (or adds the line; the 195 line and everything
     else are left untouched) with an atomic write;
  4. restarts the container: `pct stop <ctid> && pct start <ctid>`. This KILLS every process
     in the container (a running server included) - expected: the GPUs are unusable anyway.
     It runs detached (setsid) on the hypervisor, so a dropped SSH session cannot stop it
     between the stop and the start and leave the container down;
  5. waits (up to `restart_wait`) for the container's SSH to come back and reconnects.

`verify` probes again in the container: cuInit(0) must now return 0. Without a hypervisor in
the inventory (or with `fix_uvm: false`) the StageError gives the exact conf line and the
commands to run on the hypervisor. In --dry-run the Needed reason says exactly which line of
which file would change.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.config.model import HypervisorSpec
from orchestrator.errors import (
    OrchestratorError,
    PreflightError,
    StageError,
    TransientConnectError,
)
from orchestrator.facts import to_data
from orchestrator.facts.hardware import (
    DirUsage,
    DiskFree,
    GpuHealth,
    KernelXid,
    ShmFacts,
    UvmFacts,
)
from orchestrator.host import Host
from orchestrator.stages.base import CheckResult, Converged, Needed, Stage, StageContext
from orchestrator.stages.host_health_rules import (
    MODPROBE,
    DiskBudget,
    HealthFacts,
    HostHealthParams,
    HypervisorView,
    Problem,
    UvmEdit,
    allow_line,
    cuda_init_needed,
    failure_text,
    plan_uvm_allow,
    problems,
    repair,
    repair_reason,
    summary,
    uvm_symptoms,
    verify_failure,
    version_less,
)

__all__ = ["HostHealthParams", "HostHealthStage", "Problem", "UvmEdit", "UvmRepair",
           "allow_line", "plan_uvm_allow", "uvm_symptoms", "version_less"]

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class UvmRepair:
    """check()'s plan for apply(): the uvm problem, the hypervisor, and the connection to it
    check opened (None when it could not; apply then opens one)."""

    problem: Problem
    hv: HypervisorSpec
    hypervisor: Host | None = None


def hypervisor_of(host: Host, ctx: StageContext) -> HypervisorSpec | None:
    """The inventory's `hypervisor: {host, ctid}` of this host, if any."""
    spec = ctx.inventory_hosts.get(host.name) or host.spec
    return getattr(spec, "hypervisor", None)


def open_hypervisor(ctx: StageContext, hv: HypervisorSpec) -> Host:
    """A connection to the hypervisor (closed by the runner after the stage)."""
    if ctx.open_host is None:
        raise StageError(f"cannot reach the hypervisor {hv.host}: this run gives stages no "
                         "access to other inventory hosts")
    return ctx.open_host(hv.host)


def read_hypervisor(h: Host, hv: HypervisorSpec) -> HypervisorView:
    """The container's conf, the current uvm major and the edit, as the hypervisor is now."""
    conf_path = f"/etc/pve/lxc/{hv.ctid}.conf"
    uvm = h.fact(UvmFacts, cuda=False)
    text = h.read_text(conf_path)
    if text is None:
        raise StageError(
            f"{h.name}: {conf_path} does not exist: container {hv.ctid} is not on this "
            "hypervisor", hint=f"check `pct list` on {h.name} and the inventory's "
            "`hypervisor: {host, ctid}` of this host")
    return HypervisorView.of(conf_path, text, uvm)


def rewrite_conf(h: Host, hv: HypervisorSpec, view: HypervisorView,
                 ctx: StageContext) -> dict[str, Any]:
    """Back the conf up and write the edit (when there is one); the `uvm_fix` record."""
    edit, conf_path = view.edit, view.conf_path
    assert edit is not None and view.major is not None
    record: dict[str, Any] = {"hypervisor": h.name, "ctid": hv.ctid, "conf": conf_path,
                              "major": view.major, "action": edit.action, "backup": None,
                              "changes": [list(c) for c in edit.changes]}
    if not edit.changed:
        return record
    backup = f"{conf_path}.orchestrator-{_SAFE.sub('_', ctx.run_id)}.bak"
    if h.read_file(backup) is None:  # a retry keeps the first (original) backup
        h.write_file(backup, view.text, mode=0o640)
    record["backup"] = backup
    ctx.progress(f"{h.name}: {edit.describe(conf_path)}")
    try:
        h.write_file(conf_path, edit.text)
    except OrchestratorError as exc:
        raise StageError(
            f"{h.name}: could not write {conf_path}: {exc.message}",
            hint=f"edit it by hand: {edit.describe(conf_path)}; then "
            f"`pct stop {hv.ctid} && pct start {hv.ctid}`") from exc
    ctx.log.info("uvm.conf_rewritten", hypervisor=h.name, conf=conf_path,
                 major=view.major, backup=backup)
    return record


class HostHealthStage(Stage, kind="host_health"):
    """Check GPUs, driver, CUDA/nvidia-uvm, /dev/shm and disk; repair uvm via the hypervisor."""

    Params = HostHealthParams
    params: HostHealthParams

    def read_facts(self, host: Host, ctx: StageContext) -> HealthFacts:
        """Every fact the rules need, each recorded in the run record."""
        p = self.params
        disk_reads = [(DiskFree, {"path": p.disk_path}), (DirUsage, {"path": p.disk_path})] \
            if p.disk_path else []
        gpus, uvm, shm, xid, *space = host.facts(
            (GpuHealth, {}), (UvmFacts, {"cuda": False}), (ShmFacts, {}), (KernelXid, {}),
            *disk_reads)
        if cuda_init_needed(p, gpus, uvm):  # a new process runs cuInit(0)
            uvm = host.fact(UvmFacts, cuda=True)
        disk = DiskBudget.of(space[0], space[1], p.disk_needed_gib) if space else None
        facts = HealthFacts(gpus, uvm, shm, xid, disk)
        for key, value in (("gpus", gpus), ("uvm", uvm), ("shm", shm), ("xid", xid),
                           ("disk", disk)):
            if value is not None:
                ctx.record(key, to_data(value))
        return facts

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        """Converged, Needed(plan=UvmRepair), or a PreflightError listing every problem."""
        facts = self.read_facts(host, ctx)
        hv = hypervisor_of(host, ctx)
        # restarting the container we run in would kill this very run
        found = problems(self.params, facts, hv, can_fix=host.spec.connection != "local")
        fix = repair(found)
        if found and fix is None:
            raise PreflightError(
                failure_text(host.name, found),
                hint="fix these on the host and run again (facts are in the run record)")
        if fix is None:
            return Converged(summary(facts))
        assert hv is not None  # only a known hypervisor makes a problem remediable
        h = None
        try:
            h = open_hypervisor(ctx, hv)
            view = read_hypervisor(h, hv)
        except OrchestratorError as exc:
            reason = repair_reason(fix.what, hv, None, exc.message)
        else:
            reason = repair_reason(fix.what, hv, view)
        return Needed(reason, plan=UvmRepair(fix, hv, h))

    def apply(self, host: Host, ctx: StageContext, plan: UvmRepair | None = None) -> None:
        """Repair nvidia-uvm through the hypervisor (the container restart kills its processes)."""
        hv = plan.hv if isinstance(plan, UvmRepair) else hypervisor_of(host, ctx)
        if hv is None:  # check() only answers Needed with a hypervisor
            raise StageError(f"{host.name}: no hypervisor configured to repair nvidia-uvm")
        h = plan.hypervisor if isinstance(plan, UvmRepair) else None
        h = h or open_hypervisor(ctx, hv)
        ctx.progress(f"{h.name}: {MODPROBE}")
        h.run(MODPROBE, timeout=120, check=True, what=f"{MODPROBE} on {h.name}",
              hint="run it as root on the hypervisor; the nvidia driver must be installed there")
        view = read_hypervisor(h, hv)
        if view.edit is None:
            raise StageError(
                f"{h.name}: the nvidia-uvm module is still not loaded after `{MODPROBE}` (no "
                "nvidia-uvm line in /proc/devices)",
                hint=f"on {h.name}: `modprobe nvidia-uvm`, check `dmesg | grep -i nvidia`")
        ctx.record("uvm_fix", rewrite_conf(h, hv, view, ctx))
        restart_container(host, h, hv.ctid, ctx, self.params.restart_wait)

    def verify(self, host: Host, ctx: StageContext) -> None:
        """cuInit(0) in the container must now return 0, with no uvm symptom left."""
        uvm = host.fact(UvmFacts, cuda=True)
        ctx.record("uvm_after", to_data(uvm))
        bad = verify_failure(uvm, hypervisor_of(host, ctx))
        if bad is not None:
            raise StageError(f"{host.name}: {bad[0]}", hint=bad[1])


def restart_container(host: Host, h: Host, ctid: int, ctx: StageContext, wait: float) -> None:
    """Restart the container on the hypervisor, then reconnect to it (up to `wait` s)."""
    ctx.progress(f"{h.name}: restarting container {ctid} ({host.name}); every process in "
                 "it is stopped")
    host.transport.close()  # the container's processes (our agent too) are about to die
    try:
        _restart_detached(h, ctid, timeout=max(120.0, wait))
    except BaseException:
        with contextlib.suppress(OrchestratorError):  # leave the host usable if it is up
            host.transport.connect(budget=min(wait, 30.0))
        raise
    ctx.progress(f"waiting up to {wait:.0f}s for SSH on {host.name}")
    transport = host.transport
    previous = getattr(transport, "on_wait", None)
    if hasattr(transport, "on_wait"):
        transport.on_wait = lambda attempt, elapsed, exc: ctx.progress(
            f"waiting for SSH on {host.name} after the restart: {elapsed:.0f}s of "
            f"{wait:.0f}s ({exc})")
    try:
        transport.connect(budget=wait)
    except TransientConnectError as exc:
        raise StageError(
            f"{host.name} did not come back within {wait:.0f}s after `pct start {ctid}` "
            f"on {h.name}: {exc.message}",
            hint=f"on {h.name}: `pct status {ctid}`, `pct enter {ctid}`; raise "
            "restart_wait if it boots slowly") from exc
    finally:
        if hasattr(transport, "on_wait"):
            transport.on_wait = previous
    ctx.progress(f"{host.name} is back")


def _restart_detached(h: Host, ctid: int, timeout: float) -> None:
    """`pct stop CTID && pct start CTID` on the hypervisor, detached from our SSH session.

    Run as a plain command, a session cut between the stop and the start (the agent kills its
    commands when the connection drops) would leave the container STOPPED, and nothing could
    reach it again. So the restart runs in its own session (setsid) and records its output and
    exit status under ~/.orchestrator/pct-restart-CTID-TOKEN/ on the hypervisor; we poll for
    the status, reconnecting as needed. The job starts at most once per call (mkdir guard), so
    a launch that is cut and re-sent never restarts the container twice.
    """
    job = f'"$HOME"/.orchestrator/pct-restart-{int(ctid)}-{secrets.token_hex(4)}'
    restart = (f"if pct status {int(ctid)} | grep -q running; then pct stop {int(ctid)}; fi "
               f"&& pct start {int(ctid)}")
    inner = (f'mkdir "$0" 2>/dev/null || exit 0; ({restart}) >"$0/log" 2>&1; '
             'echo $? >"$0/rc.tmp" && mv "$0/rc.tmp" "$0/rc"')
    launch = (f"mkdir -p \"$HOME\"/.orchestrator && setsid sh -c {shlex.quote(inner)} {job} "
              "</dev/null >/dev/null 2>&1 &")
    hint = (f"on {h.name}: `pct status {ctid}`, `pct start {ctid}`; see /var/log/pve/tasks or "
            f"`journalctl -u pve-container@{ctid}`")
    deadline = time.monotonic() + timeout
    launched = False
    while True:
        try:
            if not launched:
                h.run(launch, timeout=30, check=True,
                      what=f"starting the restart of container {ctid} on {h.name}", hint=hint)
                launched = True
            res = h.run(f"cat {job}/rc 2>/dev/null", timeout=30)
            if res.stdout.strip():
                break
        except TransientConnectError:
            pass  # the session was cut: the next call reconnects (a re-sent launch is a no-op)
        if time.monotonic() > deadline:
            raise StageError(
                f"restarting container {ctid} on {h.name} did not finish within {timeout:.0f}s: "
                f"{restart}", hint=hint)
        time.sleep(0.2)
    code = int(res.stdout.strip()) if res.stdout.strip().lstrip("-").isdigit() else -1
    out = ""
    for _ in range(2):  # the restart is done: a cut here must not fail the stage
        try:
            out = h.run(f"cat {job}/log 2>/dev/null; rm -rf {job}", timeout=30).stdout
            break
        except TransientConnectError:
            continue
    if code != 0:
        tail = "\n".join("    " + ln for ln in out.rstrip().splitlines()[-20:])
        raise StageError(
            f"restarting container {ctid} on {h.name} failed: exit code {code}\n"
            f"  command: {restart}" + (f"\n  output (last lines):\n{tail}" if tail else ""),
            hint=hint)
