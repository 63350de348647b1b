"""Rules on attention backends x GPU generation x model kind (ServerArgs and the registry).

ServerArgs checks some backends against the compute capability at start; the attention backend
registry (layers/attention/attention_registry.py) checks the rest when each model runner creates
its backend, which is AFTER the weights loaded (0.5.9-0.5.12: after the target's load;
0.5.15+: after both loads, scheduler.py:864-875 (0.5.15), :1128-1146 (0.5.23)). The draft
inherits the target's backends unless --speculative-draft-attention-backend is given
(model_executor/model_runner.py:1739-1791 (0.5.9); model_runner_components/
attention_backend_setup.py:183-202 (0.5.23)).
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.sglang.hfconfig import is_eagle3_drafter, is_mla, is_mla_drafter
from orchestrator.sglang.rules import Launch, rule
from orchestrator.sglang.rules.speculative import EAGLE_FAMILY

TARGET_OPTIONS = ("--attention-backend", "--prefill-attention-backend",
                  "--decode-attention-backend")
DRAFT_OPTION = "--speculative-draft-attention-backend"
FIX = "use attention_backend: flashinfer or triton"
FIX_SENTENCE = "Use attention_backend: flashinfer or triton"


def _majors(launch: Launch) -> set[int]:
    return {g.compute_capability[0] for g in launch.gpus}


def _sm(launch: Launch) -> str:
    ccs = sorted({g.compute_capability for g in launch.gpus})
    return ", ".join(f"sm_{a}{b}" for a, b in ccs)


def _target_backends(launch: Launch) -> dict[str, str]:
    """option -> backend for the target's prefill/decode backends that were given."""
    found = {}
    for option in TARGET_OPTIONS:
        value = launch.options.get(option)
        if isinstance(value, str):
            found[option] = value
    return found


def _draft_backend(launch: Launch) -> str | None:
    """The backend the draft model runner uses: its own option, else the target's."""
    value = launch.options.get(DRAFT_OPTION)
    if isinstance(value, str):
        return value
    target = _target_backends(launch)
    return target.get("--decode-attention-backend") or target.get("--attention-backend")


def _llama_drafter(launch: Launch) -> bool:
    return (launch.algorithm in EAGLE_FAMILY and bool(launch.draft_path)
            and is_eagle3_drafter(launch.draft) and not is_mla_drafter(launch.draft))


@rule("backends.fa3-compute-capability", "after-load")
def fa3(launch: Launch) -> Iterator[str]:
    """fa3 runs only on sm_80 (non-MLA) or sm_90; no ServerArgs check, the registry asserts.

    "FlashAttention v3 Backend requires SM>=80 and SM<=90": layers/attention/
    attention_registry.py:126-138 (0.5.9, 0.5.10), :147-170 (0.5.12), :187-210 (0.5.15),
    :215-238 (0.5.19), :227-250 (0.5.20), :238-261 (0.5.23).
    """
    majors = _majors(launch)
    if not majors:
        return
    target_mla = is_mla(launch.target)
    uses = [(o, target_mla) for o, b in _target_backends(launch).items() if b == "fa3"]
    if _llama_drafter(launch) and _draft_backend(launch) == "fa3":
        uses.append((DRAFT_OPTION if launch.options.get(DRAFT_OPTION) else "the drafter", False))
    for option, mla in uses:
        if any(not ((m == 8 and not mla) or m == 9) for m in majors):
            yield (f"{option} fa3 needs sm_90 (or sm_80 for a non-MLA model); this host's GPUs "
                   f"are {_sm(launch)}: the backend asserts after the weights loaded. "
                   f"{FIX_SENTENCE}")
            return


@rule("backends.trtllm-mla", "start")
def trtllm_mla_gpu(launch: Launch) -> Iterator[str]:
    """trtllm_mla needs a Blackwell GPU (compute capability 10, 11 or 12).

    "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)": server_args.py:
    1873-1893 (0.5.9), :2341-2361 (0.5.10), :2712-2732 (0.5.12); arg_groups/overrides.py:
    1583-1603 (0.5.15), :1210-1225 (0.5.19), :1250-1263 (0.5.20), :1205-1218 (0.5.23).
    """
    majors = _majors(launch)
    if majors and "trtllm_mla" in _target_backends(launch).values() and majors - {10, 11, 12}:
        yield (f"trtllm_mla needs a Blackwell GPU (sm_100/sm_12x); this host's GPUs are "
               f"{_sm(launch)}. {FIX_SENTENCE}")


@rule("backends.mla-only-backend-for-drafter", "after-load")
def mla_only_for_drafter(launch: Launch) -> Iterator[str]:
    """An MLA-only backend inherited by a non-MLA (Llama) EAGLE-3 drafter, or given to a
    non-MLA target.

    "trtllm_mla backend can only be used with MLA models": attention_registry.py:50-51 (0.5.9),
    :59 (0.5.12), :62 (0.5.15), :80 (0.5.19), :81 (0.5.20), :96-97 (0.5.23); tokenspeed_mla
    (0.5.12-0.5.20) :68 (0.5.12), :99 (0.5.20); cutedsl_mla :120-121 (0.5.23).
    """
    mla_only = {"trtllm_mla", "tokenspeed_mla", "cutedsl_mla"}
    target = _target_backends(launch)
    if launch.target is not None and not is_mla(launch.target):
        for option, backend in target.items():
            if backend in mla_only:
                yield f"{option} {backend} can only be used with MLA models. {FIX_SENTENCE}"
                return
    backend = _draft_backend(launch)
    if _llama_drafter(launch) and backend in mla_only:
        yield (f"the EAGLE-3 drafter is not an MLA model but inherits attention backend "
               f"{backend} ('{backend} backend can only be used with MLA models' after the "
               f"target's load): add {DRAFT_OPTION} triton (or flashinfer) to extra_args, or "
               f"{FIX}")


@rule("backends.trtllm-mha", "start")
def trtllm_mha_gpu(launch: Launch) -> Iterator[str]:
    """trtllm_mha's GPU generations per release (prefill side; --attention-backend sets both).

    0.5.9: SM100 only (server_args.py:1895-1908); 0.5.10-0.5.15: prefill SM100 only, decode
    SM90/100/120 (server_args.py:2363-2395 (0.5.10), :2765-2778 (0.5.12), :4450-4462 (0.5.15));
    0.5.19+: SM90/100/120 (arg_groups/attention_hook.py:130-169 (0.5.19), :198-242 (0.5.23)).
    """
    majors = _majors(launch)
    backends = _target_backends(launch)
    if not majors:
        return
    for option, backend in backends.items():
        if backend != "trtllm_mha":
            continue
        prefill = option in ("--attention-backend", "--prefill-attention-backend")
        if not launch.at_least(0, 5, 10) or (prefill and not launch.at_least(0, 5, 19)):
            allowed = {10}
        else:
            allowed = {9, 10, 12}
        if majors - allowed:
            gens = ", ".join(f"sm_{m}x" for m in sorted(allowed))
            yield (f"{option} trtllm_mha on sglang {launch.version} needs {gens}; this host's "
                   f"GPUs are {_sm(launch)}. {FIX_SENTENCE}")


@rule("backends.trtllm-mha-mla", "after-load")
def trtllm_mha_mla(launch: Launch) -> Iterator[str]:
    """trtllm_mha with an MLA target: "trtllm_mha backend can only be used with non-MLA models".

    attention_registry.py:158 (0.5.9), :190 (0.5.12), :230 (0.5.15), :260 (0.5.19), :265
    (0.5.20), :280 (0.5.23); no ServerArgs check compares it with MLA.
    """
    if is_mla(launch.target) and "trtllm_mha" in _target_backends(launch).values():
        yield ("trtllm_mha cannot serve an MLA model (DeepSeek/Kimi): the registry refuses it "
               f"after the weights loaded. {FIX_SENTENCE}")


@rule("backends.cutedsl-mla", "start", since="0.5.15")
def cutedsl_mla_gpu(launch: Launch) -> Iterator[str]:
    """cutedsl_mla (and 0.5.23's tokenspeed_mla alias) is SM100-only.

    "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)": arg_groups/overrides.py:
    1630-1660 (0.5.15), :1269 (0.5.19), :1307 (0.5.20), :1246 (0.5.23); alias at
    arg_groups/serving_hook.py:303-334 (0.5.23).
    """
    majors = _majors(launch)
    names = {"cutedsl_mla"} | ({"tokenspeed_mla"} if launch.at_least(0, 5, 23) else set())
    if majors and majors - {10} and names & set(_target_backends(launch).values()):
        yield f"cutedsl_mla needs sm_100; this host's GPUs are {_sm(launch)}. {FIX_SENTENCE}"


@rule("backends.tokenspeed-mla-kv", "start", since="0.5.12", until="0.5.22")
def tokenspeed_kv(launch: Launch) -> Iterator[str]:
    """tokenspeed_mla needs an fp8_e4m3 KV cache (and a Blackwell GPU).

    "tokenspeed_mla backend requires kv-cache-dtype=fp8_e4m3": server_args.py:2734-2750
    (0.5.12); arg_groups/overrides.py:1605-1615 (0.5.15), :1227-1237 (0.5.19), :1265-1275
    (0.5.20), :1149-1160 (0.5.21), :1168-1179 (0.5.22); 0.5.23 makes it an alias of cutedsl_mla.
    """
    if "tokenspeed_mla" in _target_backends(launch).values():
        kv = launch.options.get("--kv-cache-dtype") or "auto"
        if kv != "fp8_e4m3":
            yield (f"tokenspeed_mla requires kv_cache_dtype fp8_e4m3 (got {kv}): add "
                   f"--kv-cache-dtype fp8_e4m3, or {FIX}")


def _draft_map(launch: Launch) -> set[str]:
    """The attention backends DraftBackendFactory has an EAGLE draft backend for (the decode
    and extend maps are the same set in every release).

    speculative/draft_utils.py:43/:67 (0.5.9), :43/:68 (0.5.10, + fa4), :43/:70 (0.5.12, + dsv4,
    tokenspeed_mla), :44/:73 (0.5.15, + cutedsl_mla, dsa), :88/:115 (0.5.19, + intel_amx),
    :96/:127 (0.5.20-0.5.22, + intel_xpu), :96/:126 (0.5.23, - tokenspeed_mla: aliased to
    cutedsl_mla at start).
    """
    names = {"aiter", "ascend", "fa3", "flashinfer", "flashmla", "hybrid_linear_attn", "nsa",
             "triton", "trtllm_mha", "trtllm_mla"}
    for since, more in (((0, 5, 10), {"fa4"}), ((0, 5, 12), {"dsv4", "tokenspeed_mla"}),
                        ((0, 5, 15), {"cutedsl_mla", "dsa"}), ((0, 5, 19), {"intel_amx"}),
                        ((0, 5, 20), {"intel_xpu"})):
        if launch.at_least(*since):
            names |= more
    if launch.at_least(0, 5, 23):
        names.discard("tokenspeed_mla")
    return names


def _given(launch: Launch, *options: str) -> str | None:
    for option in options:
        value = launch.options.get(option)
        if isinstance(value, str):
            return value
    return None


@rule("backends.no-eagle-draft-backend", "after-load")
def no_eagle_draft_backend(launch: Launch) -> Iterator[str]:
    """The draft's attention backend has no EAGLE implementation in this release.

    DraftBackendFactory takes --speculative-draft-attention-backend, else the target's decode
    backend for multi-step drafting (built only when num_steps > 1) and its prefill backend for
    draft extend (the decode one with --speculative-attention-mode decode), and raises
    ValueError "EAGLE is not supported in (decode) attention backend X" when the backend is not
    in its map: speculative/draft_utils.py raise@35 (0.5.9-0.5.15), @59 (0.5.19), @64
    (0.5.20-0.5.23), after the target's load (v1) or both loads (v2).
    """
    if launch.algorithm not in EAGLE_FAMILY:
        return
    known = _draft_map(launch)
    steps = launch.options.int("--speculative-num-steps")
    draft = _given(launch, DRAFT_OPTION)
    decode_mode = launch.options.get("--speculative-attention-mode") == "decode"
    decode = draft or _given(launch, "--decode-attention-backend", "--attention-backend")
    extend = draft or (decode if decode_mode else _given(
        launch, "--prefill-attention-backend", "--attention-backend"))
    for what, backend, used in (("decode ", decode, steps is None or steps > 1),
                                ("", extend, True)):
        if used and backend is not None and backend not in known:
            yield (f"EAGLE's draft has no {backend} backend in sglang {launch.version} ('EAGLE "
                   f"is not supported in {what}attention backend {backend}' after the load): "
                   f"add {DRAFT_OPTION} triton to extra_args, or {FIX}")
            return


def _verify_backend(launch: Launch) -> str | None:
    """The backend given for the target's verify pass: the prefill backend (the decode one with
    --speculative-attention-mode decode), else --attention-backend. None: the release's default,
    never flashinfer for these targets here: triton for MLA on sm_120, fa3 on sm_90
    (server_args.py:1820-1833 (0.5.9); arg_groups/model_override_base.py:336-351 (0.5.23)), and
    on sm_100 the DeepSeek family's override picks trtllm_mla (model_overrides/deepseek_v2.py:40
    (0.5.23))."""
    decode_mode = launch.options.get("--speculative-attention-mode") == "decode"
    side = "--decode-attention-backend" if decode_mode else "--prefill-attention-backend"
    return _given(launch, side, "--attention-backend")


@rule("backends.flashinfer-mla-tree-verify", "silent")
def flashinfer_mla_tree_verify(launch: Launch) -> Iterator[str]:
    """EAGLE with topk > 1 on an MLA target verified by FlashInfer MLA: the draft tree's mask
    is built and then dropped (the paged plan is causal), so sibling branches see each other
    and verification is wrong - no message anywhere.

    "TODO: Support topk > 1 with custom mask" and the causal plan: layers/attention/
    flashinfer_mla_backend.py:857 and :882-895 (0.5.9-0.5.12), :876 (0.5.15), :1103 (0.5.19),
    :1090 (0.5.20, 0.5.21), :1110 (0.5.22, 0.5.23).
    """
    topk = launch.options.int("--speculative-eagle-topk") or 1
    if launch.algorithm in EAGLE_FAMILY and topk > 1 and is_mla(launch.target) \
            and _verify_backend(launch) == "flashinfer":
        yield (f"speculative.eagle_topk {topk} on an MLA target verified by FlashInfer MLA: "
               "it drops the draft tree's mask (flashinfer_mla_backend.py 'TODO: Support topk "
               "> 1 with custom mask'), so verification is wrong without any error. Use "
               "eagle_topk: 1, or attention_backend: triton for tree drafting")
