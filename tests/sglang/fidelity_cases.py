"""The fidelity table: launch cases and what the REAL SGLang does with each, per release.

Each case is run through the orchestrator's preflight and through the SGLang stand-in of every
supported release (tests/sglang/test_fidelity.py). `expect` maps the first release of a range
to the outcome from there on: "ok" (it starts and speculation works), or (phase, rule) where
phase is when real SGLang finds the problem (argparse, start, sched-init, after-load, silent)
and rule is the preflight rule that must refuse it. Every outcome is read from the real source
(the citation beside each case; paths under sglang/srt/).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator_sim.hubrepos import eagle3_config

RELEASES = ("0.5.9", "0.5.10", "0.5.12", "0.5.15", "0.5.19", "0.5.20", "0.5.21", "0.5.22",
            "0.5.23")
FAMILIES = {"0.5.9-0.5.10": RELEASES[:2], "0.5.12-0.5.19": RELEASES[2:5],
            "0.5.20-0.5.23": RELEASES[5:]}
WEIGHTS = 548_000_000_000  # K2.x checkpoint index total_size

QUANT = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
         "config_groups": {"group_0": {"format": "nvfp4-pack-quantized"}}}
K2_TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
    "vocab_size": 163840, "num_hidden_layers": 61, "num_attention_heads": 64,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "num_nextn_predict_layers": 0, "max_position_embeddings": 262144,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
}
K2 = dict(K2_TEXT)
# no top-level hidden_size/vocab_size: SGLang's KimiK25Config derives them from text_config as
# read-only properties (configs/kimi_k25.py:163-171 (0.5.23)), so a config.json setting them
# fails at start ("property 'hidden_size' of 'KimiK25Config' object has no setter")
K26 = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
       "text_config": {**K2_TEXT, "quantization_config": QUANT}, "quantization_config": QUANT,
       "vision_config": {"model_type": "moonvit", "hidden_size": 1152, "num_hidden_layers": 27}}
EAGLE3 = eagle3_config()
EAGLE3_MLA = {**EAGLE3, "architectures": ["Eagle3DeepseekV2ForCausalLM"], "q_lora_rank": 1536,
              "kv_lora_rank": 512}
SPEC = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
TREE = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]

Outcome = Any  # "ok" or (phase, rule id)


@dataclass
class Case:
    """One launch: arguments beyond the base, both configs, GPUs and environment."""

    id: str
    expect: dict[str, Outcome]
    args: list[str] = field(default_factory=list)
    spec: list[str] | None = None  # None: SPEC
    target: dict = field(default_factory=lambda: K2)
    draft: dict | None = field(default_factory=lambda: EAGLE3)
    draft_path: bool = True
    cc: str = "12.0"
    env: dict[str, str] = field(default_factory=dict)
    #: 0.9: K2.x at tp 8 on 96 GB then holds ~300k tokens, clear of its 262144 context both
    #: ways (the KV pool rule's margin); 0.88 sits within 5% of it
    mem_fraction: str | None = "0.9"
    #: tensor names of the drafter's model.safetensors (header only); None: no weights there
    draft_tensors: list[str] | None = None
    served_name: str | None = "kimi"

    def outcome(self, release: str) -> Outcome:
        """The expected outcome on `release` (the last range start at or below it)."""
        key = tuple(int(x) for x in release.split("."))
        chosen: Outcome = None
        for start, outcome in sorted(self.expect.items(),
                                     key=lambda kv: tuple(int(x) for x in kv[0].split("."))):
            if tuple(int(x) for x in start.split(".")) <= key:
                chosen = outcome
        return chosen

    def digest(self) -> str:
        """What a recorded real outcome depends on (tests/sglang/real_serverargs.json): the
        arguments, both configs, the GPU and the environment."""
        data = {"argv": self.argv("TARGET", "DRAFT"), "target": self.target,
                "draft": self.draft, "draft_path": self.draft_path, "cc": self.cc,
                "env": self.env, "served_name": self.served_name,
                **({"draft_tensors": self.draft_tensors} if self.draft_tensors else {})}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def argv(self, target_dir: str, draft_dir: str) -> list[str]:
        """The launch arguments (as the sglang_server stage would build them)."""
        out = ["--model-path", target_dir, "--tp-size", "8", "--trust-remote-code"]
        if self.served_name:
            out += ["--served-model-name", self.served_name]
        if self.mem_fraction:
            out += ["--mem-fraction-static", self.mem_fraction]
        spec = SPEC if self.spec is None else self.spec
        out += spec
        if spec and self.draft_path:
            out += ["--speculative-draft-model-path", draft_dir]
        return out + self.args


def _all(outcome: Outcome) -> dict[str, Outcome]:
    return {"0.5.9": outcome}


OK = _all("ok")
#: a K2.5/K2.6 target on 0.5.9: refused at start under the pip default cuDNN 9.10 (torch 2.9.1's
#: check, server_args.py:5263-5298 (0.5.9)), found by the real-ServerArgs run; without it,
#: after the load (speculative.kimi-k25-eagle)
CUDNN_091 = ("start", "serving.cudnn-for-torch-2.9.1")
FA3 = ("after-load", "backends.fa3-compute-capability")

CASES: list[Case] = [
    # --- the user's deploy (models/kimi_k25.py: EAGLE3 hooks from 0.5.10, :841-850)
    Case("k26-eagle3-playbook", {"0.5.9": CUDNN_091,
                                 "0.5.10": "ok"}, target=K26,
         args=["--attention-backend", "flashinfer", "--context-length", "262144"]),
    Case("k26-eagle3-cudnn-check-off", {"0.5.9": ("after-load", "speculative.kimi-k25-eagle"),
                                        "0.5.10": "ok"},
         target=K26, env={"SGLANG_DISABLE_CUDNN_CHECK": "1"}),
    Case("k26-default-memory-and-backend", {"0.5.9": CUDNN_091,
                                            "0.5.10": ("silent", "memory.kv-pool-below-context")},
         target=K26, mem_fraction=None),  # the default fraction holds ~72k-131k tokens
    Case("k26-default-memory-32k-context", {"0.5.9": CUDNN_091,
                                            "0.5.10": "ok"},
         target=K26, mem_fraction=None, args=["--context-length", "32768"]),
    Case("k2-eagle3", OK),
    Case("k2-no-speculation", OK, spec=[], draft_path=False),
    # --- argparse, from the generated flag files
    Case("unknown-flag", _all(("argparse", "argparse.unknown")), args=["--enable-fancy-mode"]),
    Case("cuda-graph-max-bs", {"0.5.9": "ok", "0.5.20": ("argparse", "argparse.ambiguous")},
         args=["--cuda-graph-max-bs", "64"]),
    Case("kv-cache-not-a-choice", _all(("argparse", "argparse.choice")),
         args=["--kv-cache-dtype", "fp8"]),
    Case("tp-prefix", OK, args=["--tp", "8"]),
    Case("switch-with-value", _all(("argparse", "argparse.switch-value")),
         args=["--enable-metrics=yes"]),
    Case("disable-cuda-graph-deprecated", OK, args=["--disable-cuda-graph"]),
    # --- speculative algorithm and parameters (speculative/spec_info.py; speculative_hook.py)
    Case("algorithm-lower-case", {"0.5.9": ("argparse", "argparse.choice"), "0.5.12": "ok"},
         spec=["--speculative-algorithm", "eagle3", *SPEC[2:]]),
    Case("algorithm-unknown", {"0.5.9": ("argparse", "argparse.choice"),
                               "0.5.12": ("start", "speculative.unknown-algorithm")},
         spec=["--speculative-algorithm", "MEDUSA", *SPEC[2:]]),
    Case("topk-without-steps", _all(("start", "speculative.params-without-steps")),
         spec=["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1"]),
    Case("steps-without-topk", _all(("start", "speculative.params-without-steps")),
         spec=["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]),
    Case("auto-chosen-parameters", OK, spec=["--speculative-algorithm", "EAGLE3"]),
    Case("topk1-draft-tokens-adjusted", OK,
         spec=["--speculative-algorithm", "EAGLE3", *SPEC[2:-1], "6"]),
    Case("topk4-spec-v2-env", {"0.5.9": ("start", "speculative.spec-v2-topk"), "0.5.12": "ok"},
         spec=["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"],
         env={"SGLANG_ENABLE_SPEC_V2": "1"}),
    Case("eagle-with-eagle3-drafter", _all(("silent", "speculative.eagle-with-eagle3-drafter")),
         spec=["--speculative-algorithm", "EAGLE", *SPEC[2:]]),
    Case("nextn-with-eagle3-drafter", _all(("silent", "speculative.eagle-with-eagle3-drafter")),
         spec=["--speculative-algorithm", "NEXTN", *SPEC[2:]]),
    Case("k26-no-draft-path", {"0.5.9": CUDNN_091,
                               "0.5.10": ("after-load", "speculative.no-draft-path")},
         target=K26, draft_path=False),
    Case("k2-no-draft-path-autofill", _all(("silent", "speculative.no-draft-path")),
         draft_path=False),  # the draft is the target's MTP module (model_config.py:1032-1036)
    # --- the drafter (models/llama_eagle3.py, models/kimi_k25_eagle3.py, models/llama.py)
    Case("drafter-two-layers", {"0.5.9": ("after-load", "drafter.llama-eagle3-one-layer"),
                                "0.5.12": "ok"}, draft={**EAGLE3, "num_hidden_layers": 2}),
    Case("mla-drafter", {"0.5.9": ("after-load", "drafter.mla-needs-0.5.12"), "0.5.12": "ok"},
         draft=EAGLE3_MLA),
    Case("mla-drafter-two-layers", {"0.5.9": ("after-load", "drafter.mla-needs-0.5.12"),
                                    "0.5.12": ("after-load", "drafter.mla-one-layer")},
         draft={**EAGLE3_MLA, "num_hidden_layers": 2}),
    Case("mla-drafter-no-q-lora-rank", {"0.5.9": ("after-load", "drafter.mla-needs-0.5.12"),
                                        "0.5.12": ("after-load", "drafter.mla-one-layer")},
         draft={k: v for k, v in EAGLE3_MLA.items() if k != "q_lora_rank"}),
    Case("drafter-hidden-4096", _all(("after-load", "drafter.shape-mismatch")),
         draft={**EAGLE3, "hidden_size": 4096}),
    Case("drafter-vocab-mismatch", _all(("after-load", "drafter.shape-mismatch")),
         draft={**EAGLE3, "vocab_size": 129280}),
    # 28 heads divide hidden 7168 (transformers >= 5.6, 0.5.12+, refuses at start otherwise),
    # not tp 8
    Case("drafter-heads-vs-tp", _all(("after-load", "drafter.heads-divide-tp")),
         draft={**EAGLE3, "num_attention_heads": 28, "num_key_value_heads": 28}),
    Case("draft-inherits-quantization", {"0.5.9": CUDNN_091,
                                         "0.5.10": ("after-load",
                                                    "drafter.inherits-quantization")},
         target=K26, args=["--quantization", "compressed-tensors"]),
    Case("draft-quantization-unquant", {"0.5.9": CUDNN_091,
                                        "0.5.10": "ok"}, target=K26,
         args=["--quantization", "compressed-tensors",
               "--speculative-draft-model-quantization", "unquant"]),
    # --- context length (configs/model_config.py get_context_length and its check)
    Case("drafter-context-shorter", _all(("after-load", "drafter.context-shorter")),
         draft={**EAGLE3, "max_position_embeddings": 4096}),
    Case("drafter-context-shorter-allowed", OK, draft={**EAGLE3, "max_position_embeddings": 4096},
         env={"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}),
    Case("context-longer-than-model", _all(("start", "serving.context-longer-than-model")),
         args=["--context-length", "300000"]),
    Case("context-longer-than-drafter", _all(("sched-init", "drafter.context-shorter")),
         draft={**EAGLE3, "max_position_embeddings": 4096}, args=["--context-length", "8192"]),
    # --- names and nodes (validation_hook.py; engine.py)
    Case("served-name-colon", _all(("start", "serving.served-name-colon")), served_name="kimi:2"),
    Case("model-path-colon-default-name", _all(("start", "serving.served-name-colon")),
         served_name=None),
    Case("nodes-do-not-divide-tp", _all(("start", "serving.nodes-divide-tp")),
         args=["--nnodes", "3"]),
    Case("two-nodes-no-dist-init-addr", _all(("sched-init", "serving.multinode-address")),
         args=["--nnodes", "2"]),
    Case("tp16-on-one-8-gpu-box", _all(("sched-init", "serving.gpus-per-node")),
         args=["--tp-size", "16"]),
    Case("pipeline-with-speculation", _all(("start", "serving.pp-with-speculative")),
         args=["--pp-size", "2"]),
    # --- attention backends x compute capability (attention_registry.py; overrides.py)
    Case("fa3-on-sm120", _all(FA3), args=["--attention-backend", "fa3"]),
    Case("fa3-on-sm90", OK, args=["--attention-backend", "fa3"], cc="9.0"),
    Case("fa3-decode-only", _all(FA3), args=["--decode-attention-backend", "fa3"]),
    Case("trtllm-mla-drafter-inherits", _all(("after-load",
                                              "backends.mla-only-backend-for-drafter")),
         args=["--attention-backend", "trtllm_mla"]),
    Case("trtllm-mla-with-draft-backend", OK,
         args=["--attention-backend", "trtllm_mla",
               "--speculative-draft-attention-backend", "triton"]),
    Case("trtllm-mla-on-sm90", _all(("start", "backends.trtllm-mla")),
         args=["--attention-backend", "trtllm_mla"], cc="9.0"),
    Case("trtllm-mha-mla-target", {"0.5.9": ("start", "backends.trtllm-mha"),
                                   "0.5.19": ("after-load", "backends.trtllm-mha-mla")},
         args=["--attention-backend", "trtllm_mha"], spec=[], draft_path=False),
    Case("cutedsl-mla-on-sm120", {"0.5.9": ("argparse", "argparse.choice"),
                                  "0.5.15": ("start", "backends.cutedsl-mla")},
         args=["--attention-backend", "cutedsl_mla"]),
    Case("cutlass-mla-eagle", {"0.5.9": ("after-load", "backends.no-eagle-draft-backend"),
                               "0.5.20": ("argparse", "argparse.choice")},
         args=["--attention-backend", "cutlass_mla"]),
    # --- memory (kv cache pool sizing after the load)
    Case("static-fraction-too-small", _all(("after-load",
                                            "memory.weights-exceed-static-fraction")),
         mem_fraction="0.6"),
    Case("static-fraction-just-enough", OK, mem_fraction="0.7",
         args=["--context-length", "16384"]),
    Case("half-the-gpus", _all(("after-load", "memory.weights-exceed-static-fraction")),
         args=["--tp-size", "4"]),
    # --- round 3: what the draft worker, the CUDA-graph runners and the first forward find
    # (speculative/draft_utils.py, layers/attention/flashinfer_mla_backend.py,
    # speculative/eagle_utils.py, models/deepseek_v2.py, eagle_worker_v2.py)
    Case("flashinfer-mla-tree-verify", _all(("silent", "backends.flashinfer-mla-tree-verify")),
         spec=TREE, args=["--attention-backend", "flashinfer"]),
    Case("triton-mla-tree", OK, spec=TREE, args=["--attention-backend", "triton"]),
    Case("default-backend-tree-on-sm120", OK, spec=TREE),  # MLA on sm_120: triton
    Case("mla-drafter-flashinfer-tree", {"0.5.9": ("after-load", "drafter.mla-needs-0.5.12"),
                                         "0.5.12": ("after-load", "drafter.mla-flashinfer-topk")},
         spec=TREE, draft=EAGLE3_MLA, args=["--attention-backend", "flashinfer"]),
    Case("mla-drafter-flashinfer-chain", {"0.5.9": ("after-load", "drafter.mla-needs-0.5.12"),
                                          "0.5.12": "ok"},
         draft=EAGLE3_MLA, args=["--attention-backend", "flashinfer"]),
    Case("prefill-backend-without-eagle", _all(("after-load",
                                                "backends.no-eagle-draft-backend")),
         args=["--attention-backend", "flashinfer", "--prefill-attention-backend",
               "torch_native"]),
    Case("draft-tokens-exceed-tree", _all(("first-request",
                                           "speculative.draft-tokens-exceed-tree")),
         spec=["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "1",
               "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"],
         args=["--attention-backend", "triton"]),
    Case("draft-tokens-fill-the-tree", OK,
         spec=["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "1",
               "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "5"],
         args=["--attention-backend", "triton"]),
    Case("rejection-sampling-draft-vocab", {"0.5.9": ("argparse", "argparse.unknown"),
                                            "0.5.15": ("after-load",
                                                       "speculative.rejection-sampling-vocab")},
         args=["--speculative-use-rejection-sampling"]),
    Case("rejection-sampling-full-vocab", {"0.5.9": ("argparse", "argparse.unknown"),
                                           "0.5.15": "ok"},
         draft={**EAGLE3, "draft_vocab_size": None}, args=["--speculative-use-rejection-sampling"]),
    Case("aux-layer-past-the-target", {"0.5.9": ("first-request", "drafter.aux-layer-ids"),
                                       "0.5.19": ("after-load", "drafter.aux-layer-ids")},
         draft={**EAGLE3, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 60],
                                           "use_aux_hidden_state": True}}),
    Case("aux-layer-shift-until-0.5.12", {"0.5.9": ("first-request", "drafter.aux-layer-ids"),
                                          "0.5.15": "ok"},
         draft={**EAGLE3, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 60],
                                           "use_aux_hidden_state": True}}),
    Case("token-map-with-eagle3", OK, args=["--speculative-token-map", "/x/hot.pt"]),
    # the drafter's vocabulary map (models/llama_eagle3.py `"d2t" in name`)
    Case("drafter-without-vocab-map", _all(("silent", "drafter.vocab-map-missing")),
         draft_tensors=["midlayer.fc.weight", "midlayer.self_attn.q_proj.weight"]),
    Case("drafter-with-vocab-map", OK,
         draft_tensors=["midlayer.fc.weight", "d2t", "t2d"]),
    # --- the KV pool, predicted from the real formulas (rules/memory.py; the stand-in's own)
    Case("pool-below-context-at-0.7", _all(("silent", "memory.kv-pool-below-context")),
         mem_fraction="0.7"),
    Case("pool-holds-a-shorter-context", OK, mem_fraction="0.7",
         args=["--context-length", "8192"]),
]
