"""Rules on the speculative algorithm, its parameters and the draft path."""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.sglang.hfconfig import (
    architectures,
    config_get,
    first_architecture,
    is_eagle3_drafter,
    is_kimi_k25,
)
from orchestrator.sglang.rules import Launch, rule

EAGLE_FAMILY = ("EAGLE", "EAGLE3")
DRAFT_MODEL_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")


def algorithm_names(version_at_least: object) -> tuple[str, ...]:
    """Built-in algorithm names of a release (a `Launch.at_least`-like callable).

    speculative/spec_info.py:18-22 (0.5.9, 0.5.10: argparse choices, +NEXTN); :32-38 (0.5.12,
    DFLASH and FROZEN_KV_MTP); :39-46 (0.5.19, + DSPARK); :40-48 (0.5.20, + UNO); :39-47 (0.5.23).
    """
    at = version_at_least
    names = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
    if at(0, 5, 12):  # type: ignore[operator]
        names += ["DFLASH", "FROZEN_KV_MTP"]
    if at(0, 5, 19):  # type: ignore[operator]
        names.append("DSPARK")
    if at(0, 5, 20):  # type: ignore[operator]
        names.append("UNO")
    return tuple(names)


def autofill_architectures(launch: Launch) -> tuple[str, ...]:
    """Targets whose missing draft path ServerArgs fills with the target (built-in MTP).

    server_args.py:2397-2421 (0.5.9), :3028-3052 (0.5.10), :3780-3806 (0.5.12);
    arg_groups/speculative_hook.py:348-373 (0.5.15), :687-720 (0.5.19), :862-898 (0.5.20),
    :1120-1156 (0.5.23). KimiK25ForConditionalGeneration is on no list.
    """
    names = ["DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM",
             "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM",
             "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM",
             "PixtralForConditionalGeneration"]
    if launch.at_least(0, 5, 12):
        names += ["DeepseekV4ForCausalLM", "HYV3ForCausalLM"]
    if launch.at_least(0, 5, 20):
        names += ["HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration"]
    return tuple(names)


@rule("speculative.unknown-algorithm", "start", since="0.5.12")
def unknown_algorithm(launch: Launch) -> Iterator[str]:
    """An algorithm name the release does not know (0.5.9/0.5.10: argparse choices instead).

    The name is upper-cased, then SpeculativeAlgorithm.from_string raises "Unknown speculative
    algorithm name": speculative/spec_info.py:54 (0.5.12), :57 (0.5.15), :62 (0.5.19), :66
    (0.5.20), :65 (0.5.23); upper-casing at arg_groups/speculative_hook.py:137-143 (0.5.23).
    """
    algo = launch.algorithm
    known = algorithm_names(launch.at_least)
    if algo is not None and algo not in known:
        yield (f"speculative algorithm {algo!r} is unknown to sglang {launch.version} (SGLang: "
               f"'Unknown speculative algorithm name: {algo}'); choose one of: "
               + ", ".join(known))


@rule("speculative.params-without-steps", "start")
def params_without_steps(launch: Launch) -> Iterator[str]:
    """eagle_topk or num_draft_tokens without num_steps (bare AssertionError), or num_steps
    without eagle_topk (TypeError: '>' not supported between 'NoneType' and 'int').

    server_args.py:2422-2432 and :2453 (0.5.9), :3053-3063 (0.5.10), :3807-3817 and :3838
    (0.5.12); arg_groups/speculative_hook.py:375-388 and :455 (0.5.15), :722-737 (0.5.19),
    :900-915 (0.5.20), :1159-1174 and :1274 (0.5.23).
    """
    if launch.algorithm not in DRAFT_MODEL_ALGORITHMS:
        return
    o = launch.options
    steps = o.int("--speculative-num-steps")
    topk = o.int("--speculative-eagle-topk")
    ndt = o.int("--speculative-num-draft-tokens")
    if steps is None and (topk is not None or ndt is not None):
        given = [n for n, v in (("eagle_topk", topk), ("num_draft_tokens", ndt)) if v is not None]
        yield (f"speculative.{' and '.join(given)} set without speculative.num_steps: SGLang "
               "stops with a bare AssertionError. Set num_steps too (e.g. num_steps: 3, "
               "eagle_topk: 1, num_draft_tokens: 4), or leave all three unset")
    elif steps is not None and topk is None:
        yield (f"speculative.num_steps {steps} without speculative.eagle_topk: SGLang stops with "
               "TypeError ('>' not supported between 'NoneType' and 'int'). Set eagle_topk "
               "(1 is the usual choice)")


@rule("speculative.topk1-draft-tokens", "start", warning=True)
def topk1_draft_tokens(launch: Launch) -> Iterator[str]:
    """topk == 1 forces num_draft_tokens = num_steps + 1 (a warning in SGLang).

    server_args.py:2443-2450 (0.5.9), :3074-3081 (0.5.10), :3828-3835 (0.5.12);
    arg_groups/speculative_hook.py:439-447 (0.5.15), :790-803 (0.5.19), :968-981 (0.5.20),
    :1254-1267 (0.5.23).
    """
    o = launch.options
    steps, topk = o.int("--speculative-num-steps"), o.int("--speculative-eagle-topk")
    ndt = o.int("--speculative-num-draft-tokens")
    if launch.algorithm in DRAFT_MODEL_ALGORITHMS and topk == 1 and steps is not None \
            and ndt is not None and ndt != steps + 1:
        yield (f"speculative.eagle_topk is 1, so SGLang replaces num_draft_tokens {ndt} with "
               f"num_steps + 1 = {steps + 1}; set num_draft_tokens: {steps + 1} to say so")


@rule("speculative.spec-v2-topk", "start", until="0.5.10")
def spec_v2_topk(launch: Launch) -> Iterator[str]:
    """topk > 1 with SGLANG_ENABLE_SPEC_V2 on: "Spec v2 currently only supports topk = 1".

    server_args.py:2368-2388 (0.5.9), :2999-3019 (0.5.10); the variable defaults to False there
    (environ.py:414 (0.5.9)). 0.5.12 falls back to spec v1; 0.5.15+ runs topk > 1 on v2.
    """
    topk = launch.options.int("--speculative-eagle-topk") or 0
    if launch.algorithm in DRAFT_MODEL_ALGORITHMS and topk > 1 \
            and launch.env_on("SGLANG_ENABLE_SPEC_V2"):
        yield (f"speculative.eagle_topk {topk} with SGLANG_ENABLE_SPEC_V2 on sglang "
               f"{launch.version}: 'Spec v2 currently only supports topk = 1'; use eagle_topk: 1 "
               "or unset SGLANG_ENABLE_SPEC_V2")


@rule("speculative.no-draft-path", "after-load")
def no_draft_path(launch: Launch) -> Iterator[str]:
    """An EAGLE-family or STANDALONE launch without --speculative-draft-model-path.

    Nothing refuses it at start. For targets off the auto-fill list (Kimi K2.5/K2.6 among them)
    the draft worker builds its config from None and ModelConfig.from_server_args falls back to
    the target: `model_path or server_args.model_path` (configs/model_config.py:251 (0.5.9),
    :271 (0.5.10), :391 (0.5.12), :505 (0.5.15), :622 (0.5.19), :744 (0.5.20), :956 (0.5.23);
    the draft TpModelWorker at managers/tp_worker.py:313-318 (0.5.9) ... :469-474 (0.5.23)), so
    the target is loaded a second time after its own load (out of memory for a 1T model). For
    auto-filled targets the draft is the target's built-in MTP layers, which EAGLE3 cannot use
    and which a checkpoint with num_nextn_predict_layers 0 lacks.
    """
    algo = launch.algorithm
    if algo not in DRAFT_MODEL_ALGORITHMS or launch.draft_path:
        return
    arch = first_architecture(launch.target) or "unknown"
    fix = "set draft_model_path to the drafter's directory"
    if arch in autofill_architectures(launch):
        mtp = config_get(launch.target, "num_nextn_predict_layers")
        if algo == "EAGLE3":
            yield (f"speculative.algorithm EAGLE3 without draft_model_path: SGLang fills in the "
                   f"{arch} target itself (its built-in MTP layers), which is not an EAGLE-3 "
                   f"drafter; {fix} (the EAGLE-3 drafter)")
        elif not mtp:
            yield (f"speculative.algorithm {algo} without draft_model_path on a {arch} target "
                   f"whose checkpoint has no MTP layers (num_nextn_predict_layers {mtp}): "
                   f"there is nothing to draft with; {fix}")
        return
    yield (f"speculative.algorithm {algo} without draft_model_path: SGLang loads the {arch} "
           "target a second time as its own draft (after the target's load; out of memory or "
           f"no speedup, sglang issue #36528); {fix}")


@rule("speculative.eagle-with-eagle3-drafter", "silent")
def eagle_with_eagle3_drafter(launch: Launch) -> Iterator[str]:
    """--speculative-algorithm EAGLE (or NEXTN) with an EAGLE-3 drafter: accept length 1.00.

    No release compares the drafter's class with the algorithm (PR #21272 was closed unmerged;
    arg_groups/speculative_hook.py:81-118 (0.5.23) only special-cases Gemma4). EAGLE enables no
    aux hidden-state capture and replaces the drafter's lm_head with the target's:
    speculative/eagle_worker.py:176-183 (0.5.9), eagle_worker_v2.py:366 (0.5.15), :378 (0.5.23).
    """
    if launch.algorithm == "EAGLE" and launch.draft_path and is_eagle3_drafter(launch.draft):
        raw = launch.options.get("--speculative-algorithm")
        darch = ", ".join(architectures(launch.draft))
        yield (f"speculative.algorithm {raw} with an EAGLE-3 drafter ({darch}): SGLang starts "
               "but silently accepts nothing (accept length 1.00, no speedup). Set "
               "speculative.algorithm: EAGLE3")


@rule("speculative.kimi-k25-eagle", "after-load", until="0.5.9")
def kimi_k25_eagle(launch: Launch) -> Iterator[str]:
    """Kimi K2.5/K2.6 targets cannot drive an EAGLE drafter before 0.5.10.

    KimiK25ForConditionalGeneration (models/kimi_k25.py:648 (0.5.9)) lacks
    set_eagle3_layers_to_capture and get_embed_and_head: AttributeError after the target's load
    (model_runner.py:621-624, speculative/eagle_worker.py:157 (0.5.9)). Added in
    models/kimi_k25.py:841-850 (0.5.10).
    """
    if launch.algorithm in EAGLE_FAMILY and is_kimi_k25(launch.target):
        tarch = first_architecture(launch.target)
        yield (f"{launch.algorithm} on a Kimi K2.5/K2.6 target ({tarch}) needs sglang >= 0.5.10 "
               f"(installed: {launch.version}; the target cannot capture the drafter's hidden "
               "states and fails after its load). Pin sglang>=0.5.10 in the pip stage")


@rule("speculative.draft-path-unused", "silent", warning=True)
def draft_path_unused(launch: Launch) -> Iterator[str]:
    """A draft path without an algorithm is ignored (ServerArgs reads it only for speculation)."""
    if launch.algorithm is None and launch.draft_path:
        yield ("draft_model_path is set but speculative.algorithm is not: the drafter is not "
               "used (set speculative.algorithm: EAGLE3 to use it)")


@rule("speculative.draft-tokens-exceed-tree", "first-request")
def draft_tokens_exceed_tree(launch: Launch) -> Iterator[str]:
    """num_draft_tokens - 1 larger than the draft tree: topk + (num_steps - 1) * topk^2.

    organize_draft_results picks `torch.topk(score_list, num_draft_tokens - 1)` over the tree's
    scores: RuntimeError "selected index k out of range" at the first request (the server's
    warm-up, right after the load): speculative/eagle_utils.py:27 (0.5.9, 0.5.10), :28
    (0.5.12), :114 (0.5.15), :117 (0.5.19), :116 (0.5.20), :120 (0.5.21), :123 (0.5.22), :110
    (0.5.23). ServerArgs checks nothing of it; topk 1 has num_draft_tokens forced.
    """
    o = launch.options
    steps, topk = o.int("--speculative-num-steps"), o.int("--speculative-eagle-topk")
    ndt = o.int("--speculative-num-draft-tokens")
    if launch.algorithm not in EAGLE_FAMILY or steps is None or topk is None or ndt is None \
            or topk <= 1:
        return
    tree = topk + (steps - 1) * topk * topk
    if ndt - 1 > tree:
        yield (f"speculative.num_draft_tokens {ndt} needs {ndt - 1} tree nodes, but num_steps "
               f"{steps} x eagle_topk {topk} drafts {tree}: SGLang fails at its first request "
               f"('selected index k out of range'). Set num_draft_tokens to {tree + 1} or less, "
               "or raise num_steps")


@rule("speculative.token-map-ignored-eagle3", "silent", warning=True)
def token_map_ignored(launch: Launch) -> Iterator[str]:
    """--speculative-token-map with EAGLE3 is ignored: the drafter's own d2t maps its vocabulary.

    "Speculative token map specified, but EAGLE3 models already have this. Ignoring the
    specified token map.": eagle_worker.py:123 (0.5.9, 0.5.10), :142 (0.5.12);
    eagle_worker_v2.py:317 (0.5.15), :276 (0.5.19), :310 (0.5.20), :317 (0.5.21), :308
    (0.5.22), :328 (0.5.23).
    """
    if launch.algorithm == "EAGLE3" and launch.options.get("--speculative-token-map"):
        yield ("speculative_token_map is ignored with EAGLE3 (the drafter maps its own "
               "vocabulary); remove --speculative-token-map from extra_args")


@rule("speculative.rejection-sampling-vocab", "after-load", since="0.5.15")
def rejection_sampling_vocab(launch: Launch) -> Iterator[str]:
    """Rejection sampling needs the draft and target to share one vocabulary.

    ValueError "--speculative-use-rejection-sampling requires the draft and target to share one
    vocab, but the draft vocab (N) != target vocab (M).": eagle_worker_v2.py raise@232 (0.5.15),
    @225 (0.5.19), @254 (0.5.20), @253 (0.5.21), @250 (0.5.22), @270 (0.5.23), after both loads;
    the draft vocab is its hot-token map's size, config draft_vocab_size (models/
    llama_eagle3.py:306 (0.5.23)). 0.5.22+: --speculative-use-block-verification turns
    rejection sampling on for EAGLE/EAGLE3.
    """
    o = launch.options
    on = o.flag("--speculative-use-rejection-sampling") or (
        launch.at_least(0, 5, 22) and o.flag("--speculative-use-block-verification"))
    if not (on and launch.algorithm in EAGLE_FAMILY and is_eagle3_drafter(launch.draft)):
        return
    draft_vocab = config_get(launch.draft, "draft_vocab_size")
    vocab = config_get(launch.target, "vocab_size")
    if isinstance(draft_vocab, int) and isinstance(vocab, int) and draft_vocab != vocab:
        yield (f"rejection sampling needs one vocabulary, but the drafter drafts over "
               f"{draft_vocab} tokens (draft_vocab_size) and the target has {vocab}: SGLang "
               "stops after both loads. Remove --speculative-use-rejection-sampling (greedy "
               "verification is the default), or use a full-vocabulary drafter")
