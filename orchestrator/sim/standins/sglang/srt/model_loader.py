"""Model loading of the stand-in: CUDA init, quantization config, GPU memory, weights, drafter.

Nothing is computed; each phase takes its nominal time (scaled by the hardware's time scale) and
fails the way SGLang fails when the checkpoint, the drafter, the libraries or the GPUs are wrong.
The HTTP port stays closed for all of it.
"""

from __future__ import annotations

import glob
import os
import threading

from sglang.srt import hardware
from sglang.srt.hf_config import KIMI_K25_ARCHITECTURES, HFConfig, load_config
from sglang.srt.utils import at_least, log
from sglang.version import __version__

EAGLE3_DRAFT_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
MLA_DRAFT_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM",)
ACCEPT_PROB = 0.72  # per-token acceptance of a matched EAGLE-3 drafter: 3 steps -> 2.61
SPEC_OVERHEAD = 2.61 / 1.65  # step cost of EAGLE-3 (3 steps, topk 1) vs a plain decode step


class Stopped(Exception):
    """SIGTERM/SIGINT arrived while loading."""


class SpecProfile:
    """How speculation behaves for this target/drafter pair (the speed model's inputs)."""

    def __init__(self, enabled: bool, accept_length: float = 1.0, speedup_at_1: float = 1.0,
                 num_draft_tokens: int = 1, note: str = "") -> None:
        self.enabled = enabled
        self.accept_length = accept_length
        self.speedup_at_1 = speedup_at_1
        self.num_draft_tokens = max(1, num_draft_tokens)
        self.note = note


class LoadedModel:
    """What loading produced: configs, GPUs held, KV capacity and the speculation profile."""

    def __init__(self) -> None:
        self.hf_config = None
        self.draft_config = None
        self.gpus = []
        self.total_mib = 0
        self.max_total_num_tokens = 0
        self.spec = SpecProfile(False)
        self.context_len = 0
        self.cuda_graph_max_bs = 0


class ModelLoader:
    """Runs the start-up phases in SGLang's order (rank TP0's view)."""

    def __init__(self, server_args, stop: threading.Event) -> None:
        self.args = server_args
        self.stop = stop
        self.scale = hardware.time_scale()
        self.result = LoadedModel()

    # -------------------------------------------------------------- helpers
    def _sleep(self, nominal_seconds: float) -> None:
        if self.stop.wait(max(0.0, nominal_seconds) * self.scale):
            raise Stopped()

    # -------------------------------------------------------------- phases
    def run(self) -> LoadedModel:
        args = self.args
        cfg = args.get_hf_config()
        self.result.hf_config = cfg
        hardware.cuda_init()
        gpus = self._pick_gpus()
        self._verify_quantization(cfg)
        self._allocate(gpus)
        self._load_target(cfg)
        self._load_draft(cfg)
        self._init_attention_backend(cfg)
        self._init_memory_pool(cfg)
        self._capture_cuda_graphs()
        return self.result

    def _pick_gpus(self) -> list:
        args = self.args
        per_node = max(1, (args.tp_size * args.pp_size) // max(1, args.nnodes))
        visible = hardware.visible_gpus()
        wanted = [args.base_gpu_id + i * args.gpu_id_step for i in range(per_node)]
        if not visible or wanted[-1] >= len(visible):
            raise RuntimeError(
                f"CUDA error: invalid device ordinal (this node needs {per_node} GPUs for "
                f"tp_size={args.tp_size} pp_size={args.pp_size} nnodes={args.nnodes}, "
                f"{len(visible)} visible)"
            )
        chosen = [visible[i] for i in wanted]
        self.result.gpus = [int(g["index"]) for g in chosen]
        self.result.total_mib = int(chosen[0].get("memory_total_mib", 0))
        return chosen

    def _verify_quantization(self, cfg: HFConfig) -> None:
        qc = cfg.quantization_config
        if not qc:
            return
        method = str(qc.get("quant_method", "")).replace("_", "-")
        wanted = self.args.quantization
        if wanted is not None and wanted.replace("_", "-") != method:
            raise ValueError(
                f"Quantization method specified in the model config ({method}) does not match the "
                f"quantization method specified in the `quantization` argument ({wanted})."
            )
        if method == "compressed-tensors":
            for fmt in cfg.quant_formats():
                _get_scheme_format(fmt)
            if "nvfp4-pack-quantized" in cfg.quant_formats():
                cc = hardware.compute_capability() or (0, 0)
                if cc[0] == 12:
                    log("Using MarlinNVFP4 (W4A16) kernels for nvfp4-pack-quantized weights on "
                        f"sm_{cc[0]}{cc[1]}.", "TP0")

    def _allocate(self, gpus: list) -> None:
        mib = int(self.result.total_mib * float(self.args.mem_fraction_static))
        hardware.allocate(mib, self.result.gpus)

    def _load_target(self, cfg: HFConfig) -> None:
        total_gb = self.result.total_mib / 1024.0
        log(f"Load weight begin. avail mem={total_gb * 0.985:.2f} GB", "TP0")
        shards = sorted(glob.glob(os.path.join(self.args.model_path, "*.safetensors")))
        n = max(len(shards), 1) if shards else 64
        seconds = hardware.nominal_load_seconds()
        per = seconds / n
        log(f"Loading safetensors checkpoint shards:   0% Completed | 0/{n} [00:00<?, ?it/s]")
        for i in range(1, n + 1):
            self._sleep(per)
            done = per * i
            left = per * (n - i)
            log(f"Loading safetensors checkpoint shards: {100 * i // n:3d}% Completed | {i}/{n} "
                f"[{_mmss(done)}<{_mmss(left)}, {per:.2f}s/it]")
        static_gb = total_gb * float(self.args.mem_fraction_static)
        weights_gb = min(static_gb * 0.8, 548.0 / max(1, self.args.tp_size))
        self._weights_gb = weights_gb
        log(f"Load weight end. type={cfg.arch}, dtype=torch.bfloat16, "
            f"avail mem={total_gb * 0.985 - weights_gb:.2f} GB, mem usage={weights_gb:.2f} GB.",
            "TP0")

    def _load_draft(self, cfg: HFConfig) -> None:
        args = self.args
        algo = args.speculative_algorithm
        if algo is None:
            return
        steps = int(args.speculative_num_steps or 1)
        ndt = int(args.speculative_num_draft_tokens or steps + 1)
        if algo == "NGRAM":
            self.result.spec = SpecProfile(True, 1.4, 1.15, ndt, "ngram")
            return
        if algo == "EAGLE3" and cfg.arch in KIMI_K25_ARCHITECTURES and not at_least(0, 5, 10):
            raise ValueError(
                f"EAGLE3 speculative decoding is not supported for {cfg.arch} in sglang "
                f"{__version__}: the target model cannot capture auxiliary hidden states for the "
                "drafter."
            )
        draft_path = args.speculative_draft_model_path
        if draft_path is None:
            raise ValueError(
                f"speculative_draft_model_path is required for {algo} speculative decoding."
            )
        dcfg = load_config(draft_path)
        self.result.draft_config = dcfg
        same_as_target = os.path.realpath(draft_path) == os.path.realpath(args.model_path)
        darch = dcfg.arch
        if darch in MLA_DRAFT_ARCHITECTURES and not at_least(0, 5, 12):
            raise ValueError(
                f"Model architectures ['{darch}'] are not supported for now. Supported "
                "architectures: dict_keys(['DeepseekV3ForCausalLMNextN', 'LlamaForCausalLMEagle', "
                "'LlamaForCausalLMEagle3', 'Qwen2ForCausalLMEagle', ...])"
            )
        is_eagle3_draft = any(a in EAGLE3_DRAFT_ARCHITECTURES for a in dcfg.architectures)
        if is_eagle3_draft and dcfg.num_hidden_layers != 1 and not at_least(0, 5, 12):
            raise ValueError("EAGLE3 currently only supports 1 layer")
        log(f"Load weight begin. avail mem={self.result.total_mib / 1024.0 * 0.1:.2f} GB", "TP0")
        self._sleep(8.0 if not same_as_target else hardware.nominal_load_seconds())
        if is_eagle3_draft and (
            dcfg.hidden_size != cfg.hidden_size or dcfg.vocab_size != cfg.vocab_size
        ):
            # The drafter shares the target's embedding: its shape must match the drafter's.
            raise AssertionError(
                f"Attempted to load weight (torch.Size([{cfg.vocab_size}, {cfg.hidden_size}])) "
                f"into parameter (torch.Size([{dcfg.vocab_size}, {dcfg.hidden_size}]))"
            )
        log(f"Load weight end. type={darch}, dtype=torch.bfloat16, "
            f"avail mem={self.result.total_mib / 1024.0 * 0.08:.2f} GB, mem usage=0.75 GB.", "TP0")

        if same_as_target:
            profile = SpecProfile(True, 1.0, 0.5, ndt, "target model used as its own draft")
        elif is_eagle3_draft and algo == "EAGLE":
            profile = SpecProfile(True, 1.0, 0.9, ndt, "EAGLE with an EAGLE-3 drafter")
        elif is_eagle3_draft or algo in ("EAGLE", "DFLASH"):
            accept = sum(ACCEPT_PROB ** i for i in range(steps + 1))
            accept = min(accept, float(ndt))
            profile = SpecProfile(True, accept, accept / SPEC_OVERHEAD, ndt, "matched drafter")
        elif algo == "STANDALONE":
            profile = SpecProfile(True, 2.0, 1.2, ndt, "standalone draft model")
        else:
            profile = SpecProfile(True, 1.0, 0.9, ndt, "drafter of an unexpected kind")
        self.result.spec = profile

    def _init_attention_backend(self, cfg: HFConfig) -> None:
        cc = hardware.compute_capability() or (0, 0)
        backend = self.args.decode_attention_backend or self.args.attention_backend
        for name in (backend, self.args.prefill_attention_backend):
            if name == "fa3":
                assert (cc[0] == 8 and not cfg.is_mla) or cc[0] == 9, (
                    "FlashAttention v3 Backend requires SM>=80 and SM<=90. "
                    "Please use `--attention-backend flashinfer`."
                )
            if name in ("flashmla", "cutlass_mla", "fa4") and cc[0] not in (9, 10):
                raise RuntimeError(
                    f"{name} attention backend is not supported on sm_{cc[0]}{cc[1]}."
                )

    def _init_memory_pool(self, cfg: HFConfig) -> None:
        args = self.args
        total_gb = self.result.total_mib / 1024.0
        kv_gb = max(0.5, total_gb * float(args.mem_fraction_static) - self._weights_gb)
        layers = int(cfg.num_hidden_layers or 32)
        if cfg.is_mla:
            bytes_per_token = layers * (512 + 64) * 2
        else:
            hidden = int(cfg.hidden_size or 4096)
            bytes_per_token = layers * 2 * hidden * 2 // max(1, args.tp_size)
        if args.kv_cache_dtype.startswith("fp8"):
            bytes_per_token //= 2
        tokens = int(kv_gb * (1 << 30) / max(1, bytes_per_token))
        if args.max_total_tokens:
            tokens = min(tokens, int(args.max_total_tokens))
        self.result.max_total_num_tokens = tokens
        self.result.context_len = int(args.context_length or cfg.context_length)
        log(f"KV Cache is allocated. #tokens: {tokens}, KV size: {kv_gb:.2f} GB", "TP0")
        if args.max_running_requests is None:
            args.max_running_requests = min(1024, max(1, tokens // 512))
        log(f"max_total_num_tokens={tokens}, chunked_prefill_size={args.chunked_prefill_size}, "
            f"max_prefill_tokens={args.max_prefill_tokens}, "
            f"max_running_requests={args.max_running_requests}, "
            f"context_len={self.result.context_len}, available_gpu_mem={total_gb * 0.04:.2f} GB",
            "TP0")

    def _capture_cuda_graphs(self) -> None:
        args = self.args
        max_bs = getattr(args, "cuda_graph_max_bs", None) or getattr(
            args, "cuda_graph_max_bs_decode", None
        )
        if args.cuda_graph_bs:
            max_bs = max(args.cuda_graph_bs)
        if max_bs is None:
            max_bs = 64 if self.result.spec.enabled or args.speculative_algorithm else 160
            max_bs = min(max_bs, int(args.max_running_requests or max_bs))
        self.result.cuda_graph_max_bs = 0 if args.disable_cuda_graph else int(max_bs)
        if args.disable_cuda_graph:
            return
        log("Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB"
            % (self.result.total_mib / 1024.0 * 0.04), "TP0")
        self._sleep(30.0)
        log("Capture cuda graph end. Time elapsed: 30.00 s. mem usage=1.20 GB. avail mem=%.2f GB."
            % (self.result.total_mib / 1024.0 * 0.03), "TP0")


def _get_scheme_format(fmt: str):
    """Map a checkpoint's compressed-tensors `format` string to the library's enum member."""
    from compressed_tensors import CompressionFormat

    if fmt == "nvfp4-pack-quantized":
        return CompressionFormat.nvfp4_pack_quantized
    for member in CompressionFormat:
        if member.value == fmt:
            return member
    return None


def _mmss(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"
