"""Rules on the draft model: its class per release, layers, shapes, quantization and context.

All of these fire in the draft worker, which SGLang builds only after the target's weights
loaded (scheduler.py `init_model_worker`: 0.5.9:563-565; 0.5.23:1128-1146).
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.sglang.hfconfig import (
    Config,
    architectures,
    config_get,
    context_length,
    has_quantization,
    is_eagle3_drafter,
    is_mla,
    is_mla_drafter,
)
from orchestrator.sglang.rules import Launch, rule
from orchestrator.sglang.rules.serving import ALLOW_LONGER
from orchestrator.sglang.rules.speculative import EAGLE_FAMILY


def _drafting(launch: Launch) -> bool:
    return (launch.algorithm in EAGLE_FAMILY and bool(launch.draft_path)
            and launch.draft is not None)


@rule("drafter.mla-needs-0.5.12", "after-load", until="0.5.10")
def mla_drafter_release(launch: Launch) -> Iterator[str]:
    """The MLA EAGLE-3 drafter class exists from 0.5.12 only.

    Eagle3DeepseekV2ForCausalLM: models/kimi_k25_eagle3.py:472 (0.5.12), :520 (0.5.15-0.5.20),
    :523 (0.5.23); absent in 0.5.9/0.5.10, where models/registry.py refuses the architecture
    when the draft loads.
    """
    if _drafting(launch) and is_mla_drafter(launch.draft):
        yield (f"the MLA EAGLE-3 drafter ({', '.join(architectures(launch.draft))}) needs "
               f"sglang >= 0.5.12; installed: {launch.version}. Pin sglang>=0.5.12 in the pip "
               "stage or use a Llama EAGLE-3 drafter")


@rule("drafter.llama-eagle3-one-layer", "after-load", until="0.5.10")
def llama_one_layer(launch: Launch) -> Iterator[str]:
    """LlamaForCausalLMEagle3 accepts only 1 layer up to 0.5.10.

    ValueError "EAGLE3 currently only supports 1 layer": models/llama_eagle3.py:198-199 (0.5.9),
    :212-213 (0.5.10); from 0.5.12 the layers are a loop (llama_eagle3.py:183 (0.5.12), :202
    (0.5.23)).
    """
    layers = config_get(launch.draft, "num_hidden_layers")
    if _drafting(launch) and is_eagle3_drafter(launch.draft) and not is_mla_drafter(
            launch.draft) and layers != 1:
        yield (f"the EAGLE-3 drafter has num_hidden_layers {layers}; sglang {launch.version} "
               "stops with 'EAGLE3 currently only supports 1 layer' after the target's load. "
               "Use a 1-layer drafter or sglang>=0.5.12")


@rule("drafter.mla-one-layer", "after-load", since="0.5.12")
def mla_one_layer(launch: Launch) -> Iterator[str]:
    """Eagle3DeepseekV2ForCausalLM accepts only 1 layer, and needs q_lora_rank.

    ValueError "EAGLE3 currently only supports 1 layer": models/kimi_k25_eagle3.py:206-207
    (0.5.12), :242-243 (0.5.15-0.5.20), :243-244 (0.5.23); "Eagle3 MLA layer requires
    q_lora_rank in the draft config": :104 (0.5.12), :114 (0.5.15-0.5.20), :115 (0.5.23).
    """
    if not (_drafting(launch) and is_mla_drafter(launch.draft)):
        return
    layers = config_get(launch.draft, "num_hidden_layers")
    if layers != 1:
        yield (f"the MLA EAGLE-3 drafter has num_hidden_layers {layers}; SGLang stops with "
               "'EAGLE3 currently only supports 1 layer' after the target's load. Use a "
               "1-layer drafter")
    if config_get(launch.draft, "q_lora_rank") is None:
        yield ("the MLA EAGLE-3 drafter's config.json has no q_lora_rank; SGLang stops with "
               "'Eagle3 MLA layer requires q_lora_rank in the draft config' after the target's "
               "load. Use the drafter's complete config.json")


@rule("drafter.shape-mismatch", "after-load")
def shape_mismatch(launch: Launch) -> Iterator[str]:
    """An EAGLE-3 drafter shares the target's embedding: hidden and vocab sizes must match.

    models/llama.py:910-918 (0.5.23) set_embed shares the target embedding unless
    target_hidden_size differs; the fc input is target_hidden_size x 3 (llama_eagle3.py:135-139
    (0.5.9), :157-167 (0.5.23)): another model's drafter fails in the weight loader.
    """
    if not (_drafting(launch) and is_eagle3_drafter(launch.draft) and launch.target):
        return
    for key in ("hidden_size", "vocab_size"):
        dv = config_get(launch.draft, "target_" + key) if key == "hidden_size" else None
        dv = dv if dv is not None else config_get(launch.draft, key)
        tv = config_get(launch.target, key)
        if dv is not None and tv is not None and dv != tv:
            yield (f"the drafter's {key} is {dv} but the target's is {tv}: the weights cannot be "
                   "loaded (a drafter for another model?). Use the drafter made for this target")


@rule("drafter.heads-divide-tp", "after-load")
def heads_divide_tp(launch: Launch) -> Iterator[str]:
    """The Llama drafter's attention heads must split over --tp-size.

    models/llama.py:139,145,149 (0.5.9), :183,189,193 (0.5.23): total_num_heads % tp == 0 and
    kv heads % tp == 0 (kv >= tp) or tp % kv heads == 0 (bare AssertionError).
    """
    if not (_drafting(launch) and is_eagle3_drafter(launch.draft)) or is_mla_drafter(
            launch.draft):
        return
    tp = launch.options.int("--tp-size", "--tensor-parallel-size") or 1
    heads = config_get(launch.draft, "num_attention_heads")
    kv = config_get(launch.draft, "num_key_value_heads") or heads
    if not isinstance(heads, int) or not isinstance(kv, int) or heads < 1 or kv < 1:
        return
    if heads % tp or (kv % tp if kv >= tp else tp % kv):
        yield (f"the drafter has {heads} attention heads ({kv} key/value heads), which do not "
               f"split over tp {tp}: SGLang's Llama attention asserts after the target's load. "
               "Use a tp that divides the drafter's heads")


@rule("drafter.inherits-quantization", "after-load")
def inherits_quantization(launch: Launch) -> Iterator[str]:
    """--quantization given and no --speculative-draft-model-quantization: the draft inherits it.

    Copy at server_args.py:882-885 (0.5.9), :972-975 (0.5.10), :1192-1195 (0.5.12),
    :3036-3048 (0.5.15); arg_groups/serving_hook.py:629-652 (0.5.19), :685-708 (0.5.23). A
    drafter without quantization_config then gets `quant_cls()` (model_loader/weight_utils.py:240
    (0.5.9), :375 (0.5.23)): for compressed-tensors "CompressedTensorsConfig.__init__() missing 5
    required positional arguments" (compressed_tensors.py:107 (0.5.9), :118 (0.5.23)).
    """
    quant = launch.options.get("--quantization")
    if not (_drafting(launch) and isinstance(quant, str)):
        return
    draft_quant = launch.options.get("--speculative-draft-model-quantization")
    if draft_quant is None and not has_quantization(launch.draft):
        yield (f"--quantization {quant} is inherited by the drafter, whose config.json has no "
               "quantization_config: its load fails after the target's (for compressed-tensors "
               "'CompressedTensorsConfig.__init__() missing 5 required positional "
               "arguments'). Add --speculative-draft-model-quantization unquant to extra_args, "
               "or drop --quantization (SGLang reads it from the checkpoint)")


@rule("drafter.context-shorter", "after-load")
def context_shorter(launch: Launch) -> Iterator[str]:
    """A drafter whose derived context length is below the target's effective one.

    The EAGLE worker forces the draft's context_length to the target's
    (speculative/eagle_worker.py:107 (0.5.9), eagle_worker_v2.py:1067 (0.5.15), :229 (0.5.23))
    and ModelConfig raises "Target model's context_length (N) is greater than the derived
    context_length (M)" unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
    (configs/model_config.py:359-390 (0.5.9), :1291-1329 (0.5.23)).
    """
    if not (_drafting(launch) and launch.target) or launch.env_on(ALLOW_LONGER):
        return
    target = context_length(launch.target)
    wanted = launch.options.int("--context-length")
    effective = min(wanted, target) if wanted else target
    draft = context_length(launch.draft)
    if draft < effective:
        yield (f"the drafter's context length is {draft} tokens (its config.json), shorter than "
               f"the target's {effective}: SGLang stops after the target's load ('Target model's "
               f"context_length ({effective}) is greater than the derived context_length "
               f"({draft})'). Set context_length: {draft}, or env {ALLOW_LONGER}: '1' to let "
               "the drafter run past its trained length")


@rule("drafter.mla-flashinfer-topk", "after-load", since="0.5.12")
def mla_flashinfer_topk(launch: Launch) -> Iterator[str]:
    """An MLA EAGLE-3 drafter drafting a tree (topk > 1, num_steps > 1) on FlashInfer MLA.

    FlashInferMLAMultiStepDraftBackend: ValueError "Currently Flashinfer MLA only supports
    topk=1 for speculative decoding": layers/attention/flashinfer_mla_backend.py raise@913
    (0.5.12), @935 (0.5.15), @1189 (0.5.19), @1176 (0.5.20, 0.5.21), @1197 (0.5.22, 0.5.23);
    the backend is the draft option, else the decode one, else --attention-backend
    (speculative/draft_utils.py :226-248 (0.5.23)).
    """
    if not (_drafting(launch) and is_mla_drafter(launch.draft)):
        return
    o = launch.options
    topk, steps = o.int("--speculative-eagle-topk") or 1, o.int("--speculative-num-steps")
    backend = next((v for v in (o.get("--speculative-draft-attention-backend"),
                                o.get("--decode-attention-backend"), o.get("--attention-backend"))
                    if isinstance(v, str)), None)
    if backend == "flashinfer" and topk > 1 and (steps is None or steps > 1):
        yield (f"the MLA EAGLE-3 drafter drafts a tree (eagle_topk {topk}) on FlashInfer MLA, "
               "which SGLang refuses after the load ('Currently Flashinfer MLA only supports "
               "topk=1 for speculative decoding'). Use eagle_topk: 1, or add "
               "--speculative-draft-attention-backend triton to extra_args")


def _aux_layer_ids(draft: Config | None) -> list[int] | None:
    """eagle_config.eagle_aux_hidden_state_layer_ids, else the top-level key (eagle_utils.py:
    272-274 (0.5.23)); None: the target's default [2, L // 2, L - 3] is used."""
    eagle = config_get(draft, "eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    ids = ids if ids is not None else config_get(draft, "eagle_aux_hidden_state_layer_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return ids
    return None


def _captured(launch: Launch, ids: list[int]) -> list[int]:
    """The layers a DeepSeek-family target captures for the drafter's ids: every id + 1 up to
    0.5.12, only when ids[0] == 1 from 0.5.15 (models/deepseek_v2.py
    set_eagle3_layers_to_capture: def@2963 (0.5.9), @2295 (0.5.10), @2529 (0.5.12), @2897
    (0.5.15), @3209 (0.5.19), @3097 (0.5.20), @3379 (0.5.21), @3404 (0.5.22), @3458 (0.5.23))."""
    if not launch.at_least(0, 5, 15) or ids[0] == 1:
        return [i + 1 for i in ids]
    return list(ids)


def _aux_layers(launch: Launch) -> Iterator[str]:
    """The drafter's eagle_aux_hidden_state_layer_ids must name layers the target has.

    A layer's captured state is its input, so a captured id >= the target's num_hidden_layers
    is never captured: fewer aux hidden states than the drafter's fc expects. From 0.5.19 the
    CUDA-graph capture asserts "captured X of Y aux hidden states" (layers/aux_hidden_states.py
    assert@45 (0.5.19), raise@46 (0.5.20), @59 (0.5.21), @78 (0.5.22), @87 (0.5.23)); up to
    0.5.15 the draft's fc fails on its input shape at the first forward (the server's warm-up
    request).
    """
    if not (_drafting(launch) and is_eagle3_drafter(launch.draft) and is_mla(launch.target)):
        return
    ids = _aux_layer_ids(launch.draft)
    layers = config_get(launch.target, "num_hidden_layers")
    if ids is None or not isinstance(layers, int):
        return
    captured = _captured(launch, ids)
    past = [c for c in captured if c >= layers or c <= 0]
    if past:
        yield (f"the drafter's eagle_aux_hidden_state_layer_ids {ids} make sglang "
               f"{launch.version} capture target layers {captured}, but the target has "
               f"{layers} (0..{layers - 1}): {past} cannot be captured and the drafter fails "
               "at its first forward. Use the drafter trained for this target (its config.json "
               "as published), or set layer ids below the target's depth")


rule("drafter.aux-layer-ids", "first-request", until="0.5.15")(_aux_layers)
rule("drafter.aux-layer-ids", "after-load", since="0.5.19")(_aux_layers)


@rule("drafter.vocab-map-missing", "silent")
def vocab_map_missing(launch: Launch) -> Iterator[str]:
    """An EAGLE-3 drafter drafting over a reduced vocabulary (draft_vocab_size < vocab_size)
    whose checkpoint has no `d2t` tensor: hot_token_id stays None, so its draft ids are taken
    as target ids and nearly every draft is rejected (accept length ~1), with no message.

    The map is loaded from a tensor named d2t: models/llama_eagle3.py:242 (0.5.9), :256 (0.5.10),
    :318 (0.5.12), :322 (0.5.15), :339 (0.5.19-0.5.21), :347 (0.5.22), :350 (0.5.23);
    kimi_k25_eagle3.py :386 (0.5.12), :434 (0.5.15), :437 (0.5.23); used at
    speculative/eagle_worker.py:626 (0.5.9), eagle_worker_v2.py:758 (0.5.23) only when set.
    """
    if not (_drafting(launch) and is_eagle3_drafter(launch.draft)) or \
            launch.draft_vocab_map is not False or config_get(launch.draft, "tie_word_embeddings"):
        return
    yield (f"the drafter drafts over {config_get(launch.draft, 'draft_vocab_size')} tokens "
           "(draft_vocab_size) but its checkpoint has no d2t tensor (the map to the target's "
           "vocabulary): SGLang would take its draft ids as target ids and reject nearly every "
           "draft (accept length ~1, no error). Use the drafter's complete checkpoint "
           "(the hf_download stage's allow patterns must include its weights)")
