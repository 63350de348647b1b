"""FlagSet: the generated per-release flag data, and argparse-style resolution against it."""

from __future__ import annotations

import argparse

import pytest

from orchestrator.sglang.flags import at_least, flags_for, parse_version
from orchestrator.sglang.releases import RELEASES


def test_parse_version_and_at_least() -> None:
    assert parse_version("0.5.23") == (0, 5, 23)
    assert parse_version("0.5.10rc1") == (0, 5, 10)
    assert parse_version("0.5.23.post1+cu128") == (0, 5, 23)
    assert parse_version(None) == ()
    assert at_least("0.5.10", 0, 5, 10) and not at_least("0.5.9", 0, 5, 10)
    assert at_least("0.6", 0, 5, 12) and not at_least(None, 0, 0, 1)


def test_every_supported_release_has_generated_flags() -> None:
    assert set(RELEASES) >= {"0.5.9", "0.5.10", "0.5.12", "0.5.15", "0.5.19", "0.5.20",
                             "0.5.23"}
    for version in RELEASES:
        fs = flags_for(version)
        assert fs.authoritative and fs.source == "release"
        assert fs.canonical("--model") == fs.canonical("--model-path") is not None
        assert fs.arity[fs.canonical("--trust-remote-code")] == "none"
        assert fs.arity[fs.canonical("--tp-size")] == "one"


def test_tp_flag_order_flips_between_releases() -> None:
    # server_args.py:3301-3303 (0.5.9) vs arg_groups/fields/parallel.py:45 (0.5.23)
    assert flags_for("0.5.9").canonical("--tp-size") == "--tensor-parallel-size"
    assert flags_for("0.5.23").canonical("--tensor-parallel-size") == "--tp-size"


def test_a_version_between_releases_uses_the_older_data() -> None:
    fs = flags_for("0.5.11")
    assert fs.source == "nearest" and fs.data_version == "0.5.10" and not fs.authoritative
    assert fs.version == "0.5.11"
    with pytest.raises(KeyError):
        flags_for("0.4.0")


def test_resolution_follows_argparse() -> None:
    fs = flags_for("0.5.23")
    assert fs.resolve("--model").kind == "exact"
    tp = fs.resolve("--tp")
    assert tp.kind == "prefix" and tp.canonical == "--tp-size"
    amb = fs.resolve("--cuda-graph-max-bs")
    assert amb.kind == "ambiguous"
    assert amb.matches == ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill")
    assert "--cuda-graph-max-bs" in fs.removed
    assert fs.resolve("--kv-cache-dtype=fp8_e4m3").kind == "exact"
    assert fs.resolve("--no-such-flag").kind == "unknown"
    assert flags_for("0.5.12").resolve("--cuda-graph-max-bs").kind == "exact"
    # cross-check the ambiguity against argparse itself
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda-graph-max-bs-decode")
    parser.add_argument("--cuda-graph-max-bs-prefill")
    with pytest.raises(SystemExit):
        parser.parse_args(["--cuda-graph-max-bs", "8"])


def test_choices_and_deprecations_come_from_the_release() -> None:
    old, new = flags_for("0.5.9"), flags_for("0.5.23")
    assert "--speculative-algorithm" in old.choices  # argparse choices up to 0.5.10
    assert "DFLASH" not in old.choices["--speculative-algorithm"]
    assert "--speculative-algorithm" not in flags_for("0.5.12").choices  # a free string
    assert "cutlass_mla" in flags_for("0.5.19").choices["--attention-backend"]
    assert "cutlass_mla" not in flags_for("0.5.20").choices["--attention-backend"]
    assert "--disable-cuda-graph" in new.deprecated
    assert "--disable-cuda-graph" not in old.deprecated
    assert "--enable-dp-attention" in new.deprecated
    assert "--enable-dp-attention" not in flags_for("0.5.20").deprecated
