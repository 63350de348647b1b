"""ServerArgs of the stand-in: the release's real flags, and its start-time rules.

The flags come from `sglang/_release_flags.json`, the data the project generates from the real
wheel of this release (scripts/sync_sglang.py) and ships inside the stand-in wheel: option
strings, aliases, actions, types, choices and defaults, so argparse behaves like the release's
own (prefix matching, ambiguity, invalid choices, deprecation warnings).

`ServerArgs.__post_init__` follows the real release's start-time handling, each rule citing the
real file:line (paths relative to sglang/srt/). What real SGLang finds only after the weights
load lives in model_loader.py. This is the simulator's own reading of the real source, written
apart from the orchestrator's preflight (which it must never import).
"""

from __future__ import annotations

import argparse
import functools
import json
import os

from sglang.srt import hardware
from sglang.srt.hf_config import load_config
from sglang.srt.utils import at_least, log

_FLAGS_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "_release_flags.json")

ALLOW_LONGER_CONTEXT = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


@functools.lru_cache(maxsize=1)
def _flags_text() -> str:
    with open(_FLAGS_FILE, encoding="utf-8") as fh:
        return fh.read()


def release_flags() -> list:
    """The generated flag records of this release."""
    return json.loads(_flags_text())["flags"]


def _human_int(text: str) -> int:
    text = str(text).strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


_TYPES = {"int": int, "float": float, "human_readable_int": _human_int}


def _deprecation(message: str) -> None:
    """print_deprecated_warning: logger.warning in bold yellow (arg_groups/argparse_actions.py
    (0.5.15+); server_args.py:5729-5738 (0.5.9))."""
    log("\033[1;33m" + message + "\033[0m")


class _Deprecated(argparse.Action):
    """The release's deprecated actions: warn, then store like the action they wrap."""

    def __init__(self, option_strings, dest, kind="", note="", **kwargs):
        self.kind = kind
        self.note = note
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if self.kind == "deprecated":  # 0.5.9 DeprecatedAction: warning only
            _deprecation(f"The command line argument '{option_string}' is deprecated and will "
                         "be removed in future versions.")
            return
        _deprecation(f"'{option_string}' is deprecated and will be removed in a future release."
                     + (f" {self.note}" if self.note else ""))
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def _add(parser: argparse.ArgumentParser, flag: dict) -> None:
    names = [flag["name"], *flag.get("aliases", [])]
    action = flag.get("action") or "store"
    kw: dict = {"dest": flag["dest"], "default": flag.get("default")}
    if flag.get("required"):
        kw["required"] = True
    if action in ("store_true", "store_false"):
        parser.add_argument(*names, action=action, **kw)
        return
    if action == "BooleanOptionalAction":
        names = [n for n in names if not n.startswith("--no-")]
        parser.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
        return
    nargs = flag.get("nargs")
    if action.startswith("Deprecated") or action == "deprecated":
        note = str(flag.get("deprecated") or "").split("; use ", 1)
        kw.update(action=_Deprecated, kind=action, nargs=nargs,
                  note=f"Use '{note[1]}' instead." if len(note) == 2 else "")
    elif nargs is not None:
        kw["nargs"] = nargs
    if nargs != 0:
        kw["type"] = _TYPES.get(str(flag.get("type")), str)
        if flag.get("choices"):
            kw["choices"] = [kw["type"](c) if not isinstance(c, str) else c
                             for c in flag["choices"]]
    parser.add_argument(*names, **kw)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the release's ServerArgs flags to `parser`."""
    for flag in release_flags():
        _add(parser, flag)


def make_parser() -> argparse.ArgumentParser:
    """The launch_server argument parser of this release (prog as the release names it)."""
    parser = argparse.ArgumentParser(prog="sglang serve" if at_least(0, 5, 20) else None)
    add_cli_args(parser)
    return parser


def _short_dests(values: dict) -> dict:
    """Up to 0.5.12 `--tensor-parallel-size` etc. store to long dests that from_cli_args copies
    to the short fields (server_args.py:5069-5078 (0.5.9))."""
    for short, long in (("tp_size", "tensor_parallel_size"), ("pp_size", "pipeline_parallel_size"),
                        ("dp_size", "data_parallel_size"), ("ep_size", "expert_parallel_size")):
        if long in values:
            values[short] = values.pop(long)
    return values


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true")


class ServerArgs:
    """All server options, validated and completed like SGLang's ServerArgs dataclass."""

    def __init__(self, **kwargs) -> None:
        defaults = _short_dests({f["dest"]: f.get("default") for f in release_flags()})
        defaults.update(kwargs)
        self.__dict__.update(defaults)
        self.__post_init__()

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        """Up to 0.5.12 the long names are the dests and are copied to the short fields
        (server_args.py:5069-5078 (0.5.9))."""
        return cls(**_short_dests(vars(args)))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_"))
        return "ServerArgs(" + inner + ")"

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def opt(self, name: str, default=None):
        """An option this release may not have (getattr with a default)."""
        value = getattr(self, name, None)
        return default if value is None else value

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        # tokenizer_path / served_model_name default to model_path: server_args.py:847-850
        # (0.5.9); arg_groups/serving_hook.py:636-646 (0.5.23)
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if getattr(self, "device", None) is None:
            self.device = "cuda"
        if getattr(self, "random_seed", None) is None:
            self.random_seed = 42
        # draft quantization copies the USER-GIVEN --quantization: server_args.py:882-885
        # (0.5.9); arg_groups/serving_hook.py:685-708 (0.5.23); "unquant" means none
        if self.speculative_draft_model_quantization is None:
            self.speculative_draft_model_quantization = self.quantization
        elif self.speculative_draft_model_quantization == "unquant":
            self.speculative_draft_model_quantization = None
        self._resolved = False
        if not at_least(0, 5, 19):
            self._resolve()  # up to 0.5.15 __post_init__ holds the start rules

    def _resolve(self) -> None:
        if self._resolved:
            return
        self._resolved = True
        self._hf_config = load_config(self.model_path)
        self._check_context_length()
        self._handle_gpu_memory_settings()
        self._handle_attention_backend_compatibility()
        self._handle_speculative_decoding()

    @property
    def resolve_once(self):
        """0.5.19+ only: __post_init__ is empty there and the start rules run in resolve_once()
        (server_args.py:3673 (0.5.19), :241-244 (0.5.23)), which launch_server.run_server and
        Engine._launch_subprocesses call (launch_server.py:29, entrypoints/engine.py:1153
        (0.5.23)). Older releases have no such method."""
        if not at_least(0, 5, 19):
            raise AttributeError("resolve_once")
        return self._resolve

    def get_hf_config(self):
        return self._hf_config

    def _check_context_length(self) -> None:
        """configs/model_config.py:359-390 (0.5.9), :1291-1329 (0.5.23): at start, when
        ServerArgs builds the target's ModelConfig."""
        derived = self._hf_config.context_length
        if self.context_length is not None and self.context_length > derived:
            msg = (f"User-specified context_length ({self.context_length}) is greater than the "
                   f"derived context_length ({derived}). This may lead to incorrect model "
                   "outputs or CUDA errors. Note that the derived context_length may differ from "
                   "max_position_embeddings in the model's config. To allow overriding this "
                   f"maximum, set the env var {ALLOW_LONGER_CONTEXT}=1")
            if not _env_on(ALLOW_LONGER_CONTEXT):
                raise ValueError("Warning: " + msg)
            log("Warning: " + msg)

    def _handle_gpu_memory_settings(self) -> None:
        if self.mem_fraction_static is None:
            self.mem_fraction_static = default_mem_fraction_static(self)
        if self.chunked_prefill_size is None:
            gpus = hardware.visible_gpus()
            gpu_mem = min((int(g.get("memory_total_mib", 0)) for g in gpus), default=0)
            self.chunked_prefill_size = _tier_defaults(gpu_mem, self.tp_size)[0] if gpu_mem \
                else 8192
        if self.page_size is None:
            self.page_size = 1

    # ------------------------------------------------------------------ attention backends
    def _handle_attention_backend_compatibility(self) -> None:
        cc = hardware.compute_capability()
        if self.attention_backend is None:
            # MLA on anything but sm_90/sm_100 -> triton: server_args.py:1781-1838 (0.5.9);
            # arg_groups/model_override_base.py:277-350 (0.5.23); the log: overrides.py:1137
            if self._hf_config.is_mla:
                self.attention_backend = ("fa3" if cc and cc[0] == 9 else "flashinfer"
                                          if cc and cc[0] == 10 else "triton")
            else:
                self.attention_backend = "fa3" if cc and cc[0] == 9 else "flashinfer"
            log(f"Attention backend not specified. Use {self.attention_backend} backend by "
                "default.")
        if cc is None:
            return
        names = {n for n in (self.attention_backend, self.decode_attention_backend,
                             self.prefill_attention_backend) if n}
        prefill = {n for n in (self.attention_backend, self.prefill_attention_backend) if n}
        major = cc[0]
        if "trtllm_mla" in names and major not in (10, 11, 12):
            # server_args.py:1873-1893 (0.5.9); arg_groups/overrides.py:1205-1218 (0.5.23)
            raise ValueError("TRTLLM MLA backend is only supported on Blackwell GPUs "
                             "(SM100/SM12x). Please use a different backend.")
        if "trtllm_mha" in names:
            self._check_trtllm_mha(major, "trtllm_mha" in prefill)
        if "cutedsl_mla" in names and at_least(0, 5, 15) and major != 10:
            # arg_groups/overrides.py:1630-1660 (0.5.15), :1246 (0.5.23)
            raise ValueError("CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). "
                             "Please use a different backend.")
        if "tokenspeed_mla" in names and at_least(0, 5, 12):
            if at_least(0, 5, 23):  # alias of cutedsl_mla: arg_groups/serving_hook.py:303-334
                log("--attention-backend=tokenspeed_mla is deprecated; use 'cutedsl_mla' "
                    "instead.")
                if major != 10:
                    raise ValueError("CuteDSL MLA backend is only supported on Blackwell GPUs "
                                     "(SM100). Please use a different backend.")
            elif (self.kv_cache_dtype or "auto") != "fp8_e4m3":
                # server_args.py:2734-2750 (0.5.12); overrides.py:1265-1275 (0.5.20)
                raise ValueError("tokenspeed_mla backend requires kv-cache-dtype=fp8_e4m3, "
                                 f"got {self.kv_cache_dtype or 'auto'}.")

    @staticmethod
    def _check_trtllm_mha(major: int, prefill: bool) -> None:
        """server_args.py:1895-1908 (0.5.9); :2363-2395 (0.5.10); :4450-4462 (0.5.15);
        arg_groups/attention_hook.py:130-169 (0.5.19), :198-242 (0.5.23)."""
        if not at_least(0, 5, 10):
            if major != 10:
                raise ValueError("TRTLLM MHA backend is only supported on Blackwell GPUs "
                                 "(SM100). Please use a different backend.")
            return
        if prefill and not at_least(0, 5, 19) and major != 10:
            raise ValueError("TRTLLM MHA backend for prefill is only supported on Blackwell "
                             "GPUs (SM100). Please use a different prefill backend.")
        if prefill and at_least(0, 5, 19) and major not in (9, 10, 12):
            raise ValueError("TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell "
                             "(SM100), or SM120 GPUs. Please use a different prefill backend.")
        if major not in (9, 10, 12):
            raise ValueError("TRTLLM MHA backend for decode is only supported on Hopper (SM90), "
                             "Blackwell (SM100) and (SM120) GPUs. Please use a different decode "
                             "backend.")

    # ------------------------------------------------------------------ speculative decoding
    def _handle_speculative_decoding(self) -> None:
        name = self.speculative_algorithm
        if name is None:
            return
        if at_least(0, 5, 12):
            # upper-cased, NEXTN aliased, then SpeculativeAlgorithm.from_string:
            # server_args.py:3561-3562 (0.5.12); arg_groups/speculative_hook.py:137-143 and
            # speculative/spec_info.py:65 (0.5.23)
            name = str(name).upper()
            if name != "NEXTN" and name not in spec_algorithms():
                raise ValueError(f"Unknown speculative algorithm name: {name}")
        if name == "NEXTN":  # server_args.py:2352-2353 (0.5.9); speculative_hook.py:109-116
            name = "EAGLE"
        self.speculative_algorithm = name
        if self.speculative_draft_model_path is not None and \
                self.speculative_draft_model_revision is None:
            self.speculative_draft_model_revision = "main"  # server_args.py:2331-2335 (0.5.9)
        if name in ("EAGLE", "EAGLE3", "STANDALONE"):
            self._handle_eagle()
        elif name == "NGRAM":
            if self.max_running_requests is None:
                self.max_running_requests = 48
            self.disable_overlap_schedule = True
            self.enable_mixed_chunk = False
            if self.speculative_eagle_topk is None:
                self.speculative_eagle_topk = 1
            if self.speculative_num_draft_tokens is None:
                self.speculative_num_draft_tokens = 12
            if self.speculative_num_steps is None:
                self.speculative_num_steps = self.speculative_num_draft_tokens - 1

    def _handle_eagle(self) -> None:
        """server_args.py:2355-2453 (0.5.9); arg_groups/speculative_hook.py:1086-1274 (0.5.23)."""
        if self.max_running_requests is None:  # :2362-2366 (0.5.9), :1086-1094 (0.5.23)
            self.max_running_requests = 48
            log("Max running requests is reset to 48 for speculative decoding. You can override "
                "this by explicitly setting --max-running-requests.")
        self._handle_spec_overlap()
        if self.enable_mixed_chunk and not at_least(0, 5, 19):
            # off up to 0.5.15 (server_args.py:2390-2395 (0.5.9)); EAGLE keeps it from 0.5.19
            # (speculative/spec_info.py:147-155 (0.5.23))
            self.enable_mixed_chunk = False
            log("Mixed chunked prefill is disabled because of using eagle speculative decoding.")
        arch = self._hf_config.arch
        if arch in autofill_architectures():
            if self.speculative_draft_model_path is None:
                self.speculative_draft_model_path = self.model_path
                self.speculative_draft_model_revision = self.revision
            elif arch not in ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration"):
                log("DeepSeek MTP does not require setting speculative_draft_model_path.")
        if self.speculative_num_steps is None:
            # bare assertion: server_args.py:2422-2432 (0.5.9), speculative_hook.py:1159-1174
            assert self.speculative_eagle_topk is None and \
                self.speculative_num_draft_tokens is None
            (self.speculative_num_steps, self.speculative_eagle_topk,
             self.speculative_num_draft_tokens) = auto_choose_speculative_params(self)
        if self.speculative_eagle_topk > 1 and at_least(0, 5, 12) and not at_least(0, 5, 15):
            # None > 1 is the TypeError of server_args.py:2453 (0.5.9), :1274 (0.5.23)
            self.disable_overlap_schedule = True  # 0.5.12 falls back to spec v1 (:3748-3768)
            log("Spec v1 is used for eagle/eagle3/standalone speculative decoding because spec "
                "v2 currently only supports topk = 1.")
        if self.speculative_eagle_topk == 1 and \
                self.speculative_num_draft_tokens != self.speculative_num_steps + 1:
            # server_args.py:2443-2450 (0.5.9); speculative_hook.py:1254-1267 (0.5.23)
            log("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                "speculative_eagle_topk == 1")
            self.speculative_num_draft_tokens = self.speculative_num_steps + 1

    def _handle_spec_overlap(self) -> None:
        if at_least(0, 5, 15):
            # no v1 worker any more; the variable is ignored (speculative_hook.py:75-80)
            # the message: speculative_hook.py:77 (0.5.15), :109 (0.5.19), :110 (0.5.20); gone
            # from 0.5.21
            if os.environ.get("SGLANG_ENABLE_SPEC_V2") and not at_least(0, 5, 21):
                log("SGLANG_ENABLE_SPEC_V2 has been removed: spec v2 is always on.")
            return
        if at_least(0, 5, 12):  # default on (environ.py:470 (0.5.12))
            return
        # 0.5.9 / 0.5.10: opt-in, default False (environ.py:414 (0.5.9)); server_args.py:2368-2388
        if _env_on("SGLANG_ENABLE_SPEC_V2"):
            self.disable_overlap_schedule = False
            topk = self.speculative_eagle_topk
            if topk is not None and topk > 1:
                raise ValueError("Spec v2 currently only supports topk = 1 for speculative "
                                 "decoding.")
        else:
            self.disable_overlap_schedule = True
            log("Overlap scheduler is disabled when spec v2 is off or using unsupported "
                "speculative algorithm. You can set env SGLANG_ENABLE_SPEC_V2=True to enable the "
                "experimental overlap scheduler. ")

    # ------------------------------------------------------------------ final checks
    def check_server_args(self) -> None:
        """server_args.py:5131-5160 (0.5.9); arg_groups/validation_hook.py:177-219 (0.5.23)."""
        assert (self.tp_size * self.pp_size) % self.nnodes == 0, \
            "tp_size must be divisible by number of nodes"
        if not at_least(0, 5, 10):
            _check_torch_2_9_1_cudnn(self)
        if self.pp_size > 1 and self.speculative_algorithm is not None and not (
                at_least(0, 5, 21) and self.speculative_algorithm == "EAGLE"):
            # EAGLE allowed from 0.5.21: validation_hook.py:38-56 (0.5.21), :118-137 (0.5.22)
            raise ValueError("Pipeline parallelism is not compatible with overlap schedule, "
                             "speculative decoding, mixed chunked prefill.")
        name = self.served_model_name
        if ":" in name and not (at_least(0, 5, 10) and name.startswith("runai")):
            raise AssertionError(
                "served_model_name cannot contain a colon (':') character. The colon is reserved "
                "for the 'model:adapter' syntax used in LoRA adapter specification. Invalid "
                f"value: '{name}'")
        json.loads(self.json_model_override_args or "{}")


def spec_algorithms() -> tuple:
    """Built-in names: speculative/spec_info.py:18-22 (0.5.9), :32-38 (0.5.12), :39-46
    (0.5.19), :40-48 (0.5.20)."""
    names = ["EAGLE", "EAGLE3", "STANDALONE", "NGRAM"]
    if at_least(0, 5, 12):
        names += ["DFLASH", "FROZEN_KV_MTP"]
    if at_least(0, 5, 19):
        names.append("DSPARK")
    if at_least(0, 5, 20):
        names.append("UNO")
    return tuple(names)


def autofill_architectures() -> tuple:
    """Targets whose missing draft path is the target itself (built-in MTP):
    server_args.py:2397-2421 (0.5.9); speculative_hook.py:687-720 (0.5.19), :1120-1156 (0.5.23).
    """
    names = ["DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM",
             "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM",
             "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM",
             "PixtralForConditionalGeneration"]
    if at_least(0, 5, 12):
        names += ["DeepseekV4ForCausalLM", "HYV3ForCausalLM"]
    if at_least(0, 5, 20):
        names += ["HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration"]
    return tuple(names)


def auto_choose_speculative_params(self: ServerArgs):
    """(num_steps, eagle_topk, num_draft_tokens): server_args.py:5741-5781 (0.5.9);
    arg_groups/speculative_hook.py:1430-1461 (0.5.23). Keyed on the target's architecture."""
    arch = self.get_hf_config().arch
    if self.speculative_algorithm == "STANDALONE":
        return (3, 1, 4)
    if arch in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
        return (5, 4, 8)
    return (3, 1, 4)


def _tier_defaults(gpu_mem: float, tp: int) -> tuple:
    """(chunked_prefill_size, decode cuda_graph_max_bs) by GPU memory (MiB) and tp:
    server_args.py:935-998 (0.5.9), :1165-1227 (0.5.10), :3496-3540 (0.5.15);
    arg_groups/memory_hook.py:62-150 (0.5.19), :90-180 (0.5.23). 0.5.20 changed only the
    < 35 GiB tier."""
    small = tp < 4
    if gpu_mem < 20 * 1024:
        return 2048, 8
    if gpu_mem < 35 * 1024:
        if at_least(0, 5, 20):
            return 4096, 48 if small else 160
        return 2048, 24 if small else 80
    if gpu_mem < 60 * 1024:
        return 4096, 32 if small else 160
    if gpu_mem < 160 * 1024:  # 60-90 GiB and 90-160 GiB share the numbers
        return 8192, 256 if small else 512
    return 16384, 512


def _prefill_graph_reserved(self: ServerArgs, speculative: bool) -> bool:
    """Whether the (piecewise) prefill CUDA graph is on, so its memory is reserved:
    0.5.9 only with --enable-piecewise-cuda-graph (server_args.py:604, :1044-1046);
    0.5.10 off with speculative decoding or a multimodal model (server_args.py:1078-1110);
    0.5.12 off for multimodal models (server_args.py:1335-1337); 0.5.15 off for multimodal
    models that are not allow-listed (server_args.py:3300-3303, configs/model_config.py:
    1716-1718); 0.5.19 KimiK25ForConditionalGeneration is allow-listed
    (configs/model_config.py:1970-1974)."""
    if self.opt("disable_piecewise_cuda_graph"):
        return False
    if not at_least(0, 5, 10):
        return bool(self.opt("enable_piecewise_cuda_graph"))
    multimodal = _is_multimodal(self) and not self.opt("language_only")
    if not at_least(0, 5, 12):
        return not speculative and not multimodal
    if not at_least(0, 5, 19):
        return not multimodal
    return not multimodal or self._hf_config.arch == "KimiK25ForConditionalGeneration"


#: torch 2.9.1 (0.5.9's pin) requires nvidia-cudnn-cu12==9.10.2.21 (its wheel's METADATA)
TORCH_291_CUDNN = "9.10.2.21"


def _cudnn_version() -> str:
    """torch.backends.cudnn.version() of a pip install: the nvidia-cudnn-cu12 wheel's version."""
    from importlib import metadata

    try:
        return metadata.version("nvidia-cudnn-cu12")
    except metadata.PackageNotFoundError:
        return TORCH_291_CUDNN


def _check_torch_2_9_1_cudnn(self: ServerArgs) -> None:
    """check_torch_2_9_1_cudnn_compatibility, server_args.py:5263-5298, called from
    check_server_args at :5168 (0.5.9 only): a multimodal model with cuDNN below 9.15."""
    if os.environ.get("SGLANG_DISABLE_CUDNN_CHECK", "").lower() in ("1", "true"):
        return
    if not _is_multimodal(self):
        return
    major, minor = (int(x) for x in _cudnn_version().split(".")[:2])
    if (major, minor) < (9, 15):
        raise RuntimeError(
            "CRITICAL WARNING: PyTorch 2.9.1 & CuDNN Compatibility Issue Detected\n"
            f"Current Environment: PyTorch 2.9.1 | CuDNN {major}.{minor:02d}\n"
            "Solution:  You MUST upgrade CuDNN to version 9.15+ to ensure correctness.\n"
            "    pip install nvidia-cudnn-cu12==9.16.0.29\n"
            "Or you can disable this check by setting env var SGLANG_DISABLE_CUDNN_CHECK=1")



def _is_multimodal(self: ServerArgs) -> bool:
    """A checkpoint with a vision tower (KimiK25 is multimodal: configs/model_config.py:1262
    (0.5.9))."""
    return isinstance(self._hf_config.data.get("vision_config"), dict)


def default_mem_fraction_static(self: ServerArgs) -> float:
    """The release's default for this GPU.

    reserved (MiB) = 512 + max(chunked, 2048) * 1.5 + cuda_graph_max_bs * 2 + tp * pp / 8 * 1024
    [+ 1536 for an MLA prefill graph], floored at 10 GiB above 60 GiB, then + the EAGLE draft
    reserve up to 0.5.12; round((gpu_mem - reserved) / gpu_mem, 3), times the VLM factor.
    server_args.py:1020-1066 (0.5.9, EAGLE +2048 :1051-1057); :1283-1334 (0.5.10, EAGLE +4096
    :1316-1322); :1543-1594 (0.5.12, EAGLE +4096 :1576-1582); :3625-3696 (0.5.15, no EAGLE term:
    the draft is charged to the KV pool); arg_groups/memory_hook.py:240-281 with
    reserve_for_graph_mb :292-334 (0.5.19); :300-335 with :357-399 (0.5.23)."""
    gpus = hardware.visible_gpus()
    gpu_mem = min((int(g.get("memory_total_mib", 0)) for g in gpus), default=0) or None
    if gpu_mem is None:
        # no GPU memory known: memory_hook.py:266 (0.5.19) 0.88; :320 (0.5.20) 0.95
        return 0.88 if not at_least(0, 5, 20) else 0.95
    tier_chunked, tier_bs = _tier_defaults(gpu_mem, self.tp_size)
    chunked = self.chunked_prefill_size or tier_chunked
    # a user --cuda-graph-max-bs replaces the tier default before the formula; from 0.5.22 a
    # default one is capped to --max-running-requests (memory_hook.py:182-188 (0.5.22))
    # the flag's dest is cuda_graph_max_bs_decode from 0.5.19 (--cuda-graph-max-bs its
    # deprecated spelling; releases/0.5.19.json)
    given_bs = self.opt("cuda_graph_max_bs_decode") or self.opt("cuda_graph_max_bs")
    max_bs = given_bs or tier_bs
    if at_least(0, 5, 22) and not given_bs and self.max_running_requests:
        max_bs = min(max_bs, int(self.max_running_requests))
    algo = str(self.speculative_algorithm).upper() if self.speculative_algorithm else None
    speculative = algo not in (None, "NGRAM")
    reserved = 512 + max(chunked, 2048) * 1.5 + max_bs * 2 + self.tp_size * self.pp_size / 8 \
        * 1024
    if _prefill_graph_reserved(self, algo is not None) and self._hf_config.is_mla:
        reserved += 1.5 * 1024  # "For MLA backend the memory overhead is much higher"
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative and not at_least(0, 5, 15):
        if algo == "STANDALONE":
            reserved += 6 * 1024
        else:
            reserved += 2048 if not at_least(0, 5, 10) else 4096
    fraction = round((gpu_mem - reserved) / gpu_mem, 3)
    vision = self._hf_config.data.get("vision_config")
    if isinstance(vision, dict) and not self.opt("language_only"):
        # adjust_mem_fraction_for_vlm: server_args.py:5483-5519 (0.5.9); memory_hook.py:352-389
        # (0.5.19), :417-462 (0.5.23); not rounded again
        ratio = vision.get("num_hidden_layers", 24) * vision.get("hidden_size", 1024) ** 2 / (
            24 * 1024 ** 2)
        fraction *= 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return fraction


def prepare_server_args(argv: list) -> ServerArgs:
    """Parse the command line (exit 2 with usage on a bad flag) and build ServerArgs (which
    validates it up to 0.5.15; from 0.5.19 resolve_once() does)."""
    parser = make_parser()
    raw = parser.parse_args(argv)
    return ServerArgs.from_cli_args(raw)


def validate_for_launch(server_args: ServerArgs) -> ServerArgs:
    """What the launcher runs before it starts any process: resolve_once() from 0.5.19, then
    check_server_args() in every release (entrypoints/engine.py:1026 (0.5.9), :1153 and :1165
    (0.5.23))."""
    if hasattr(server_args, "resolve_once"):
        server_args.resolve_once()
    server_args.check_server_args()
    return server_args
