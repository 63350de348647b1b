"""The `sglang_server` stage kind: launch SGLang (once), refusing bad launches before they start.

    - id: server
      uses: sglang_server
      needs: [packages, inspect]
      with:
        python: "{{ venv }}/bin/python"
        model_path: "{{ target_dir }}"
        draft_model_path: "{{ drafter_dir }}"
        tp: 8
        speculative: {algorithm: EAGLE3, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}
        host: "{{ sglang_host }}"
        port: "{{ sglang_port }}"
        served_model_name: kimi-k2.6
        tool_call_parser: kimi_k2
        reasoning_parser: kimi_k2
        mem_fraction_static: 0.88
        api_key: "{{ api_key }}"          # secret: never on argv, in logs or in the run record
        env: {NCCL_P2P_LEVEL: SYS}
        extra_args: []
        state_dir: "{{ base_dir }}/run"   # pid file, log, fingerprint, launch spec, key file

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

Lock file fact "lock": {sglang_version, args (host paths as <model_path>, <draft_model_path>,
<state_dir>, <cache_dir>; --host as <host>, --port kept), bind (loopback/all/address), env (names
and a sha256 of the values)}. Under `deploy --locked` a launch whose args, bind, env or SGLang
version differ from the lock is refused in check, before anything is stopped or started (under
`plan --locked`: a "drift: ..." reason). The API key is not part of the lock (per environment).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from orchestrator.config.model import parse_duration
from orchestrator.errors import CommandTimeout, PreflightError, StageError
from orchestrator.host import Host
from orchestrator.remote.server import SUPERVISOR, SUPERVISOR_FILE
from orchestrator.sglang import launch
from orchestrator.sglang.preflight import (
    NVFP4_FORMAT,
    HostFacts,
    LaunchRequest,
    NativeCheck,
    Report,
    quant_formats,
    run_preflight,
)
from orchestrator.sglang.rules import Finding, Gpu
from orchestrator.stages._locking import arg_changes, launch_lock, missing_entry, refuse
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext

_CHECK_SCRIPT = (Path(__file__).resolve().parent.parent / "remote" / "sglang_check.py"
                 ).read_text("utf-8")

VENV_FACTS = r"""
import json, sys
import importlib.metadata as md
def v(name):
    try:
        return md.version(name)
    except Exception:
        return None
out = {"python": sys.version.split()[0], "sglang": v("sglang"),
       "compressed_tensors": v("compressed-tensors")}
if "--nvfp4" in sys.argv[1:]:
    try:
        from compressed_tensors import CompressionFormat
        out["nvfp4"] = hasattr(CompressionFormat, "nvfp4_pack_quantized")
    except Exception as exc:
        out["nvfp4"] = None
        out["nvfp4_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""

_GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,memory.used",
              "--format=csv,noheader,nounits"]
_APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
               "--format=csv,noheader,nounits"]


def _duration(v: Any) -> float:
    return parse_duration(v)


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


class SGLangServerParams(Params):
    """Parameters of the sglang_server kind."""

    python: str = Field(description="the venv's python (has sglang installed)")
    model_path: str = Field(description="target checkpoint directory on the host")
    draft_model_path: str | None = Field(None, description="drafter directory (EAGLE-3)")
    tp: int = Field(1, ge=1, description="--tp-size")
    speculative: SpeculativeParams | None = None
    host: str = Field("127.0.0.1", description="--host (address the API binds)")
    port: int = Field(30000, ge=1, le=65535, description="--port")
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
    env: dict[str, str] = Field(default_factory=dict, description="server environment, e.g. "
                                "NCCL_P2P_LEVEL, NCCL_GRAPH_FILE")
    cache_dir: str | None = Field(None, description="persistent JIT caches (Triton, inductor, "
                                  "FlashInfer); default STATE_DIR/cache")
    state_dir: str = Field(description="pid file, log, fingerprint, launch spec, key file")
    stop_stale: bool = Field(False, description="stop a foreign process holding the port")
    systemd: Literal["auto", "never", "always"] = "auto"
    unit_name: str = Field("orchestrator-sglang", pattern=r"^[A-Za-z0-9:_.@-]+$",
                           description="systemd unit (a name: it goes under /etc/systemd/system)")
    autostart: bool = Field(False, description="enable the systemd unit (start at boot)")
    preflight: Literal["enforce", "warn", "off"] = "enforce"
    native_check: bool = Field(True, description="run SGLang's own argument validation in the "
                               "venv before launching (where SGLang and torch import)")
    check_timeout: float = Field(120.0, description="limit for SGLang's own validation")
    stop_timeout: float = Field(60.0, description="SIGTERM grace before SIGKILL")
    verify_window: float = Field(5.0, description="how long verify watches the new process")
    restart_unhealthy_after: float = Field(
        3600.0, description="a same-fingerprint server still not healthy this long after its "
        "start is restarted")

    @field_validator("check_timeout", "stop_timeout", "verify_window", "restart_unhealthy_after",
                     mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return _duration(v)

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


def _sha16(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _fmt_cmd(argv: list[str], limit: int = 160) -> str:
    text = " ".join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SGLangServer(Stage, kind="sglang_server"):
    """Run one SGLang server per host, with preflight, fingerprint and graceful restarts."""

    Params = SGLangServerParams
    params: SGLangServerParams

    def __init__(self, params: SGLangServerParams) -> None:
        super().__init__(params)
        self._status: dict[str, Any] | None = None
        self._desired: dict[str, Any] | None = None
        self._venv: dict[str, Any] = {}
        self._report: Report | None = None
        self._mode: str | None = None
        self._started_at = 0.0

    # ------------------------------------------------------------------ paths
    def _path(self, name: str) -> str:
        return f"{self.params.state_dir.rstrip('/')}/{name}"

    @property
    def _cache_dir(self) -> str:
        return self.params.cache_dir or self._path("cache")

    def _unit_path(self) -> str:
        return f"/etc/systemd/system/{launch.unit_name(self.params.unit_name)}"

    # ------------------------------------------------------------------ facts
    def _venv_facts(self, host: Host, nvfp4: bool = False) -> dict[str, Any]:
        p = self.params
        argv = [p.python, "-c", VENV_FACTS] + (["--nvfp4"] if nvfp4 else [])
        r = host.run_argv(argv, timeout=max(60.0, p.check_timeout))
        if not r.ok:
            return {"error": f"`{p.python}` failed (exit {r.exit_code}): "
                             f"{r.tail(3) or 'no output'}", "sglang": None}
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": f"unexpected output of {p.python}: {r.tail(3)}", "sglang": None}

    def _read_config(self, host: Host, path: str | None) -> dict[str, Any] | None:
        if not path:
            return None
        try:
            data = host.read_json(f"{path.rstrip('/')}/config.json")
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def _identity(self, host: Host, path: str | None) -> str | None:
        if not path:
            return None
        base = path.rstrip("/")
        raw = host.read_file(f"{base}/.orchestrator/manifest.json")
        if raw is not None:
            try:
                man = json.loads(raw)
            except ValueError:
                man = None
            if isinstance(man, dict):
                for key in ("commit", "sha", "revision_sha"):
                    if isinstance(man.get(key), str):
                        return f"commit:{man[key]}"
            return f"manifest:{_sha16(raw)}"
        cfg = host.read_file(f"{base}/config.json")
        return f"config:{_sha16(cfg)}" if cfg is not None else "missing"

    def _desired_launch(self, host: Host) -> dict[str, Any]:
        p = self.params
        args = launch.build_args(p)
        env = launch.launch_env(self._cache_dir, p.env)
        self._venv = self._venv_facts(host)
        fp = launch.fingerprint(
            args, env, sglang_version=self._venv.get("sglang"),
            model_identity=self._identity(host, p.model_path) or "missing",
            draft_identity=self._identity(host, p.draft_model_path),
            api_key=p.api_key, python=p.python,
        )
        return {"args": args, "env": env, "fingerprint": fp}

    def _gpus(self, host: Host) -> tuple[list[Gpu], str | None]:
        r = host.run_argv(_GPU_QUERY, timeout=30)
        if not r.ok:
            return [], f"nvidia-smi failed (exit {r.exit_code}): {r.tail(2)}"
        gpus = []
        for line in r.stdout.splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 4 and parts[0].isdigit() and "." in parts[2]:
                major, _, minor = parts[2].partition(".")
                if major.isdigit() and minor.isdigit() and parts[3].isdigit():
                    gpus.append(Gpu(int(parts[0]), (int(major), int(minor)), int(parts[3])))
        return gpus, None if gpus else "nvidia-smi printed no compute capability"

    def _gpu_apps(self, host: Host) -> list[dict[str, Any]]:
        r = host.run_argv(_APPS_QUERY, timeout=30)
        if not r.ok:
            return []
        apps = []
        for line in r.stdout.splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 3 and parts[0].isdigit():
                apps.append({"pid": int(parts[0]), "name": parts[1],
                             "used_mib": int(parts[2]) if parts[2].isdigit() else None,
                             "gpu": parts[3] if len(parts) > 3 else None})
        return apps

    def _native_check(self, host: Host, ctx: StageContext, args: list[str],
                      env: dict[str, str]) -> NativeCheck:
        """SGLang's own parsing + ServerArgs validation in the venv (no weights are loaded)."""
        p = self.params
        ctx.progress(f"checking the launch with SGLang's own argument validation "
                     f"(up to {p.check_timeout:.0f}s)")
        started = time.monotonic()
        try:
            r = host.run_argv([p.python, "-c", _CHECK_SCRIPT, json.dumps(args)],
                              timeout=p.check_timeout, env=env)
        except CommandTimeout:
            return NativeCheck(True, kind="timeout", seconds=time.monotonic() - started)
        for line in reversed(r.stdout.splitlines()):
            if line.startswith("ORCH_RESULT "):
                try:
                    got = json.loads(line[len("ORCH_RESULT "):])
                except ValueError:
                    break
                return NativeCheck(bool(got.get("available")), bool(got.get("ok")),
                                   str(got.get("kind") or ""), str(got.get("message") or ""),
                                   float(got.get("seconds") or 0.0))
        return NativeCheck(False, kind="no answer", message=r.tail(3))

    def _weight_bytes(self, host: Host, path: str | None) -> int | None:
        """metadata.total_size of the checkpoint's model.safetensors.index.json, if any."""
        if not path:
            return None
        try:
            index = host.read_json(f"{path.rstrip('/')}/model.safetensors.index.json")
        except ValueError:
            return None
        size = (index or {}).get("metadata", {}).get("total_size") if isinstance(
            index, dict) else None
        return int(size) if isinstance(size, (int, float)) and size > 0 else None

    def _preflight(self, host: Host, ctx: StageContext, desired: dict[str, Any]) -> Report:
        p = self.params
        target = self._read_config(host, p.model_path)
        draft = self._read_config(host, p.draft_model_path)
        venv = self._venv
        if NVFP4_FORMAT in quant_formats(target) and venv.get("sglang") is not None:
            probed = self._venv_facts(host, nvfp4=True)  # imports compressed_tensors for real
            venv = probed if not probed.get("error") else {
                **venv, "nvfp4": None, "nvfp4_error": probed["error"]}
        facts = HostFacts(
            python=p.python, sglang_version=venv.get("sglang"),
            compressed_tensors_version=venv.get("compressed_tensors"),
            nvfp4_known=venv.get("nvfp4"), nvfp4_error=venv.get("nvfp4_error"),
            target_config=target, draft_config=draft, env=dict(desired["env"]),
            target_weight_bytes=self._weight_bytes(host, p.model_path),
            draft_weight_bytes=self._weight_bytes(host, p.draft_model_path),
        )
        gpu_note = None
        if facts.sglang_version:
            facts.gpus, gpu_note = self._gpus(host)
            if p.native_check:
                facts.native = self._native_check(host, ctx, desired["args"], desired["env"])
        request = LaunchRequest(args=desired["args"], model_path=p.model_path,
                                draft_model_path=p.draft_model_path, extra_args=p.extra_args)
        report = run_preflight(request, facts)
        if venv.get("error") and not facts.sglang_version:
            report.findings[:1] = [Finding("stage.broken-venv", "start",
                                           f"{p.python}: {venv['error']}; run the venv and "
                                           "pip stages first")]
        if gpu_note:
            report.warn("stage.no-gpu-facts", f"GPU rules skipped: {gpu_note}")
        if p.autostart and self._mode == "background":
            report.refuse("stage.autostart-without-systemd", "start",
                          "autostart: true needs systemd (PID 1 systemd and systemctl, as root); "
                          "this host has none: set autostart: false and re-run the deploy after "
                          "a reboot")
        self._report = report
        native = report.native
        ctx.record("preflight", {
            "flags": report.flags_source, "rules": report.rules,
            "native": None if native is None else ("ok" if native.ok else native.kind)
            if native.available else "unavailable"})
        for w in report.warnings:
            ctx.log.warning("sglang.preflight", warning=w)
        return report

    def _launch_mode(self, host: Host) -> str:
        p = self.params
        if p.systemd == "never":
            return "background"
        info = host.probe("systemd")
        usable = bool(info.get("booted") and info.get("systemctl") and info.get("uid") == 0)
        if p.systemd == "always" and not usable:
            raise StageError(
                "systemd: always, but this host is not run by systemd (PID 1: "
                f"{info.get('pid1')}, systemctl: {info.get('systemctl') or 'missing'}, uid "
                f"{info.get('uid')})", hint="use systemd: auto or never")
        return "systemd" if usable else "background"

    # ------------------------------------------------------------------ deploy --locked
    def _lock_entry(self, desired: dict[str, Any]) -> dict[str, Any]:
        """The "lock" fact: SGLang version, launch args and env (names + hash), host paths
        replaced by placeholders and --host by <host> (orchestrator.stages._locking)."""
        p = self.params
        paths = {"model_path": p.model_path, "draft_model_path": p.draft_model_path,
                 "state_dir": p.state_dir, "cache_dir": self._cache_dir, "python": p.python}
        return launch_lock(desired["args"], desired["env"], paths, self._venv.get("sglang"))

    def _check_locked(self, ctx: StageContext, entry: dict[str, Any]) -> Needed | None:
        """Refuse (dry run: report) a launch that differs from the locked one."""
        verdict = missing_entry(ctx)
        if verdict is not None:
            return verdict
        locked = ctx.locked or {}
        drift = []
        if entry["args"] != locked.get("args"):
            drift.append("launch arguments (lock -> this deploy): "
                         + "; ".join(arg_changes(locked.get("args") or [], entry["args"])))
        if entry["bind"] != locked.get("bind"):
            drift.append(f"--host reaches {entry['bind']}, the lock's reached "
                         f"{locked.get('bind')}")
        old_env = locked.get("env") or {}
        if entry["env"] != old_env:
            a, b = set(old_env.get("names") or []), set(entry["env"]["names"])
            what = [f"+{n}" for n in sorted(b - a)] + [f"-{n}" for n in sorted(a - b)]
            drift.append("server environment: " + (", ".join(what) if what else
                                                   "a value changed (sha256 differs)"))
        want, have = locked.get("sglang_version"), entry["sglang_version"]
        if drift:
            return refuse(ctx, "; ".join(drift))
        if have is None or have == want:
            # not installed: under plan the packages stage would install the locked version;
            # under deploy the preflight reports the broken venv
            return None
        if ctx.dry_run:
            return Needed(f"drift: sglang {have} installed, the lock has {want} (deploy "
                          "--locked installs the locked version first, then restarts)")
        return refuse(ctx, f"sglang version: this deploy would run {have}, the lock has {want}")

    # ------------------------------------------------------------------ check
    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        p = self.params
        self._report = None
        status = host.probe("server_status", state_dir=p.state_dir, host=p.host, port=p.port)
        self._status = status
        desired = self._desired_launch(host)
        self._desired = desired
        entry = self._lock_entry(desired)
        ctx.record("lock", entry)
        if ctx.locked is not None:
            verdict = self._check_locked(ctx, entry)
            if verdict is not None:
                return verdict
        proc = status["process"]
        listener = status.get("listener")
        recorded = status.get("fingerprint")
        want = desired["fingerprint"]["fingerprint"]
        foreign = listener is not None and not listener.get("ours")
        if foreign:
            who = self._foreign(listener)
            held = [a for a in self._gpu_apps(host) if a["pid"] == listener.get("pid")]
            if held:
                who += (f"; it also holds {sum(a['used_mib'] or 0 for a in held)} MiB on "
                        f"{len(held)} GPU(s)")
            if not p.stop_stale:
                raise StageError(
                    f"a process not started by us ({who}) holds {p.host}:{p.port}",
                    hint=f"stop it (kill {listener.get('pid')}) or set `stop_stale: true` "
                    "on this stage to have it stopped, or use another port")
            ctx.record("stale_process", {"pid": listener.get("pid"),
                                         "cmdline": _fmt_cmd(listener.get("cmdline") or [])})
        reason: str
        if proc["same_process"] and not foreign:
            same = isinstance(recorded, dict) and recorded.get("fingerprint") == want and (
                (status.get("pidfile") or {}).get("fingerprint") in (None, want))
            if same:
                health = status.get("health") or {}
                uptime = proc.get("uptime_s") or 0.0
                if health.get("status") == 200:
                    return Converged(f"running (pid {proc['pid']}, up {uptime:.0f}s) with the same "
                                     "launch fingerprint; /health 200")
                state = health.get("error") or f"/health {health.get('status')}"
                if listener is None:
                    state = "port not listening yet"
                if uptime < p.restart_unhealthy_after:
                    return Converged(f"running (pid {proc['pid']}, up {uptime:.0f}s) with the same "
                                     f"launch fingerprint, still loading ({state}); wait_ready "
                                     "waits for it")
                reason = (f"running (pid {proc['pid']}) but not healthy ({state}) {uptime:.0f}s "
                          f"after its start: restart")
            else:
                changes = launch.diff_fingerprints(recorded, desired["fingerprint"])
                reason = ("running with a different launch fingerprint (changed: "
                          + "; ".join(changes) + ")")
        else:
            reason = "not running"
            exit_rec = status.get("exit")
            if isinstance(exit_rec, dict) and not exit_rec.get("stop_requested"):
                how = (f"exit code {exit_rec.get('code')}" if exit_rec.get("code") is not None
                       else f"signal {exit_rec.get('signal')}")
                reason += f" (the last server exited with {how})"
            elif status.get("pidfile") and not status.get("stop_requested") and not exit_rec:
                reason += " (the recorded server is gone)"
            if proc["same_process"]:
                reason = f"running (pid {proc['pid']})"
            if foreign:
                reason += (f"; a process not started by us ({self._foreign(listener)}) holds "
                           f"port {p.port}: it will be stopped (stop_stale)")
        # a launch is needed: refuse it now if it cannot work
        self._mode = self._launch_mode(host)
        if p.preflight != "off":
            if ctx.dry_run and (not self._venv.get("sglang") or
                                self._read_config(host, p.model_path) is None):
                return Needed(reason + "; preflight deferred: the venv or the checkpoint is not "
                              "there yet (earlier stages would install it)")
            report = self._preflight(host, ctx, desired)
            if report.problems and p.preflight == "enforce":
                report.raise_if_problems()
            for prob in report.problems:
                ctx.log.warning("sglang.preflight.ignored", problem=prob)
        others = self._other_gpu_users(host, status, listener)
        if others:
            reason += "; GPU memory held by other processes: " + ", ".join(others)
            ctx.log.warning("sglang.gpus_in_use", processes=others)
        return Needed(reason)

    @staticmethod
    def _foreign(listener: dict[str, Any]) -> str:
        pid = listener.get("pid")
        if pid is None:
            return "a process this user cannot see"
        return f"pid {pid}, cmdline {_fmt_cmd(listener.get('cmdline') or []) or '?'}"

    def _other_gpu_users(self, host: Host, status: dict[str, Any],
                         listener: dict[str, Any] | None) -> list[str]:
        apps = self._gpu_apps(host)
        if not apps:
            return []
        ours = set()
        pidfile = status.get("pidfile") or {}
        if status["process"]["same_process"]:
            ours |= {pidfile.get("pid"), pidfile.get("supervisor_pid")}
        per_pid: dict[int, list[dict[str, Any]]] = {}
        for a in apps:
            if a["pid"] not in ours:
                per_pid.setdefault(a["pid"], []).append(a)
        out = []
        for pid, rows in sorted(per_pid.items()):
            mib = sum(r["used_mib"] or 0 for r in rows)
            note = " (on our port: stop_stale stops it)" if listener and \
                listener.get("pid") == pid and self.params.stop_stale else ""
            out.append(f"pid {pid} ({rows[0]['name']}, {len(rows)} GPU(s), {mib} MiB){note}")
        return out

    # ------------------------------------------------------------------ apply
    def apply(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        if self._status is None or self._desired is None:
            verdict = self.check(host, ctx)
            if isinstance(verdict, Converged):
                return
        status, desired = self._status, self._desired
        assert status is not None and desired is not None
        if p.preflight != "off" and self._report is None:
            report = self._preflight(host, ctx, desired)
            if report.problems and p.preflight == "enforce":
                report.raise_if_problems()
        mode = self._mode or self._launch_mode(host)
        # 1. stop what must go
        if status["process"]["same_process"] or status["process"].get("supervisor_alive"):
            old = status["process"]["pid"]
            ctx.progress(f"stopping the previous server (pid {old})")
            res = self._stop_ours(host, status)
            ctx.record("stopped_previous", {"pid": old, "forced": res.get("forced"),
                                            "waited_s": res.get("waited_s")})
        listener = status.get("listener")
        if listener is not None and not listener.get("ours") and p.stop_stale:
            pid = listener.get("pid")
            if pid is None:
                raise StageError(f"a process we cannot see holds {p.host}:{p.port}",
                                 hint="stop it by hand (run as root?)")
            ctx.progress(f"stopping the stale process {pid} on port {p.port}")
            res = host.probe("process_stop", pid=pid, grace=p.stop_timeout)
            if res.get("error") or not res.get("stopped"):
                raise StageError(f"could not stop the stale process {pid}: "
                                 f"{res.get('error') or 'still alive after SIGKILL'}")
            ctx.record("stopped_stale", {"pid": pid, "forced": res.get("forced"),
                                         "cmdline": _fmt_cmd(listener.get("cmdline") or [])})
        self._wait_port_free(host)
        # 2. write the launch files
        args, env, fp = desired["args"], desired["env"], desired["fingerprint"]
        key_file = self._path("api_key") if p.api_key else None
        if key_file:
            host.write_file(key_file, p.api_key + "\n", mode=0o600)
        else:
            host.run_argv(["rm", "-f", self._path("api_key")])
        argv = launch.server_argv(p.python, key_file, args)
        spec = {
            "argv": argv, "env": env, "log": self._path("server.log"),
            "pid_file": self._path("server.pid"), "exit_file": self._path("server.exit"),
            "key_file": key_file, "fingerprint": fp["fingerprint"], "cwd": p.state_dir,
            "mkdirs": sorted({v for k, v in env.items() if k in launch.CACHE_ENV}),
            "managed_by": mode, "unit": launch.unit_name(p.unit_name) if mode == "systemd"
            else None,
            "served_model_name": p.served_model_name, "model_path": p.model_path,
            "speculative_algorithm": p.speculative.algorithm if p.speculative else None,
            "host": p.host, "port": p.port,
        }
        host.write_file(self._path("launch.json"), json.dumps(spec, indent=1) + "\n", mode=0o600)
        host.write_file(self._path("fingerprint.json"), json.dumps(fp, indent=1) + "\n",
                        mode=0o600)
        # 3. start
        self._started_at = time.time()
        if mode == "systemd":
            info = self._start_systemd(host, ctx)
        else:
            res = host.probe("server_start", state_dir=p.state_dir, python=p.python)
            if "error" in res:
                tail = "\n".join(res.get("log_tail") or []) or res.get("stderr") or ""
                raise StageError(f"the server could not be started: {res['error']}"
                                 + (f"\n  last log lines:\n{_indent(tail)}" if tail else ""))
            info = res["pidfile"]
        ctx.record("pid", info.get("pid"))
        ctx.record("managed_by", mode)
        ctx.record("fingerprint", fp["fingerprint"][:16])
        ctx.record("log", self._path("server.log"))
        ctx.record("sglang_version", self._venv.get("sglang"))
        if self._report is not None:
            ctx.record("flags_source", self._report.flags_source)
            if self._report.warnings:
                ctx.record("preflight_warnings", self._report.warnings)
        ctx.log.info("sglang.started", pid=info.get("pid"), mode=mode,
                     args=_fmt_cmd(args, 400))

    def _stop_ours(self, host: Host, status: dict[str, Any]) -> dict[str, Any]:
        p = self.params
        pidfile = status.get("pidfile") or {}
        if pidfile.get("managed_by") == "systemd" and pidfile.get("unit"):
            host.run_argv(["systemctl", "stop", pidfile["unit"]], timeout=p.stop_timeout + 30)
        res = host.probe("server_stop", state_dir=p.state_dir, grace=p.stop_timeout)
        if res.get("error") or not res.get("stopped", True):
            raise StageError(f"could not stop the previous server (pid {res.get('pid')}): "
                             f"{res.get('error') or 'still alive after SIGKILL'}")
        return res

    def _wait_port_free(self, host: Host, timeout: float = 15.0) -> None:
        p = self.params
        deadline = time.monotonic() + timeout
        while True:
            st = host.probe("server_status", state_dir=p.state_dir, host=p.host, port=p.port,
                            health_path="")
            listener = st.get("listener")
            if listener is None:
                return
            if time.monotonic() > deadline:
                raise StageError(
                    f"port {p.host}:{p.port} is still held ({self._foreign(listener)}) "
                    f"{timeout:.0f}s after stopping the previous server",
                    hint="stop that process, or use another port")
            time.sleep(0.1)

    def _start_systemd(self, host: Host, ctx: StageContext) -> dict[str, Any]:
        p = self.params
        unit = launch.unit_name(p.unit_name)
        sup = self._path(SUPERVISOR_FILE)
        host.write_file(sup, SUPERVISOR, mode=0o644)
        text = launch.unit_file(
            unit=unit, description=f"SGLang server {p.served_model_name or p.model_path} "
            "(orchestrator)", python=p.python, supervisor=sup,
            launch_file=self._path("launch.json"), state_dir=p.state_dir,
            stop_timeout=p.stop_timeout + 10)
        host.write_file(self._unit_path(), text, mode=0o644)
        host.run_argv(["systemctl", "daemon-reload"], check=True, timeout=60,
                      what="systemctl daemon-reload")
        host.run_argv(["systemctl", "restart", unit], check=True, timeout=120,
                      what=f"systemctl restart {unit}")
        action = "enable" if p.autostart else "disable"
        host.run_argv(["systemctl", action, unit], check=True, timeout=60,
                      what=f"systemctl {action} {unit}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st = host.probe("server_status", state_dir=p.state_dir)
            pf = st.get("pidfile") or {}
            if pf.get("started_at", 0) >= self._started_at - 1:
                return pf
            time.sleep(0.2)
        r = host.run_argv(["systemctl", "status", "--no-pager", unit], timeout=30)
        raise StageError(f"systemd started {unit} but its server never wrote "
                         f"{self._path('server.pid')}:\n{_indent(r.tail(15))}")

    # ------------------------------------------------------------------ verify
    def verify(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        deadline = time.monotonic() + p.verify_window
        while True:
            st = host.probe("server_status", state_dir=p.state_dir, log_lines=30)
            pf = st.get("pidfile") or {}
            proc = st["process"]
            if not proc["same_process"] or pf.get("started_at", 0) < self._started_at - 1:
                exit_rec = st.get("exit") or {}
                how = (f"exit code {exit_rec.get('code')}" if exit_rec.get("code") is not None
                       else f"signal {exit_rec.get('signal')}" if exit_rec.get("signal")
                       else "no exit record")
                tail = "\n".join(st.get("log_tail") or []) or "(the log is empty)"
                raise StageError(
                    f"the SGLang server exited right after its start ({how}); last lines of "
                    f"{st['log_path']}:\n{_indent(tail)}",
                    hint="fix what the log says (a bad argument, the GPUs, the checkpoint), "
                    "then deploy again")
            if time.monotonic() >= deadline:
                return
            ctx.sleep(min(0.2, max(0.01, deadline - time.monotonic())))


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


__all__ = ["PreflightError", "SGLangServer", "SGLangServerParams", "SpeculativeParams"]
