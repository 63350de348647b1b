"""FlagSet: --help parsing (real argparse output), argparse-style resolution, the FACTS table."""

from __future__ import annotations

import argparse

import pytest

from orchestrator.sglang.flags import FlagSet, at_least, parse_help, parse_version, table_flags


def sglang_like_help() -> str:
    """Real argparse --help text of a parser shaped like SGLang 0.5.23's (aliases, choices...)."""
    p = argparse.ArgumentParser(prog="launch_server.py")
    p.add_argument("--model-path", "--model", required=True, dest="model_path",
                   help="The path of the model weights. This can be a local folder or a "
                   "Hugging Face repo ID; --tokenizer-path defaults to it.")
    p.add_argument("--tensor-parallel-size", "--tp-size", type=int, dest="tp_size")
    p.add_argument("--tokenizer-mode", choices=["auto", "slow"], default="auto")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16"])
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--cuda-graph-bs", type=int, nargs="+")
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int)
    p.add_argument("--disable-cuda-graph", action="store_true",
                   help="Disable cuda graph. Deprecated: use --cuda-graph-bs 0.")
    p.add_argument("--speculative-algorithm", type=str)
    group = p.add_argument_group("Speculative decoding")
    group.add_argument("--speculative-draft-model-path", "--speculative-draft-model",
                       dest="speculative_draft_model_path")
    return p.format_help()


def test_parse_version_and_at_least() -> None:
    assert parse_version("0.5.23") == (0, 5, 23)
    assert parse_version("0.5.10rc1") == (0, 5, 10)
    assert parse_version("0.5.23.post1+cu128") == (0, 5, 23)
    assert parse_version(None) == ()
    assert at_least("0.5.10", 0, 5, 10) and not at_least("0.5.9", 0, 5, 10)
    assert at_least("0.6", 0, 5, 12) and not at_least(None, 0, 0, 1)


def test_parse_help_reads_aliases_choices_arity_and_deprecation() -> None:
    fs = parse_help(sglang_like_help(), "0.5.23")
    assert fs.authoritative
    assert fs.options["--model"] == "--model-path"
    assert fs.options["--tp-size"] == "--tensor-parallel-size"
    assert fs.options["--speculative-draft-model"] == "--speculative-draft-model-path"
    assert fs.choices["--tokenizer-mode"] == ["auto", "slow"]
    assert fs.arity["--trust-remote-code"] == "none"
    assert fs.arity["--cuda-graph-bs"] == "many"
    assert fs.arity["--model-path"] == "one"
    assert "--disable-cuda-graph" in fs.deprecated
    assert "--tokenizer-path" not in fs.options  # only mentioned in a help text
    assert FlagSet.from_json(fs.to_json()) == fs


def test_parse_help_rejects_text_without_options() -> None:
    with pytest.raises(ValueError):
        parse_help("Traceback (most recent call last):\nImportError: torch\n", "0.5.23")


def test_resolution_follows_argparse() -> None:
    fs = parse_help(sglang_like_help(), "0.5.23")
    assert fs.resolve("--model").kind == "exact"
    tp = fs.resolve("--tp")
    assert (tp.kind, tp.canonical) == ("prefix", "--tensor-parallel-size")
    amb = fs.resolve("--cuda-graph-max-bs")
    assert amb.kind == "ambiguous"
    assert amb.matches == ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill")
    assert fs.resolve("--kv-cache-dtype=fp8_e4m3").kind == "exact"
    assert fs.resolve("--no-such-flag").kind == "unknown"
    # cross-check against argparse itself
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda-graph-max-bs-decode")
    parser.add_argument("--cuda-graph-max-bs-prefill")
    with pytest.raises(SystemExit):
        parser.parse_args(["--cuda-graph-max-bs", "8"])


def test_facts_table_per_release() -> None:
    old = table_flags("0.5.9")
    assert not old.authoritative
    assert old.resolve("--cuda-graph-max-bs").kind == "exact"
    assert "DFLASH" not in old.choices["--speculative-algorithm"]
    mid = table_flags("0.5.17")
    assert "--cuda-graph-max-bs" in mid.deprecated
    assert "--speculative-algorithm" not in mid.choices  # a free string from 0.5.15
    new = table_flags("0.5.23")
    assert new.resolve("--cuda-graph-max-bs").kind == "ambiguous"
    assert "--cuda-graph-max-bs" in new.removed
    assert "--disable-cuda-graph" in new.deprecated
    assert new.resolve("--model").canonical == "--model-path"
