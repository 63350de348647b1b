"""Preflight mechanics against recorded configs: argparse semantics, problems together, messages.

The per-release behaviour of every rule is tested against the real source in
tests/sglang/test_fidelity.py (through the preflight AND the SGLang stand-in).
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import PreflightError
from orchestrator.sglang.multinode import NodeGroup
from orchestrator.sglang.preflight import (
    HostFacts,
    LaunchRequest,
    NativeCheck,
    Report,
    run_preflight,
)
from orchestrator.sglang.rules import Gpu

K26 = {  # Kimi K2.6: multimodal wrapper, compressed-tensors nvfp4 checkpoint
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
        "hidden_size": 7168, "vocab_size": 163840, "num_hidden_layers": 61,
        "quantization_config": {"quant_method": "compressed-tensors",
                                "format": "nvfp4-pack-quantized"},
    },
}
K2 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
      "hidden_size": 7168, "vocab_size": 163840, "num_hidden_layers": 61}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "vocab_size": 128256}
EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
          "hidden_size": 7168, "num_hidden_layers": 1, "vocab_size": 163840,
          "draft_vocab_size": 32000}
EAGLE3_MLA = {**EAGLE3, "architectures": ["Eagle3DeepseekV2ForCausalLM"]}
SM120 = [Gpu(i, (12, 0), 97887) for i in range(8)]
GOOD_SPEC = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/m/d",
             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]


def facts(version: str = "0.5.23", **over: Any) -> HostFacts:
    base: dict[str, Any] = {
        "python": "/v/bin/python", "sglang_version": version,
        "compressed_tensors_version": "0.18.0", "nvfp4_known": True, "target_config": K26,
        "draft_config": EAGLE3, "gpus": SM120,
    }
    base.update(over)
    return HostFacts(**base)


def check(args: list[str] | None = None, *, spec: list[str] | None = None,
          draft: str | None = "/m/d", extra: list[str] | None = None, **fact: Any) -> Report:
    extra = list(extra or [])
    argv = ["--model-path", "/m/t", "--tp-size", "8", "--served-model-name", "kimi-k2.6",
            "--trust-remote-code", *(GOOD_SPEC if spec is None else spec), *(args or []),
            *extra]
    return run_preflight(LaunchRequest(argv, "/m/t", draft, extra), facts(**fact))


def only(report: Report, text: str) -> None:
    assert len(report.problems) == 1, report.problems
    assert text in report.problems[0], report.problems[0]


def test_the_playbook_launch_passes() -> None:
    report = check()
    assert report.ok, report.problems
    assert report.warnings == []
    assert report.options["--tp-size"] == "8"


def test_eagle_with_an_eagle3_drafter() -> None:
    spec = ["--speculative-algorithm", "EAGLE", *GOOD_SPEC[2:]]
    only(check(spec=spec), "EAGLE with an EAGLE-3 drafter (LlamaForCausalLMEagle3)")
    nextn = ["--speculative-algorithm", "NEXTN", *GOOD_SPEC[2:]]
    only(check(spec=nextn), "NEXTN with an EAGLE-3 drafter")  # NEXTN is rewritten to EAGLE
    eagle_ok = check(spec=spec, draft_config={**EAGLE3, "architectures": ["LlamaForCausalLMEagle"]})
    assert eagle_ok.ok, eagle_ok.problems


def test_topk_or_draft_tokens_without_steps() -> None:
    only(check(spec=["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                     "/m/d", "--speculative-eagle-topk", "1"]),
         "speculative.eagle_topk set without speculative.num_steps")
    only(check(spec=["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                     "/m/d", "--speculative-num-draft-tokens", "4"]),
         "num_draft_tokens set without speculative.num_steps")
    auto = check(spec=["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                       "/m/d"])
    assert auto.ok, auto.problems  # all three omitted: SGLang chooses


def test_topk_one_with_other_draft_tokens_is_a_warning() -> None:
    spec = GOOD_SPEC[:-1] + ["6"]
    report = check(spec=spec)
    assert report.ok
    assert any("num_steps + 1 = 4" in w for w in report.warnings)


def test_eagle_launches_without_a_draft_path() -> None:
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1"]
    only(check(spec=spec, draft=None, draft_config=None),
         "loads the KimiK25ForConditionalGeneration target a second time")  # K2.6: no autofill
    only(check(spec=spec, draft=None, target_config=K2, draft_config=None),
         "fills in the DeepseekV3ForCausalLM target itself")  # K2: auto-filled MTP
    only(check(spec=spec, draft=None, target_config=LLAMA, draft_config=None),
         "set draft_model_path")


def test_versions_between_supported_releases_use_the_older_data() -> None:
    report = check(extra=["--enable-p2p-check"], version="0.5.11")
    assert report.flags_source == "nearest" and report.ok, report.problems
    # served by the older table, but never silently: one warning names both releases
    unverified = [w for w in report.warnings if "not a verified release" in w]
    assert len(unverified) == 1 and "are those of 0.5.10" in unverified[0], report.warnings
    assert not any("not a verified release" in w for w in check(version="0.5.22").warnings)
    newer = check(version="0.5.24").warnings
    assert any("sglang 0.5.24 is not a verified release" in w and "0.5.23" in w for w in newer)
    unknown = check(extra=["--no-such-flag"], version="0.5.11")
    assert unknown.ok and any("could not be verified" in w for w in unknown.warnings)
    refused = check(extra=["--no-such-flag"], version="0.5.10")
    only(refused, "--no-such-flag is not a flag of sglang 0.5.10")
    only(check(version="0.4.0"), "older than the oldest supported release 0.5.9")


def test_flags_the_release_lacks() -> None:
    only(check(extra=["--cuda-graph-max-bs", "64"]),
         "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
         "--cuda-graph-max-bs-prefill")
    assert check(extra=["--cuda-graph-max-bs", "64"], version="0.5.12").ok
    prefix = check(extra=["--tp", "8"])
    assert prefix.ok
    assert any("--tp is not a flag" in w and "write --tp-size" in w for w in prefix.warnings)
    deprecated = check(extra=["--disable-cuda-graph"])
    assert deprecated.ok and any("deprecated" in w for w in deprecated.warnings)
    only(check(extra=["--kv-cache-dtype", "fp8"]), "--kv-cache-dtype fp8 is not accepted")
    only(check(extra=["--trust-remote-code=yes"]), "takes no value")
    # argparse's own -h/--help: usage on stdout, exit 0, no server
    only(check(extra=["-h"]), "-h makes launch_server print its usage and exit 0")
    assert check(extra=["--help", "x"]).rules == ["argparse.help", "argparse.stray-value"]


def test_native_check_is_reported_verbatim_with_our_fix() -> None:
    native = NativeCheck(True, False, "ValueError", "Unknown speculative algorithm name: MEDUSA")
    report = check(spec=["--speculative-algorithm", "MEDUSA"], native=native)
    assert report.rules == ["speculative.unknown-algorithm", "native.server-args"]
    assert report.problems[1] == ("SGLang's own validation also refuses it (ValueError): Unknown "
                                  "speculative algorithm name: MEDUSA")
    assert "choose one of: EAGLE, EAGLE3" in report.problems[0]
    alone = check(native=NativeCheck(True, False, "argparse", "usage: sglang serve [-h]\n"
                                     "sglang serve: error: the following arguments are required"))
    assert alone.problems == ["SGLang's own validation refuses this launch (argparse): sglang "
                              "serve: error: the following arguments are required -- no rule of "
                              "ours covers it: change what SGLang names"]
    assert check(native=NativeCheck(True, True)).ok
    assert check(native=NativeCheck(False, kind="ModuleNotFoundError")).ok  # tables decided
    slow = check(native=NativeCheck(True, kind="timeout", seconds=120))
    assert slow.ok and any("did not finish in 120s" in w for w in slow.warnings)


def test_compressed_tensors_must_know_the_checkpoint_format() -> None:
    only(check(compressed_tensors_version="0.8.1", nvfp4_known=False),
         "compressed-tensors 0.8.1 does not know nvfp4_pack_quantized; install "
         "compressed-tensors>=0.10.0 (the pip stage)")
    only(check(compressed_tensors_version=None, nvfp4_known=None),
         "compressed-tensors is not installed")
    only(check(nvfp4_known=None, nvfp4_error="ImportError: torch"), "ImportError: torch")
    # a checkpoint without nvfp4 needs no such check
    assert check(spec=[], draft=None, target_config=LLAMA, draft_config=None,
                 compressed_tensors_version="0.8.1", nvfp4_known=False).ok


def test_stage_owned_and_secret_flags() -> None:
    only(check(extra=["--api-key", "sk-x"]), "extra_args sets --api-key")
    only(check(extra=["--port=30001"]), "use the stage parameter `port`")
    only(check(extra=["--model", "/x"]), "extra_args sets --model-path")
    only(check(extra=["oops"]), "unexpected argument 'oops'")
    no_cfg = check(target_config=None)
    assert any("/m/t/config.json is missing" in p for p in no_cfg.problems)


def test_missing_sglang_and_all_problems_together() -> None:
    only(check(version=None), "sglang is not installed in /v/bin/python")
    report = check(["--served-model-name", "a:b", "--attention-backend", "fa3"],
                   spec=["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1",
                         "--speculative-draft-model-path", "/m/d"],
                   compressed_tensors_version="0.8.1", nvfp4_known=False)
    assert len(report.problems) == 5, report.problems
    with pytest.raises(PreflightError) as err:
        report.raise_if_problems()
    text = err.value.render()
    assert "5 problems found before launching anything" in text
    assert text.count("\n  - ") == 5
    assert "hint:" in text


def _grouped(extra: list[str], group: NodeGroup | None) -> Report:
    argv = ["--model-path", "/m/t", "--tp-size", "8", "--served-model-name", "kimi-k2.6",
            "--trust-remote-code", *GOOD_SPEC, *extra, *(group.args() if group else [])]
    return run_preflight(LaunchRequest(argv, "/m/t", "/m/d", extra, group=group), facts())


def test_extra_args_must_agree_with_the_node_group() -> None:
    pair = NodeGroup(("gpu-a", "gpu-b"), 1, "10.0.0.21:20000")
    # single-node playbook, extra_args naming peers: refused with the fix (the `nodes` list)
    lone = _grouped(["--nnodes", "2", "--node-rank", "0"], None)
    assert lone.rules.count("stage.extra-args-vs-nodes") == 1, lone.problems
    assert "extra_args sets --nnodes 2, but this playbook runs a single-node server" in \
        lone.problems[0]
    assert "`nodes`" in lone.problems[0]
    # in a group: a value that contradicts the group is refused, naming what the stage sets
    wrong = _grouped(["--nnodes", "4", "--dist-init-addr", "10.0.0.9:20000"], pair)
    assert wrong.rules.count("stage.extra-args-vs-nodes") == 2, wrong.problems
    assert "the stage sets --nnodes 2" in wrong.problems[0]
    assert "node 0 at 10.0.0.21:20000" in wrong.problems[1]
    # values that agree (and the harmless --nnodes 1 alone) pass
    assert _grouped(["--nnodes", "2", "--node-rank", "1"], pair).ok
    assert _grouped(["--nnodes=1"], None).ok


def test_torch_2_9_1_needs_cudnn_9_15_for_a_multimodal_target() -> None:
    k26 = {**K26, "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27}}
    refused = check(version="0.5.9", target_config=k26, cudnn_version="9.10.2.21")
    assert "serving.cudnn-for-torch-2.9.1" in refused.rules
    assert any("nvidia-cudnn-cu12==9.16.0.29" in p for p in refused.problems)
    for fine in (check(version="0.5.9", target_config=k26, cudnn_version="9.16.0.29"),
                 check(version="0.5.9", target_config=k26, cudnn_version=None),
                 check(version="0.5.9", target_config=k26, cudnn_version="9.10.2.21",
                       env={"SGLANG_DISABLE_CUDNN_CHECK": "1"}),
                 check(version="0.5.10", target_config=k26, cudnn_version="9.10.2.21")):
        assert "serving.cudnn-for-torch-2.9.1" not in fine.rules
