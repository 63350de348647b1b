"""Rule on GPU memory: the weights per GPU must fit inside the static memory fraction.

After the weights load, the KV pool gets `post - pre * (1 - mem_fraction_static)` GiB, where pre
and post are the free GPU memory before and after loading (minimum over ranks). It is <= 0 -
and the server stops - exactly when the loaded weights use up `mem_fraction_static * pre`:
model_executor/model_runner_kv_cache_mixin.py:116-149 and :415-419 (0.5.9, "Not enough memory.
Please try to increase --mem-fraction-static"), kv_cache_mixin.py:44-59 (0.5.10),
pool_configurator.py:51-56 (0.5.12), kv_cache_mixin.py:104-138 (0.5.15, "Loaded weights leave
no GPU memory for the KV cache under --mem-fraction-static=X"), mem_cache/
kv_cache_configurator.py:1990-2045 (0.5.19), :2148-2203 (0.5.20), :2990-3060 (0.5.23). From
0.5.15 the draft's weights are loaded before the pool is sized and count too.
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.sglang.hfconfig import Config, is_mla
from orchestrator.sglang.rules import Launch, rule
from orchestrator.sglang.rules.speculative import DRAFT_MODEL_ALGORITHMS

MIB = 1 << 20


def _vlm_factor(target: Config | None) -> float:
    """adjust_mem_fraction_for_vlm: server_args.py:5483-5519 (0.5.9); arg_groups/
    memory_hook.py:417-460 (0.5.23). Multimodal checkpoints (a vision_config) only."""
    vision = (target or {}).get("vision_config")
    if not isinstance(vision, dict):
        return 1.0
    layers = vision.get("num_hidden_layers", 24)
    hidden = vision.get("hidden_size", 1024)
    ratio = layers * hidden ** 2 / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def default_mem_fraction(launch: Launch, gpu_mib: int) -> float | None:
    """SGLang's default --mem-fraction-static for a 90-160 GiB GPU (None for other sizes).

    `reserved` MiB = 512 + max(chunked_prefill_size 8192, 2048) * 1.5 + cuda-graph max_bs * 2
    (512 at tp >= 4, else 256) + tp*pp/8 * 1024 + 1536 for MLA prefill graphs (0.5.10+), at
    least 10240; + 2048 (0.5.9) or 4096 (0.5.10, 0.5.12) for EAGLE-family speculation.
    server_args.py:1020-1063 (0.5.9), :1281-1327 (0.5.10), :1541-1594 (0.5.12), :3623-3696
    (0.5.15); arg_groups/memory_hook.py:230-281 (0.5.19), :282-345 and :359-400 (0.5.23).
    """
    if not 90 * 1024 <= gpu_mib < 160 * 1024:
        return None
    o = launch.options
    tp = o.int("--tp-size", "--tensor-parallel-size") or 1
    pp = o.int("--pp-size", "--pipeline-parallel-size") or 1
    chunked = o.int("--chunked-prefill-size") or 8192
    max_bs = 512 if tp >= 4 else 256
    reserved = 512 + max(chunked, 2048) * 1.5 + max_bs * 2 + tp * pp / 8 * 1024
    if is_mla(launch.target) and launch.at_least(0, 5, 10):
        reserved += 1536
    reserved = max(reserved, 10240)
    if launch.algorithm in DRAFT_MODEL_ALGORITHMS and not launch.at_least(0, 5, 15):
        reserved += 2048 if not launch.at_least(0, 5, 10) else 4096
    return round((gpu_mib - reserved) / gpu_mib, 3) * _vlm_factor(launch.target)


@rule("memory.weights-exceed-static-fraction", "after-load")
def weights_exceed(launch: Launch) -> Iterator[str]:
    """The weights per GPU (checkpoint index total_size / (tp x pp), plus the draft's from
    0.5.15) reach mem_fraction_static x the GPU's memory: no KV cache is left after the load.

    The GPU's total memory stands in for SGLang's free memory before the load, so this refuses
    only launches that cannot fit even on an empty GPU.
    """
    if not launch.gpus or not launch.target_weight_bytes:
        return
    o = launch.options
    ranks = (o.int("--tp-size", "--tensor-parallel-size") or 1) * (
        o.int("--pp-size", "--pipeline-parallel-size") or 1)
    per_gpu = launch.target_weight_bytes / ranks
    counted = "the target's"
    if launch.at_least(0, 5, 15) and launch.draft_weight_bytes and launch.draft_path \
            and launch.algorithm in DRAFT_MODEL_ALGORITHMS:
        per_gpu += launch.draft_weight_bytes / ranks
        counted = "the target's and the drafter's"
    gpu_mib = min(g.memory_mib for g in launch.gpus)
    given = o.float("--mem-fraction-static")
    mfs = given if given is not None else default_mem_fraction(launch, gpu_mib)
    if mfs is None:
        return
    budget_mib = mfs * gpu_mib
    need_mib = per_gpu / MIB
    if need_mib >= budget_mib:
        minimum = need_mib / gpu_mib
        what = f"mem_fraction_static {mfs:.3f}" + ("" if given is not None else
                                                   " (SGLang's default here)")
        yield (f"{counted} weights need {need_mib / 1024:.1f} GiB per GPU over {ranks} GPUs, "
               f"but {what} x {gpu_mib / 1024:.1f} GiB leaves only {budget_mib / 1024:.1f} GiB "
               "for weights and KV cache: SGLang stops after the load with no KV cache. Set "
               f"mem_fraction_static above {minimum:.2f} (about {min(0.95, minimum + 0.05):.2f}) "
               "or use more GPUs (tp)")
