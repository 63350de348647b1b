"""The plan cache (orchestrator.plancache): a re-run whose inputs did not change takes the last
run's rendered plan; any change to a file the load read, a variable `!env` looked up, the
command line's vars or selection, or the code is a fresh load; the entry holds no secret in
clear; a damaged entry is ignored; and the CLI says when it used one, and still masks and
warns as a fresh render does."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import orchestrator.stages  # noqa: F401 - the stage kinds, for load_all
from orchestrator.config import load_all
from orchestrator.config.reads import ReadLog, RecordingEnviron, recording
from orchestrator.plan import RenderedPlan, Selection, build_plan, render_plan
from orchestrator.plancache import PlanCache
from tests.runner.helpers import cli, local_inventory, write_yaml

SECRET = "hf_s3cr3tValueThatMustNotLeak"
CODE = b"code-1"


def _files(tmp: Path) -> tuple[Path, Path]:
    write_yaml(tmp / "model.yaml", {"model": "kimi-k2.6"})
    pb = write_yaml(tmp / "pb.yaml", {
        "name": "p", "hosts": "gpu", "vars_files": ["model.yaml"], "vars": {"extra": "-"},
        "stages": [
            {"id": "a", "run": "echo {{ model }} {{ greeting }} {{ extra }}",
             "env": {"TOKEN": "{{ token }}"}},
            {"id": "b", "run": "true", "needs": ["a"]},
        ],
    })
    inv = tmp / "inv.yaml"
    inv.write_text(
        "hosts:\n"
        "  gpu-1: {address: 127.0.0.1, groups: [gpu], vars: {greeting: !env GREETING}}\n"
        "  gpu-2: {address: 127.0.0.1, groups: [gpu]}\n"
        "vars:\n"
        "  greeting: hello\n"
        "  token: !env HF_TOKEN\n"
    )
    return pb, inv


def _fresh(pb: Path, inv: Path, cli_vars: dict[str, Any], selection: Selection,
           ) -> tuple[RenderedPlan, ReadLog]:
    with recording() as reads:
        playbook, inventory = load_all(str(pb), str(inv), cli_vars,
                                       environ=RecordingEnviron(os.environ))
    return render_plan(build_plan(playbook, inventory, selection), cli_vars), reads


def _cache(tmp: Path, pb: Path, inv: Path, cli_vars: dict[str, Any] | None = None,
           selection: Selection | None = None, code: bytes = CODE) -> PlanCache:
    cache = PlanCache.for_run(tmp / "runs", pb, inv, cli_vars or {},
                              selection or Selection.from_args(), code=code)
    assert cache is not None
    return cache


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, PlanCache]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GREETING", "hi")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    pb, inv = _files(tmp_path)
    rendered, reads = _fresh(pb, inv, {}, Selection.from_args())
    cache = _cache(tmp_path, pb, inv)
    assert cache.store(rendered, reads)
    return pb, inv, cache


def _commands(rendered: RenderedPlan) -> dict[tuple[str, str], Any]:
    return {(h, s): (n.params.model_dump() if n.params is not None else None, n.env)
            for h, nodes in rendered.nodes.items() for s, n in nodes.items()}


def test_unchanged_inputs_give_the_same_plan(setup: tuple[Path, Path, PlanCache],
                                             tmp_path: Path) -> None:
    pb, inv, cache = setup
    cached = _cache(tmp_path, pb, inv).load()
    assert cached is not None
    fresh, _ = _fresh(pb, inv, {}, Selection.from_args())
    assert _commands(cached) == _commands(fresh)
    assert cached.nodes["gpu-1"]["a"].params.command == "echo kimi-k2.6 hi -"
    assert cached.nodes["gpu-2"]["a"].params.command == "echo kimi-k2.6 hello -"
    assert cached.secrets == fresh.secrets and SECRET in cached.secrets["gpu-1"]
    assert cached.plan.deps == fresh.plan.deps


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


CHANGES = {
    "the playbook": lambda t, mp: _edit(t / "pb.yaml", "run: 'true'", "run: 'false'"),
    "a vars file": lambda t, mp: _edit(t / "model.yaml", "kimi-k2.6", "kimi-k2.7"),
    "the inventory": lambda t, mp: _edit(t / "inv.yaml", "greeting: hello", "greeting: hey"),
    "a variable !env read": lambda t, mp: mp.setenv("GREETING", "ho"),
    "the secret !env read": lambda t, mp: mp.setenv("HF_TOKEN", SECRET + "x"),
    "a variable !env read, unset": lambda t, mp: mp.delenv("GREETING"),
    "the vars file, deleted": lambda t, mp: (t / "model.yaml").unlink(),
    "the working directory": lambda t, mp: mp.chdir(t / "runs"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_input_is_a_fresh_load(change: str, setup: tuple[Path, Path, PlanCache],
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         ) -> None:
    pb, inv, cache = setup
    # absolute paths, so that the entry is the same one from another directory
    assert cache.path.exists()
    CHANGES[change](tmp_path, monkeypatch)
    assert _cache(tmp_path, pb, inv).load() is None


def test_the_command_line_and_the_code_are_inputs(setup: tuple[Path, Path, PlanCache],
                                                  tmp_path: Path) -> None:
    pb, inv, _ = setup
    assert _cache(tmp_path, pb, inv, cli_vars={"extra": 1}).load() is None
    assert _cache(tmp_path, pb, inv, selection=Selection.from_args(["gpu-1"])).load() is None
    assert _cache(tmp_path, pb, inv, code=b"code-2").load() is None
    assert _cache(tmp_path, pb, inv).load() is not None  # and the entry is still good


def test_a_variable_the_load_did_not_read_changes_nothing(
        setup: tuple[Path, Path, PlanCache], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pb, inv, _ = setup
    monkeypatch.setenv("SOME_OTHER_VARIABLE", "changed")
    assert _cache(tmp_path, pb, inv).load() is not None


def test_the_entry_holds_no_secret_in_clear(setup: tuple[Path, Path, PlanCache]) -> None:
    _, _, cache = setup
    data = cache.path.read_bytes()
    assert SECRET.encode() not in data
    assert b"kimi-k2.6" not in data  # the plan itself is encrypted, not just the secrets
    assert b"HF_TOKEN" in data  # the names of the variables read are kept, in clear
    assert stat.S_IMODE(cache.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.path.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "empty", "other magic"])
def test_a_damaged_entry_is_ignored(damage: str, setup: tuple[Path, Path, PlanCache],
                                    tmp_path: Path) -> None:
    pb, inv, cache = setup
    data = bytearray(cache.path.read_bytes())
    if damage == "flip a byte":
        data[-20] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:
        data[:5] = b"xxxxx"
    cache.path.write_bytes(bytes(data))
    assert _cache(tmp_path, pb, inv).load() is None


@pytest.mark.parametrize("plain", [b"not a pickle", b"\x80\x05}\x94.", b""])
def test_an_entry_that_decrypts_but_is_no_plan_is_ignored(
        plain: bytes, setup: tuple[Path, Path, PlanCache], tmp_path: Path) -> None:
    """Encrypted with the right key (so it passes the check and the tag), but the plaintext is
    not a pickle, or a pickle of something else (an empty dict), or nothing."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from orchestrator.plancache import MAGIC

    pb, inv, cache = setup
    data = cache.path.read_bytes()
    end = data.find(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC):end])
    digest = cache._inputs(header["files"], header["env"])
    assert digest is not None
    key, _ = cache._keys(digest)
    nonce = os.urandom(12)
    cache.path.write_bytes(data[:end + 1] + nonce + AESGCM(key).encrypt(nonce, plain, MAGIC))
    assert _cache(tmp_path, pb, inv).load() is None


def test_an_ansible_inventory_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          ) -> None:
    monkeypatch.chdir(tmp_path)
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "p", "stages": [{"id": "a", "run": "true"}]})
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu]\ngpu-1 ansible_host=127.0.0.1\n")
    rendered, reads = _fresh(pb, inv, {}, Selection.from_args())
    assert not reads.complete and "group_vars" in (reads.why_not or "")
    cache = _cache(tmp_path, pb, inv)
    assert not cache.store(rendered, reads)
    assert not cache.path.exists()


# -- through the CLI ------------------------------------------------------------------------------


def _cli_files(tmp: Path) -> tuple[Path, Path]:
    pb = write_yaml(tmp / "pb.yaml", {"name": "p", "stages": [
        {"id": "say", "run": "echo said-{{ word }}"},
        # a secret written into the command: a warning, in a fresh and in a cached plan alike
        {"id": "leak", "run": "test -n {{ token }}"},
    ]})
    inv = local_inventory(tmp / "inv.yaml")
    text = inv.read_text()
    inv.write_text(text + "vars:\n  word: !env WORD\n  token: !env HF_TOKEN\n")
    return pb, inv


def test_the_cli_says_when_it_used_the_cached_plan(tmp_path: Path) -> None:
    pb, inv = _cli_files(tmp_path)
    runs = tmp_path / "runs"
    env = {"WORD": "one", "HF_TOKEN": SECRET}
    args = ("deploy", str(pb), "-i", str(inv))

    def events(run: Any, name: str) -> list[dict[str, Any]]:
        return [e for e in run.events if e.get("event") == name]

    first = cli(*args, runs=runs, env=env)
    assert first.code == 0, first.stderr
    assert not events(first, "plan.cached")
    second = cli(*args, runs=runs, env=env)
    assert second.code == 0, second.stderr
    assert len(events(second, "plan.cached")) == 1
    assert second.statuses("localhost") == first.statuses("localhost")
    for run in (first, second):
        assert [e["command"] for e in events(run, "command") if e["stage"] == "say"] == [
            "echo said-one"]
    for run in (first, second):
        warned = events(run, "secret_on_command_line")
        assert [(w["host"], w["stage"]) for w in warned] == [("localhost", "leak")]
        record = (run.run_dir / "events.jsonl").read_text() + run.stdout + run.stderr
        assert SECRET not in record  # masked: the cached plan's secrets reach the redactor
    # a changed !env value is a fresh load, which the next run takes from the cache again
    env["WORD"] = "two"
    third = cli(*args, runs=runs, env=env)
    assert not events(third, "plan.cached")
    assert [e["command"] for e in events(third, "command") if e["stage"] == "say"] == [
        "echo said-two"]
    assert events(cli(*args, runs=runs, env=env), "plan.cached")
    # --verify takes nothing on trust from earlier runs
    assert not events(cli(*args, "--verify", runs=runs, env=env), "plan.cached")


def test_a_cached_plan_loads_neither_the_loader_nor_jinja(
        setup: tuple[Path, Path, PlanCache], tmp_path: Path) -> None:
    """What the cache saves: in a fresh interpreter, taking the plan reads no YAML through the
    loader and compiles no template (the code fingerprint is the real one here)."""
    pb, inv, _ = setup
    rendered, reads = _fresh(pb, inv, {}, Selection.from_args())
    cache = PlanCache.for_run(tmp_path / "runs", pb, inv, {}, Selection.from_args())
    assert cache is not None and cache.store(rendered, reads)
    probe = (
        "import sys\n"
        "import orchestrator.deploy, orchestrator.stages\n"
        "from orchestrator.plancache import PlanCache\n"
        "from orchestrator.selection import Selection\n"
        f"c = PlanCache.for_run({str(tmp_path / 'runs')!r}, {str(pb)!r}, {str(inv)!r}, {{}},"
        " Selection.from_args())\n"
        "r = c.load()\n"
        "print(r is not None and r.nodes['gpu-1']['a'].params.command,"
        " sorted(m for m in ('jinja2', 'orchestrator.config._jinja',"
        " 'orchestrator.config.loader', 'orchestrator.config.variables')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, check=True).stdout
    assert out.strip() == "echo kimi-k2.6 hi - []", out
