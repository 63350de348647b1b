"""ServerArgs of the stand-in: the release's real command-line flags and validation rules.

The flag set follows SGLang 0.5.9 and 0.5.23 (see the simulator's FACTS): argparse with prefix
matching (so `--tp` means `--tp-size`), `--cuda-graph-max-bs` present in 0.5.9 and removed in
0.5.23 (where argparse reports it ambiguous between the -decode and -prefill flags), the
speculative algorithm as a choice list in 0.5.9 and a free upper-cased string later.

`ServerArgs.__post_init__` applies the speculative-decoding rules of `_handle_speculative_decoding`
(NEXTN -> EAGLE, max_running_requests 48, DeepSeek-style targets filling in the draft path with the
target itself, the bare assertion when num_steps is missing, auto-chosen (steps, topk, tokens),
topk handling per release) plus the attention-backend and multi-node checks.
"""

from __future__ import annotations

import argparse
import json
import os

from sglang.srt import hardware
from sglang.srt.hf_config import DEEPSEEK_MTP_ARCHITECTURES, KIMI_K25_ARCHITECTURES, load_config
from sglang.srt.utils import at_least, log

QUANTIZATION_CHOICES = [
    "awq",
    "fp8",
    "gptq",
    "marlin",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "petit_nvfp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "qoq",
    "w4afp8",
    "mxfp4",
    "compressed-tensors",
    "auto-round",
]
ATTENTION_BACKEND_CHOICES = [
    "triton",
    "torch_native",
    "flex_attention",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
]
TOOL_CALL_PARSERS = [
    "deepseekv3",
    "deepseekv31",
    "glm",
    "glm45",
    "gpt-oss",
    "kimi_k2",
    "llama3",
    "mistral",
    "pythonic",
    "qwen",
    "qwen25",
    "qwen3_coder",
    "step3",
]
REASONING_PARSERS = [
    "deepseek-r1",
    "deepseek-v3",
    "glm45",
    "gpt-oss",
    "kimi",
    "kimi_k2",
    "qwen3",
    "qwen3-thinking",
    "step3",
]
SPEC_ALGORITHMS_059 = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
SPEC_ALGORITHMS_LATER = SPEC_ALGORITHMS_059 + ["DFLASH"]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the release's ServerArgs flags to `parser`."""
    a = parser.add_argument
    # Model and tokenizer
    a("--model-path", "--model", type=str, required=True, dest="model_path",
      help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.")
    a("--tokenizer-path", type=str, default=None)
    a("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow"])
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", type=str, default="auto",
      choices=["auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf",
               "bitsandbytes", "layered", "remote"])
    a("--model-loader-extra-config", type=str, default="{}")
    a("--trust-remote-code", action="store_true")
    a("--context-length", type=int, default=None)
    a("--is-embedding", action="store_true")
    a("--enable-multimodal", default=None, action="store_true")
    a("--revision", type=str, default=None)
    a("--model-impl", type=str, default="auto")
    # HTTP server
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--skip-server-warmup", action="store_true")
    a("--warmups", type=str, default=None)
    a("--nccl-port", type=int, default=None)
    # Quantization and data type
    a("--dtype", type=str, default="auto",
      choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    a("--quantization", type=str, default=None, choices=QUANTIZATION_CHOICES)
    a("--quantization-param-path", type=str, default=None)
    a("--kv-cache-dtype", type=str, default="auto",
      choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"])
    # Memory and scheduling
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-queued-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", type=str, default="fcfs",
      choices=["lpm", "random", "fcfs", "dfs-weight", "lof", "priority"])
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=None)
    # Runtime options
    a("--device", type=str, default=None)
    a("--tensor-parallel-size", "--tp-size", type=int, default=1, dest="tp_size")
    a("--pipeline-parallel-size", "--pp-size", type=int, default=1, dest="pp_size")
    a("--stream-interval", type=int, default=1)
    a("--stream-output", action="store_true")
    a("--random-seed", type=int, default=None)
    a("--watchdog-timeout", type=float, default=300)
    a("--dist-timeout", type=int, default=None)
    a("--download-dir", type=str, default=None)
    a("--base-gpu-id", type=int, default=0)
    a("--gpu-id-step", type=int, default=1)
    a("--sleep-on-idle", action="store_true")
    # Logging
    a("--log-level", type=str, default="info")
    a("--log-level-http", type=str, default=None)
    a("--log-requests", action="store_true")
    a("--log-requests-level", type=int, default=2, choices=[0, 1, 2, 3])
    a("--show-time-cost", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    # API related
    a("--api-key", type=str, default=None)
    a("--served-model-name", type=str, default=None)
    a("--weight-version", type=str, default="default")
    a("--chat-template", type=str, default=None)
    a("--completion-template", type=str, default=None)
    a("--file-storage-path", type=str, default="sglang_storage")
    a("--enable-cache-report", action="store_true")
    a("--reasoning-parser", type=str, default=None, choices=REASONING_PARSERS)
    a("--tool-call-parser", type=str, default=None, choices=TOOL_CALL_PARSERS)
    # Data parallelism
    a("--data-parallel-size", "--dp-size", type=int, default=1, dest="dp_size")
    a("--load-balance-method", type=str, default="round_robin",
      choices=["round_robin", "shortest_queue", "minimum_tokens"])
    # Multi-node distributed serving
    a("--dist-init-addr", "--nccl-init-addr", type=str, default=None, dest="dist_init_addr")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    # Model override args
    a("--json-model-override-args", type=str, default="{}")
    a("--preferred-sampling-params", type=str, default=None)
    # Kernel backends
    a("--attention-backend", type=str, default=None, choices=ATTENTION_BACKEND_CHOICES)
    a("--prefill-attention-backend", type=str, default=None, choices=ATTENTION_BACKEND_CHOICES)
    a("--decode-attention-backend", type=str, default=None, choices=ATTENTION_BACKEND_CHOICES)
    a("--sampling-backend", type=str, default=None, choices=["flashinfer", "pytorch"])
    a("--grammar-backend", type=str, default=None,
      choices=["xgrammar", "outlines", "llguidance", "none"])
    a("--mm-attention-backend", type=str, default=None)
    # Speculative decoding
    if at_least(0, 5, 15):
        a("--speculative-algorithm", type=str, default=None)
    else:
        a("--speculative-algorithm", type=str, default=None, choices=SPEC_ALGORITHMS_059)
    a("--speculative-draft-model-path", "--speculative-draft-model", type=str, default=None,
      dest="speculative_draft_model_path")
    a("--speculative-draft-model-revision", type=str, default=None)
    a("--speculative-draft-model-quantization", type=str, default=None,
      choices=QUANTIZATION_CHOICES + ["unquant"])
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-accept-threshold-single", type=float, default=1.0)
    a("--speculative-accept-threshold-acc", type=float, default=1.0)
    a("--speculative-token-map", type=str, default=None)
    a("--speculative-attention-mode", type=str, default="prefill", choices=["prefill", "decode"])
    # Expert parallelism
    a("--expert-parallel-size", "--ep-size", type=int, default=1, dest="ep_size")
    a("--moe-a2a-backend", type=str, default="none", choices=["none", "deepep", "mooncake"])
    a("--moe-runner-backend", type=str, default="auto")
    a("--enable-eplb", action="store_true")
    # Optimization / debug options
    a("--disable-radix-cache", action="store_true")
    a("--cuda-graph-bs", type=int, nargs="+", default=None)
    if at_least(0, 5, 20):
        # --cuda-graph-max-bs is gone: argparse reports it ambiguous between these two.
        a("--cuda-graph-max-bs-decode", type=int, default=None)
        a("--cuda-graph-max-bs-prefill", type=int, default=None)
    else:
        a("--cuda-graph-max-bs", type=int, default=None)
    a("--disable-cuda-graph", action="store_true")
    a("--disable-cuda-graph-padding", action="store_true")
    a("--enable-profile-cuda-graph", action="store_true")
    a("--enable-nccl-nvls", action="store_true")
    a("--enable-symm-mem", action="store_true")
    a("--disable-outlines-disk-cache", action="store_true")
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-mscclpp", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--enable-dp-attention", action="store_true")
    a("--enable-dp-lm-head", action="store_true")
    a("--enable-two-batch-overlap", action="store_true")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--torchao-config", type=str, default="")
    a("--enable-nan-detection", action="store_true")
    a("--enable-p2p-check", action="store_true")
    a("--triton-attention-reduce-in-fp32", action="store_true")
    a("--triton-attention-num-kv-splits", type=int, default=8)
    a("--num-continuous-decode-steps", type=int, default=1)
    a("--delete-ckpt-after-loading", action="store_true")
    a("--enable-memory-saver", action="store_true")
    a("--allow-auto-truncate", action="store_true")
    a("--enable-custom-logit-processor", action="store_true")
    a("--disable-shared-experts-fusion", action="store_true")
    a("--disable-chunked-prefix-cache", action="store_true")
    a("--disable-fast-image-processor", action="store_true")
    a("--enable-hierarchical-cache", action="store_true")
    a("--hicache-ratio", type=float, default=2.0)
    a("--enable-deterministic-inference", action="store_true")


def make_parser() -> argparse.ArgumentParser:
    """The launch_server argument parser of this release."""
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser


class ServerArgs:
    """All server options, validated and completed like SGLang's ServerArgs dataclass."""

    def __init__(self, **kwargs) -> None:
        defaults = vars(make_parser().parse_args(["--model-path", kwargs.get("model_path", "")]))
        defaults.update(kwargs)
        self.__dict__.update(defaults)
        self.__post_init__()

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        return cls(**vars(args))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_"))
        return "ServerArgs(" + inner + ")"

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if self.device is None:
            self.device = "cuda"
        if self.random_seed is None:
            self.random_seed = 42
        if ":" in self.served_model_name and self.served_model_name != self.model_path:
            raise ValueError(
                f"served_model_name must not contain ':' (got {self.served_model_name!r}): the "
                "':' separates the model name from a LoRA adapter name in requests."
            )
        if self.disable_cuda_graph and at_least(0, 5, 20):
            log("--disable-cuda-graph is deprecated and will be removed in a future release.")
        self._hf_config = load_config(self.model_path)
        self._handle_gpu_memory_settings()
        self._handle_attention_backend_compatibility()
        self._handle_speculative_decoding()
        self.check_server_args()

    def get_hf_config(self):
        return self._hf_config

    def _handle_gpu_memory_settings(self) -> None:
        if self.mem_fraction_static is None:
            self.mem_fraction_static = 0.88 if self.tp_size >= 2 else 0.85
            if self.speculative_algorithm is not None:
                self.mem_fraction_static = round(self.mem_fraction_static - 0.01, 3)
        if self.chunked_prefill_size is None:
            self.chunked_prefill_size = 8192
        if self.page_size is None:
            self.page_size = 1

    def _handle_attention_backend_compatibility(self) -> None:
        cc = hardware.compute_capability()
        if cc is None:
            return
        sm100 = cc[0] == 10
        for name in (self.attention_backend, self.decode_attention_backend,
                     self.prefill_attention_backend):
            if name == "trtllm_mha" and not sm100:
                raise ValueError(
                    "TRTLLM MHA backend is only supported on Blackwell GPUs (SM100). Please use "
                    "a different backend."
                )
            if name == "trtllm_mla" and not sm100:
                raise ValueError(
                    "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100). Please use "
                    "a different backend."
                )
        if self.attention_backend is None:
            self.attention_backend = "triton" if self._hf_config.is_mla else "flashinfer"
            log("Attention backend not explicitly specified. "
                f"Use {self.attention_backend} backend by default.")

    def _handle_speculative_decoding(self) -> None:
        if self.speculative_draft_model_path is not None and (
            self.speculative_draft_model_revision is None
        ):
            self.speculative_draft_model_revision = "main"
        if self.speculative_algorithm is None:
            return
        if self.speculative_draft_model_quantization is None:
            self.speculative_draft_model_quantization = self.quantization
        if at_least(0, 5, 15):
            name = str(self.speculative_algorithm).upper()
            if name not in SPEC_ALGORITHMS_LATER:
                raise ValueError(f"Unknown speculative algorithm name: {name}")
            self.speculative_algorithm = name
        if self.speculative_algorithm == "NEXTN":
            self.speculative_algorithm = "EAGLE"

        if self.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE", "DFLASH"):
            if self.max_running_requests is None:
                self.max_running_requests = 48
                log("Max running requests is reset to 48 for speculative decoding. You can "
                    "override this by explicitly setting --max-running-requests.")
            self._handle_spec_overlap()
            if self.enable_mixed_chunk:
                self.enable_mixed_chunk = False
                log("Mixed chunked prefill is disabled because of using eagle speculative "
                    "decoding.")
            model_arch = self._hf_config.arch
            if model_arch in DEEPSEEK_MTP_ARCHITECTURES:
                if self.speculative_draft_model_path is None:
                    self.speculative_draft_model_path = self.model_path
                    self.speculative_draft_model_revision = self.revision
                else:
                    log("DeepSeek MTP does not require setting speculative_draft_model_path.")
            if self.speculative_num_steps is None:
                assert (
                    self.speculative_eagle_topk is None
                    and self.speculative_num_draft_tokens is None
                )
                (
                    self.speculative_num_steps,
                    self.speculative_eagle_topk,
                    self.speculative_num_draft_tokens,
                ) = auto_choose_speculative_params(self)
            if self.speculative_eagle_topk is None:
                self.speculative_eagle_topk = 1
            if self.speculative_num_draft_tokens is None:
                self.speculative_num_draft_tokens = self.speculative_num_steps + 1
            if self.speculative_eagle_topk > 1 and at_least(0, 5, 12):
                if not self.disable_overlap_schedule:
                    self.disable_overlap_schedule = True
                    log("Spec v1 is used for eagle/eagle3/standalone speculative decoding "
                        "because spec v2 currently only supports topk = 1.")
            if (
                self.speculative_eagle_topk == 1
                and self.speculative_num_draft_tokens != self.speculative_num_steps + 1
            ):
                log("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                    "when speculative_eagle_topk == 1")
                self.speculative_num_draft_tokens = self.speculative_num_steps + 1

        if self.speculative_algorithm == "NGRAM":
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

    def _handle_spec_overlap(self) -> None:
        if at_least(0, 5, 12):
            if self.speculative_eagle_topk is not None and self.speculative_eagle_topk > 1:
                return  # handled after the auto choice: fall back to spec v1
            if not self.disable_overlap_schedule:
                log("Spec v2 is enabled by default for eagle/eagle3/standalone speculative "
                    "decoding.")
            return
        # 0.5.9: spec v2 is opt-in (SGLANG_ENABLE_SPEC_V2)
        if _env_flag("SGLANG_ENABLE_SPEC_V2"):
            self.disable_overlap_schedule = False
            log("Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule "
                "is turned on.")
            if self.speculative_eagle_topk is not None and self.speculative_eagle_topk > 1:
                raise ValueError(
                    "Spec v2 currently only supports topk = 1 for speculative decoding."
                )
        else:
            self.disable_overlap_schedule = True
            log("Overlap scheduler is disabled when spec v2 is off or using unsupported "
                "speculative algorithm. You can set env SGLANG_ENABLE_SPEC_V2=True to enable the "
                "experimental overlap scheduler. ")

    def check_server_args(self) -> None:
        assert (
            self.tp_size * self.pp_size
        ) % self.nnodes == 0, "tp_size must be divisible by number of nodes"
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ValueError("--dist-init-addr is required when --nnodes > 1 (format HOST:PORT).")
        if self.dist_init_addr is not None and ":" not in self.dist_init_addr:
            raise ValueError(
                f"--dist-init-addr must be HOST:PORT, got {self.dist_init_addr!r}"
            )
        assert 0 <= self.node_rank < self.nnodes, "node_rank must be in [0, nnodes)"
        assert self.base_gpu_id >= 0, "base_gpu_id must be non-negative"
        assert self.gpu_id_step >= 1, "gpu_id_step must be positive"
        json.loads(self.json_model_override_args)


def auto_choose_speculative_params(self: ServerArgs):
    """(num_steps, eagle_topk, num_draft_tokens) chosen from the target's architecture."""
    arch = self.get_hf_config().arch
    if arch in ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM") + KIMI_K25_ARCHITECTURES:
        return (3, 1, 4)
    return (5, 4, 8)


def prepare_server_args(argv: list) -> ServerArgs:
    """Parse the command line (exit 2 with usage on a bad flag) and validate it."""
    parser = make_parser()
    raw = parser.parse_args(argv)
    return ServerArgs.from_cli_args(raw)
