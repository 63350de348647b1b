#!/usr/bin/env python3
"""Record what the REAL SGLang start-up validation says of every fidelity case, per release.

    python scripts/real_serverargs/record.py [--releases 0.5.9,0.5.23] [--cases ID,...]
                                             [--jobs N] [--check]

Each case of tests/sglang/fidelity_cases.py runs through `run_real.py` (the release's own
prepare_server_args, resolve_once from 0.5.19, check_server_args: what launch_server runs before
starting any process; torch, triton and the GPU stubbed) for each supported release, and the
outcome goes to tests/sglang/real_serverargs.json: "ok", "argparse", or "start:<Exception>",
with the message and the case's input digest. tests/sglang/test_fidelity.py holds the table's
argparse and start expectations to it (and every later-phase case to "ok": ServerArgs cannot see
them), and fails when a case changed since it was recorded.

Needs the dependency venvs (setup.sh) and the releases' sources under
.cache/real-serverargs/src/<version> (setup.sh extracts them from the wheels `make sync-sglang`
downloads). `make fidelity-real` does all of it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(REPO / "sim"), str(HERE)]

import run_real  # noqa: E402

from tests.sglang.fidelity_cases import CASES, RELEASES, Case  # noqa: E402

OUT = REPO / "tests" / "sglang" / "real_serverargs.json"
SRC = Path(os.environ.get("REALARGS_SRC") or REPO / ".cache" / "real-serverargs" / "src")
GPU_MIB = 97887  # the fidelity table's GPUs (tests/sglang/test_fidelity.py MEM_MIB)

# The real Kimi-K2 checkpoints ship remote code for model_type "kimi_k2" (config.json auto_map ->
# configuration_deepseek.DeepseekV3Config): transformers itself has no "kimi_k2", and the
# table's configs leave it out. Written here as the checkpoint has it (its defaults).
REMOTE_CONFIG = '''
from transformers.configuration_utils import PretrainedConfig


class DeepseekV3Config(PretrainedConfig):
    model_type = "kimi_k2"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                 moe_intermediate_size=2048, num_hidden_layers=61, num_nextn_predict_layers=1,
                 num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                 n_routed_experts=256, ep_size=1, routed_scaling_factor=2.5, kv_lora_rank=512,
                 q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                 topk_method="noaux_tc", n_group=8, topk_group=4, num_experts_per_tok=8,
                 moe_layer_freq=1, first_k_dense_replace=3, norm_topk_prob=True,
                 scoring_func="sigmoid", hidden_act="silu", max_position_embeddings=4096,
                 initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True, pad_token_id=None,
                 bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, rope_theta=10000.0,
                 rope_scaling=None, attention_bias=False, attention_dropout=0.0, **kwargs):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_nextn_predict_layers = num_nextn_predict_layers
        self.num_attention_heads = num_attention_heads
        self.n_shared_experts = n_shared_experts
        self.n_routed_experts = n_routed_experts
        self.ep_size = ep_size
        self.routed_scaling_factor = routed_scaling_factor
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.topk_method = topk_method
        self.n_group = n_group
        self.topk_group = topk_group
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_layer_freq = moe_layer_freq
        self.first_k_dense_replace = first_k_dense_replace
        self.norm_topk_prob = norm_topk_prob
        self.scoring_func = scoring_func
        if num_key_value_heads is None:
            num_key_value_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings,
                         **kwargs)
'''


def _write_model(path: str, config: dict[str, Any]) -> None:
    os.makedirs(path, exist_ok=True)
    config = dict(config)
    if config.get("model_type") == "kimi_k2" and "auto_map" not in config:
        config["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}
        Path(path, "configuration_deepseek.py").write_text(REMOTE_CONFIG)
    Path(path, "config.json").write_text(json.dumps(config))


def outcome(result: dict[str, Any]) -> str:
    """"ok", "argparse" or "start:<Exception>"."""
    if result.get("ok"):
        return "ok"
    return "argparse" if result.get("kind") == "argparse" else f"start:{result.get('kind')}"


def one(case: Case, release: str, root: str) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix=f"{case.id}-", dir=root)
    # a colon in the model path is what the colon case is about (served name defaults to it)
    target = os.path.join(work, "kimi-k2" if case.served_name is not None else "kimi:k2")
    draft = os.path.join(work, "kimi-eagle3")
    _write_model(target, case.target)
    if case.draft is not None:
        _write_model(draft, case.draft)
    result = run_real.run(str(SRC / release), case.argv(target, draft), cc=case.cc,
                          mib=GPU_MIB, gpus=8, env=case.env)
    shutil.rmtree(work, ignore_errors=True)
    return {"case": case.id, "release": release, "digest": case.digest(),
            "outcome": outcome(result), "stage": result.get("stage"),
            "message": str(result.get("message") or "")[:300]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", default=",".join(RELEASES))
    ap.add_argument("--cases", default="", help="only these case ids (the rest are kept)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ns = ap.parse_args(argv)
    releases = ns.releases.split(",")
    wanted = set(ns.cases.split(",")) if ns.cases else None
    cases = [c for c in CASES if wanted is None or c.id in wanted]
    old = json.loads(OUT.read_text()) if OUT.exists() else {"outcomes": {}}
    table: dict[str, dict[str, Any]] = old["outcomes"]
    root = tempfile.mkdtemp(prefix="realargs-cases-")
    try:
        with cf.ThreadPoolExecutor(ns.jobs) as pool:
            futures = [pool.submit(one, c, r, root) for c in cases for r in releases]
            for n, future in enumerate(cf.as_completed(futures), 1):
                got = future.result()
                table.setdefault(got.pop("case"), {})[got.pop("release")] = got
                print(f"\r{n}/{len(futures)}", end="", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(file=sys.stderr)
    doc = {"generated_by": "scripts/real_serverargs/record.py", "gpu_mib": GPU_MIB,
           "outcomes": {k: dict(sorted(v.items(), key=lambda kv: [int(x) for x in
                                                                   kv[0].split(".")]))
                        for k, v in sorted(table.items())}}
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
