"""The agent compiles each shipped module once per host: marshalled code under
~/.cache/orchestrator-agent/, keyed by the source (and the Python's bytecode magic), used only
when it is the effective uid's and nobody else's, and not written on a dry run."""

from __future__ import annotations

import hashlib
import marshal
import os
import pwd
import stat
import subprocess
import sys
from importlib.util import MAGIC_NUMBER
from pathlib import Path

import pytest

from orchestrator.config.model import HostSpec
from orchestrator.remote import agent, bootstrap
from orchestrator.remote.agent import cached_compile
from orchestrator.transports import LocalTransport, make_transport
from orchestrator.transports.agent_client import agent_source, shipped_modules

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
    agent._cache_store(source, bootstrap.AGENT_FILE, code)  # as the agent keeps its own
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


# ---------------------------------------------------------------- planted entries
# Someone who can write the cache directory (or an entry in it) plants marshalled code whose
# run writes a marker file. The cache is used only when the directory and the entry are owned
# by the effective uid, writable by no one else and no symlink: the tests run as root, so the
# other user is uid 65534.

OTHER_UID = 65534


def _plant(cache: Path, marker: Path, how: str, sources: list[tuple[bytes, str]]) -> None:
    """Entries for SOURCES (source, file name) under CACHE/orchestrator-agent whose code writes
    MARKER, made unsafe as HOW says ("safe" leaves them as the agent itself would)."""
    planted = marshal.dumps(compile(f"open({str(marker)!r}, 'w').write('ran')\n", "x", "exec"))
    where = cache / ("elsewhere" if how.startswith("symlinked") else "orchestrator-agent")
    where.mkdir(mode=0o700, parents=True)
    for source, name in sources:
        entry = where / Path(bootstrap.cache_path(source, name)).name
        entry.write_bytes(planted)
        entry.chmod(0o620 if how == "group-writable file" else 0o600)
        if how in ("dir of another user", "file of another user"):
            os.chown(entry, OTHER_UID, OTHER_UID)
        if how == "symlinked entry":
            (cache / "orchestrator-agent").mkdir(mode=0o700, exist_ok=True)
            (cache / "orchestrator-agent" / entry.name).symlink_to(entry)
    if how == "dir of another user":
        os.chown(where, OTHER_UID, OTHER_UID)
    if how == "group-writable dir":
        where.chmod(0o770)
    if how == "symlinked dir":
        (cache / "orchestrator-agent").symlink_to(where)


UNSAFE = ["dir of another user", "file of another user", "group-writable dir",
          "group-writable file", "symlinked entry", "symlinked dir"]


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("planting entries of another user needs root")


@pytest.mark.parametrize("how", ["safe", *UNSAFE])
def test_a_planted_entry_runs_only_when_it_is_safe(how: str, tmp_path: Path, as_root: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The control ("safe": as the agent keeps them) shows the planted code would run."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    marker = tmp_path / "marker"
    name = "orchestrator/remote/demo.py"
    _plant(tmp_path / "cache", marker, how, [(SOURCE.encode(), name),
                                              (agent_source(), bootstrap.AGENT_FILE)])
    scope = run(cached_compile(SOURCE, name))
    _, fresh = bootstrap.compiled(agent_source())
    assert marker.exists() == (how == "safe")
    if how != "safe":
        assert scope["ANSWER"] == 42 and fresh


@pytest.mark.parametrize("how", ["dir of another user", "group-writable dir",
                                 "symlinked entry"])
def test_an_agent_never_runs_planted_code_and_still_works(
        how: str, tmp_path: Path, as_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries planted for the agent itself (the bootstrap reads it) and every shipped module."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    marker = tmp_path / "marker"
    sources = [(agent_source(), bootstrap.AGENT_FILE)]
    sources += [(text.encode(), f"orchestrator/remote/{name}.py")
                for name, text in shipped_modules()]
    _plant(tmp_path / "cache", marker, how, sources)
    t = LocalTransport(HostSpec(name="planted", connection="local"))
    try:
        assert t.module_errors() == {}  # every shipped module imported
        assert t.probe("python")["version_info"][:2] == list(sys.version_info[:2])
        assert t.run("echo ok").stdout == "ok\n"
    finally:
        t.close()
    assert not marker.exists()


def test_the_cache_is_private_and_never_written_in_a_directory_of_another_user(
        tmp_path: Path, as_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached_compile(SOURCE, "orchestrator/remote/demo.py")
    directory = tmp_path / "orchestrator-agent"
    [entry] = directory.iterdir()
    assert (stat.S_IMODE(directory.stat().st_mode), stat.S_IMODE(entry.stat().st_mode)) == (
        0o700, 0o600)
    os.chown(directory, OTHER_UID, OTHER_UID)
    cached_compile("ANSWER = 1\n", "orchestrator/remote/demo.py")
    assert list(directory.iterdir()) == [entry]


def test_a_root_helper_keeps_its_own_cache(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """sudo may keep the user's $HOME and $XDG_CACHE_HOME; in a process it started (SUDO_UID)
    the cache is under the effective uid's home from the password database."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert bootstrap.cache_path(b"x", "n").startswith(str(tmp_path / "cache") + "/")
    monkeypatch.setenv("SUDO_UID", "1000")
    home = pwd.getpwuid(os.geteuid()).pw_dir
    assert bootstrap.cache_path(b"x", "n").startswith(
        os.path.join(home, ".cache", "orchestrator-agent") + "/")


def test_a_root_helper_never_uses_the_cache_sudo_kept_pointing_at_the_user(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper for become=True starts under `sudo -n`; a sudo that keeps the user's $HOME
    and $XDG_CACHE_HOME (here a stand-in that keeps them and sets SUDO_UID, as sudo always
    does) must not make it read or write the user's cache."""
    kept = tmp_path / "user-cache"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sudo").write_text(
        '#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift\n'
        f'SUDO_UID=1000 XDG_CACHE_HOME={kept} HOME={tmp_path} exec "$@"\n')
    (tmp_path / "bin" / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "agent-cache"))
    t = LocalTransport(HostSpec(name="helper", connection="local"), become_mode="sudo")
    try:
        assert t.run("echo $SUDO_UID", become=True).stdout == "1000\n"  # the helper ran it
        assert t.run("echo $SUDO_UID").stdout == "\n"
    finally:
        t.close()
    assert not kept.exists()


# ---------------------------------------------------------------- dry runs

@pytest.mark.parametrize("read_only", [True, False])
def test_a_dry_run_agent_writes_no_cache(read_only: bool, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run's connection (make_transport(read_only=True), as `plan` and `deploy --dry-run`
    open them) leaves a fresh home as it was; a deploy's keeps the compiled code there."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    t = make_transport(HostSpec(name="dry", connection="local"), read_only=read_only)
    try:
        assert t.module_errors() == {}  # every shipped module compiled
        assert t.run("echo ok").stdout == "ok\n"
    finally:
        t.close()
    kept = sorted(p.name for p in (home / ".cache" / "orchestrator-agent").glob("*.code"))
    if read_only:
        assert list(home.iterdir()) == []
    else:
        # the agent's own code, and every shipped module's but the bootstrap's (it reads them)
        assert len(kept) == len(shipped_modules())
