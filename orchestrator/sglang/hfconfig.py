"""Reading a checkpoint's config.json the way SGLang reads it (plain dicts in, plain values out).

SGLang reads the text model of multimodal wrappers (Kimi K2.5/K2.6 keep their sizes in
`text_config`): sglang/srt/utils/hf_transformers_utils.py:146-151 (0.5.9) `get_hf_text_config`.
`context_length` follows `get_context_length`: utils/hf_transformers_utils.py:444-470 (0.5.9),
utils/hf_transformers/common.py:668-693 (0.5.23); the same code in every release in between.
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]

#: sglang/srt/utils/hf_transformers/common.py:668-674 (0.5.23): "the ordering here is important"
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
KIMI_K25_ARCHITECTURES = ("KimiK25ForConditionalGeneration",)
MLA_DRAFTER_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM",)
#: MLA targets (DeepSeek V2/V3 family, Kimi K2/K2.5/K2.6): configs/model_config.py
#: `_derive_model_shapes` treats these as MLA (0.5.9 - 0.5.23)
MLA_TARGET_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                            "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
                            "Eagle3DeepseekV2ForCausalLM")


def text_config(cfg: Config | None) -> Config:
    """The language model's config: `text_config` when the checkpoint has one, else itself."""
    if not isinstance(cfg, dict):
        return {}
    text = cfg.get("text_config")
    return text if isinstance(text, dict) else cfg


def config_get(cfg: Config | None, key: str) -> Any:
    """A value of the top level, else of `text_config` (multimodal wrappers like K2.5/K2.6)."""
    if not isinstance(cfg, dict):
        return None
    if key in cfg:
        return cfg[key]
    return text_config(cfg).get(key)


def architectures(cfg: Config | None) -> list[str]:
    """The top-level `architectures` (or the text model's when the top level has none)."""
    if not isinstance(cfg, dict):
        return []
    archs = cfg.get("architectures") or config_get(cfg, "architectures") or []
    return [str(a) for a in archs] if isinstance(archs, list) else []


def first_architecture(cfg: Config | None) -> str:
    """`architectures[0]`, the name SGLang keys its per-model rules on ("" when unknown)."""
    archs = architectures(cfg)
    return archs[0] if archs else ""


def context_length(cfg: Config | None) -> int:
    """The derived context length of `get_context_length` (2048 when no key is present)."""
    text = text_config(cfg)
    rope = text.get("rope_scaling")
    factor: float = 1
    if isinstance(rope, dict) and rope:
        factor = rope.get("factor", 1) or 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = text.get(key)
        if value is not None:
            return int(factor * value)
    return 2048


def quant_formats(cfg: Config | None) -> list[str]:
    """Every compressed-tensors `format` a checkpoint's quantization_config names."""
    formats: list[str] = []
    for qc in (config_get(cfg, "quantization_config"), text_config(cfg).get("quantization_config")):
        if not isinstance(qc, dict):
            continue
        if isinstance(qc.get("format"), str):
            formats.append(qc["format"])
        groups = qc.get("config_groups")
        if isinstance(groups, dict):
            formats += [g["format"] for g in groups.values()
                        if isinstance(g, dict) and isinstance(g.get("format"), str)]
    return list(dict.fromkeys(formats))


def has_quantization(cfg: Config | None) -> bool:
    """True when the checkpoint declares a quantization (or compression) config."""
    return any(isinstance(config_get(cfg, k), dict)
               for k in ("quantization_config", "compression_config"))


def is_eagle3_drafter(cfg: Config | None) -> bool:
    """True for EAGLE-3 drafters (LlamaForCausalLMEagle3, Eagle3DeepseekV2ForCausalLM, ...)."""
    return any("Eagle3" in a for a in architectures(cfg))


def is_mla_drafter(cfg: Config | None) -> bool:
    """True for MLA EAGLE-3 drafters (the `*-eagle3-mla` repos)."""
    return any(a in MLA_DRAFTER_ARCHITECTURES for a in architectures(cfg))


def is_kimi_k25(cfg: Config | None) -> bool:
    """True for Kimi K2.5 / K2.6 targets."""
    return (any(a in KIMI_K25_ARCHITECTURES for a in architectures(cfg))
            or str((cfg or {}).get("model_type", "")) == "kimi_k25")


def is_mla(cfg: Config | None) -> bool:
    """True for models with multi-head latent attention (DeepSeek V2/V3, Kimi K2.x)."""
    text = text_config(cfg)
    return (any(a in MLA_TARGET_ARCHITECTURES for a in architectures(cfg))
            or isinstance(text.get("kv_lora_rank"), int))
