"""Preflight rules for an SGLang launch: refuse in seconds what would fail after a 15-minute load.

Written from FACTS.md ("SGLang launch", "compressed-tensors"), independently of the simulator's
stand-in, so the stand-in can catch a wrong rule. Inputs are plain data, so every rule is unit
tested against recorded configs:

    facts   = HostFacts(...)        what the host has: versions, configs, GPUs, the release's flags
    request = LaunchRequest(...)    the server arguments we are about to use
    report  = run_preflight(request, facts)
    report.problems / report.warnings; report.raise_if_problems()

The rules read the EFFECTIVE options, i.e. the arguments parsed the way SGLang's argparse parses
them (prefixes resolved, the last occurrence wins), so an override in `extra_args` is checked the
same as a stage parameter. Every problem is collected; they are reported together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import PreflightError
from orchestrator.sglang.flags import (
    SPEC_ALGORITHMS_0515,
    FlagSet,
    at_least,
    table_flags,
)

NVFP4_FORMAT = "nvfp4-pack-quantized"
EAGLE_FAMILY = ("EAGLE", "EAGLE3")
#: targets that fill a missing draft path with the target itself (FACTS.md, sglang #36528)
SELF_DRAFT_ARCHITECTURES = ("DeepseekV3ForCausalLM",)
KIMI_K25_ARCHITECTURES = ("KimiK25ForConditionalGeneration",)
MLA_DRAFTER_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM",)
#: attention backends and the GPU generations (compute capability majors) they run on
BACKEND_SM = {
    "fa3": (8, 9),  # FlashAttention 3 asserts outside SM80-SM90
    "trtllm_mha": (10,),  # SM100 only
    "trtllm_mla": (10,),
}
#: backends FACTS.md says are unavailable on sm_120 (RTX PRO 6000 Blackwell)
UNAVAILABLE_ON_SM120 = ("flashmla",)
BACKEND_OPTIONS = ("--attention-backend", "--decode-attention-backend",
                   "--prefill-attention-backend")


# ------------------------------------------------------------------------------ inputs


@dataclass
class HostFacts:
    """What the host has, gathered by the stage before launching anything."""

    python: str
    sglang_version: str | None
    compressed_tensors_version: str | None = None
    #: hasattr(CompressionFormat, "nvfp4_pack_quantized") in the venv; None = not checked
    nvfp4_known: bool | None = None
    nvfp4_error: str | None = None
    target_config: dict[str, Any] | None = None
    draft_config: dict[str, Any] | None = None
    #: (major, minor) per GPU, from nvidia-smi; empty when unknown
    compute_capabilities: list[tuple[int, int]] = field(default_factory=list)
    flags: FlagSet | None = None
    #: why `launch_server --help` could not be used (the table was used instead)
    flags_error: str | None = None
    #: environment the server will get (launch env)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class LaunchRequest:
    """The launch being checked: server arguments (without the API key) and where they came from."""

    args: list[str]
    model_path: str
    draft_model_path: str | None = None
    extra_args: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Problems (refusals) and warnings of one preflight, plus the effective options."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    flags_source: str = "table"

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_problems(self, what: str = "sglang_server preflight") -> None:
        """Raise one PreflightError listing every problem (nothing was launched)."""
        if not self.problems:
            return
        n = len(self.problems)
        lines = [f"{what}: {n} problem{'s' if n != 1 else ''} found before launching anything:"]
        lines += [f"  - {p}" for p in self.problems]
        raise PreflightError(
            "\n".join(lines),
            hint="fix the stage parameters (or the pip/download stages) as each problem says; "
            "nothing was started",
        )


# ------------------------------------------------------------------------------ config helpers


def config_get(cfg: dict[str, Any] | None, key: str) -> Any:
    """A config value, looked up in `text_config` too (multimodal wrappers like K2.5/K2.6)."""
    if not isinstance(cfg, dict):
        return None
    if key in cfg:
        return cfg[key]
    text = cfg.get("text_config")
    if isinstance(text, dict):
        return text.get(key)
    return None


def architectures(cfg: dict[str, Any] | None) -> list[str]:
    """The top-level `architectures` (or the text model's when the top level has none)."""
    if not isinstance(cfg, dict):
        return []
    archs = cfg.get("architectures") or config_get(cfg, "architectures") or []
    return [str(a) for a in archs] if isinstance(archs, list) else []


def quant_formats(cfg: dict[str, Any] | None) -> list[str]:
    """Every compressed-tensors `format` a checkpoint's quantization_config names."""
    formats: list[str] = []
    qcs = []
    if isinstance(cfg, dict):
        qcs.append(cfg.get("quantization_config"))
        text = cfg.get("text_config")
        if isinstance(text, dict):
            qcs.append(text.get("quantization_config"))
    for qc in qcs:
        if not isinstance(qc, dict):
            continue
        if isinstance(qc.get("format"), str):
            formats.append(qc["format"])
        groups = qc.get("config_groups")
        if isinstance(groups, dict):
            for group in groups.values():
                if isinstance(group, dict) and isinstance(group.get("format"), str):
                    formats.append(group["format"])
    return list(dict.fromkeys(formats))


def is_eagle3_drafter(cfg: dict[str, Any] | None) -> bool:
    """True for EAGLE-3 drafters (LlamaForCausalLMEagle3, Eagle3DeepseekV2ForCausalLM, ...)."""
    return any("Eagle3" in a for a in architectures(cfg))


def is_mla_drafter(cfg: dict[str, Any] | None) -> bool:
    """True for MLA EAGLE-3 drafters (the `*-eagle3-mla` repos)."""
    return any(a in MLA_DRAFTER_ARCHITECTURES for a in architectures(cfg))


def is_kimi_k25(cfg: dict[str, Any] | None) -> bool:
    """True for Kimi K2.5 / K2.6 targets."""
    model_type = str((cfg or {}).get("model_type", ""))
    return any(a in KIMI_K25_ARCHITECTURES for a in architectures(cfg)) or model_type == "kimi_k25"


def self_drafting_target(cfg: dict[str, Any] | None) -> bool:
    """Targets where SGLang fills a missing draft path with the target (DeepseekV3 / Kimi)."""
    model_type = str((cfg or {}).get("model_type", ""))
    return (any(a in SELF_DRAFT_ARCHITECTURES for a in architectures(cfg))
            or model_type.startswith("kimi") or is_kimi_k25(cfg))


# ------------------------------------------------------------------------------ options


def parse_options(args: list[str], flags: FlagSet, report: Report) -> dict[str, Any]:
    """Parse `args` like SGLang's argparse: canonical option -> value (last one wins).

    Unknown, removed and ambiguous options and prefix matches are reported into `report`.
    """
    opts: dict[str, Any] = {}
    i = 0
    version = flags.version
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--") or token == "--":
            report.problems.append(
                f"unexpected argument {token!r}: every server argument must follow an option "
                "(check extra_args)")
            continue
        name, eq, inline = token.partition("=")
        res = flags.resolve(name)
        canon = res.canonical
        if res.kind == "ambiguous":
            report.problems.append(
                f"{name} is not a flag of sglang {version}; argparse will stop with `ambiguous "
                f"option: {name} could match {', '.join(res.matches)}`"
                + (f" ({flags.removed[name]})" if name in flags.removed else "")
                + ": use the full flag name")
            canon = None
        elif res.kind == "unknown":
            if name in flags.removed:
                report.problems.append(f"{name}: {flags.removed[name]} (sglang {version})")
            elif flags.authoritative:
                report.problems.append(
                    f"{name} is not a flag of sglang {version} (`launch_server --help` does not "
                    "list it): remove it or install a release that has it")
            else:
                report.warnings.append(
                    f"{name} could not be verified against sglang {version} (its --help was "
                    "unavailable and the built-in table does not list it)")
        elif res.kind == "prefix":
            report.warnings.append(
                f"{name} is not a flag of sglang {version} but argparse accepts it as an "
                f"abbreviation of {res.matches[0] if len(res.matches) == 1 else canon}; "
                f"write {canon} instead")
        if canon is not None and canon in flags.deprecated:
            report.warnings.append(f"{canon} is deprecated in sglang {version}: "
                                   f"{flags.deprecated[canon]}")
        arity = flags.arity.get(canon or "", "unknown")
        values: list[str] = []
        if eq:
            values.append(inline)
        if arity in ("one", "many", "unknown") and not eq:
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
                if arity == "one":
                    break
        elif arity == "none" and eq:
            report.problems.append(f"{name} takes no value (got {token!r})")
        if arity == "one" and not values:
            report.problems.append(f"{name} needs a value")
        key = canon or name
        if arity == "none":
            opts[key] = True
        elif arity == "many":
            opts[key] = values
        else:
            opts[key] = values[0] if len(values) == 1 else (values or True)
        if canon and canon in flags.choices and arity in ("one", "many"):
            allowed = flags.choices[canon]
            for v in values:
                if v not in allowed:
                    report.problems.append(
                        f"{canon} {v} is not accepted by sglang {version}; choose one of: "
                        + ", ".join(allowed))
    return opts


class _Opts:
    """Effective options, looked up by any alias."""

    def __init__(self, opts: dict[str, Any], flags: FlagSet) -> None:
        self.opts = opts
        self.flags = flags

    def get(self, *names: str) -> Any:
        for name in names:
            canon = self.flags.canonical(name) or name
            if canon in self.opts:
                return self.opts[canon]
        return None

    def int(self, *names: str) -> int | None:
        value = self.get(*names)
        try:
            return int(value) if value is not None and value is not True else None
        except (TypeError, ValueError):
            return None


# ------------------------------------------------------------------------------ rules


def run_preflight(request: LaunchRequest, facts: HostFacts) -> Report:
    """Check one launch against the host's facts; return every problem and warning."""
    report = Report()
    version = facts.sglang_version
    if not version:
        report.problems.append(
            f"sglang is not installed in {facts.python} (importlib.metadata finds no "
            "'sglang'): run the pip stage first")
        return report
    flags = facts.flags or table_flags(version)
    report.flags_source = flags.source
    if facts.flags_error:
        report.warnings.append(
            f"`{facts.python} -m sglang.launch_server --help` failed ({facts.flags_error}); "
            f"flags were checked against the built-in table for sglang {version}")
    opts = _Opts(parse_options(request.args, flags, report), flags)
    report.options = dict(opts.opts)
    owned = {"--host": "host", "--port": "port", "--model-path": "model_path"}
    for token in request.extra_args:
        if not token.startswith("--"):
            continue
        canon = flags.resolve(token).canonical or token.split("=", 1)[0]
        if canon == "--api-key":
            report.problems.append(
                "extra_args sets --api-key: the key would be visible in `ps` to every user of "
                "the host; use the stage's api_key parameter (it reaches SGLang through a 0600 "
                "file, never argv)")
        elif canon in owned:
            report.problems.append(
                f"extra_args sets {canon}: use the stage parameter `{owned[canon]}` instead (the "
                "stage checks that address and fingerprints that model)")
    _check_configs(request, facts, opts, report)
    _check_served_name(opts, report)
    _check_nodes(opts, report)
    _check_speculative(request, facts, opts, report, version)
    _check_backends(facts, opts, report)
    _check_compressed_tensors(facts, report)
    return report


def _check_configs(request: LaunchRequest, facts: HostFacts, opts: _Opts,
                   report: Report) -> None:
    if facts.target_config is None:
        report.problems.append(
            f"{request.model_path}/config.json is missing or not JSON: model_path must be the "
            "downloaded checkpoint directory (run the download stage)")
    if request.draft_model_path and facts.draft_config is None:
        report.problems.append(
            f"{request.draft_model_path}/config.json is missing or not JSON: draft_model_path "
            "must be the downloaded drafter directory (run the download stage)")
    cfg = facts.target_config
    if isinstance(cfg, dict) and cfg.get("auto_map") and not opts.get("--trust-remote-code"):
        # The checkpoint ships its own code; SGLang needs --trust-remote-code to load it.
        report.warnings.append(
            f"{request.model_path}/config.json uses custom code (auto_map) but "
            "--trust-remote-code is not set: set trust_remote_code: true if loading fails")


def _check_served_name(opts: _Opts, report: Report) -> None:
    name = opts.get("--served-model-name")
    if isinstance(name, str) and ":" in name:
        report.problems.append(
            f"served_model_name {name!r} contains ':', which SGLang refuses (':' separates a "
            "LoRA adapter name in requests): choose a name without ':'")


def _check_nodes(opts: _Opts, report: Report) -> None:
    tp = opts.int("--tp-size", "--tensor-parallel-size") or 1
    pp = opts.int("--pp-size", "--pipeline-parallel-size") or 1
    nnodes = opts.int("--nnodes") or 1
    if nnodes < 1:
        report.problems.append(f"--nnodes {nnodes} must be at least 1")
        return
    if (tp * pp) % nnodes:
        report.problems.append(
            f"tp ({tp}) x pp ({pp}) = {tp * pp} is not divisible by --nnodes {nnodes}: SGLang "
            "asserts tp_size * pp_size % nnodes == 0; change tp or nnodes")
    if nnodes > 1:
        addr = opts.get("--dist-init-addr")
        if not isinstance(addr, str) or ":" not in addr:
            report.problems.append(
                f"--nnodes {nnodes} needs --dist-init-addr NODE0_HOST:PORT (the same on every "
                "node) in extra_args")


def _check_speculative(request: LaunchRequest, facts: HostFacts, opts: _Opts, report: Report,
                       version: str) -> None:
    algo_raw = opts.get("--speculative-algorithm")
    steps = opts.int("--speculative-num-steps")
    topk = opts.int("--speculative-eagle-topk")
    ndt = opts.int("--speculative-num-draft-tokens")
    draft_path = opts.get("--speculative-draft-model-path", "--speculative-draft-model")
    if not isinstance(algo_raw, str):
        if draft_path or request.draft_model_path:
            report.warnings.append(
                "draft_model_path is set but speculative.algorithm is not: the drafter is not "
                "used (set speculative.algorithm: EAGLE3 to use it)")
        return
    algo = algo_raw.upper()
    known = SPEC_ALGORITHMS_0515 if at_least(version, 0, 5, 15) else SPEC_ALGORITHMS_0515[:-1]
    if algo not in known:
        canon = opts.flags.canonical("--speculative-algorithm") or "--speculative-algorithm"
        if canon not in opts.flags.choices:  # else argparse's choices were reported already
            report.problems.append(
                f"speculative algorithm {algo_raw!r} is unknown to sglang {version} (known: "
                f"{', '.join(known)})")
        return
    effective = "EAGLE" if algo == "NEXTN" else algo  # SGLang rewrites NEXTN to EAGLE
    target, draft = facts.target_config, facts.draft_config
    tarch = ", ".join(architectures(target)) or "unknown"
    darch = ", ".join(architectures(draft)) or "unknown"

    if effective in EAGLE_FAMILY + ("STANDALONE",):
        if steps is None and (topk is not None or ndt is not None):
            given = [n for n, v in (("eagle_topk", topk), ("num_draft_tokens", ndt))
                     if v is not None]
            report.problems.append(
                f"speculative.{' and '.join(given)} set without speculative.num_steps: SGLang "
                "stops with a bare AssertionError. Set num_steps too (e.g. num_steps: 3, "
                "eagle_topk: 1, num_draft_tokens: 4), or leave all three unset to let SGLang "
                "choose")
        if topk == 1 and steps is not None and ndt is not None and ndt != steps + 1:
            report.warnings.append(
                f"speculative.eagle_topk is 1, so SGLang replaces num_draft_tokens {ndt} with "
                f"num_steps + 1 = {steps + 1}; set num_draft_tokens: {steps + 1} to say so")
        if (topk or 0) > 1 and not at_least(version, 0, 5, 12) and str(
                facts.env.get("SGLANG_ENABLE_SPEC_V2", "")).lower() in ("1", "true", "yes", "on"):
            report.problems.append(
                f"speculative.eagle_topk {topk} with SGLANG_ENABLE_SPEC_V2 on sglang {version}: "
                "'Spec v2 currently only supports topk = 1'; use eagle_topk: 1 or unset "
                "SGLANG_ENABLE_SPEC_V2")

    if effective == "EAGLE3" and not draft_path:
        if self_drafting_target(target):
            report.problems.append(
                f"speculative.algorithm EAGLE3 on a {tarch} target without draft_model_path: "
                "SGLang silently uses the target itself as the draft model (sglang issue "
                "#36528), loading it twice with no speedup. Set draft_model_path to the "
                "EAGLE-3 drafter directory")
        else:
            report.problems.append(
                "speculative.algorithm EAGLE3 needs draft_model_path (the EAGLE-3 drafter)")

    if effective == "EAGLE" and is_eagle3_drafter(draft):
        report.problems.append(
            f"speculative.algorithm {algo} with an EAGLE-3 drafter ({darch}): SGLang starts "
            "but silently accepts nothing (accept length 1.00, no speedup; sglang PR #21272). "
            "Set speculative.algorithm: EAGLE3")

    if effective == "EAGLE3" and is_kimi_k25(target) and not at_least(version, 0, 5, 10):
        report.problems.append(
            f"EAGLE3 on a Kimi K2.5/K2.6 target ({tarch}) needs sglang >= 0.5.10 (PR #19689); "
            f"installed: {version}. Pin sglang>=0.5.10 in the pip stage")

    if draft_path and effective in EAGLE_FAMILY and draft is not None:
        if is_mla_drafter(draft) and not at_least(version, 0, 5, 12):
            report.problems.append(
                f"the MLA EAGLE-3 drafter ({darch}) needs sglang >= 0.5.12; installed: "
                f"{version}. Pin sglang>=0.5.12 in the pip stage or use a Llama EAGLE-3 drafter")
        layers = config_get(draft, "num_hidden_layers")
        if is_eagle3_drafter(draft) and layers != 1 and not at_least(version, 0, 5, 12):
            report.problems.append(
                f"the EAGLE-3 drafter has num_hidden_layers {layers}; sglang {version} asserts "
                "'EAGLE3 currently only supports 1 layer'. Use a 1-layer drafter or "
                "sglang>=0.5.12")
        if is_eagle3_drafter(draft) and target is not None:
            for key in ("hidden_size", "vocab_size"):
                dv, tv = config_get(draft, key), config_get(target, key)
                if dv is not None and tv is not None and dv != tv:
                    report.problems.append(
                        f"the drafter's {key} is {dv} but the target's is {tv}: the weights "
                        "cannot be loaded (a drafter for another model?). Use the drafter made "
                        "for this target")


def _check_backends(facts: HostFacts, opts: _Opts, report: Report) -> None:
    if not facts.compute_capabilities:
        return
    majors = sorted({cc[0] for cc in facts.compute_capabilities})
    sm = ", ".join(f"sm_{a}{b}" for a, b in sorted(set(facts.compute_capabilities)))
    for option in BACKEND_OPTIONS:
        backend = opts.get(option)
        if not isinstance(backend, str):
            continue
        allowed = BACKEND_SM.get(backend)
        bad = (allowed is not None and any(m not in allowed for m in majors)) or (
            backend in UNAVAILABLE_ON_SM120 and 12 in majors)
        if bad:
            need = ("SM80-SM90" if backend == "fa3" else "SM100 (B200/GB200)"
                    if backend.startswith("trtllm") else "a GPU other than sm_120")
            report.problems.append(
                f"{option} {backend} needs {need}; this host's GPUs are {sm}. Use "
                "attention_backend: flashinfer or triton")


def _check_compressed_tensors(facts: HostFacts, report: Report) -> None:
    if NVFP4_FORMAT not in quant_formats(facts.target_config):
        return
    ct = facts.compressed_tensors_version
    if ct is None:
        report.problems.append(
            f"the checkpoint's quantization format is {NVFP4_FORMAT} but compressed-tensors is "
            f"not installed in {facts.python}; install compressed-tensors>=0.10.0 (the pip "
            "stage)")
        return
    if facts.nvfp4_known is False:
        report.problems.append(
            f"compressed-tensors {ct} does not know nvfp4_pack_quantized; install "
            "compressed-tensors>=0.10.0 (the pip stage)")
    elif facts.nvfp4_known is None:
        why = facts.nvfp4_error or "not checked"
        report.problems.append(
            f"could not check whether compressed-tensors {ct} knows nvfp4_pack_quantized "
            f"(importing it failed: {why}); repair the venv (the pip stage)")
