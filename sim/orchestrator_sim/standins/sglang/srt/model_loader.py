"""Model loading of the stand-in: CUDA init, quantization config, GPU memory, weights, drafter.

Nothing is computed; each phase takes its nominal time (scaled by the hardware's time scale) and
fails the way SGLang fails when the checkpoint, the drafter, the libraries or the GPUs are wrong.
The HTTP port stays closed for all of it.
"""

from __future__ import annotations

import glob
import json
import math
import os
import threading
import time

from sglang.srt import distributed, hardware, kernel_cache
from sglang.srt.hf_config import KIMI_K25_ARCHITECTURES, HFConfig, load_config
from sglang.srt.server_args import ALLOW_LONGER_CONTEXT
from sglang.srt.utils import at_least, log
from sglang.version import __version__

EAGLE3_DRAFT_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
MLA_DRAFT_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM",)
ACCEPT_PROB = 0.72  # per-token acceptance of a matched EAGLE-3 drafter: 3 steps -> 2.61
TARGET_AS_DRAFT = 0.038 / 0.0072  # a draft step of the full target costs a target forward
#: Free memory torch reports before the weights load ("Load weight begin. avail mem=") is the
#: GPU's total less what the process already holds at that point: the CUDA context (~0.5 GiB on
#: Hopper/Blackwell with the kernel images loaded), the NCCL communicators of the TP group and
#: the custom all-reduce IPC buffers (~1 GiB at tp 8). This stand-in's reading: 1536 MiB in all,
#: the same for every release (SGLang measures it, model_runner.py:828-853 (0.5.9)).
CUDA_CONTEXT_MIB = 1536
#: What the load leaves allocated beside the weights (the sampler's and the attention
#: backend's workspaces, the torch allocator's rounding): 512 MiB.
LOAD_MISC_MIB = 512
#: The vision cache a multimodal model keeps out of the KV budget from 0.5.19:
#: SGLANG_VLM_CACHE_SIZE_MB (environ.py:1248 (0.5.19)) in mm_runtime_reservation_gb,
#: mem_cache/kv_cache_configurator.py:132-149 (0.5.19), :202-218 (0.5.23).
VLM_CACHE_MIB = 100
#: A one-layer EAGLE-3 head of a 7168-hidden target (midlayer, fc, a 32k draft lm_head) is
#: about 1B parameters: 2 GB in bf16, spread over the ranks.
DRAFT_BYTES_WITHOUT_WEIGHTS = 2_000_000_000


class Stopped(Exception):
    """SIGTERM/SIGINT arrived while loading."""


class SpecProfile:
    """How speculation behaves for this target/drafter pair (the speed model's inputs).

    accept_length: tokens a verify step emits per request on average; num_steps, topk,
    num_draft_tokens: the launch's speculative settings; draft_scale: the cost of one draft
    forward relative to a one-layer EAGLE-3 drafter (engine.spec_step_seconds).
    """

    def __init__(self, enabled: bool, accept_length: float = 1.0, num_steps: int = 1,
                 topk: int = 1, num_draft_tokens: int = 1, draft_scale: float = 1.0,
                 note: str = "") -> None:
        self.enabled = enabled
        self.accept_length = accept_length
        self.num_steps = max(1, num_steps)
        self.topk = max(1, topk)
        self.num_draft_tokens = max(1, num_draft_tokens)
        self.draft_scale = draft_scale
        self.note = note


def eagle3_accept_length(steps: int, topk: int, ndt: int) -> float:
    """Accept length of a matched EAGLE-3 drafter (a model, not SGLang's code).

    A chain (topk 1) of `steps` drafts accepts draft i with probability ACCEPT_PROB ** i, plus
    the bonus token: 3 steps -> 2.61. A tree (topk > 1) of num_draft_tokens - 1 drafts over
    min(steps, ndt - 1) levels has b = min(topk, drafts / levels) candidates per level; a level
    is accepted with 1 - (1 - ACCEPT_PROB) / sqrt(b): wider trees accept more, with diminishing
    returns (3 steps, topk 4, 8 tokens -> 3.03).
    """
    depth = max(1, min(steps, ndt - 1))
    branch = max(1.0, min(float(topk), (ndt - 1) / float(depth)))
    level = 1.0 - (1.0 - ACCEPT_PROB) / math.sqrt(branch)
    return sum(level ** i for i in range(depth + 1))


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
        #: min(context_len - 1, pool - 1): the longest request the scheduler admits
        #: (tp_worker.py:287-294 (0.5.9), :557-568 (0.5.23))
        self.max_req_len = 0
        self.cuda_graph_max_bs = 0
        self.group = None  # the multi-node group's links (srt/distributed.py), kept open
        #: what the first forward (the server's warm-up request) raises, if anything
        self.first_request_error = None

    def first_forward(self) -> None:
        """Run the first forward: raise what real SGLang's first batch would raise."""
        if self.first_request_error is not None:
            raise self.first_request_error


class ModelLoader:
    """Runs the start-up phases in the release's order (rank TP0's view).

    0.5.9 - 0.5.12: target weights, target KV pool, target attention backend, target CUDA
    graphs, then the draft worker (model_runner.py:493/590/607/609 (0.5.9); scheduler.py:563-565).
    0.5.15+: target weights, draft weights, both pools, both backends, then graphs
    (scheduler.py:864-875 (0.5.15), :1128-1146 (0.5.23)).
    """

    def __init__(self, server_args, stop: threading.Event) -> None:
        self.args = server_args
        self.stop = stop
        self.scale = hardware.time_scale()
        self.result = LoadedModel()
        self._weights_gb = 0.0
        self._free_gb = 0.0
        self._draft_gb = 0.0
        self._misc_gb = 0.0
        #: what fails the server's warm-up request (its first forward), if anything
        self._first_request_error = None
        #: the target's verify backend drops the tree mask (flashinfer MLA, topk > 1)
        self._aux_capture = None  # (captured, wanted) aux hidden states, when short
        #: where start-up is: "sched-init" until the target's weights loaded, then "after-load"
        self.phase = "sched-init"

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
        self._wait_for_peers()
        self._check_draft_context_early(cfg)
        self._verify_quantization(cfg)
        self._allocate(gpus)
        self._load_target(cfg)
        if at_least(0, 5, 15):
            # v2: both loads, then the draft worker's pool (token map, lm_head, the rejection
            # sampling vocab check), then both backends: eagle_worker_v2.py:244-295 (0.5.23)
            self._load_draft(cfg)
            self._init_memory_pool(cfg)
            self._init_draft_worker(cfg)
            self._init_attention_backend(cfg, draft=False)
            self._init_attention_backend(cfg, draft=True)
        else:
            self._init_memory_pool(cfg)
            self._init_attention_backend(cfg, draft=False)
            self._load_draft(cfg)
            self._init_draft_worker(cfg)
            self._init_attention_backend(cfg, draft=True)
        self._capture_cuda_graphs()
        self._check_tree_verify()
        self._check_vocab_map()
        return self.result

    def warmup(self) -> None:
        """The server's warm-up: one generate request sent right after start-up
        (_wait_and_warmup, entrypoints/http_server.py (0.5.9 - 0.5.23)). Its first forward
        finds what no start-up step checks; the scheduler dies with the error."""
        self.phase = "first-request"
        self.result.first_forward()

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
        used = max(int(g.get("memory_used_mib", 0) or 0) for g in chosen)
        # the pre-load free memory SGLang profiles (min over ranks): see CUDA_CONTEXT_MIB
        self._free_gb = max(0.0, self.result.total_mib - used - CUDA_CONTEXT_MIB) / 1024.0
        return chosen

    def _wait_for_peers(self) -> None:
        """nnodes > 1 with --dist-init-addr: the group's rendezvous (srt/distributed.py).
        Without it every node initialises torch.distributed at its
        own tcp://127.0.0.1 and waits for the others until the timeout (model_runner.py:773-779
        (0.5.9); distributed/bootstrap.py:233-247 (0.5.23)). Nothing checks it at start."""
        args = self.args
        if args.nnodes > 1 and args.dist_init_addr:
            # every node rank waits for the others at tcp://DIST_INIT_ADDR (srt/distributed.py)
            group = distributed.Group(args, self.stop)
            try:
                group.join()
            except distributed.Stopped:
                raise Stopped() from None
            self.result.group = group
            return
        if args.nnodes > 1 and not args.dist_init_addr:
            timeout = float(getattr(args, "dist_timeout", None) or 1800)
            log(f"Init torch distributed begin. nnodes={args.nnodes}, no --dist-init-addr: "
                "waiting for the other ranks on 127.0.0.1", "TP0")
            self._sleep(timeout)
            raise RuntimeError(f"torch.distributed init timed out after {timeout:.0f}s waiting "
                               f"for {args.tp_size} ranks (world size) on tcp://127.0.0.1")

    def _check_draft_context_early(self, cfg: HFConfig) -> None:
        """An explicit --context-length above the drafter's: the target runner builds the draft
        ModelConfig with it before the load (model_runner.py:345-368 (0.5.9); 0.5.15-0.5.19
        only with a draft path; spec_aux_hidden_state.py:132-196 (0.5.23))."""
        args = self.args
        if args.speculative_algorithm != "EAGLE3" or not args.context_length:
            return
        draft = args.speculative_draft_model_path
        if draft is None:
            return
        derived = load_config(draft).context_length
        if args.context_length > derived and not _env_on(ALLOW_LONGER_CONTEXT):
            raise ValueError(_longer_context("User-specified", args.context_length, derived))

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

    def _weights_per_gpu_gb(self, cfg: HFConfig) -> float:
        """The checkpoint's weights over tp x pp ranks. A folder without weights (a bare
        config.json in tests) counts as 80% of the static budget, at most 548 GB / ranks."""
        size = cfg.weight_bytes
        ranks = max(1, self.args.tp_size * self.args.pp_size)
        if size:
            return size / ranks / (1 << 30)
        static = self._free_gb * float(self.args.mem_fraction_static)
        return min(static * 0.8, 548.0 / ranks)

    def _since(self, t0: float) -> float:
        """Nominal seconds since monotonic T0 (what real SGLang's `elapsed=` would say)."""
        return (time.monotonic() - t0) / max(hardware.time_scale(), 1e-9)

    def _load_target(self, cfg: HFConfig) -> None:
        total_gb = self.result.total_mib / 1024.0
        t0 = time.monotonic()
        log(f"Load weight begin. avail mem={self._free_gb:.2f} GB", "TP0")
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
        self.phase = "after-load"  # the 15 minutes are spent; what fails now fails late
        weights_gb = self._weights_per_gpu_gb(cfg)
        if weights_gb > self._free_gb:
            raise hardware.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {weights_gb:.2f} GiB. GPU 0 has a total "
                f"capacity of {total_gb:.2f} GiB of which {self._free_gb:.2f} GiB is free.")
        self._weights_gb = weights_gb
        self._misc_gb = LOAD_MISC_MIB / 1024.0
        # the real line: model_runner.py:1041-1047 (0.5.9), :1373-1379 (0.5.23)
        log(f"Load weight end. elapsed={self._since(t0):.2f} s, type={cfg.arch}, "
            f"dtype=torch.bfloat16, avail mem={self._free_gb - weights_gb - self._misc_gb:.2f} GB, "
            f"mem usage={weights_gb:.2f} GB.", "TP0")

    def _load_draft(self, cfg: HFConfig) -> None:
        args = self.args
        algo = args.speculative_algorithm
        if algo is None:
            return
        steps = int(args.speculative_num_steps or 1)
        topk = int(args.speculative_eagle_topk or 1)
        ndt = int(args.speculative_num_draft_tokens or steps + 1)
        shape = {"num_steps": steps, "topk": topk, "num_draft_tokens": ndt}
        if algo == "NGRAM":  # drafts are n-gram lookups on the CPU: almost free, rarely right
            self.result.spec = SpecProfile(True, 1.4, **dict(shape, num_steps=1),
                                           draft_scale=0.1, note="ngram")
            return
        if algo in ("EAGLE", "EAGLE3") and cfg.arch in KIMI_K25_ARCHITECTURES and \
                not at_least(0, 5, 10):
            # KimiK25ForConditionalGeneration has no set_eagle3_layers_to_capture /
            # get_embed_and_head before 0.5.10: models/kimi_k25.py:648 (0.5.9), added :841-850
            # (0.5.10); raised at model_runner.py:621-624 / eagle_worker.py:157 (0.5.9)
            missing = "set_eagle3_layers_to_capture" if algo == "EAGLE3" else "get_embed_and_head"
            raise AttributeError(f"'{cfg.arch}' object has no attribute '{missing}'")
        # no draft path: the draft worker's ModelConfig falls back to the target
        # (configs/model_config.py:251 (0.5.9), :956 (0.5.23): `model_path or
        # server_args.model_path`)
        draft_path = args.speculative_draft_model_path or args.model_path
        dcfg = load_config(draft_path)
        self.result.draft_config = dcfg
        same_as_target = os.path.realpath(draft_path) == os.path.realpath(args.model_path)
        self._check_draft_class(dcfg)
        self._check_draft_context(cfg, dcfg)
        t0 = time.monotonic()
        log(f"Load weight begin. avail mem={self._free_gb - self._weights_gb:.2f} GB", "TP0")
        if same_as_target and cfg.arch in ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"):
            # the draft of a DeepSeek V3 checkpoint is its MTP module, DeepseekV3ForCausalLMNextN
            # (configs/model_config.py _config_draft_model, :1032-1036 (0.5.23)): small, and
            # untrained where the checkpoint has no MTP layers (num_nextn_predict_layers 0)
            self._sleep(8.0)
            mtp = int(cfg.get("num_nextn_predict_layers") or 0)
            self._draft_gb = 0.75
            self.result.spec = (_spec_profile(algo, cfg, False, shape) if mtp else
                                SpecProfile(True, 1.0, **shape,
                                            note="MTP draft without MTP weights"))
            log(f"Load weight end. elapsed={self._since(t0):.2f} s, "
                "type=DeepseekV3ForCausalLMNextN, dtype=torch.bfloat16, "
                f"avail mem={self._free_gb - self._weights_gb - 0.75:.2f} GB, mem usage=0.75 GB.",
                "TP0")
            return
        if same_as_target:
            self._sleep(hardware.nominal_load_seconds())
            need = self._weights_per_gpu_gb(dcfg)
            left = self._free_gb - self._weights_gb
            if need > left:
                raise hardware.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {need:.2f} GiB. GPU 0 has a total "
                    f"capacity of {self.result.total_mib / 1024.0:.2f} GiB of which "
                    f"{max(0.0, left):.2f} GiB is free.")
        else:
            self._sleep(8.0)
        self._check_draft_weights(cfg, dcfg)
        # a drafter folder without weights (a bare config.json in tests) counts as
        # DRAFT_BYTES_WITHOUT_WEIGHTS over the tp x pp ranks
        draft_gb = self._weights_per_gpu_gb(dcfg) if dcfg.weight_bytes else \
            DRAFT_BYTES_WITHOUT_WEIGHTS / max(1, args.tp_size * args.pp_size) / (1 << 30)
        self._draft_gb = draft_gb
        left = self._free_gb - self._weights_gb - draft_gb
        log(f"Load weight end. elapsed={self._since(t0):.2f} s, type={dcfg.arch}, "
            f"dtype=torch.bfloat16, avail mem={left:.2f} GB, mem usage={draft_gb:.2f} GB.",
            "TP0")
        self.result.spec = _spec_profile(algo, dcfg, same_as_target, shape)

    def _check_draft_class(self, dcfg: HFConfig) -> None:
        """The draft model class: models/llama_eagle3.py, models/kimi_k25_eagle3.py."""
        darch = dcfg.arch
        if darch in MLA_DRAFT_ARCHITECTURES:
            if not at_least(0, 5, 12):  # no kimi_k25_eagle3.py before 0.5.12
                raise ValueError(
                    f"Model architectures ['{darch}'] are not supported for now. Supported "
                    "architectures: dict_keys(['DeepseekV3ForCausalLMNextN', "
                    "'LlamaForCausalLMEagle', 'LlamaForCausalLMEagle3', ...])")
            if dcfg.num_hidden_layers != 1:  # kimi_k25_eagle3.py:243-244 (0.5.23)
                raise ValueError("EAGLE3 currently only supports 1 layer")
            if dcfg.get("q_lora_rank") is None:  # kimi_k25_eagle3.py:115 (0.5.23)
                raise ValueError("Eagle3 MLA layer requires q_lora_rank in the draft config")
        elif darch == "LlamaForCausalLMEagle3":
            if dcfg.num_hidden_layers != 1 and not at_least(0, 5, 12):
                raise ValueError("EAGLE3 currently only supports 1 layer")  # llama_eagle3.py:198
            heads = dcfg.get("num_attention_heads") or 1
            kv = dcfg.get("num_key_value_heads") or heads
            tp = self.args.tp_size
            # models/llama.py:139,145,149 (0.5.9), :183,189,193 (0.5.23): bare assertions
            assert heads % tp == 0
            assert (kv % tp == 0) if kv >= tp else (tp % kv == 0)
        quant = self.args.speculative_draft_model_quantization
        if quant in ("compressed-tensors", "compressed_tensors") and not dcfg.quantization_config:
            # weight_utils.py:240 (0.5.9), :375 (0.5.23): quant_cls() without a config
            raise TypeError(
                "CompressedTensorsConfig.__init__() missing 5 required positional arguments: "
                "'target_scheme_map', 'ignore', 'quant_format', 'sparsity_scheme_map', and "
                "'sparsity_ignore_list'")

    def _check_draft_context(self, cfg: HFConfig, dcfg: HFConfig) -> None:
        """The draft's context is forced to the target's (eagle_worker.py:107 (0.5.9),
        eagle_worker_v2.py:229 (0.5.23)) and checked (configs/model_config.py:359-390)."""
        target = self.args.context_length or cfg.context_length
        if target > dcfg.context_length and not _env_on(ALLOW_LONGER_CONTEXT):
            raise ValueError(_longer_context("Target model's", target, dcfg.context_length))

    def _check_draft_weights(self, cfg: HFConfig, dcfg: HFConfig) -> None:
        """An EAGLE-3 drafter shares the target's embedding (models/llama.py:910-918 (0.5.23))."""
        if not any(a in EAGLE3_DRAFT_ARCHITECTURES for a in dcfg.architectures):
            return
        hidden = dcfg.get("target_hidden_size") or dcfg.hidden_size
        if hidden != cfg.hidden_size or dcfg.vocab_size != cfg.vocab_size:
            raise AssertionError(
                f"Attempted to load weight (torch.Size([{cfg.vocab_size}, {cfg.hidden_size}])) "
                f"into parameter (torch.Size([{dcfg.vocab_size}, {hidden}]))")

    def _init_attention_backend(self, cfg: HFConfig, draft: bool) -> None:
        """The attention backend registry, per model runner (layers/attention/
        attention_registry.py). The draft runner inherits the target's backends unless
        --speculative-draft-attention-backend is set (model_runner.py:1739-1791 (0.5.9))."""
        args = self.args
        if draft and self.result.draft_config is None:
            return
        model = self.result.draft_config if draft else cfg
        mla = model.is_mla
        own = getattr(args, "speculative_draft_attention_backend", None) if draft else None
        names = {own} if own else {args.decode_attention_backend or args.attention_backend,
                                   args.prefill_attention_backend or args.attention_backend}
        cc = hardware.compute_capability() or (0, 0)
        for name in names - {None}:
            if name == "fa3":  # attention_registry.py:126-138 (0.5.9), :238-261 (0.5.23)
                assert (cc[0] == 8 and not mla) or cc[0] == 9, (
                    "FlashAttention v3 Backend requires SM>=80 and SM<=90. "
                    "Please use `--attention-backend flashinfer`.")
            if name in ("trtllm_mla", "tokenspeed_mla", "cutedsl_mla") and not mla:
                raise ValueError(f"{name} backend can only be used with MLA models.")
            if name == "trtllm_mha" and mla:  # attention_registry.py:158 (0.5.9), :280 (0.5.23)
                raise ValueError("trtllm_mha backend can only be used with non-MLA models.")
        if draft and args.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
            self._create_draft_backends(model)

    def _create_draft_backends(self, dcfg: HFConfig) -> None:
        """DraftBackendFactory (speculative/draft_utils.py): the multi-step draft decode
        backend (only with num_steps > 1: `== 1` :40 (0.5.9-0.5.12), `<= 1` :41 (0.5.15), :81
        (0.5.19), :86 (0.5.20-0.5.23)), then the draft-extend backend. Each is the
        --speculative-draft-attention-backend, else the decode / prefill backend, else
        --attention-backend (_create_backend :23-37 (0.5.9), :47-82 (0.5.23)); a name
        missing from the release's map raises (raise :35 (0.5.9-0.5.15), :59 (0.5.19), :64
        (0.5.20-0.5.23)); the messages: decode :63 (0.5.9), :64 (0.5.10), :66 (0.5.12), :69
        (0.5.15), :110 (0.5.19), :119 (0.5.20-0.5.22), :118 (0.5.23); extend :91 (0.5.9), :93
        (0.5.10), :97 (0.5.12), :103 (0.5.15), :142 (0.5.19), :155 (0.5.20-0.5.22), :153
        (0.5.23)."""
        args = self.args
        known = _draft_backend_map()
        own = args.opt("speculative_draft_attention_backend")
        steps = int(args.speculative_num_steps or 1)
        topk = int(args.speculative_eagle_topk or 1)
        if steps > 1:
            decode = own or args.decode_attention_backend or args.attention_backend
            if decode not in known:
                raise ValueError(f"EAGLE is not supported in decode attention backend {decode}")
            if decode == "flashinfer" and dcfg.is_mla and topk > 1:
                # an MLA drafter gets FlashInferMLAMultiStepDraftBackend (draft_utils.py:115
                # `use_mla_backend` of the draft runner, the last to set it (0.5.12); :121
                # (0.5.15), :227 (0.5.23)), which refuses a tree: flashinfer_mla_backend.py raise
                # :913 (0.5.12), :935 (0.5.15), :1189 (0.5.19), :1176 (0.5.20, 0.5.21), :1197
                # (0.5.22, 0.5.23). No MLA drafter loads before 0.5.12.
                raise ValueError("Currently Flashinfer MLA only supports topk=1 for speculative "
                                 "decoding")
        extend = own or args.prefill_attention_backend or args.attention_backend
        if extend not in known:
            raise ValueError(f"EAGLE is not supported in attention backend {extend}")

    def _init_draft_worker(self, cfg: HFConfig) -> None:
        """What the EAGLE draft worker finds once both models are there: the token map, the
        rejection sampling vocab, the target's aux hidden-state layers and the draft tree."""
        args = self.args
        dcfg = self.result.draft_config
        algo = args.speculative_algorithm
        if dcfg is None or algo not in ("EAGLE", "EAGLE3"):
            return
        if args.opt("speculative_token_map") and algo == "EAGLE3":
            # eagle_worker.py:123 (0.5.9, 0.5.10), :142 (0.5.12); eagle_worker_v2.py:182
            # (0.5.9), :188 (0.5.10), :201 (0.5.12), :317 (0.5.15), :276 (0.5.19), :310
            # (0.5.20), :317 (0.5.21), :308 (0.5.22), :328 (0.5.23)
            log("Speculative token map specified, but EAGLE3 models already have this. "
                "Ignoring the specified token map.", "TP0")
        # --speculative-use-block-verification turns rejection sampling on for EAGLE/EAGLE3
        # (arg_groups/speculative_hook.py:161 (0.5.22), :175 (0.5.23))
        if at_least(0, 5, 15) and (args.opt("speculative_use_rejection_sampling") or
                                   args.opt("speculative_use_block_verification")):
            # the draft vocab is hot_token_id.shape[0] (the drafter's d2t, draft_vocab_size),
            # else the target's: eagle_worker_v2.py raise :232 (0.5.15), :225 (0.5.19), :254
            # (0.5.20), :253 (0.5.21), :250 (0.5.22), :270 (0.5.23)
            target_vocab = cfg.vocab_size
            draft_vocab = dcfg.get("draft_vocab_size") or target_vocab
            if draft_vocab != target_vocab:
                raise ValueError(
                    "--speculative-use-rejection-sampling requires the draft and target to share "
                    f"one vocab, but the draft vocab ({draft_vocab}) != target vocab "
                    f"({target_vocab}).")
        steps = int(args.speculative_num_steps or 1)
        topk = int(args.speculative_eagle_topk or 1)
        ndt = int(args.speculative_num_draft_tokens or steps + 1)
        if topk > 1 and ndt - 1 > topk + (steps - 1) * topk ** 2:
            # organize_draft_results: torch.topk(score_list, num_draft_token - 1) over
            # topk + (steps - 1) * topk**2 scores, outside the CUDA graph, at the first decode:
            # speculative/eagle_utils.py:27 (0.5.9, 0.5.10), :28 (0.5.12), :114 (0.5.15), :117
            # (0.5.19), :116 (0.5.20), :120 (0.5.21), :123 (0.5.22), :110 (0.5.23); called at
            # eagle_worker.py:681 (0.5.9), eagle_worker_v2.py:919 (0.5.23). ServerArgs does not
            # check it.
            self.result.first_request_error = RuntimeError("selected index k out of range")
        if algo == "EAGLE3":
            self._set_eagle3_layers_to_capture(cfg, dcfg)

    def _set_eagle3_layers_to_capture(self, cfg: HFConfig, dcfg: HFConfig) -> None:
        """The target captures the input of layer i for each id (deepseek_v2.py:2721 (0.5.9),
        :3194 (0.5.23)); the ids come from the drafter's eagle_config (model_runner.py:363-368
        (0.5.9), :474-479 (0.5.15); spec_aux_hidden_state.py:185-196 (0.5.23)), default
        [2, L // 2, L - 3]. DeepSeek targets shift them +1 always up to 0.5.12, only when
        ids[0] == 1 from 0.5.15: set_eagle3_layers_to_capture deepseek_v2.py:2963 (0.5.9),
        :2295 (0.5.10), :2529 (0.5.12), :2897 (0.5.15), :3209 (0.5.19), :3097 (0.5.20), :3379
        (0.5.21), :3404 (0.5.22), :3458 (0.5.23); Llama targets always (llama.py:790 (0.5.9),
        :823 (0.5.15), :941 (0.5.23)). An id >= the target's layers is never captured."""
        layers = int(cfg.num_hidden_layers or 0)
        eagle = dcfg.get("eagle_config")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
        if ids is None:
            return  # [2, L // 2, L - 3]: always inside the model
        ids = [int(i) for i in ids]
        deepseek = cfg.is_mla
        if not deepseek or not at_least(0, 5, 15) or (ids and ids[0] == 1):
            captured = [i + 1 for i in ids]
        else:
            captured = list(ids)
        got = sum(1 for i in captured if i < layers)
        if got == len(captured):
            return
        if at_least(0, 5, 19):
            # AuxHiddenStatePacker checks the count after the forward, first met while the
            # target's CUDA graphs are captured: layers/aux_hidden_states.py assert :45 (0.5.19),
            # raise RuntimeError :46 (0.5.20), :59 (0.5.21), :78 (0.5.22), :87 (0.5.23)
            self._aux_capture = (got, len(captured))
            return
        # up to 0.5.15 the drafter's fc (3 x hidden in) gets fewer hidden states at the first
        # draft-extend forward (llama_eagle3.py fc; the packing has no check)
        hidden = int(cfg.hidden_size or 7168)
        self.result.first_request_error = RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied (6x{got * hidden} and "
            f"{len(captured) * hidden}x{hidden})")

    def _aux_capture_error(self) -> Exception:
        got, want = self._aux_capture
        message = f"captured {got} of {want} aux hidden states"
        return AssertionError(message) if not at_least(0, 5, 20) else RuntimeError(message)

    def _check_vocab_map(self) -> None:
        """An EAGLE-3 drafter with draft_vocab_size < vocab_size maps its draft ids through a
        tensor named d2t in its weights (models/llama_eagle3.py load_weights: `if "d2t" in
        name` :242 (0.5.9), :350 (0.5.23)); without one hot_token_id stays None and the draft
        ids are read as target ids (eagle_worker.py:626 (0.5.9), eagle_worker_v2.py:758
        (0.5.23)): nearly every draft is rejected, nothing is raised. The names come from the
        drafter folder's safetensors (index weight_map, else each file's header); a folder
        with no weights says nothing."""
        spec, args = self.result.spec, self.args
        dcfg = self.result.draft_config
        if not spec.enabled or dcfg is None or \
                args.speculative_algorithm not in ("EAGLE", "EAGLE3"):
            return
        small, full = dcfg.get("draft_vocab_size"), dcfg.get("vocab_size")
        if not small or not full or small >= full or dcfg.get("tie_word_embeddings"):
            return
        names = _tensor_names(args.speculative_draft_model_path or args.model_path)
        if names is not None and not any("d2t" in n for n in names):
            spec.accept_length = 1.0
            spec.note = "no d2t in the drafter: draft ids read as target ids"

    def _check_tree_verify(self) -> None:
        """Target verify of an MLA model on FlashInfer computes the tree's custom mask and
        drops it (a causal paged plan): with topk > 1 sibling drafts see each other, and the
        verify logits are wrong; nothing is raised. flashinfer_mla_backend.py "TODO: Support
        topk > 1 with custom mask" :857 (0.5.9-0.5.12), :876 (0.5.15), :1103 (0.5.19), :1090
        (0.5.20, 0.5.21), :1110 (0.5.22, 0.5.23). Verify runs on the prefill backend unless
        --speculative-attention-mode decode (server_args.py:477, hybrid_attn_backend.py:44-47
        (0.5.9))."""
        args = self.args
        spec = self.result.spec
        cfg = self.result.hf_config
        if not spec.enabled or args.speculative_algorithm not in ("EAGLE", "EAGLE3") or \
                int(args.speculative_eagle_topk or 1) <= 1 or not cfg.is_mla:
            return
        if args.opt("speculative_attention_mode") == "decode":
            verify = args.decode_attention_backend or args.attention_backend
        else:
            verify = args.prefill_attention_backend or args.attention_backend
        if verify == "flashinfer":
            spec.accept_length = 1.0
            spec.note = ("tree verify on FlashInfer MLA drops the custom mask: drafts are "
                         "rejected")

    def _init_memory_pool(self, cfg: HFConfig) -> None:
        """The KV pool, profiled like the release does (rank TP0's view, GiB):

        rest = post - pre * (1 - mem_fraction_static) [- the VLM cache from 0.5.19], pre = the
        free memory before the load (CUDA_CONTEXT_MIB), post = after the target's weights (and
        from 0.5.15 the draft's, loaded first); tokens = rest // cell bytes, page-floored.
        model_runner_kv_cache_mixin.py:116-149 (budget :143-145), :387-390 (page floor)
        (0.5.9); :144-177, :826 (0.5.10); pool_configurator.py:185-186 (0.5.12);
        kv_cache_mixin.py:104-139 (0.5.15); mem_cache/kv_cache_configurator.py:1990-2043
        (0.5.19), :2148-2201 (0.5.20), :2177-2230 (0.5.21), :2671-2741 (0.5.22), :2990-3060
        (slack :3007, rest :3038) (0.5.23). rest <= 0 stops the server after the load."""
        args = self.args
        mfs = float(args.mem_fraction_static)
        pre = self._free_gb
        # up to 0.5.12 the draft loads after the pool is sized (_draft_gb is still 0 here)
        post = pre - self._weights_gb - self._misc_gb - self._draft_gb
        rest = post - pre * (1 - mfs)
        if at_least(0, 5, 19) and isinstance(cfg.data.get("vision_config"), dict) and \
                not args.opt("language_only"):
            rest -= VLM_CACHE_MIB / 1024.0
        if rest <= 0:
            raise _no_kv_cache(mfs, pre, post)
        kv_bytes = 1 if str(args.kv_cache_dtype).startswith("fp8") else 2  # "auto": bf16
        target_cell = _cell_bytes(cfg, args.tp_size, kv_bytes)
        cell = target_cell + self._draft_cell_charge(cfg, target_cell)
        page = max(1, int(args.page_size or 1))
        tokens = int(rest * (1 << 30)) // max(1, cell) // page * page
        if args.max_total_tokens:  # a cap (0.5.9 :378-385; 0.5.10 :811-821)
            tokens = min(tokens, int(args.max_total_tokens)) // page * page
        if tokens <= 0:  # MemoryPoolConfig.__post_init__ (0.5.10 :55-60; 0.5.23 :96)
            raise _no_kv_cache(mfs, pre, post)
        self.result.max_total_num_tokens = tokens
        context_len = int(args.context_length or cfg.context_length)
        self.result.context_len = context_len
        kv_size = tokens * target_cell / float(1 << 30)
        dtype = "" if not at_least(0, 5, 15) else (
            "dtype: torch.float8_e4m3fn, " if kv_bytes == 1 else "dtype: torch.bfloat16, ")
        # mem_cache/memory_pool.py:652/:658 (0.5.9), :1242/:1248 (0.5.15), :2089/:2097 (0.5.23)
        if cfg.is_mla:
            sizes = f"KV size: {kv_size:.2f} GB"
        else:
            sizes = f"K size: {kv_size / 2:.2f} GB, V size: {kv_size / 2:.2f} GB"
        log(f"KV Cache is allocated. {dtype}#tokens: {tokens}, {sizes}", "TP0")
        # a pool below the context length is accepted: max_req_len = min(context_len - 1,
        # pool - 1), asserted > 0 only: tp_worker.py:287-294 (0.5.9), :301-308 (0.5.10),
        # :304-311 (0.5.12), :343-347 (0.5.15), :428-433 (0.5.19); 0.5.23 warns (:557-568)
        self.result.max_req_len = min(context_len - 1, tokens - 1)
        if self.result.max_req_len <= 5:
            raise AssertionError("Memory pool size is too small")
        if tokens < context_len and at_least(0, 5, 23):
            log(f"KV pool holds {tokens} tokens, fewer than --context-length {context_len}. One "
                "full-length request cannot fit, so long requests will be refused or "
                "truncated at serving time. Lower --context-length, raise "
                "--mem-fraction-static, or free memory taken before the pool is sized.", "TP0")
        if args.max_running_requests is None:
            args.max_running_requests = min(1024, max(1, tokens // 512))
        log(f"max_total_num_tokens={tokens}, chunked_prefill_size={args.chunked_prefill_size}, "
            f"max_prefill_tokens={args.max_prefill_tokens}, "
            f"max_running_requests={args.max_running_requests}, "
            f"context_len={self.result.context_len}, available_gpu_mem={pre * 0.04:.2f} GB",
            "TP0")

    def _draft_cell_charge(self, cfg: HFConfig, target_cell: int) -> int:
        """From 0.5.15 the target's pool also holds the EAGLE draft's KV, charged at the
        target's per-layer size times the draft's layers (num_nextn_predict_layers, else
        max(num_hidden_layers, num_attention_layers): model_runner.py:442-462 (0.5.15);
        spec_aux_hidden_state.py:156-176 (0.5.23)): int(cell * (1 + d / L))
        pool_configurator.py:139-155 (0.5.15), :183-221 (0.5.19), :268 (0.5.20), :254 (0.5.21);
        cell + int(cell * d / L) :303-306 (0.5.22), :309-312 (0.5.23)."""
        args = self.args
        dcfg = self.result.draft_config
        if not at_least(0, 5, 15) or dcfg is None or \
                args.speculative_algorithm not in ("EAGLE", "EAGLE3", "STANDALONE") or \
                not args.speculative_draft_model_path:
            return 0
        nextn = dcfg.get("num_nextn_predict_layers")
        draft_layers = int(nextn) if nextn is not None else int(dcfg.num_hidden_layers or 1)
        layers = int(cfg.num_hidden_layers or 0)
        if draft_layers <= 0 or layers <= 0:
            return 0
        if at_least(0, 5, 22):
            return int(target_cell * draft_layers / layers)
        return int(target_cell * (1 + draft_layers / layers)) - target_cell

    def _capture_cuda_graphs(self) -> None:
        args = self.args
        max_bs = getattr(args, "cuda_graph_max_bs", None) or getattr(
            args, "cuda_graph_max_bs_decode", None
        )
        graph_bs = args.opt("cuda_graph_bs") or args.opt("cuda_graph_bs_decode")
        if graph_bs:
            max_bs = max(graph_bs)
        if max_bs is None:
            max_bs = 64 if self.result.spec.enabled or args.speculative_algorithm else 160
            max_bs = min(max_bs, int(args.max_running_requests or max_bs))
        disabled = bool(args.opt("disable_cuda_graph"))
        self.result.cuda_graph_max_bs = 0 if disabled else int(max_bs)
        if disabled:
            if self._aux_capture is not None:  # met by the first forward instead
                self.result.first_request_error = self._aux_capture_error()
            return
        t0 = time.monotonic()
        before, after = self.result.total_mib / 1024.0 * 0.04, self.result.total_mib / 1024.0 * 0.03
        # the decode capture's lines per release: model_runner.py:2146-2161 (0.5.9-0.5.12);
        # model_runner.py:2667-2695 (0.5.15, num_tokens_per_bs and bs= in begin);
        # model_runner_components/cuda_graph_setup.py:551-575 (0.5.19), :571-596 (0.5.20),
        # :720-745 (0.5.21) (bs= in begin); :716-749 (0.5.22), :758-791 (0.5.23) (bs= in end)
        what = "target verify" if self.result.spec.enabled else "target decode"
        width = "num_tokens_per_bs" if not at_least(0, 5, 19) else "num_tokens_per_req"
        bs_in_end = at_least(0, 5, 22)
        if at_least(0, 5, 15):
            log(f"Capture {what} CUDA graph begin. backend=full, {width}=1, "
                + ("" if bs_in_end else f"bs={list(range(1, int(max_bs) + 1))[-3:]}, ")
                + f"avail mem={before:.2f} GB", "TP0")
        else:
            log("Capture cuda graph begin. This can take up to several minutes. "
                f"avail mem={before:.2f} GB", "TP0")
        if self._aux_capture is not None:
            raise self._aux_capture_error()
        key = self._cache_key(max_bs)
        warm = kernel_cache.warm(key)
        self._sleep(kernel_cache.WARM_S if warm else kernel_cache.COLD_S)
        if not warm:
            kernel_cache.store(key)
        took = self._since(t0)
        if at_least(0, 5, 15):
            log(f"Capture {what} CUDA graph end. " + (f"bs={max_bs}, " if bs_in_end else "")
                + f"elapsed={took:.2f} s, mem usage=1.20 GB, avail mem={after:.2f} GB.", "TP0")
        else:
            log(f"Capture cuda graph end. Time elapsed: {took:.2f} s. mem usage=1.20 GB. "
                f"avail mem={after:.2f} GB.", "TP0")

    def _cache_key(self, max_bs: int) -> str:
        """What the kernels compiled during capture depend on (release, GPU, model, shapes)."""
        args, cfg = self.args, self.result.hf_config
        return "|".join(str(x) for x in (
            __version__, self.result.total_mib, getattr(cfg, "arch", None), args.tp_size,
            max_bs, self.result.spec.enabled, args.speculative_num_draft_tokens))


def _draft_backend_map() -> set:
    """The attention backends DraftBackendFactory has EAGLE draft backends for (the decode and
    the extend maps hold the same names): speculative/draft_utils.py create_decode_backend
    :39-65 / create_draft_extend_backend :66-92 (0.5.9); fa4 from 0.5.10 (:58/:83);
    tokenspeed_mla and dsv4 from 0.5.12 (:56-60/:83-87); cutedsl_mla and dsa from 0.5.15
    (:57-59); intel_amx from 0.5.19 (:79/:114); intel_xpu from 0.5.20 (:84/:123); tokenspeed_mla
    gone in 0.5.23 (:84/:122, aliased to cutedsl_mla at start)."""
    names = {"flashinfer", "triton", "aiter", "fa3", "hybrid_linear_attn", "flashmla",
             "trtllm_mha", "trtllm_mla", "nsa", "ascend"}
    if at_least(0, 5, 10):
        names.add("fa4")
    if at_least(0, 5, 12):
        names |= {"tokenspeed_mla", "dsv4"}
    if at_least(0, 5, 15):
        names |= {"cutedsl_mla", "dsa"}
    if at_least(0, 5, 19):
        names.add("intel_amx")
    if at_least(0, 5, 20):
        names.add("intel_xpu")
    if at_least(0, 5, 23):
        names.discard("tokenspeed_mla")
    return names


def _cell_bytes(cfg: HFConfig, tp: int, kv_bytes: int) -> int:
    """KV bytes per token on one rank. MLA: (kv_lora_rank + qk_rope_head_dim) * layers,
    not divided by tp (model_runner_kv_cache_mixin.py:47-54 (0.5.9); pool_configurator.py:
    125-140 (0.5.12), :340-386 (0.5.23)); MHA/GQA: max(1, kv_heads // tp) * (head_dim +
    v_head_dim) * layers (model_runner_kv_cache_mixin.py:96-102 (0.5.9))."""
    layers = int(cfg.num_hidden_layers or 32)
    if cfg.is_mla:
        rank = int(cfg.get("kv_lora_rank") or 512)
        rope = int(cfg.get("qk_rope_head_dim") or 64)
        return (rank + rope) * layers * kv_bytes
    heads = int(cfg.get("num_attention_heads") or 32)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg.hidden_size or 4096) // heads)
    v_dim = int(cfg.get("v_head_dim") or head_dim)
    return max(1, kv_heads // max(1, tp)) * (head_dim + v_dim) * layers * kv_bytes


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true")


def _longer_context(reason: str, wanted: int, derived: int) -> str:
    """configs/model_config.py:359-390 (0.5.9), :1291-1329 (0.5.23)."""
    return (f"Warning: {reason} context_length ({wanted}) is greater than the derived "
            f"context_length ({derived}). This may lead to incorrect model outputs or CUDA "
            "errors. Note that the derived context_length may differ from "
            "max_position_embeddings in the model's config. To allow overriding this maximum, "
            f"set the env var {ALLOW_LONGER_CONTEXT}=1")


def _no_kv_cache(mfs: float, pre: float, post: float) -> Exception:
    """The release's words for a KV pool <= 0 (see ModelLoader._init_memory_pool)."""
    if at_least(0, 5, 15):
        floor = math.ceil((1 - post / pre) * 1000) / 1000 if pre > 0 else 1.0
        return ValueError(
            f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
            f"{mfs}. Raise --mem-fraction-static above {floor} (minimum viable = 1 - "
            f"available/pre = {floor}). If using speculative decoding, draft weights are now "
            "counted.")
    text = "Not enough memory. Please try to increase --mem-fraction-static."
    if at_least(0, 5, 12):
        return RuntimeError(text)
    name = "self.server_args.mem_fraction_static" if not at_least(0, 5, 10) else \
        "mem_fraction_static"
    return RuntimeError(f"{text} Current value: {name}={mfs}")


def _spec_profile(algo: str, dcfg: HFConfig, same_as_target: bool, shape: dict) -> SpecProfile:
    """How speculation behaves for this target/drafter pair (the speed model's inputs)."""
    is_eagle3_draft = any(a in EAGLE3_DRAFT_ARCHITECTURES for a in dcfg.architectures)
    if same_as_target:  # every draft step is a forward of the full target
        return SpecProfile(True, 1.0, **shape, draft_scale=TARGET_AS_DRAFT,
                           note="target model used as its own draft")
    if is_eagle3_draft and algo == "EAGLE":
        # silent: no aux hidden states, the target's lm_head (eagle_worker.py:176-183 (0.5.9))
        return SpecProfile(True, 1.0, **shape, note="EAGLE with an EAGLE-3 drafter")
    if is_eagle3_draft or algo in ("EAGLE", "DFLASH"):
        accept = min(eagle3_accept_length(shape["num_steps"], shape["topk"],
                                          shape["num_draft_tokens"]),
                     float(shape["num_draft_tokens"]))
        return SpecProfile(True, accept, **shape, note="matched drafter")
    if algo == "STANDALONE":
        return SpecProfile(True, 2.0, **shape, draft_scale=2.0, note="standalone draft model")
    return SpecProfile(True, 1.0, **shape, note="drafter of an unexpected kind")


def _get_scheme_format(fmt: str):
    """Map a checkpoint's compressed-tensors `format` string to the library's enum member.

    Real SGLang names `CompressionFormat.nvfp4_pack_quantized` while classifying the formats
    (layers/quantization/compressed_tensors/utils.py:17 (0.5.9), :18 (0.5.23)); the member exists
    from compressed-tensors 0.10.0 (compressed_tensors/config/base.py:35)."""
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


def _tensor_names(folder: str):
    """The tensor names of a checkpoint folder's safetensors, or None when it holds none."""
    import struct

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as fh:
            return list(json.load(fh).get("weight_map") or {})
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        return None
    names = []
    for path in files:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            names += [k for k in json.loads(fh.read(length)) if k != "__metadata__"]
    return names
