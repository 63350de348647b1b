"""Preflight of an SGLang launch: refuse in seconds what would fail at start, after a 15-minute
load, at the first request - or run and waste the deploy.

Three sources decide, in this order of authority:

1. SGLang's own argument parsing and ServerArgs validation, run on the host in the venv where
   SGLang and torch import (the real box); its error is reported verbatim (`NativeCheck`).
2. The flags of the installed release, generated from its real wheel (orchestrator/sglang/
   releases, `flags_for`): unknown, removed, ambiguous and deprecated flags, choices, arity.
3. The rules of orchestrator/sglang/rules, read from the real source of every supported release:
   mostly what SGLang finds only after the load or never reports.

Inputs are plain data, so every rule is tested from tables:

    facts   = HostFacts(...)        what the host has: versions, configs, GPUs, weight sizes
    request = LaunchRequest(...)    the server arguments we are about to use
    report  = run_preflight(request, facts)
    report.problems / report.warnings / report.findings; report.raise_if_problems()

Options are read the way SGLang's argparse parses them (prefixes resolved, the last occurrence
wins), so an override in `extra_args` is checked the same as a stage parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import PreflightError
from orchestrator.sglang.flags import FlagSet, flags_for
from orchestrator.sglang.hfconfig import Config, quant_formats
from orchestrator.sglang.multinode import NodeGroup
from orchestrator.sglang.releases import RELEASES
from orchestrator.sglang.rules import EXPENSIVE, Finding, Gpu, Launch, Options, evaluate
from orchestrator.sglang.rules.memory import KvPool, predict
from orchestrator.sglang.rules.quantization import NVFP4_FORMAT

__all__ = ["NVFP4_FORMAT", "HostFacts", "LaunchRequest", "NativeCheck", "Report",
           "quant_formats", "run_preflight"]


# ------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class NativeCheck:
    """The outcome of SGLang's own parsing + ServerArgs validation on the host."""

    available: bool  # SGLang's server_args imported (False: torch or SGLang missing)
    ok: bool = False
    kind: str = ""  # "argparse" (exit 2), an exception class name, or "timeout"
    message: str = ""
    seconds: float = 0.0


@dataclass
class HostFacts:
    """What the host has, gathered by the stage before launching anything."""

    python: str
    sglang_version: str | None
    compressed_tensors_version: str | None = None
    #: nvidia-cudnn-cu12's version in the venv (torch's cuDNN on a pip install); None: unknown
    cudnn_version: str | None = None
    #: hasattr(CompressionFormat, "nvfp4_pack_quantized") in the venv; None = not checked
    nvfp4_known: bool | None = None
    nvfp4_error: str | None = None
    target_config: Config | None = None
    draft_config: Config | None = None
    gpus: list[Gpu] = field(default_factory=list)
    flags: FlagSet | None = None
    #: environment the server will get (launch env)
    env: dict[str, str] = field(default_factory=dict)
    #: metadata.total_size of model.safetensors.index.json (bytes) of target and drafter
    target_weight_bytes: int | None = None
    draft_weight_bytes: int | None = None
    #: whether the drafter's checkpoint holds its vocabulary map (a `d2t` tensor); None: unknown
    draft_vocab_map: bool | None = None
    native: NativeCheck | None = None


@dataclass
class LaunchRequest:
    """The launch being checked: server arguments (without the API key) and where they came from."""

    args: list[str]
    model_path: str
    draft_model_path: str | None = None
    extra_args: list[str] = field(default_factory=list)
    #: the playbook's node group for this host (the stage's `nodes`); None: a single node
    group: NodeGroup | None = None


@dataclass
class Report:
    """Findings of one preflight (problems refuse, warnings inform), plus the effective options."""

    findings: list[Finding] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    flags_source: str = "release"
    native: NativeCheck | None = None
    #: the KV pool predicted from the release's formulas (rules/memory.py), when knowable
    kv_pool: KvPool | None = None

    def refuse(self, rule: str, phase: str, message: str) -> None:
        self.findings.append(Finding(rule, phase, message))

    def warn(self, rule: str, message: str) -> None:
        self.findings.append(Finding(rule, "start", message, warning=True))

    @property
    def problems(self) -> list[str]:
        return [f.message for f in self.findings if not f.warning]

    @property
    def warnings(self) -> list[str]:
        return [f.message for f in self.findings if f.warning]

    @property
    def rules(self) -> list[str]:
        """The ids of the rules that refused (in order)."""
        return [f.rule for f in self.findings if not f.warning]

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_problems(self, what: str = "sglang_server preflight") -> None:
        """Raise one PreflightError listing every problem (nothing was launched)."""
        refused = [f for f in self.findings if not f.warning]
        if not refused:
            return
        n = len(refused)
        lines = [f"{what}: {n} problem{'s' if n != 1 else ''} found before launching anything:"]
        for f in refused:
            when = (" [real SGLang: only after the weights load]" if f.phase in EXPENSIVE[:2]
                    else " [real SGLang: starts, but the deploy is wasted]"
                    if f.phase == "silent" else "")
            lines.append(f"  - {f.message}{when}")
        raise PreflightError(
            "\n".join(lines),
            hint="fix the stage parameters (or the pip/download stages) as each problem says; "
            "nothing was started")


# ------------------------------------------------------------------------------ options


def _values(args: list[str], i: int, arity: str, inline: str | None) -> tuple[list[str], int]:
    """The values an option takes from args[i:] (argparse: up to the next '--' option)."""
    if inline is not None:
        return [inline], i
    values: list[str] = []
    if arity in ("one", "many", "optional", "unknown"):
        while i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
            if arity in ("one", "optional"):
                break
    return values, i


def _resolve(name: str, flags: FlagSet, report: Report) -> str | None:
    """The canonical flag `name` resolves to, reporting what argparse would say about it."""
    version = flags.version
    res = flags.resolve(name)
    if res.kind == "ambiguous":
        report.refuse("argparse.ambiguous", "argparse",
                      f"{name} is not a flag of sglang {version}; argparse will stop with "
                      f"`ambiguous option: {name} could match {', '.join(res.matches)}`"
                      + (f" ({flags.removed[name]})" if name in flags.removed else "")
                      + ": use the full flag name")
        return None
    if res.kind == "unknown":
        if name in flags.removed:
            report.refuse("argparse.removed", "argparse",
                          f"{name} does not exist in sglang {version}: {flags.removed[name]}")
        elif flags.authoritative:
            report.refuse("argparse.unknown", "argparse",
                          f"{name} is not a flag of sglang {version}: remove it or install a "
                          "release that has it")
        else:
            report.warn("argparse.unverified",
                        f"{name} could not be verified: sglang {version} has no generated flag "
                        f"file, and the nearest older one ({flags.data_version}) lacks it")
        return None
    if res.kind == "prefix":
        report.warn("argparse.prefix",
                    f"{name} is not a flag of sglang {version} but argparse accepts it as an "
                    f"abbreviation of {res.canonical}; write {res.canonical} instead")
    if res.canonical in flags.deprecated:
        report.warn("argparse.deprecated", f"{res.canonical} is deprecated in sglang {version}: "
                    f"{flags.deprecated[res.canonical]}")
    return res.canonical


def parse_options(args: list[str], flags: FlagSet, report: Report) -> dict[str, Any]:
    """Parse `args` like SGLang's argparse: canonical option -> value (last one wins)."""
    opts: dict[str, Any] = {}
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        short = len(token) > 1 and token[0] == "-" and token[1].isalpha()  # -h
        if not (token.startswith("--") or short) or token == "--":
            report.refuse("argparse.stray-value", "argparse",
                          f"unexpected argument {token!r}: every server argument must follow an "
                          "option (check extra_args)")
            continue
        name, eq, inline = token.partition("=")
        canon = _resolve(name, flags, report)
        if canon == "--help":
            report.refuse("argparse.help", "argparse",
                          f"{name} makes launch_server print its usage and exit 0: the server "
                          "would never start; remove it from extra_args")
        arity = flags.arity.get(canon or "", "unknown")
        if arity == "none" and eq:
            report.refuse("argparse.switch-value", "argparse",
                          f"{name} takes no value (got {token!r}): write {name} alone")
        values, i = _values(args, i, arity, inline if eq else None)
        if arity == "one" and not values:
            report.refuse("argparse.missing-value", "argparse", f"{name} needs a value")
        key = canon or name
        opts[key] = (True if arity == "none" else values if arity == "many"
                     else values[0] if len(values) == 1 else (values or True))
        for v in values if canon in flags.choices else []:
            if v not in flags.choices[canon]:
                report.refuse("argparse.choice", "argparse",
                              f"{canon} {v} is not accepted by sglang {flags.version}; choose "
                              "one of: " + ", ".join(flags.choices[canon]))
    return opts


# ------------------------------------------------------------------------------ the preflight

_OWNED = {"--host": "host", "--port": "port", "--model-path": "model_path"}


def _check_extra_args(request: LaunchRequest, flags: FlagSet, report: Report) -> None:
    for token in request.extra_args:
        if not token.startswith("--"):
            continue
        canon = flags.resolve(token.split("=", 1)[0]).canonical or token.split("=", 1)[0]
        if canon == "--api-key":
            report.refuse("stage.api-key-on-argv", "start",
                          "extra_args sets --api-key: the key would be visible in `ps` to every "
                          "user of the host; use the stage's api_key parameter (it reaches SGLang "
                          "through a 0600 file, never argv)")
        elif canon in _OWNED:
            report.refuse("stage.owned-flag", "start",
                          f"extra_args sets {canon}: use the stage parameter `{_OWNED[canon]}` "
                          "instead (the stage checks that address and fingerprints that model)")


#: the flags the stage writes from `nodes` (multinode.NodeGroup.args)
_GROUP_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr")


def _check_group_flags(request: LaunchRequest, flags: FlagSet, report: Report) -> None:
    """--nnodes/--node-rank/--dist-init-addr in extra_args must agree with the playbook's group.

    A server told of peers the playbook does not start waits for them in torch.distributed's
    rendezvous until --dist-timeout (multinode.py); one told of fewer forms a group without the
    others. Either way the deploy waits out the whole ready timeout.
    """
    given = parse_options(request.extra_args, flags, Report())
    group = request.group
    values = (group.nnodes, group.rank, group.dist_init_addr) if group else (1, 0, None)
    wanted = dict(zip(_GROUP_FLAGS, values, strict=True))
    fix = ("remove it from extra_args: the stage writes --nnodes/--node-rank/--dist-init-addr "
           "from `nodes` (the inventory hosts in rank order, e.g. \"{{ groups.gpu }}\"), with "
           "dist_init_addr/dist_init_port for node 0's address")
    for flag in _GROUP_FLAGS:
        value = given.get(flag)
        if value is None:
            continue
        want = wanted.get(flag)
        if want is not None and str(value) == str(want):
            continue
        if group is None:
            where = ("this playbook runs a single-node server (the stage's `nodes` names no "
                     "group)")
        else:
            where = (f"the playbook's group is {group.nnodes} nodes ({', '.join(group.nodes)}) "
                     f"with this host as node rank {group.rank} and node 0 at "
                     f"{group.dist_init_addr}, so the stage sets {flag} {want}")
        report.refuse("stage.extra-args-vs-nodes", "sched-init",
                      f"extra_args sets {flag} {value}, but {where}: the server would wait "
                      f"for peers that never come until the distributed timeout; {fix}")


def _check_configs(request: LaunchRequest, facts: HostFacts, opts: Options,
                   report: Report) -> None:
    if facts.target_config is None:
        report.refuse("stage.no-target-config", "start",
                      f"{request.model_path}/config.json is missing or not JSON: model_path must "
                      "be the downloaded checkpoint directory (run the download stage)")
    if request.draft_model_path and facts.draft_config is None:
        report.refuse("stage.no-draft-config", "start",
                      f"{request.draft_model_path}/config.json is missing or not JSON: "
                      "draft_model_path must be the downloaded drafter directory (run the "
                      "download stage)")
    cfg = facts.target_config
    if isinstance(cfg, dict) and cfg.get("auto_map") and not opts.flag("--trust-remote-code"):
        report.warn("stage.remote-code",
                    f"{request.model_path}/config.json uses custom code (auto_map) but "
                    "--trust-remote-code is not set: set trust_remote_code: true if loading fails")


def _check_native(native: NativeCheck | None, report: Report) -> None:
    """SGLang's own verdict, verbatim, when it could run on the host."""
    report.native = native
    if native is None or not native.available or native.ok:
        return
    if native.kind == "timeout":
        report.warn("native.timeout", f"SGLang's own argument check did not finish in "
                    f"{native.seconds:.0f}s; the generated flags and our rules decided")
        return
    lines = [ln.strip() for ln in native.message.strip().splitlines() if ln.strip()]
    said = [ln for ln in lines if "error:" in ln] or lines[-1:] or ["(no message)"]
    words = " ".join(said)[-600:]
    phase = "argparse" if native.kind == "argparse" else "start"
    rule = "native." + ("argparse" if native.kind == "argparse" else "server-args")
    if report.problems:
        report.refuse(rule, phase, f"SGLang's own validation also refuses it ({native.kind}): "
                      f"{words}")
    else:
        report.refuse(rule, phase, f"SGLang's own validation refuses this launch ({native.kind}): "
                      f"{words} -- no rule of ours covers it: change what SGLang names")


def run_preflight(request: LaunchRequest, facts: HostFacts) -> Report:
    """Check one launch against the host's facts; return every finding."""
    report = Report()
    version = facts.sglang_version
    if not version:
        report.refuse("stage.no-sglang", "start",
                      f"sglang is not installed in {facts.python} (importlib.metadata finds no "
                      "'sglang'): run the pip stage first")
        return report
    try:
        flags = facts.flags or flags_for(version)
    except KeyError as exc:
        report.refuse("stage.unsupported-release", "start", str(exc).strip("'\""))
        return report
    report.flags_source = flags.source
    if not flags.authoritative:
        report.warn("stage.unverified-release",
                    f"sglang {version} is not a verified release: it has no table of its own "
                    f"(verified: {', '.join(RELEASES)}), so its flags and rules are those of "
                    f"{flags.data_version}, the nearest older one, and may miss what changed "
                    f"since. Pin a verified release in the pip stage, or add {version} to "
                    "scripts/sync_sglang.py and run `make sync-sglang`")
    opts = Options(parse_options(request.args, flags, report), flags)
    report.options = dict(opts.values)
    _check_extra_args(request, flags, report)
    _check_group_flags(request, flags, report)
    _check_configs(request, facts, opts, report)
    launch = Launch(
        version=version, options=opts, model_path=request.model_path,
        target=facts.target_config, draft=facts.draft_config, gpus=list(facts.gpus),
        env=dict(facts.env), target_weight_bytes=facts.target_weight_bytes,
        draft_weight_bytes=facts.draft_weight_bytes, python=facts.python,
        draft_vocab_map=facts.draft_vocab_map,
        compressed_tensors_version=facts.compressed_tensors_version,
        cudnn_version=facts.cudnn_version,
        nvfp4_known=facts.nvfp4_known, nvfp4_error=facts.nvfp4_error)
    report.findings += evaluate(launch)
    report.kv_pool = predict(launch)
    _check_native(facts.native, report)
    return report
