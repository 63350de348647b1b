"""hf_download on a local host with the real huggingface_hub client against the simulated hub."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator.errors import StageError
from orchestrator.stages.base import Converged, Needed
from orchestrator.stages.hf_download import MANIFEST, HfDownloadStage
from orchestrator_sim.hub import (
    HUB_DOWN,
    HUB_FLAKY,
    HUB_GATED,
    HUB_UNREACHABLE,
    ModelHub,
)
from orchestrator_sim.hubrepos import EAGLE3_OLD_BRANCH, EAGLE3_REPO, list_refs, seed_repos

TOKEN = "hf_canaryTOKEN_7f3a9c2e1b"


@pytest.fixture(scope="module")
def hub_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    data = tmp_path_factory.mktemp("hubdata")
    return data, seed_repos(data)


@pytest.fixture
def hub(hub_data, tmp_path: Path):
    h = ModelHub(hub_data[0], token=TOKEN, fault_file=tmp_path / "faults.json")
    h.start()
    yield h
    h.stop()


@pytest.fixture(autouse=True)
def _clean_hf_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # the local agent inherits this process's environment: no ambient token, endpoint or proxy
    for name in list(os.environ):
        if name.startswith(("HF_", "HUGGING_FACE_")) or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)



def make(hub: ModelHub, tmp_path: Path, **kw: object) -> HfDownloadStage:
    params = {
        "python": sys.executable, "repo": EAGLE3_REPO, "local_dir": str(tmp_path / "drafter"),
        "endpoint": hub.url, "progress_interval": 0.05,
        "env": {"HF_HOME": str(tmp_path / "hf_home"), "NO_PROXY": "127.0.0.1,localhost"},
        **kw,
    }
    return HfDownloadStage(HfDownloadStage.Params.model_validate(params))


def hub_files(data: Path, repo: str, commit: str) -> dict[str, str]:
    root = data / repo / "commits" / commit
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def local_files(local_dir: Path) -> dict[str, str]:
    return {p.relative_to(local_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in local_dir.rglob("*") if p.is_file()
            and p.relative_to(local_dir).parts[0] not in (".cache", ".orchestrator")}


def test_pinned_download_is_verified_then_converged_without_network(
        hub, hub_data, tmp_path, local_host, stage_ctx, converge):
    data, heads = hub_data
    commit = heads[EAGLE3_REPO]
    stage = make(hub, tmp_path, revision=commit)
    ctx = stage_ctx("drafter")
    with capture_logs() as logs:
        status, reason = converge(stage, local_host, ctx)
    assert status == "changed" and "no verified download" in reason
    local = tmp_path / "drafter"
    assert local_files(local) == hub_files(data, EAGLE3_REPO, commit)
    manifest = json.loads((local / MANIFEST).read_text())
    assert manifest["commit"] == commit and len(manifest["files"]) == 6
    by_path = {f["path"]: f for f in manifest["files"]}
    weights = local / "model.safetensors"
    assert by_path["model.safetensors"]["hash"] == "sha256:" + hashlib.sha256(
        weights.read_bytes()).hexdigest()
    assert by_path["config.json"]["hash"].startswith("git-sha1:")
    assert by_path["model.safetensors"]["mtime_ns"] == weights.stat().st_mtime_ns
    assert ctx.facts["commit"] == commit and ctx.facts["files"] == 6
    assert ctx.facts["bytes"] == sum(f.stat().st_size for f in local.iterdir() if f.is_file())
    assert ctx.facts["revision_pinned"] is True
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert any(m.startswith("downloaded ") for m in ctx.progress_messages)

    before = len(hub.requests)
    again = stage_ctx("drafter")
    verdict = stage.check(local_host, again)
    assert isinstance(verdict, Converged) and f"6 files of {EAGLE3_REPO}@{commit[:12]}" in \
        verdict.reason
    assert len(hub.requests) == before  # a pinned commit is checked without the hub
    assert again.facts["bytes"] == ctx.facts["bytes"]


def test_branch_revision_warns_and_follows_the_branch(hub, hub_data, tmp_path, local_host,
                                                      stage_ctx, converge):
    data, _ = hub_data
    refs = list_refs(data, EAGLE3_REPO)
    stage = make(hub, tmp_path, revision=EAGLE3_OLD_BRANCH)
    ctx = stage_ctx("drafter")
    with capture_logs() as logs:
        assert converge(stage, local_host, ctx)[0] == "changed"
    warnings = [e for e in logs if e["event"] == "hf_download.unpinned_revision"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"  # once per stage run
    assert ctx.facts["warnings"] == [warnings[0]["message"]]
    assert warnings[0]["commit"] == refs[EAGLE3_OLD_BRANCH]
    assert ctx.facts["revision_pinned"] is False and ctx.facts["commit"] == refs[
        EAGLE3_OLD_BRANCH]
    assert local_files(tmp_path / "drafter") == hub_files(data, EAGLE3_REPO,
                                                          refs[EAGLE3_OLD_BRANCH])
    assert isinstance(stage.check(local_host, stage_ctx()), Converged)
    # the same folder asked for `main` (another commit): needed, then replaced and verified
    main = make(hub, tmp_path, revision="main")
    verdict = main.check(local_host, stage_ctx())
    assert verdict == Needed(f"{tmp_path / 'drafter'} holds commit "
                             f"{refs[EAGLE3_OLD_BRANCH][:12]}, main is {refs['main'][:12]}")
    (tmp_path / "drafter" / "old-shard.safetensors").write_bytes(b"left by another revision")
    ctx = stage_ctx()
    with capture_logs() as logs:
        assert converge(main, local_host, ctx)[0] == "changed"
    expected = hub_files(data, EAGLE3_REPO, refs["main"])
    assert local_files(tmp_path / "drafter") == {
        **expected, "old-shard.safetensors": hashlib.sha256(b"left by another revision")
        .hexdigest()}
    assert ctx.facts["extra_files"] == ["old-shard.safetensors"]  # reported, never deleted
    assert any(e["event"] == "hf_download.extra_files" for e in logs)


def test_partial_folder_and_flaky_hub_download_completes_and_is_verified(
        hub, hub_data, tmp_path, local_host, stage_ctx, converge):
    data, heads = hub_data
    commit = heads[EAGLE3_REPO]
    # a folder left half-done (here: only the small files were fetched before the stop)
    partial = make(hub, tmp_path, revision=commit, allow_patterns=["*.json"])
    assert converge(partial, local_host, stage_ctx())[0] == "changed"
    assert sorted(local_files(tmp_path / "drafter")) == [
        "config.json", "generation_config.json", "tokenizer_config.json"]
    hub.set_fault(HUB_FLAKY, True)
    before = len(hub.requests)
    stage = make(hub, tmp_path, revision=commit)
    status, reason = converge(stage, local_host, stage_ctx())
    assert status == "changed" and "patterns changed" in reason
    new = hub.requests[before:]
    assert any(r.cut for r in new)  # a download really was cut short, and retried
    gets = [r.path.rsplit("/", 1)[-1] for r in new if r.method == "GET" and "/resolve/" in r.path]
    assert "config.json" not in gets and "model.safetensors" in gets  # complete files kept
    assert local_files(tmp_path / "drafter") == hub_files(data, EAGLE3_REPO, commit)
    third = converge(stage, local_host, stage_ctx())
    assert third[0] == "ok", third


def test_gated_repo_needs_the_token_which_never_leaks(hub, hub_data, tmp_path, local_host,
                                                      commands, stage_ctx, converge):
    _, heads = hub_data
    hub.set_fault(HUB_GATED, True)
    anon = make(hub, tmp_path, revision="main")
    ctx = stage_ctx("drafter")
    assert isinstance(anon.check(local_host, ctx), Needed)
    with pytest.raises(StageError) as err:
        anon.apply(local_host, ctx)
    assert "is gated (HTTP 401) and no token was given" in err.value.message
    assert "accept the model's license" in err.value.hint and "HF_TOKEN" in err.value.hint

    wrong = make(hub, tmp_path, revision="main", token="hf_not_the_right_one")
    with pytest.raises(StageError, match="refused") as err:
        wrong.apply(local_host, stage_ctx())
    assert "HF_TOKEN" in err.value.hint

    stage = make(hub, tmp_path, revision="main", token=TOKEN)
    ctx = stage_ctx("drafter")
    with capture_logs() as logs:
        assert converge(stage, local_host, ctx)[0] == "changed"
        assert converge(stage, local_host, ctx)[0] == "ok"
    assert ctx.facts["commit"] == heads[EAGLE3_REPO]
    assert all(r.authorized for r in hub.requests if r.status == 200)
    seen = [repr(stage.params), repr(ctx.facts), repr(logs), repr(ctx.progress_messages),
            (tmp_path / "drafter" / MANIFEST).read_text()]
    seen += [c.command + c.stdout + c.stderr for c in commands]
    assert all(TOKEN not in text for text in seen)


def downloaded(hub, hub_data, tmp_path, local_host, stage_ctx, converge):
    """The drafter downloaded and verified at its pinned commit: (stage, folder, files)."""
    data, heads = hub_data
    commit = heads[EAGLE3_REPO]
    stage = make(hub, tmp_path, revision=commit)
    assert converge(stage, local_host, stage_ctx())[0] == "changed"
    return stage, tmp_path / "drafter", hub_files(data, EAGLE3_REPO, commit)


def test_corrupted_files(hub, hub_data, tmp_path, local_host, stage_ctx, converge):
    stage, local, expected = downloaded(hub, hub_data, tmp_path, local_host, stage_ctx,
                                        converge)
    weights = local / "model.safetensors"
    size = weights.stat().st_size

    def corrupt(path: Path) -> os.stat_result:
        st = path.stat()
        with open(path, "r+b") as fh:
            fh.seek(st.st_size // 2)
            fh.write(b"\xff" * 64)
        return st

    # 1) changed in place, mtime moves (what any write does): the stat changed, so check
    # hashes it again, sees it, and a run fetches it again
    st = corrupt(weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 100 * 10**9))
    verdict = stage.check(local_host, stage_ctx())
    assert verdict == Needed("1 file(s) differ from the verified download: "
                             "model.safetensors (content changed since verified)")
    assert converge(stage, local_host, stage_ctx())[0] == "changed"
    assert local_files(local) == expected
    assert isinstance(stage.check(local_host, stage_ctx()), Converged)

    # 2) same size AND same mtime AND inode: the stat check cannot see it (documented);
    # `deploy --verify` (ctx.verify) hashes every file and does
    st = corrupt(weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    bad = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert isinstance(stage.check(local_host, stage_ctx()), Converged)
    thorough = stage_ctx()
    thorough.verify = True
    assert stage.check(local_host, thorough) == Needed(
        "1 file(s) differ from the verified download: model.safetensors (content changed since "
        "verified)")
    (local / MANIFEST).unlink()  # e.g. an operator forcing a re-verification
    ctx = stage_ctx()
    assert isinstance(stage.check(local_host, ctx), Needed)
    stage.apply(local_host, ctx)  # the client trusts its own metadata and keeps the file
    with pytest.raises(StageError) as err:
        stage.verify(local_host, ctx)
    assert (f"model.safetensors: sha256 {bad}, expected {expected['model.safetensors']} "
            "(deleted)") in err.value.message
    assert "run again" in err.value.hint
    assert not weights.exists() and not (local / MANIFEST).exists()
    assert converge(stage, local_host, stage_ctx())[0] == "changed"
    assert weights.stat().st_size == size and local_files(local) == expected

    # 3) touched, and replaced by a copy of itself (new inode, same mtime): hashed again, the
    # content is the verified one, so only the manifest takes the new stat (then converged)
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 200 * 10**9))
    shutil.copy2(weights, local / "copy")
    os.replace(local / "copy", weights)
    status, reason = converge(stage, local_host, stage_ctx())
    assert status == "changed" and "rewritten with the verified content" in reason, reason
    recorded = json.loads((local / MANIFEST).read_text())["files"]
    now = weights.stat()
    assert {(f["mtime_ns"], f["ino"]) for f in recorded if f["path"] == "model.safetensors"} == {
        (now.st_mtime_ns, now.st_ino)}
    assert isinstance(stage.check(local_host, stage_ctx()), Converged)


def test_missing_repo_and_revision_are_explained(hub, tmp_path, local_host, stage_ctx):
    with pytest.raises(StageError, match="repository sim/no-such-repo not found on http://127"):
        make(hub, tmp_path, repo="sim/no-such-repo").apply(local_host, stage_ctx())
    with pytest.raises(StageError, match="revision 'no-such-branch' does not exist in "
                       + EAGLE3_REPO) as err:
        make(hub, tmp_path, revision="no-such-branch").apply(local_host, stage_ctx())
    assert "40-hex commit" in err.value.hint
    with pytest.raises(StageError, match="revision '0{40}' does not exist"):
        make(hub, tmp_path, revision="0" * 40).apply(local_host, stage_ctx())
    assert not (tmp_path / "drafter" / MANIFEST).exists()


def test_cli_run_keeps_the_token_out_of_console_events_and_record(hub, hub_data, tmp_path):
    from tests.runner.helpers import cli, local_inventory

    hub.set_fault(HUB_GATED, True)
    local = tmp_path / "drafter"
    (tmp_path / "pb.yaml").write_text(f"""
name: hf-canary
vars:
  hf_token: !env HF_TOKEN
stages:
  - id: drafter
    uses: hf_download
    with:
      python: {sys.executable}
      repo: {EAGLE3_REPO}
      revision: main
      local_dir: {local}
      endpoint: {hub.url}
      token: "{{{{ hf_token }}}}"
      progress_interval: 0.05
      env: {{HF_HOME: {tmp_path / "hf_home"}, NO_PROXY: 127.0.0.1}}
""")
    inv = local_inventory(tmp_path / "inv.yaml")
    r = cli("deploy", str(tmp_path / "pb.yaml"), "-i", str(inv), runs=tmp_path / "runs",
            env={"HF_TOKEN": TOKEN})
    assert r.code == 0, r.stdout + r.stderr
    assert r.statuses("localhost") == {"drafter": "changed"}
    assert r.summary["hosts"]["localhost"]["facts"]["drafter"]["files"] == 6
    assert (local / MANIFEST).is_file()
    outputs = [r.stdout, r.stderr] + [p.read_text() for p in r.run_dir.rglob("*") if p.is_file()]
    assert all(TOKEN not in text for text in outputs)


#: a proxy for https only: the http:// test hub is still reached directly, through urllib
OTHER = {"https": "http://127.0.0.1:9"}


def test_agent_resolves_branches_as_huggingface_hub_does(hub, hub_data) -> None:
    """The converged check's stdlib request (remote/hfcheck.py hf_revision) and the real
    huggingface_hub client name the same commit for every ref, gated or not, and both fail on
    a ref that does not exist."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import RevisionNotFoundError

    from orchestrator.remote.hfcheck import hf_revision

    data, _ = hub_data
    api = HfApi(endpoint=hub.url)
    refs = list_refs(data, EAGLE3_REPO)
    assert EAGLE3_OLD_BRANCH in refs and "main" in refs
    for gated in (False, True):
        hub.set_fault(HUB_GATED, gated)
        for ref, commit in refs.items():
            ours = hf_revision(hub.url, EAGLE3_REPO, ref, token=TOKEN, proxies={})
            # a proxy given (for another scheme) takes urllib's path instead of the socket one
            via_urllib = hf_revision(hub.url, EAGLE3_REPO, ref, token=TOKEN, proxies=OTHER)
            theirs = api.repo_info(EAGLE3_REPO, revision=ref, token=TOKEN).sha
            assert ours == via_urllib == {"commit": commit} and theirs == commit
    for proxies in ({}, OTHER):
        gated = hf_revision(hub.url, EAGLE3_REPO, "main", token=None, proxies=proxies)
        assert gated == {"error": "HTTP 401", "status": 401}
    hub.set_fault(HUB_GATED, False)
    for proxies in ({}, OTHER):
        missing = hf_revision(hub.url, EAGLE3_REPO, "no-such-branch", proxies=proxies)
        assert missing == {"error": "HTTP 404", "status": 404}
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(EAGLE3_REPO, revision="no-such-branch")


def test_truncated_and_deleted_files_are_named_and_fetched_again(hub, hub_data, tmp_path,
                                                                 local_host, stage_ctx, converge,
                                                                 commands):
    stage, local, expected = downloaded(hub, hub_data, tmp_path, local_host, stage_ctx,
                                        converge)
    size = (local / "model.safetensors").stat().st_size
    before = len(commands)
    assert isinstance(stage.check(local_host, stage_ctx()), Converged)
    assert len(commands) == before  # converged: the agent's stat of the manifest, no command
    with open(local / "model.safetensors", "r+b") as fh:
        fh.truncate(size // 2)
    (local / "config.json").unlink()
    verdict = stage.check(local_host, stage_ctx())
    assert verdict == Needed(
        f"2 file(s) differ from the verified download: config.json (missing), "
        f"model.safetensors (size {size // 2} != {size})")
    assert converge(stage, local_host, stage_ctx())[0] == "changed"
    assert local_files(local) == expected
    assert isinstance(stage.check(local_host, stage_ctx()), Converged)


OUTAGES = {HUB_GATED: "refused the request (HTTP 401: no token was given)",
           HUB_DOWN: "the hub is failing (HTTP 503)",
           HUB_UNREACHABLE: "the hub cannot be reached (connection refused)"}


@pytest.mark.parametrize("fault", list(OUTAGES))
def test_a_verified_download_survives_a_hub_outage_with_one_warning(
        fault, hub, hub_data, tmp_path, local_host, stage_ctx, converge) -> None:
    _, heads = hub_data
    stage = make(hub, tmp_path, revision="main")
    assert converge(stage, local_host, stage_ctx("drafter"))[0] == "changed"
    hub.set_fault(fault, True)
    try:
        ctx = stage_ctx("drafter")
        with capture_logs() as logs:
            status, reason = converge(stage, local_host, ctx)
        assert status == "ok", reason
        [warning] = ctx.facts["warnings"]
        assert OUTAGES[fault] in warning and heads[EAGLE3_REPO][:12] in warning
        assert "orchestrator pin" in warning
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
            "hf_download.hub_unavailable"]
        # a fresh folder has nothing to fall back on: the hub's failure, and what to do
        fresh = make(hub, tmp_path, revision="main", local_dir=str(tmp_path / "fresh"))
        with pytest.raises(StageError) as err:
            converge(fresh, local_host, stage_ctx("drafter"))
        assert err.value.hint and "HF_TOKEN" in err.value.hint if fault == HUB_GATED else \
            "verified on this host yet" in (err.value.hint or "")
    finally:
        hub.set_fault(fault, False)
    assert converge(stage, local_host, stage_ctx("drafter"))[0] == "ok"


def test_a_hub_that_answers_no_such_revision_is_not_an_outage(
        hub, tmp_path, local_host, stage_ctx, converge) -> None:
    assert converge(make(hub, tmp_path, revision="main"), local_host, stage_ctx())[0] == \
        "changed"
    gone = make(hub, tmp_path, revision="no-such-branch")
    with pytest.raises(StageError, match="revision 'no-such-branch' does not exist"):
        gone.check(local_host, stage_ctx())
