"""The agent compiles each shipped module once per host: marshalled code under
~/.cache/orchestrator-agent/, keyed by the source (and the Python's bytecode magic)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from importlib.util import MAGIC_NUMBER
from pathlib import Path

import pytest

from orchestrator.remote import agent, bootstrap
from orchestrator.remote.agent import cached_compile
from orchestrator.transports.agent_client import agent_source

SOURCE = "ANSWER = 6 * 7\n"


def run(code: object) -> dict:
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the code under test
    return scope


def test_compiled_once_then_loaded_and_a_damaged_entry_is_just_compiled_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = cached_compile(SOURCE, "orchestrator/remote/demo.py")
    entries = list((tmp_path / "orchestrator-agent").glob("*.code"))
    assert run(first)["ANSWER"] == 42 and len(entries) == 1
    entries[0].write_bytes(b"\xe3not marshal data")
    assert run(cached_compile(SOURCE, "orchestrator/remote/demo.py"))["ANSWER"] == 42
    assert entries[0].read_bytes()[:4] != b"\xe3not"  # rewritten with good code
    # another source is another entry; nothing else (no temp file) is left behind
    cached_compile("ANSWER = 1\n", "orchestrator/remote/demo.py")
    assert sorted(p.suffix for p in (tmp_path / "orchestrator-agent").iterdir()) == [
        ".code", ".code"]


def test_an_unwritable_cache_still_compiles(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert run(cached_compile(SOURCE, "orchestrator/remote/demo.py"))["ANSWER"] == 42


def test_the_bootstrap_reads_the_entry_the_agent_keeps_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = agent_source()
    code, fresh = bootstrap.compiled(source)
    assert fresh and not list(tmp_path.glob("*/*.code"))  # the bootstrap only reads
    agent._keep_own_code(source, code)
    again, fresh = bootstrap.compiled(source)
    assert not fresh and again.co_filename == "orchestrator/remote/agent.py"
    # both sides key it by SHA-256 as hashlib computes it
    key = hashlib.sha256(MAGIC_NUMBER + b"orchestrator/remote/agent.py" + source).hexdigest()
    assert [p.name for p in tmp_path.glob("*/*.code")] == [key[:32] + ".code"]


def test_the_cache_key_needs_no_openssl() -> None:
    """hashlib loads OpenSSL (_hashlib) when imported: the agent's start keys its cache with
    the interpreter's own SHA-256 instead."""
    prog = ("import runpy, sys; b = runpy.run_path(sys.argv[1]); "
            "print(b['sha256_hex'](b'abc'), '_hashlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", prog, bootstrap.__file__], check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [hashlib.sha256(b"abc").hexdigest(), "False"]
