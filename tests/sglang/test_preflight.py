"""Preflight rules against recorded configs (FACTS.md): each refusal, each near miss that passes."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import PreflightError
from orchestrator.sglang.flags import table_flags
from orchestrator.sglang.preflight import HostFacts, LaunchRequest, Report, run_preflight

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
SM120 = [(12, 0)] * 8
GOOD_SPEC = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/m/d",
             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]


def facts(version: str = "0.5.23", **over: Any) -> HostFacts:
    base: dict[str, Any] = {
        "python": "/v/bin/python", "sglang_version": version,
        "compressed_tensors_version": "0.18.0", "nvfp4_known": True, "target_config": K26,
        "draft_config": EAGLE3, "compute_capabilities": SM120, "flags": table_flags(version),
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


def test_self_drafting_targets_need_an_explicit_draft_path() -> None:
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
    only(check(spec=spec, draft=None, target_config=K2, draft_config=None),
         "silently uses the target itself as the draft model (sglang issue #36528)")
    only(check(spec=spec, draft=None, draft_config=None), "#36528")  # K2.6 too
    only(check(spec=spec, draft=None, target_config=LLAMA, draft_config=None),
         "EAGLE3 needs draft_model_path")


def test_version_gates() -> None:
    only(check(version="0.5.9", nvfp4_known=True),
         "EAGLE3 on a Kimi K2.5/K2.6 target (KimiK25ForConditionalGeneration) needs sglang "
         ">= 0.5.10")
    assert check(version="0.5.10").ok
    only(check(version="0.5.11", draft_config=EAGLE3_MLA), "needs sglang >= 0.5.12")
    assert check(version="0.5.12", draft_config=EAGLE3_MLA).ok
    two = {**EAGLE3, "num_hidden_layers": 2}
    only(check(version="0.5.11", draft_config=two), "'EAGLE3 currently only supports 1 layer'")
    assert check(version="0.5.23", draft_config=two).ok
    only(check(spec=["--speculative-algorithm", "DFLASH"], version="0.5.9"),
         "--speculative-algorithm DFLASH is not accepted by sglang 0.5.9")
    only(check(spec=["--speculative-algorithm", "MEDUSA"]), "'MEDUSA' is unknown")


def test_attention_backends_per_gpu_generation() -> None:
    only(check(["--attention-backend", "fa3"]),
         "--attention-backend fa3 needs SM80-SM90; this host's GPUs are sm_120")
    assert check(["--attention-backend", "fa3"], compute_capabilities=[(9, 0)]).ok
    only(check(["--attention-backend", "trtllm_mla"]), "needs SM100")
    assert check(["--attention-backend", "trtllm_mla"], compute_capabilities=[(10, 0)]).ok
    only(check(["--attention-backend", "flashmla"]), "flashinfer or triton")
    assert check(["--attention-backend", "flashinfer"]).ok
    assert check(["--attention-backend", "triton"]).ok
    # unknown GPUs: the rule cannot apply
    assert check(["--attention-backend", "fa3"], compute_capabilities=[]).ok


def test_flags_the_release_lacks() -> None:
    report = check(extra=["--cuda-graph-max-bs", "64"])
    only(report, "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
                 "--cuda-graph-max-bs-prefill")
    assert check(extra=["--cuda-graph-max-bs", "64"], version="0.5.12").ok
    deprecated = check(extra=["--cuda-graph-max-bs", "64"], version="0.5.17")
    assert deprecated.ok and any("deprecated" in w for w in deprecated.warnings)
    prefix = check(extra=["--tp", "8"])
    assert prefix.ok
    assert any("--tp is not a flag" in w and "write --tp-size" in w for w in prefix.warnings)
    # the table is partial: an option it does not know is a warning, not a refusal
    unknown = check(extra=["--enable-p2p-check"])
    assert unknown.ok and any("could not be verified" in w for w in unknown.warnings)


def test_help_flag_set_is_authoritative() -> None:
    from orchestrator.sglang.flags import parse_help
    from tests.sglang.test_flags import sglang_like_help

    fs = parse_help(sglang_like_help(), "0.5.23")
    report = run_preflight(
        LaunchRequest(["--model-path", "/m/t", "--tp-size", "8", "--enable-p2p-check",
                       "--kv-cache-dtype", "fp8"], "/m/t"),
        facts(flags=fs, draft_config=None))
    assert any("--enable-p2p-check is not a flag of sglang 0.5.23" in p for p in report.problems)
    assert any("--kv-cache-dtype fp8 is not accepted" in p for p in report.problems)


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


def test_misc_rules() -> None:
    only(check(["--served-model-name", "kimi:k2.6"]), "contains ':'")
    only(check(["--nnodes", "3", "--dist-init-addr", "10.0.0.1:5000"]),
         "tp (8) x pp (1) = 8 is not divisible by --nnodes 3")
    only(check(["--nnodes", "2"]), "needs --dist-init-addr")
    only(check(extra=["--api-key", "sk-x"]), "extra_args sets --api-key")
    only(check(extra=["--port=30001"]), "use the stage parameter `port`")
    only(check(extra=["--model", "/x"]), "extra_args sets --model-path")
    only(check(extra=["oops"]), "unexpected argument 'oops'")
    drafter_for_other = {**EAGLE3, "hidden_size": 4096}
    only(check(draft_config=drafter_for_other), "the drafter's hidden_size is 4096")
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
