"""The `sglang_server` stage kind: launch SGLang (once), refusing bad launches before they start.

Example: playbooks/kimi-k2.6-eagle3.yaml; every param is described in its Params model.

check: converged when the server recorded in `state_dir` is alive (the same process, not a
recycled pid), was launched with the same FINGERPRINT (arguments, environment, SGLang version,
model and drafter identity, API key hash) and answers /health 200 - or is still loading (port
closed / 503) for less than `restart_unhealthy_after`. Otherwise it says why: "not running",
"running with a different launch fingerprint (changed: ...)", a stale process of someone else on
the port (an error unless `stop_stale: true`). Before any launch - and in a dry run - the
PREFLIGHT (orchestrator.sglang.preflight) runs SGLang's own argument validation in the venv
(remote/sglang_check.py, `native_check`, bounded by `check_timeout`; where SGLang and torch
import), checks the launch against the installed release's generated flags and the rules read
from the real source (both config.json files, the checkpoint's weight size, the GPUs), and
refuses with every problem at once.

apply: stops our previous server (SIGTERM to its process group, SIGKILL after `stop_timeout`),
the stale one if `stop_stale`, then starts the supervisor (orchestrator.remote.server) with
setsid - or, where systemd runs the host (`systemd: auto`), a unit `systemctl restart`ed - and
returns at once: readiness is `wait_ready`'s job. verify: the process is still alive
`verify_window` after the start (a bad argument shows at once), else the log tail is reported.
With `restart_on_failure` (default on; never for a multi-node group, change.restart_policy)
the launch spec carries the supervisor's restart policy (orchestrator.sglang.launch.
RESTART_ON_FAILURE: 1, 2, 4 ... 30 s apart, at most 5 within 300 s; part of the fingerprint)
and the systemd unit restarts the supervisor itself; a server its supervisor restarted (a new
pid, the same fingerprint) is ours and converged.

Multi-node TP (orchestrator/sglang/multinode.py): with `nodes: "{{ groups.gpu }}"` (two or more
inventory hosts, node 0 first) every node gets `--nnodes N --node-rank R --dist-init-addr
NODE0:dist_init_port` (or `dist_init_addr`). Before a launch, node 0 must own that address and
every other node must reach it (probe `tcp_port`; no answer is asked again for up to
`dist_init_wait`; refused in the preflight otherwise). A running
node rank >= 1 whose node 0 no longer listens there is launched again: one rank dying ends the
group in real SGLang, so after either box reboots the whole group restarts.

The pin (fact "pin", rules.py ServerPin): {sglang_version, args (host paths as <model_path>,
<draft_model_path>, <state_dir>, <cache_dir>; --host as <host>, --port kept), bind
(loopback/all/address), env (names and a sha256 of the values)}. Under `deploy --locked` a launch
whose args, bind, env or SGLang version differ from the pin is refused in check, before anything
is stopped or started (under `plan --locked`: a "drift: ..." reason). The API key is not pinned
(per environment).

check() returns Needed(reason, plan=LaunchPlan) and apply() receives that plan.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from orchestrator.config.model import Duration
from orchestrator.errors import PreflightError, StageError
from orchestrator.facts.hardware import GpuHealth
from orchestrator.facts.server import ServerStatus, SystemdInfo
from orchestrator.facts.venv import VenvVersions
from orchestrator.host import Host
from orchestrator.sglang import launch
from orchestrator.sglang.api import DEFAULT_HOST, DEFAULT_PORT
from orchestrator.sglang.multinode import DEFAULT_DIST_INIT_PORT, NodeGroup, node_group
from orchestrator.sglang.preflight import Report
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.pin import pinned, refuse
from orchestrator.stages.sglang_server import change, reads, rules
from orchestrator.stages.sglang_server.layout import ServerLayout
from orchestrator.stages.sglang_server.reads import Desired
from orchestrator.stages.sglang_server.rules import ServerPin, launch_pin, pin_drift, version_drift


class SpeculativeParams(Params):
    """Speculative decoding settings (`--speculative-*`)."""

    algorithm: str | None = Field(None, description="EAGLE3, EAGLE, NEXTN, STANDALONE, NGRAM, "
                                  "DFLASH (0.5.15+), or null for none")
    num_steps: int | None = Field(None, ge=1, description="--speculative-num-steps")
    eagle_topk: int | None = Field(None, ge=1, description="--speculative-eagle-topk")
    num_draft_tokens: int | None = Field(None, ge=1,
                                         description="--speculative-num-draft-tokens")
    draft_model_revision: str | None = Field(
        None, description="--speculative-draft-model-revision (SGLang uses 'main' when unset)")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.strip().upper() if isinstance(v, str) and v.strip() else (None if v == "" else v)


class RestartOnFailure(Params):
    """`restart_on_failure:` as a mapping: how often and how soon the supervisor restarts."""

    max: int = Field(5, ge=1, description="give up after this many restarts within `window`")
    window: Duration = Field(300.0, gt=0)
    backoff: Duration = Field(1.0, gt=0, description="the first delay; doubled per restart")
    backoff_max: Duration = Field(30.0, gt=0)


class SGLangServerParams(Params):
    """Parameters of the sglang_server kind."""

    python: str = Field(description="the venv's python (has sglang installed)")
    model_path: str = Field(description="target checkpoint directory on the host")
    draft_model_path: str | None = Field(None, description="drafter directory (EAGLE-3)")
    tp: int = Field(1, ge=1, description="--tp-size")
    speculative: SpeculativeParams | None = None
    host: str = Field(DEFAULT_HOST, description="--host (address the API binds)")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="--port")
    served_model_name: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    context_length: int | None = Field(None, ge=1)
    max_running_requests: int | None = Field(None, ge=1)
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    quantization: str | None = None
    trust_remote_code: bool = Field(False, description="--trust-remote-code")
    api_key: str | None = Field(None, description="SECRET: --api-key, passed through a 0600 "
                                "file read in-process, never argv")
    enable_metrics: bool = True
    log_level: str | None = None
    extra_args: list[str] = Field(default_factory=list,
                                  description="more server arguments, checked like the rest")
    nodes: list[str] = Field(default_factory=list, description="multi-node TP: the group's "
                             "inventory hosts in node-rank order, e.g. \"{{ groups.gpu }}\"; "
                             "empty or one name = a single-node server")
    dist_init_addr: str | None = Field(None, description="--dist-init-addr HOST:PORT (default: "
                                       "node 0's inventory address and dist_init_port)")
    dist_init_port: int = Field(DEFAULT_DIST_INIT_PORT, ge=1, le=65535,
                                description="port of node 0's torch.distributed store")
    dist_timeout: int | None = Field(None, ge=1, description="--dist-timeout seconds (SGLang: "
                                     "torch's 30 minutes when unset)")
    dist_init_wait: Duration = Field(300.0, description="how long a node rank >= 1 waits for node "
                                  "0's dist-init address to answer (its box may be rebooting) "
                                  "before the launch is refused")
    env: dict[str, str] = Field(default_factory=dict, description="server environment, e.g. "
                                "NCCL_P2P_LEVEL, NCCL_GRAPH_FILE")
    cache_dir: str | None = Field(None, description="the kernel caches (Triton, inductor, "
                                  "FlashInfer, DeepGEMM, SGLang's own; kept across restarts and "
                                  "reboots); default VENV/../kernel-cache/sglang-VERSION")
    state_dir: str = Field(description="pid file, log, fingerprint, launch spec, key file")
    stop_stale: bool = Field(False, description="stop a foreign process holding the port")
    systemd: Literal["auto", "never", "always"] = "auto"
    unit_name: str = Field("orchestrator-sglang", pattern=r"^[A-Za-z0-9:_.@-]+$",
                           description="systemd unit (a name: it goes under /etc/systemd/system)")
    autostart: bool = Field(False, description="enable the systemd unit (start at boot)")
    restart_on_failure: bool | RestartOnFailure = Field(
        True, description="the supervisor restarts a server that exited non-zero or by a "
        "signal (no stop asked) after 1, 2, 4 ... 30 s, and gives up after 5 restarts within "
        "300 s (launch spec \"restart\"; systemd units: Restart=on-failure for the supervisor); "
        "a mapping sets max/window/backoff/backoff_max; never for a multi-node group (a rank "
        "cannot rejoin alone: the next deploy restarts the group)")
    preflight: Literal["enforce", "warn", "off"] = "enforce"
    native_check: bool = Field(True, description="run SGLang's own argument validation in the "
                               "venv before launching (where SGLang and torch import)")
    check_timeout: Duration = Field(120.0, description="limit for SGLang's own validation")
    stop_timeout: Duration = Field(60.0, description="SIGTERM grace before SIGKILL")
    verify_window: Duration = Field(5.0, description="how long verify watches the new process")
    restart_unhealthy_after: Duration = Field(
        3600.0, description="a same-fingerprint server still not healthy this long after its "
        "start is restarted")

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): (("true" if x else "false") if isinstance(x, bool) else str(x))
                    for k, x in v.items()}
        return v

    @field_validator("extra_args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        if isinstance(v, str):
            return shlex.split(v)
        if isinstance(v, list):
            return [str(x) for x in v]
        return v


@dataclass(frozen=True)
class LaunchPlan:
    """What check() found and decided, handed to apply(): the status, the wanted launch, the
    venv's versions, the preflight report (None when deferred or off) and the launch mode."""

    status: ServerStatus
    desired: Desired
    venv: VenvVersions
    report: Report | None
    mode: str


class SGLangServer(Stage, kind="sglang_server"):
    """Run one SGLang server per host, with preflight, fingerprint and graceful restarts."""

    speculative_check = True
    disruptive = True  # a launch stops the running server (behind a gateway: gated)

    Params = SGLangServerParams
    params: SGLangServerParams
    Pin = ServerPin

    @property
    def _layout(self) -> ServerLayout:
        return ServerLayout(self.params.state_dir)

    def _group(self, host: Host, ctx: StageContext) -> NodeGroup | None:
        p = self.params
        return node_group(p.nodes, host.name, ctx.inventory_hosts, dist_timeout=p.dist_timeout,
                          dist_init_addr=p.dist_init_addr, dist_init_port=p.dist_init_port)

    def _cache_dir(self, venv: VenvVersions) -> str:
        """The kernel caches' directory: `cache_dir`, else beside the venv (or in the state
        dir when `python` is not a venv's), one per SGLang release (launch.kernel_cache_dir)."""
        p = self.params
        return p.cache_dir or launch.kernel_cache_dir(p.python, self._layout.cache, venv.sglang)

    def _desired(self, host: Host, venv: VenvVersions, group: NodeGroup | None) -> Desired:
        p = self.params
        args = launch.build_args(p) + (group.args() if group else [])
        env = launch.launch_env(self._cache_dir(venv), p.env)
        fp = launch.fingerprint(
            args, env, sglang_version=venv.sglang,
            model_identity=reads.identity(host, p.model_path) or "missing",
            draft_identity=reads.identity(host, p.draft_model_path),
            api_key=p.api_key, python=p.python, restart=change.restart_policy(p),
        )
        return Desired(args, env, fp, group)

    def _launch_mode(self, host: Host) -> str:
        p = self.params
        info = None if p.systemd == "never" else host.fact(SystemdInfo)
        return rules.launch_mode(p.systemd, info)

    def _pin(self, desired: Desired, venv: VenvVersions) -> ServerPin:
        """This launch's pin: SGLang version, launch args and env (names + hash), host paths
        replaced by placeholders and --host by <host> (rules.py)."""
        p = self.params
        paths = {"model_path": p.model_path, "draft_model_path": p.draft_model_path,
                 "state_dir": p.state_dir, "cache_dir": self._cache_dir(venv),
                 "python": p.python}
        return launch_pin(desired.args, desired.env, paths, venv.sglang)

    @staticmethod
    def _check_pin(ctx: StageContext, entry: ServerPin) -> Needed | None:
        """Under --locked: refuse (dry run: report) a launch that differs from the pinned one."""
        pin = pinned(ctx, ServerPin)
        if not isinstance(pin, ServerPin):
            return pin
        drift = pin_drift(entry, pin)
        if drift:
            return refuse(ctx, "; ".join(drift))
        version = version_drift(entry.sglang_version, pin.sglang_version, dry_run=ctx.dry_run)
        if version is None:
            return None
        kind, message = version
        return Needed(message) if kind == "needed" else refuse(ctx, message)

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        """Converged when our server runs with the same fingerprint; else what a launch needs
        (the plan apply() receives), after the preflight refused what cannot work."""
        p = self.params
        status = host.fact(ServerStatus, state_dir=p.state_dir, host=p.host, port=p.port)
        venv = reads.venv_versions(host, p.python, p.check_timeout)
        desired = self._desired(host, venv, self._group(host, ctx))
        entry = self._pin(desired, venv)
        ctx.record("pin", entry.to_json())
        refused = self._check_pin(ctx, entry)
        if refused is not None:
            return refused
        gpu = self._check_stale(host, ctx, status)
        verdict = rules.server_verdict(status, desired.fingerprint, port=p.port,
                                       restart_after=p.restart_unhealthy_after)
        broken = reads.group_broken(host, desired.group) if verdict.converged else None
        if verdict.converged and broken is None:
            return Converged(verdict.reason)
        return self._needed(host, ctx, broken or verdict.reason, status, desired, venv, gpu)

    def _check_stale(self, host: Host, ctx: StageContext,
                     status: ServerStatus) -> GpuHealth | None:
        """A foreign process on our port: refused unless stop_stale (then recorded)."""
        p = self.params
        listener = status.foreign_listener
        if listener is None:
            return None
        gpu = host.fact(GpuHealth)
        held = [a for a in gpu.processes if a.pid == listener.pid]
        problem = rules.stale_refusal(listener, held, bind=p.host,
                                      port=p.port, stop_stale=p.stop_stale)
        if problem is not None:
            raise problem
        ctx.record("stale_process", {"pid": listener.pid,
                                     "cmdline": rules.fmt_cmd(listener.cmdline)})
        return gpu

    def _needed(self, host: Host, ctx: StageContext, reason: str, status: ServerStatus,
                desired: Desired, venv: VenvVersions, gpu: GpuHealth | None) -> Needed:
        """A launch is needed: refuse it now if it cannot work; say who else holds GPUs."""
        p = self.params
        if ctx.ahead:  # only a Converged early answer is used: the preflight waits its turn
            return Needed(reason)
        mode = self._launch_mode(host)
        report = None
        if p.preflight != "off":
            if ctx.dry_run and (not venv.sglang or
                                reads.read_config(host, p.model_path) is None):
                return Needed(reason + "; preflight deferred: the venv or the checkpoint is not "
                              "there yet (earlier stages would install it)")
            gpu = gpu or host.fact(GpuHealth)
            report = self._preflight(host, ctx, desired, venv, gpu, mode)
            if report.kv_pool is not None:
                reason += f"; {report.kv_pool.line()}"
        gpu = gpu or host.fact(GpuHealth)
        others = rules.other_gpu_users(status, gpu.processes, stop_stale=p.stop_stale)
        if others:
            reason += "; GPU memory held by other processes: " + ", ".join(others)
            ctx.log.warning("sglang.gpus_in_use", processes=others)
        return Needed(reason, plan=LaunchPlan(status, desired, venv, report, mode))

    def _preflight(self, host: Host, ctx: StageContext, desired: Desired, venv: VenvVersions,
                   gpu: GpuHealth, mode: str) -> Report:
        p = self.params
        report = reads.preflight(host, ctx, p, desired, venv, gpu, mode)
        if desired.group is not None:
            reads.check_group(host, ctx, desired.group, report, p.dist_init_wait)
        if report.problems and p.preflight == "enforce":
            report.raise_if_problems()
        for prob in report.problems:
            ctx.log.warning("sglang.preflight.ignored", problem=prob)
        return report

    def apply(self, host: Host, ctx: StageContext, plan: LaunchPlan | None = None) -> None:
        """Stop what must go, write the launch files, start; `plan` comes from check()."""
        p = self.params
        if plan is None:
            verdict = self.check(host, ctx)
            if isinstance(verdict, Converged):
                return
            plan = verdict.plan
            if plan is None:  # a dry run's deferred preflight: nothing was decided
                raise StageError(f"sglang_server cannot launch: {verdict.reason}")
        report = plan.report
        if p.preflight != "off" and report is None:
            report = self._preflight(host, ctx, plan.desired, plan.venv, host.fact(GpuHealth),
                                     plan.mode)
        change.stop_previous(host, ctx, p, plan.status)
        change.write_launch_files(host, p, plan.desired, plan.mode)
        started_at = time.time()
        if plan.mode == "systemd":
            info = change.start_systemd(host, p, started_at)
        else:
            info = change.start_background(host, p)
        self._record_start(ctx, plan, report, info.pid if info else None)

    def _record_start(self, ctx: StageContext, plan: LaunchPlan, report: Report | None,
                      pid: int | None) -> None:
        ctx.record("pid", pid)
        ctx.record("managed_by", plan.mode)
        ctx.record("fingerprint", plan.desired.fingerprint["fingerprint"][:16])
        ctx.record("log", self._layout.log)
        ctx.record("sglang_version", plan.venv.sglang)
        if report is not None:
            ctx.record("flags_source", report.flags_source)
            if report.warnings:
                ctx.record("preflight_warnings", report.warnings)
        ctx.log.info("sglang.started", pid=pid, mode=plan.mode,
                     args=rules.fmt_cmd(plan.desired.args, 400))

    def verify(self, host: Host, ctx: StageContext) -> None:
        """The server apply started (ctx.facts["pid"]) is still alive `verify_window` later."""
        p = self.params
        deadline = time.monotonic() + p.verify_window
        while True:
            st = host.fact(ServerStatus, state_dir=p.state_dir, log_lines=30)
            how = rules.started_too_soon(st, ctx.facts.get("pid"))
            if how is not None:
                st = self._settled(host, st)
                how = rules.started_too_soon(st, ctx.facts.get("pid")) or how
                tail = "\n".join(st.log_tail) or "(the log is empty)"
                raise StageError(
                    f"the SGLang server exited right after its start ({how}); last lines of "
                    f"{st.log_path}:\n{change.indent(tail)}",
                    hint="fix what the log says (a bad argument, the GPUs, the checkpoint), "
                    "then deploy again")
            if time.monotonic() >= deadline:
                return
            ctx.sleep(min(0.2, max(0.01, deadline - time.monotonic())))

    def _settled(self, host: Host, st: ServerStatus, wait: float = 3.0) -> ServerStatus:
        """The status once the supervisor has written the exit record (it may still be at it)."""
        deadline = time.monotonic() + wait
        while st.exit is None and st.process.supervisor_alive and time.monotonic() < deadline:
            time.sleep(0.05)
            st = host.fact(ServerStatus, state_dir=self.params.state_dir, log_lines=30)
        return st


__all__ = ["PreflightError", "SGLangServer", "SGLangServerParams", "SpeculativeParams"]
