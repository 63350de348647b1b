"""Reading a checkpoint's config.json the way transformers' AutoConfig would (local folders only).

Multimodal wrappers such as KimiK25ForConditionalGeneration keep the language model's sizes in
`text_config`; `HFConfig.get` looks there when the top level lacks a key.
"""

from __future__ import annotations

import json
import os

MLA_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "KimiK25ForConditionalGeneration",
    # the MLA EAGLE-3 drafter: AttentionArch.MLA (configs/model_config.py:616 (0.5.12), :1392
    # (0.5.23))
    "Eagle3DeepseekV2ForCausalLM",
)
KIMI_K25_ARCHITECTURES = ("KimiK25ForConditionalGeneration",)


class HFConfig:
    """A parsed config.json."""

    def __init__(self, path: str, data: dict) -> None:
        self.path = path
        self.data = data

    def get(self, key: str, default=None):
        if key in self.data:
            return self.data[key]
        text = self.data.get("text_config")
        if isinstance(text, dict) and key in text:
            return text[key]
        return default

    @property
    def architectures(self) -> list:
        archs = self.data.get("architectures") or self.get("architectures") or []
        return list(archs)

    @property
    def arch(self) -> str:
        archs = self.architectures
        return archs[0] if archs else "Unknown"

    @property
    def model_type(self) -> str:
        return str(self.data.get("model_type", "unknown"))

    @property
    def hidden_size(self):
        return self.get("hidden_size")

    @property
    def vocab_size(self):
        return self.get("vocab_size")

    @property
    def num_hidden_layers(self):
        return self.get("num_hidden_layers")

    @property
    def text(self) -> dict:
        """The language model's config (`text_config` of multimodal wrappers)."""
        text = self.data.get("text_config")
        return text if isinstance(text, dict) else self.data

    @property
    def context_length(self) -> int:
        """get_context_length of the text config: utils/hf_transformers_utils.py:444-470
        (0.5.9), utils/hf_transformers/common.py:668-693 (0.5.23): the first present key of
        CONTEXT_LENGTH_KEYS times the rope-scaling factor, which counts as 1 when
        rope_scaling names original_max_position_embeddings or rope_type llama3."""
        text = self.text
        rope = text.get("rope_scaling")
        factor = 1
        if rope:
            factor = rope.get("factor", 1)
            if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
                factor = 1
        for key in ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                    "max_position_embeddings"):
            if text.get(key) is not None:
                return int(factor * text[key])
        return 2048

    @property
    def weight_bytes(self):
        """The checkpoint's size: metadata.total_size of model.safetensors.index.json, else
        the sum of its *.safetensors files (None for a folder without weights)."""
        try:
            with open(os.path.join(self.path, "model.safetensors.index.json"),
                      encoding="utf-8") as fh:
                size = json.load(fh).get("metadata", {}).get("total_size")
            if isinstance(size, (int, float)) and size > 0:
                return int(size)
        except (OSError, ValueError, AttributeError):
            pass
        sizes = [os.path.getsize(os.path.join(self.path, n)) for n in os.listdir(self.path)
                 if n.endswith(".safetensors")] if os.path.isdir(self.path) else []
        return sum(sizes) or None

    @property
    def quantization_config(self):
        qc = self.get("quantization_config")
        return qc if isinstance(qc, dict) else None

    @property
    def is_mla(self) -> bool:
        return self.arch in MLA_ARCHITECTURES or self.model_type.startswith(("deepseek", "kimi"))

    def quant_formats(self) -> list:
        """Every compressed-tensors `format` the quantization config names (top level + groups)."""
        qc = self.quantization_config or {}
        formats = []
        if isinstance(qc.get("format"), str):
            formats.append(qc["format"])
        groups = qc.get("config_groups")
        if isinstance(groups, dict):
            for group in groups.values():
                if isinstance(group, dict) and isinstance(group.get("format"), str):
                    formats.append(group["format"])
        return formats


def load_config(path: str) -> HFConfig:
    """Load `path/config.json`; fail like transformers does when it is not there."""
    if not os.path.isdir(path):
        raise OSError(
            "Can't load the configuration of '" + path + "'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the "
            "same name. Otherwise, make sure '" + path + "' is the correct path to a directory "
            "containing a config.json file"
        )
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise OSError(
            path + " does not appear to have a file named config.json. Checkout "
            "'https://huggingface.co/" + path + "/tree/None' for available files."
        )
    with open(config_file, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except ValueError as exc:
            raise OSError(
                "It looks like the config file at '" + config_file + "' is not a valid JSON file."
            ) from exc
    if not isinstance(data, dict):
        raise OSError(
            "It looks like the config file at '" + config_file + "' is not a valid JSON file."
        )
    return HFConfig(path, data)
