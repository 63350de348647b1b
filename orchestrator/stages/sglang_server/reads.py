"""What `sglang_server` reads from the host besides the server status: the venv's versions,
both checkpoints (config, identity, weight size), the GPUs, SGLang's own argument validation,
and the preflight report assembled from them."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.errors import CommandTimeout
from orchestrator.facts.files import PathInfo, TensorNames
from orchestrator.facts.hardware import GpuHealth
from orchestrator.facts.network import TcpPort
from orchestrator.facts.programs import marked_result
from orchestrator.facts.pyenv import VenvInventory, venv_of
from orchestrator.facts.venv import VenvVersions
from orchestrator.host import Host
from orchestrator.remote import source
from orchestrator.sglang.multinode import NodeGroup, reach_problem
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
from orchestrator.stages.base import StageContext

#: programs run by the venv's python (real modules of orchestrator/remote/, shipped as text)
_CHECK_SCRIPT = source("sglang_check")
VENV_FACTS = source("venv_versions")


@dataclass(frozen=True)
class Desired:
    """The launch this deploy wants: server arguments, environment, fingerprint record, and
    this host's multi-node group (None for a single-node server)."""

    args: list[str]
    env: dict[str, str]
    fingerprint: dict[str, Any]
    group: NodeGroup | None = None


def group_reach(host: Host, group: NodeGroup, timeout: float = 3.0) -> TcpPort:
    """A TCP connect from this host to node 0's dist-init HOST:PORT (and whether it is ours)."""
    address, port = group.leader_address
    return host.fact(TcpPort, address=address, port=port, timeout=timeout)


def group_broken(host: Host, group: NodeGroup | None) -> str | None:
    """Why a running node rank >= 1 no longer has a group, or None.

    Node 0's torch.distributed store listens on the dist-init port for the group's life; when
    nothing accepts there (node 0's box rebooted, its server died) the ranks on this node wait
    for a group that is gone (real SGLang ends them too, once a collective fails: see
    orchestrator.sglang.multinode), so this node is launched again to rejoin a new one.
    """
    if group is None or group.leader:
        return None
    reach = group_reach(host, group)
    if reach.listening:
        return None
    return (f"the group's node 0 ({group.nodes[0]}, {group.dist_init_addr}) no longer serves "
            f"its dist-init port ({reach.reach}): the whole group restarts")


def check_group(host: Host, ctx: StageContext, group: NodeGroup, report: Report,
                wait: float = 0.0, probe_timeout: float = 3.0) -> None:
    """Refuse (in the preflight report) a launch that cannot form its group: node 0's
    dist-init address unreachable from this node, or not node 0's own.

    A node rank >= 1 that gets no answer (timeout, unreachable: node 0's box may be rebooting)
    asks again every few seconds for up to `wait` seconds (not in a dry run) before refusing.
    """
    deadline = time.monotonic() + (0.0 if ctx.dry_run else wait)
    while True:
        reach = group_reach(host, group, probe_timeout)
        problem = reach_problem(group, reach.reach, reach.local, reach.error)
        retry = reach.reach in ("timeout", "unreachable") and time.monotonic() < deadline
        if problem is None or not retry:
            break
        ctx.progress(f"node 0's dist-init address {group.dist_init_addr} does not answer "
                     f"({reach.reach}); asking again for {deadline - time.monotonic():.0f}s")
        ctx.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
    if problem is not None:
        report.refuse("multinode.dist-init-unreachable", "sched-init", problem)


def venv_versions(host: Host, python: str, timeout: float, nvfp4: bool = False) -> VenvVersions:
    """The venv's versions: read from its files (no interpreter, probe `venv_inventory`) when
    they settle it and NVFP4 support is not asked; else the venv's python answers VENV_FACTS
    (a failing python is an `error`)."""
    venv = None if nvfp4 else venv_of(python)
    if venv is not None:
        inv = host.fact(VenvInventory, path=venv,
                        names=["sglang", "compressed-tensors", "nvidia-cudnn-cu12"])
        if inv.settled and inv.versions is not None:
            return VenvVersions.from_answer({
                "python": inv.version, "sglang": inv.versions["sglang"],
                "compressed_tensors": inv.versions["compressed-tensors"],
                "cudnn": inv.versions.get("nvidia-cudnn-cu12")})
    argv = [python, "-c", VENV_FACTS] + (["--nvfp4"] if nvfp4 else [])
    r = host.run_argv(argv, timeout=max(60.0, timeout))
    if not r.ok:
        return VenvVersions.from_answer({"error": f"`{python}` failed (exit {r.exit_code}): "
                                                  f"{r.tail(3) or 'no output'}"})
    try:
        answer = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": f"unexpected output of {python}: {r.tail(3)}"}
    return VenvVersions.from_answer(answer)


def read_config(host: Host, path: str | None) -> dict[str, Any] | None:
    """PATH/config.json as a dict, or None."""
    if not path:
        return None
    try:
        data = host.read_json(f"{path.rstrip('/')}/config.json")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _sha16(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def identity(host: Host, path: str | None) -> str | None:
    """A checkpoint's identity for the fingerprint: its commit, else a hash of what is there."""
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


def weight_bytes(host: Host, path: str | None) -> int | None:
    """metadata.total_size of the checkpoint's model.safetensors.index.json, else the size of
    its single model.safetensors (a small drafter has no index), if any."""
    if not path:
        return None
    try:
        index = host.read_json(f"{path.rstrip('/')}/model.safetensors.index.json")
    except ValueError:
        index = None
    size = (index or {}).get("metadata", {}).get("total_size") if isinstance(
        index, dict) else None
    if isinstance(size, (int, float)) and size > 0:
        return int(size)
    single = host.fact(PathInfo, path=f"{path.rstrip('/')}/model.safetensors")
    return single.size if single.is_file and single.size else None


def vocab_map(host: Host, path: str | None, draft: dict[str, Any] | None) -> bool | None:
    """Whether a drafter that drafts over a reduced vocabulary has its map (a `d2t` tensor);
    None when it needs none or its tensor names cannot be read."""
    cfg = draft or {}
    small, full = cfg.get("draft_vocab_size"), cfg.get("vocab_size")
    if not path or not isinstance(small, int) or not isinstance(full, int) or small >= full:
        return None
    return host.fact(TensorNames, path=path, wanted=["d2t"]).has("d2t")


def _cc(value: str | None) -> tuple[int, int] | None:
    """"12.0" -> (12, 0); None when it is not MAJOR.MINOR."""
    major, dot, minor = str(value or "").partition(".")
    return (int(major), int(minor)) if dot and major.isdigit() and minor.isdigit() else None


def launch_gpus(gpu: GpuHealth) -> tuple[list[Gpu], str | None]:
    """The GPUs the launch rules check, or why there are none."""
    out = []
    for d in gpu.devices:
        cc = _cc(d.compute_capability)
        if d.index is not None and cc is not None and d.memory_total_mib is not None:
            out.append(Gpu(d.index, cc, d.memory_total_mib))
    if out:
        return out, None
    return [], gpu.error or "no GPU reported a compute capability"


def native_check(host: Host, ctx: StageContext, python: str, timeout: float,
                 desired: Desired) -> NativeCheck:
    """SGLang's own parsing + ServerArgs validation in the venv (no weights are loaded)."""
    ctx.progress(f"checking the launch with SGLang's own argument validation "
                 f"(up to {timeout:.0f}s)")
    started = time.monotonic()
    try:
        r = host.run_argv([python, "-c", _CHECK_SCRIPT, json.dumps(desired.args)],
                          timeout=timeout, env=desired.env)
    except CommandTimeout:
        return NativeCheck(True, kind="timeout", seconds=time.monotonic() - started)
    try:
        got = marked_result(r.stdout)
    except ValueError:
        got = None
    if not isinstance(got, dict):
        return NativeCheck(False, kind="no answer", message=r.tail(3))
    return NativeCheck(bool(got.get("available")), bool(got.get("ok")),
                       str(got.get("kind") or ""), str(got.get("message") or ""),
                       float(got.get("seconds") or 0.0))


def _nvfp4(host: Host, p: Any, target: dict[str, Any] | None,
           venv: VenvVersions) -> VenvVersions:
    """With an NVFP4 checkpoint: import compressed_tensors for real."""
    if NVFP4_FORMAT not in quant_formats(target) or venv.sglang is None:
        return venv
    probed = venv_versions(host, p.python, p.check_timeout, nvfp4=True)
    return probed if not probed.error else replace(venv, nvfp4=None, nvfp4_error=probed.error)


def host_facts(host: Host, ctx: StageContext, p: Any, desired: Desired, venv: VenvVersions,
               gpu: GpuHealth) -> tuple[HostFacts, str | None]:
    """The preflight's facts (and why GPU rules must be skipped, if they must)."""
    target = read_config(host, p.model_path)
    venv = _nvfp4(host, p, target, venv)
    facts = HostFacts(
        python=p.python, sglang_version=venv.sglang,
        compressed_tensors_version=venv.compressed_tensors, cudnn_version=venv.cudnn,
        nvfp4_known=venv.nvfp4, nvfp4_error=venv.nvfp4_error,
        target_config=target, draft_config=read_config(host, p.draft_model_path),
        env=dict(desired.env),
        target_weight_bytes=weight_bytes(host, p.model_path),
        draft_weight_bytes=weight_bytes(host, p.draft_model_path),
    )
    facts.draft_vocab_map = vocab_map(host, p.draft_model_path, facts.draft_config)
    gpu_note = None
    if facts.sglang_version:
        facts.gpus, gpu_note = launch_gpus(gpu)
        if p.native_check:
            facts.native = native_check(host, ctx, p.python, p.check_timeout, desired)
    return facts, gpu_note


def preflight(host: Host, ctx: StageContext, p: Any, desired: Desired, venv: VenvVersions,
              gpu: GpuHealth, mode: str | None) -> Report:
    """Run the preflight on the host's facts; record and log its outcome."""
    facts, gpu_note = host_facts(host, ctx, p, desired, venv, gpu)
    request = LaunchRequest(args=desired.args, model_path=p.model_path,
                            draft_model_path=p.draft_model_path, extra_args=p.extra_args,
                            group=desired.group)
    report = run_preflight(request, facts)
    if venv.error and not facts.sglang_version:
        report.findings[:1] = [Finding("stage.broken-venv", "start",
                                       f"{p.python}: {venv.error}; run the venv and "
                                       "pip stages first")]
    if gpu_note:
        report.warn("stage.no-gpu-facts", f"GPU rules skipped: {gpu_note}")
    if p.autostart and mode == "background":
        report.refuse("stage.autostart-without-systemd", "start",
                      "autostart: true needs systemd (PID 1 systemd and systemctl, as root); "
                      "this host has none: set autostart: false and re-run the deploy after "
                      "a reboot")
    if report.kv_pool is not None:
        ctx.record("kv_pool", report.kv_pool.to_json())
    native = report.native
    ctx.record("preflight", {
        "flags": report.flags_source, "rules": report.rules,
        "native": None if native is None else ("ok" if native.ok else native.kind)
        if native.available else "unavailable"})
    for w in report.warnings:
        ctx.warn("sglang.preflight", w)
    return report
