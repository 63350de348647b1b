"""Rules on GPU memory, from the real formulas: the static fraction, the KV pool predicted in
tokens before the load, and what must fit in it.

After the weights load, the KV pool gets `rest = post - pre * (1 - mem_fraction_static)` GiB,
where pre and post are the free GPU memory (minimum over ranks) before and after loading: the
fraction multiplies the memory free BEFORE the load, not the GPU's total:
model_executor/model_runner_kv_cache_mixin.py:116-149 and :415-419 (0.5.9, "Not enough memory.
Please try to increase --mem-fraction-static"), :144-177 (0.5.10), :62-76 and
pool_configurator.py:51-56 (0.5.12), kv_cache_mixin.py:104-138 (0.5.15, "Loaded weights leave
no GPU memory for the KV cache under --mem-fraction-static=X"), mem_cache/
kv_cache_configurator.py:1990-2043 (0.5.19), :2148-2201 (0.5.20), :2177-2230 (0.5.21),
:2671-2741 (0.5.22), :2990-3060 (0.5.23). From 0.5.15 the draft's weights are loaded before the
pool is sized (scheduler.py:840-850 (0.5.15)) and count too; from 0.5.19 a multimodal target
sets 100 MiB aside (kv_cache_configurator.py:132-149 (0.5.19), :202-218 (0.5.23)).

Tokens = rest // cell bytes, floored to the page size (0.5.9 :387-390; pool_configurator.py
:185-186 (0.5.12), :640-646 (0.5.23)). An MLA cell is (kv_lora_rank + qk_rope_head_dim) x layers
x dtype bytes on every rank (0.5.9 :47-54; pool_configurator.py:340-386 (0.5.23)), else
max(1, kv_heads // tp) x (head_dim + v_head_dim) x layers x dtype bytes (0.5.9 :96-102). From
0.5.15 the draft's layers are charged at the target's per-layer size (pool_configurator.py
:139-155 (0.5.15), :183-221 (0.5.19), :268 (0.5.20), :254 (0.5.21); cell + int(cell x d / L)
at :303-306 (0.5.22), :309-312 (0.5.23)).

A pool smaller than the context length does not stop SGLang: it lowers max_req_len to the pool
(tp_worker.py:287-294 (0.5.9), :421-425 (0.5.23); a warning only in 0.5.23, :557-568), and
every longer request is refused when it comes. A --max-running-requests above what the pool
holds is clamped to tokens // 2 from 0.5.15 with a warning (kv_cache_mixin.py:1225-1262
(0.5.15); kv_cache_configurator.py:3124-3170 (0.5.23)).

Two figures are not in SGLang's code and are assumptions here, with their effect: the memory
free before the load is the GPU's total less PRE_LOAD_OVERHEAD_MIB (CUDA context, NCCL, custom
all-reduce; SGLang logs it as "Load weight begin. avail mem=X GB"), and MISC_AFTER_LOAD_MIB more
is gone after the load. One GiB either way moves the K2.x pool by ~15k tokens (bf16).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.sglang.hfconfig import (
    Config,
    context_length,
    is_kimi_k25,
    is_mla,
    text_config,
)
from orchestrator.sglang.rules import Launch, rule
from orchestrator.sglang.rules.speculative import DRAFT_MODEL_ALGORITHMS

MIB = 1 << 20
GIB = 1 << 30
#: assumptions (see the module docstring): free memory before the load = total - this ...
PRE_LOAD_OVERHEAD_MIB = 1536
#: ... and this much more is gone after the load besides the weights
MISC_AFTER_LOAD_MIB = 512
#: a prediction within this fraction of the need only warns (the two assumptions above)
MARGIN = 0.05


def _vlm_factor(target: Config | None) -> float:
    """adjust_mem_fraction_for_vlm: server_args.py:5483-5519 (0.5.9); arg_groups/
    memory_hook.py:352-389 (0.5.19), :410-455 (0.5.20, 0.5.21), :419-464 (0.5.22), :417-462
    (0.5.23). Multimodal checkpoints (a vision_config) only; not rounded again."""
    vision = (target or {}).get("vision_config")
    if not isinstance(vision, dict):
        return 1.0
    layers = vision.get("num_hidden_layers", 24)
    hidden = vision.get("hidden_size", 1024)
    ratio = layers * hidden ** 2 / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def _tier(launch: Launch, gpu_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda-graph max bs) defaults by GPU memory: server_args.py:935-998
    (0.5.9), :1165-1227 (0.5.10), :3496-3540 (0.5.15); arg_groups/memory_hook.py:62-150
    (0.5.19), :89-179 (0.5.20, 0.5.21), :90-180 (0.5.23)."""
    small = tp < 4
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        if launch.at_least(0, 5, 20):
            return 4096, 48 if small else 160
        return 2048, 24 if small else 80
    if gpu_mib < 60 * 1024:
        return 4096, 32 if small else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if small else 512
    return 16384, 512


def _ranks(launch: Launch) -> tuple[int, int]:
    o = launch.options
    return (o.int("--tp-size", "--tensor-parallel-size") or 1,
            o.int("--pp-size", "--pipeline-parallel-size") or 1)


def _speculative(launch: Launch) -> bool:
    return launch.algorithm in DRAFT_MODEL_ALGORITHMS and bool(launch.draft_path)


def _graph_max_bs(launch: Launch) -> int | None:
    """--cuda-graph-max-bs (--cuda-graph-max-bs-decode from 0.5.20), if given."""
    return launch.options.int("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs")


def _prefill_graph(launch: Launch) -> bool:
    """Whether the MLA prefill (piecewise) CUDA graph is on, which reserves 1536 MiB: never in
    0.5.9 (server_args.py:604); 0.5.10 off for speculative and multimodal launches
    (:1078-1107); 0.5.12/0.5.15 off for multimodal ones (:1335-1337; :3300-3303); from 0.5.19
    also on for KimiK25ForConditionalGeneration (configs/model_config.py:1973-1974 (0.5.19))."""
    multimodal = isinstance((launch.target or {}).get("vision_config"), dict)
    if not launch.at_least(0, 5, 10):
        return False
    if not launch.at_least(0, 5, 12):
        return not multimodal and not _speculative(launch)
    if not launch.at_least(0, 5, 19):
        return not multimodal
    return not multimodal or is_kimi_k25(launch.target)


def default_mem_fraction(launch: Launch, gpu_mib: int) -> float:
    """SGLang's default --mem-fraction-static for this launch and GPU.

    `reserved` MiB = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda-graph max_bs * 2 +
    tp*pp/8 * 1024 (+ 1536 for an MLA prefill graph), at least 10240 above 60 GiB; then
    + 2048 (0.5.9) or 4096 (0.5.10, 0.5.12) for EAGLE-family speculation; a given
    --cuda-graph-max-bs replaces the tier's, and from 0.5.22 a default one is capped to
    --max-running-requests. server_args.py:1020-1066 (0.5.9), :1283-1334 (0.5.10), :1543-1594
    (0.5.12), :3625-3696 (0.5.15); arg_groups/memory_hook.py:250-281 and :292-334 (0.5.19),
    :302-310 and :350-392 (0.5.20, 0.5.21), :311-319 and :359-401 (0.5.22), :309-317 and
    :357-399 (0.5.23); the cap at :182-188 (0.5.22, 0.5.23).
    """
    tp, pp = _ranks(launch)
    chunked, max_bs = _tier(launch, gpu_mib, tp)
    chunked = launch.options.int("--chunked-prefill-size") or chunked
    given_bs = _graph_max_bs(launch)
    running = launch.options.int("--max-running-requests")
    if given_bs is not None:
        max_bs = given_bs
    elif launch.at_least(0, 5, 22) and running:
        max_bs = min(max_bs, running)
    reserved = 512 + max(chunked, 2048) * 1.5 + max_bs * 2 + tp * pp / 8 * 1024
    if _prefill_graph(launch) and is_mla(launch.target):
        reserved += 1536
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    if launch.algorithm in DRAFT_MODEL_ALGORITHMS and not launch.at_least(0, 5, 15):
        reserved += 2048 if not launch.at_least(0, 5, 10) else 4096
    return round((gpu_mib - reserved) / gpu_mib, 3) * _vlm_factor(launch.target)


def _cell_bytes(cfg: Config, tp: int, dtype_bytes: int, layers: int) -> int:
    if cfg.get("kv_lora_rank"):
        return (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 64)) * layers \
            * dtype_bytes
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size") or 0) // heads)
    return max(1, kv // tp) * (head_dim + int(cfg.get("v_head_dim") or head_dim)) * layers \
        * dtype_bytes


@dataclass(frozen=True)
class KvPool:
    """The KV pool a launch will get, predicted before the load (per rank; GiB and tokens)."""

    mem_fraction_static: float
    default_fraction: bool
    pre_load_gib: float
    post_load_gib: float
    budget_gib: float
    cell_bytes: int
    tokens: int
    context_length: int

    def to_json(self) -> dict[str, Any]:
        """The run record's fact `kv_pool`."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def line(self) -> str:
        """One line for the console."""
        frac = f"mem_fraction_static {self.mem_fraction_static:.3f}" + (
            " (SGLang's default)" if self.default_fraction else "")
        return (f"predicted KV pool {self.tokens:,} tokens per rank ({self.budget_gib:.1f} GiB "
                f"at {self.cell_bytes} B/token, {frac}); context {self.context_length:,}")


def predict(launch: Launch) -> KvPool | None:
    """The KV pool of this launch from the release's own formulas, or None when the GPUs, the
    target's config or its weight size are unknown."""
    if not launch.gpus or not launch.target_weight_bytes or launch.target is None:
        return None
    text = text_config(launch.target)
    layers = text.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        return None
    tp, pp = _ranks(launch)
    gpu_mib = min(g.memory_mib for g in launch.gpus)
    given = launch.options.float("--mem-fraction-static")
    mfs = given if given is not None else default_mem_fraction(launch, gpu_mib)
    pre = (gpu_mib - PRE_LOAD_OVERHEAD_MIB) / 1024
    post = pre - launch.target_weight_bytes / (tp * pp) / GIB - MISC_AFTER_LOAD_MIB / 1024
    spec = _speculative(launch)
    if spec and launch.at_least(0, 5, 15) and launch.draft_weight_bytes:
        post -= launch.draft_weight_bytes / (tp * pp) / GIB
    budget = post - pre * (1 - mfs)
    if isinstance((launch.target or {}).get("vision_config"), dict) and launch.at_least(0, 5, 19):
        budget -= 100 / 1024
    dtype = str(launch.options.get("--kv-cache-dtype") or "auto")
    cell = _cell_bytes(text, tp, 1 if dtype.startswith("fp8") else 2, layers)
    if spec and launch.at_least(0, 5, 15):
        draft = launch.draft or {}
        d = draft.get("num_nextn_predict_layers") or draft.get("num_hidden_layers") or 1
        cell = cell + int(cell * d / layers) if launch.at_least(0, 5, 22) else int(
            cell * (1 + d / layers))
    page = max(1, launch.options.int("--page-size") or 1)
    tokens = max(0, int(budget * GIB) // cell // page * page)
    cap = launch.options.int("--max-total-tokens")
    tokens = min(tokens, cap) if cap else tokens
    wanted = launch.options.int("--context-length")
    derived = context_length(launch.target)
    ctx = min(wanted, derived) if wanted else derived
    return KvPool(mfs, given is None, pre, post, budget, cell, tokens, ctx)


@rule("memory.weights-exceed-static-fraction", "after-load")
def weights_exceed(launch: Launch) -> Iterator[str]:
    """The weights per GPU (checkpoint index total_size / (tp x pp), plus the draft's from
    0.5.15) reach mem_fraction_static x the memory free before the load: no KV cache is left
    after the load (the raises in the module docstring)."""
    pool = predict(launch)
    if pool is None or pool.budget_gib > 0:
        return
    tp, pp = _ranks(launch)
    need = pool.pre_load_gib - pool.post_load_gib
    minimum = need / pool.pre_load_gib
    what = f"mem_fraction_static {pool.mem_fraction_static:.3f}" + (
        " (SGLang's default here)" if pool.default_fraction else "")
    counted = "the target's and the drafter's" if launch.at_least(0, 5, 15) and \
        launch.draft_weight_bytes and _speculative(launch) else "the target's"
    yield (f"{counted} weights need {need:.1f} GiB per GPU over {tp * pp} GPUs, but {what} x "
           f"{pool.pre_load_gib:.1f} GiB free before the load leaves only "
           f"{pool.mem_fraction_static * pool.pre_load_gib:.1f} GiB for weights and KV cache: "
           f"SGLang stops after the load with no KV cache. Set mem_fraction_static above "
           f"{minimum:.2f} (about {min(0.95, minimum + 0.05):.2f}) or use more GPUs (tp)")


@rule("memory.kv-pool-below-context", "silent")
def pool_below_context(launch: Launch) -> Iterator[str]:
    """A KV pool smaller than the context length: SGLang starts and serves, but lowers the
    longest request to the pool and refuses every longer one when it comes (the module
    docstring), a deploy that cannot serve what it was configured for."""
    pool = predict(launch)
    if pool is None or pool.budget_gib <= 0 or pool.tokens >= pool.context_length * (1 - MARGIN):
        return
    need = pool.cell_bytes * pool.context_length / GIB - pool.budget_gib
    frac = pool.mem_fraction_static + need / pool.pre_load_gib
    yield (f"{pool.line()}: requests longer than {pool.tokens:,} tokens would be refused. Set "
           f"context_length: {pool.tokens // 1024 * 1024} or less, or mem_fraction_static "
           f"about {frac + 0.01:.2f} (GPU memory left for CUDA graphs shrinks with it), or "
           "--kv-cache-dtype fp8_e4m3 in extra_args (half the bytes per token)")


@rule("memory.kv-pool-near-context", "silent", warning=True)
def pool_near_context(launch: Launch) -> Iterator[str]:
    """The predicted pool is within the prediction's margin of the context length."""
    pool = predict(launch)
    if pool is not None and pool.budget_gib > 0 and \
            pool.context_length * (1 - MARGIN) <= pool.tokens < pool.context_length * (1 + MARGIN):
        yield (f"{pool.line()}: within {MARGIN:.0%} of the context length, the prediction's "
               "uncertainty; a long request may be refused. Keep some headroom")


@rule("memory.max-running-requests-clamped", "silent", warning=True, since="0.5.15")
def running_clamped(launch: Launch) -> Iterator[str]:
    """--max-running-requests above tokens // 2 is lowered with a warning (the docstring)."""
    pool = predict(launch)
    running = launch.options.int("--max-running-requests")
    if pool is not None and running and pool.tokens and running > pool.tokens // 2:
        yield (f"max_running_requests {running} will be lowered to {pool.tokens // 2} by "
               f"SGLang: the predicted pool holds {pool.tokens:,} tokens")
