"""The agent compiles each shipped module once per host: marshalled code under
~/.cache/orchestrator-agent/, keyed by the source (and the Python's bytecode magic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.remote.agent import cached_compile

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
