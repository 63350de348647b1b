"""The simulated model hub, driven by the REAL huggingface_hub client (pinned 2.4.0).

Each client scenario runs in a fresh subprocess (HF_ENDPOINT is read at import time) with
HF_HOME in tmp_path; only loopback traffic.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from orchestrator_sim.hub import HUB_FLAKY, HUB_GATED, ModelHub, read_faults, write_faults
from orchestrator_sim.hubrepos import (
    EAGLE3_MLA_REPO,
    EAGLE3_OLD_BRANCH,
    EAGLE3_REPO,
    FAULTY_DRAFTERS,
    KIMI_REPO,
    LFS_THRESHOLD,
    add_repo,
    git_blob_sha1,
    list_refs,
    safetensors_blob,
    seed_repos,
)

TOKEN = "hf_simhubtesttoken0123456789"

# Runs a list of client operations and prints one JSON line of results.
DRIVER = r"""
import json, os, sys
from huggingface_hub import hf_hub_download, snapshot_download
out = []
for op in json.loads(sys.argv[1]):
    for k, v in op.get("env", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    fn = snapshot_download if op["op"] == "snapshot" else hf_hub_download
    try:
        out.append({"ok": True, "path": fn(**op["kwargs"])})
    except Exception as e:
        resp = getattr(e, "response", None)
        out.append({
            "ok": False,
            "error": type(e).__name__,
            "mro": [c.__name__ for c in type(e).__mro__],
            "status": getattr(resp, "status_code", None),
            "message": str(e)[:400],
        })
print("RESULTS " + json.dumps(out))
"""


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def hub_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    data = tmp_path_factory.mktemp("hubdata")
    return data, seed_repos(data)


@pytest.fixture
def hub(hub_data: tuple[Path, dict[str, str]], tmp_path: Path):
    h = ModelHub(hub_data[0], token=TOKEN, fault_file=tmp_path / "faults.json")
    h.start()
    yield h
    h.stop()


def _client_env(hub: ModelHub, tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING_FACE_"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def run_client(hub: ModelHub, tmp_path: Path, *ops: dict) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(list(ops))],
        env=_client_env(hub, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")][-1]
    return json.loads(line[len("RESULTS ") :])


def snap(repo: str, local_dir: Path, **kw: object) -> dict:
    return {"op": "snapshot", "kwargs": {"repo_id": repo, "local_dir": str(local_dir), **kw}}


def commit_files(data: Path, repo: str, commit: str) -> dict[str, bytes]:
    root = data / repo / "commits" / commit
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def local_files(local_dir: Path) -> dict[str, bytes]:
    return {
        p.relative_to(local_dir).as_posix(): p.read_bytes()
        for p in local_dir.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(local_dir).parts
    }


def sha256s(files: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}


def raw(hub: ModelHub, method: str, path: str, headers: dict[str, str] | None = None):
    u = urlsplit(hub.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    try:
        body = resp.read()
    except http.client.IncompleteRead as exc:  # hub-flaky cut the body short
        body = exc.partial
    conn.close()
    return resp, body


# ------------------------------------------------------------------------------------ seeding


def test_seed_is_deterministic_and_has_the_expected_shapes(hub_data, tmp_path):
    data, heads = hub_data
    assert seed_repos(tmp_path / "again") == heads  # same content -> same shas anywhere
    assert set(heads) == {KIMI_REPO, EAGLE3_REPO, EAGLE3_MLA_REPO, *FAULTY_DRAFTERS}
    mla = json.loads(commit_files(data, EAGLE3_MLA_REPO, heads[EAGLE3_MLA_REPO])["config.json"])
    assert mla["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and mla["q_lora_rank"] == 1536
    assert all(len(s) == 40 and int(s, 16) >= 0 for s in heads.values())

    kimi = commit_files(data, KIMI_REPO, heads[KIMI_REPO])
    cfg = json.loads(kimi["config.json"])
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert cfg["model_type"] == "kimi_k25"
    assert cfg["text_config"]["hidden_size"] == 7168 and "hidden_size" not in cfg
    assert cfg["text_config"]["vocab_size"] == 163840 and "vocab_size" not in cfg
    assert cfg["text_config"]["num_hidden_layers"] == 61
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert cfg["quantization_config"]["format"] == "nvfp4-pack-quantized"
    index = json.loads(kimi["model.safetensors.index.json"])
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    for shard in shards:  # valid safetensors, LFS-sized but small
        blob = kimi[shard]
        assert LFS_THRESHOLD <= len(blob) <= 4 * 1024 * 1024
        (hlen,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + hlen])
        (name,) = [k for k in header if k != "__metadata__"]
        assert index["weight_map"][name] == shard
        assert header[name]["data_offsets"][1] == len(blob) - 8 - hlen

    refs = list_refs(data, EAGLE3_REPO)
    assert refs["main"] == heads[EAGLE3_REPO] and refs[EAGLE3_OLD_BRANCH] != refs["main"]
    new = commit_files(data, EAGLE3_REPO, refs["main"])
    old = commit_files(data, EAGLE3_REPO, refs[EAGLE3_OLD_BRANCH])
    assert len(new) == len(old) == 6 and set(new) == set(old)
    assert new["model.safetensors"] != old["model.safetensors"]
    assert new["config.json"] == old["config.json"]
    dcfg = json.loads(new["config.json"])
    assert dcfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (dcfg["hidden_size"], dcfg["num_hidden_layers"], dcfg["vocab_size"]) == (7168, 1, 163840)
    assert dcfg["draft_vocab_size"] == 32000
    assert dcfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]

    bad = {r: json.loads(commit_files(data, r, heads[r])["config.json"]) for r in FAULTY_DRAFTERS}
    assert bad["sim/eagle3-hidden4096"]["hidden_size"] == 4096
    assert bad["sim/eagle3-2layers"]["num_hidden_layers"] == 2
    assert bad["sim/eagle3-wrong-arch"]["architectures"] == ["LlamaForCausalLM"]
    assert bad["sim/eagle3-vocab-mismatch"]["vocab_size"] == 129280
    for repo in FAULTY_DRAFTERS:
        assert len(commit_files(data, repo, heads[repo])) == 6


# ------------------------------------------------------------------------------------ protocol


def test_resolve_headers_etags_and_ranges(hub, hub_data):
    data, heads = hub_data
    commit = heads[EAGLE3_REPO]
    files = commit_files(data, EAGLE3_REPO, commit)
    base = f"/{EAGLE3_REPO}/resolve"

    resp, body = raw(hub, "HEAD", f"{base}/main/config.json")
    assert resp.status == 200 and body == b""
    assert resp.getheader("X-Repo-Commit") == commit
    assert resp.getheader("ETag") == f'"{git_blob_sha1(files["config.json"])}"'
    assert int(resp.getheader("Content-Length")) == len(files["config.json"])
    assert resp.getheader("X-Linked-Etag") is None

    weights = files["model.safetensors"]
    resp, _ = raw(hub, "HEAD", f"{base}/{commit}/model.safetensors")
    assert resp.getheader("ETag") == f'"{hashlib.sha256(weights).hexdigest()}"'
    assert resp.getheader("X-Linked-Etag") == resp.getheader("ETag")
    assert int(resp.getheader("X-Linked-Size")) == len(weights)
    assert not [h for h, _ in resp.getheaders() if h.lower().startswith("x-xet")]

    resp, body = raw(hub, "GET", f"{base}/main/model.safetensors", {"Range": "bytes=1000-"})
    assert resp.status == 206 and body == weights[1000:]
    assert resp.getheader("Content-Range") == f"bytes 1000-{len(weights) - 1}/{len(weights)}"
    resp, body = raw(hub, "GET", f"{base}/main/model.safetensors", {"Range": "bytes=10-19"})
    assert resp.status == 206 and body == weights[10:20]
    resp, _ = raw(hub, "GET", f"{base}/main/model.safetensors", {"Range": f"bytes={len(weights)}-"})
    assert resp.status == 416 and resp.getheader("Content-Range") == f"bytes */{len(weights)}"

    resp, _ = raw(hub, "HEAD", f"{base}/main/nope.bin")
    assert resp.status == 404 and resp.getheader("X-Error-Code") == "EntryNotFound"
    resp, body = raw(hub, "GET", f"{base}/nope-branch/config.json")
    assert resp.status == 404 and resp.getheader("X-Error-Code") == "RevisionNotFound"
    assert "error" in json.loads(body)
    resp, _ = raw(hub, "GET", "/sim/nope/resolve/main/config.json")
    assert resp.status == 404 and resp.getheader("X-Error-Code") == "RepoNotFound"

    ranged = [r for r in hub.requests if r.range]
    assert {r.range for r in ranged} >= {"bytes=1000-", "bytes=10-19"}
    assert all(r.status in (206, 416) for r in ranged)


def test_tree_listing_pages_and_directories(hub, hub_data):
    data, heads = hub_data
    commit = heads[KIMI_REPO]
    files = commit_files(data, KIMI_REPO, commit)
    entries, pages = [], 0
    path = f"/api/models/{KIMI_REPO}/tree/main?recursive=true"
    while path:
        resp, body = raw(hub, "GET", path)
        assert resp.status == 200
        page = json.loads(body)
        assert 0 < len(page) <= hub.tree_page_size
        entries += page
        pages += 1
        link = resp.getheader("Link")
        path = None
        if link:
            assert link.endswith('rel="next"') and "cursor=" in link
            path = urlsplit(link[1 : link.index(">")])._replace(scheme="", netloc="").geturl()
    assert pages >= 2  # 13 files + 1 directory with 8 per page
    by_path = {e["path"]: e for e in entries}
    assert by_path["docs"]["type"] == "directory"
    got = {p for p, e in by_path.items() if e["type"] == "file"}
    assert got == set(files)
    for p, e in by_path.items():
        if e["type"] != "file":
            continue
        assert e["size"] == len(files[p])
        if len(files[p]) >= LFS_THRESHOLD:
            assert e["lfs"]["oid"] == hashlib.sha256(files[p]).hexdigest()
            assert e["lfs"]["size"] == len(files[p]) and e["lfs"]["pointerSize"] > 0
        else:
            assert "lfs" not in e and e["oid"] == git_blob_sha1(files[p])

    resp, body = raw(hub, "GET", f"/api/models/{KIMI_REPO}/tree/{commit}/docs")
    assert [e["path"] for e in json.loads(body)] == ["docs/deploy_guidance.md"]
    resp, body = raw(hub, "GET", f"/api/models/{KIMI_REPO}/tree/{commit}")
    top = json.loads(body)
    assert "docs" in {e["path"] for e in top}
    assert not any("/" in e["path"] for e in top)

    resp, body = raw(hub, "GET", f"/api/models/{KIMI_REPO}/revision/main")
    info = json.loads(body)
    assert info["id"] == KIMI_REPO and info["sha"] == commit
    assert {s["rfilename"] for s in info["siblings"]} == set(files)


# ------------------------------------------------------------------------------------ client


def test_snapshot_download_full_repos_match_hub(hub, hub_data, tmp_path):
    data, heads = hub_data
    kimi_dir, eagle_dir = tmp_path / "kimi", tmp_path / "eagle"
    res = run_client(hub, tmp_path, snap(KIMI_REPO, kimi_dir), snap(EAGLE3_REPO, eagle_dir))
    assert all(r["ok"] for r in res), res
    for repo, local in ((KIMI_REPO, kimi_dir), (EAGLE3_REPO, eagle_dir)):
        expected = commit_files(data, repo, heads[repo])
        assert sha256s(local_files(local)) == sha256s(expected)
        bookkeeping = local / ".cache" / "huggingface"
        meta = (bookkeeping / "download" / "config.json.metadata").read_text().splitlines()
        assert meta[0] == heads[repo]
        assert (bookkeeping / "trees" / f"{heads[repo]}.json").is_file()
    paths = [r.path for r in hub.requests]
    assert any("/tree/" in p and "cursor=" in p for p in paths)  # the client followed a page
    assert not any(r.status >= 400 for r in hub.requests)


def test_snapshot_download_pinned_commit_branch_and_patterns(hub, hub_data, tmp_path):
    data, heads = hub_data
    refs = list_refs(data, EAGLE3_REPO)
    old = refs[EAGLE3_OLD_BRANCH]
    res = run_client(
        hub,
        tmp_path,
        snap(EAGLE3_REPO, tmp_path / "pinned", revision=old),
        snap(EAGLE3_REPO, tmp_path / "branch", revision=EAGLE3_OLD_BRANCH),
        snap(EAGLE3_REPO, tmp_path / "main", revision="main"),
        snap(KIMI_REPO, tmp_path / "only-config", allow_patterns=["config.json"]),
    )
    assert all(r["ok"] for r in res), res
    old_files = sha256s(commit_files(data, EAGLE3_REPO, old))
    new_files = sha256s(commit_files(data, EAGLE3_REPO, refs["main"]))
    assert sha256s(local_files(tmp_path / "pinned")) == old_files
    assert sha256s(local_files(tmp_path / "branch")) == old_files
    assert sha256s(local_files(tmp_path / "main")) == new_files
    assert old_files["model.safetensors"] != new_files["model.safetensors"]
    only = local_files(tmp_path / "only-config")
    assert list(only) == ["config.json"]
    assert only["config.json"] == commit_files(data, KIMI_REPO, heads[KIMI_REPO])["config.json"]
    paths = [r.path for r in hub.requests]
    # a 40-hex revision needs no resolution; a branch does
    assert not any(p.startswith(f"/api/models/{EAGLE3_REPO}/revision/{old}") for p in paths)
    assert f"/api/models/{EAGLE3_REPO}/revision/{EAGLE3_OLD_BRANCH}" in paths
    kimi_gets = [p for p in paths if p.startswith(f"/{KIMI_REPO}/resolve/")]
    assert kimi_gets and all(p.endswith("/config.json") for p in kimi_gets)


def test_flaky_cuts_first_get_and_client_retries_in_the_same_call(hub, hub_data, tmp_path):
    data, heads = hub_data
    size = len(commit_files(data, EAGLE3_REPO, heads[EAGLE3_REPO])["model.safetensors"])
    hub.set_fault(HUB_FLAKY, True)
    first, second = run_client(
        hub, tmp_path, snap(EAGLE3_REPO, tmp_path / "d"), snap(EAGLE3_REPO, tmp_path / "d")
    )
    weight_gets = [
        r for r in hub.requests if r.method == "GET" and r.path.endswith("/model.safetensors")
    ]
    assert weight_gets[0].cut and weight_gets[0].status == 200 and weight_gets[0].range is None
    assert weight_gets[0].bytes_sent == size // 2
    # huggingface_hub 2.4.0 retries by itself (http_get, after 1 s). It reads in 10 MiB chunks,
    # so a cut inside the first chunk leaves nothing written: the retry is a plain full GET.
    assert first["ok"], first
    assert weight_gets[1].range is None and weight_gets[1].status == 200
    assert weight_gets[1].bytes_sent == size and not weight_gets[1].cut
    # the second call completes and finds the file already complete (no new GET of the weights)
    assert second["ok"], second
    assert len(weight_gets) == 2
    expected = sha256s(commit_files(data, EAGLE3_REPO, heads[EAGLE3_REPO]))
    assert sha256s(local_files(tmp_path / "d")) == expected
    # small files are never cut
    assert not any(r.cut for r in hub.requests if not r.path.endswith(".safetensors"))


def test_flaky_cut_after_a_full_client_chunk_is_resumed_with_range(tmp_path):
    # A 24 MiB file: the cut (at 12 MiB) falls after the client's first 10 MiB chunk, so the
    # real client resumes with `Range: bytes=N-` and the hub answers 206.
    data = tmp_path / "big-data"
    blob = safetensors_blob("big.stand_in", 24 * 1024 * 1024, "big")
    (commit,) = add_repo(data, "sim/big", [{"model.safetensors": blob, "config.json": b"{}"}])
    with ModelHub(data) as big_hub:
        big_hub.set_fault(HUB_FLAKY, True)
        (res,) = run_client(big_hub, tmp_path, snap("sim/big", tmp_path / "d"))
        gets = [
            r
            for r in big_hub.requests
            if r.method == "GET" and r.path.endswith("/model.safetensors")
        ]
    assert res["ok"], res
    assert len(gets) == 2 and gets[0].cut and gets[0].bytes_sent == len(blob) // 2
    resumed_at = len(blob) - gets[1].bytes_sent
    assert 0 < resumed_at <= len(blob) // 2
    assert gets[1].range == f"bytes={resumed_at}-" and gets[1].status == 206
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == blob
    meta = (tmp_path / "d" / ".cache/huggingface/download/model.safetensors.metadata").read_text()
    assert meta.splitlines()[:2] == [commit, hashlib.sha256(blob).hexdigest()]


def test_flaky_is_rearmed_when_switched_off_and_on(hub, hub_data):
    path = f"/{EAGLE3_REPO}/resolve/main/model.safetensors"
    size = len(
        commit_files(hub_data[0], EAGLE3_REPO, hub_data[1][EAGLE3_REPO])["model.safetensors"]
    )
    hub.set_fault(HUB_FLAKY, True)
    outcomes = []
    for toggle in (False, False, True, False):
        if toggle:
            hub.set_fault(HUB_FLAKY, False)
            hub.set_fault(HUB_FLAKY, True)
        resp, body = raw(hub, "GET", path)
        outcomes.append(len(body))
    assert outcomes == [size // 2, size, size // 2, size]


def test_gated_needs_the_right_token(hub, hub_data, tmp_path):
    data, heads = hub_data
    hub.set_fault(HUB_GATED, True)
    res = run_client(
        hub,
        tmp_path,
        snap(EAGLE3_REPO, tmp_path / "anon"),
        {**snap(EAGLE3_REPO, tmp_path / "wrong"), "env": {"HF_TOKEN": "hf_wrong_token_value"}},
        {**snap(EAGLE3_REPO, tmp_path / "ok"), "env": {"HF_TOKEN": TOKEN}},
    )
    anon, wrong, ok = res
    assert not anon["ok"] and anon["error"] == "GatedRepoError" and anon["status"] == 401
    assert not wrong["ok"] and "HfHubHTTPError" in wrong["mro"] and wrong["status"] == 401
    assert wrong["error"] != "GatedRepoError"
    assert ok["ok"], ok
    expected = sha256s(commit_files(data, EAGLE3_REPO, heads[EAGLE3_REPO]))
    assert sha256s(local_files(tmp_path / "ok")) == expected
    assert not (tmp_path / "anon").exists() or not local_files(tmp_path / "anon")
    assert TOKEN not in repr(hub.requests)


def test_client_error_classes(hub, tmp_path):
    res = run_client(
        hub,
        tmp_path,
        snap("sim/no-such-repo", tmp_path / "a"),
        snap(EAGLE3_REPO, tmp_path / "b", revision="no-such-branch"),
        snap(EAGLE3_REPO, tmp_path / "c", revision="0" * 40),
        {
            "op": "file",
            "kwargs": {
                "repo_id": EAGLE3_REPO,
                "filename": "missing.json",
                "local_dir": str(tmp_path / "d"),
            },
        },
    )
    repo, branch, commit, entry = res
    assert repo["error"] == "RepositoryNotFoundError" and repo["status"] == 404
    assert branch["error"] == "RevisionNotFoundError" and branch["status"] == 404
    assert commit["error"] == "RevisionNotFoundError" and commit["status"] == 404
    assert "EntryNotFoundError" in entry["mro"] and entry["status"] == 404


def test_fault_file_written_by_another_process_takes_effect(hub, tmp_path):
    info = f"/api/models/{EAGLE3_REPO}/revision/main"
    assert raw(hub, "GET", info)[0].status == 200

    def toggle(faults: dict) -> None:
        code = (
            "import json, sys; from pathlib import Path; "
            "from orchestrator_sim.hub import write_faults; "
            "write_faults(Path(sys.argv[1]), json.loads(sys.argv[2]))"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(hub.fault_file), json.dumps(faults)],
            check=True,
            timeout=60,
        )

    toggle({HUB_GATED: True, "gpu-xid-79": True})  # foreign keys are kept, ignored by the hub
    resp, _ = raw(hub, "GET", info)
    assert resp.status == 401 and resp.getheader("X-Error-Code") == "GatedRepo"
    assert raw(hub, "GET", info, {"Authorization": f"Bearer {TOKEN}"})[0].status == 200
    assert {k for k, on in hub.faults().items() if on} == {HUB_GATED}

    hub.set_fault(HUB_FLAKY, True)  # read-modify-write keeps the other process's keys
    assert read_faults(hub.fault_file) == {HUB_GATED: True, HUB_FLAKY: True, "gpu-xid-79": True}

    toggle({HUB_GATED: False})
    assert raw(hub, "GET", info)[0].status == 200
    assert not any(hub.faults().values())


def test_in_memory_faults_and_write_faults_roundtrip(hub_data, tmp_path):
    f = tmp_path / "x" / "faults.json"
    assert read_faults(f) == {}
    write_faults(f, {HUB_GATED: True})
    assert read_faults(f) == {HUB_GATED: True}
    with ModelHub(hub_data[0]) as h:  # no fault file, no token: any bearer accepted
        h.set_fault(HUB_GATED, True)
        assert raw(h, "GET", f"/api/models/{KIMI_REPO}")[0].status == 401
        assert (
            raw(h, "GET", f"/api/models/{KIMI_REPO}", {"Authorization": "Bearer anything"})[
                0
            ].status
            == 200
        )
        with pytest.raises(ValueError, match="unknown hub fault"):
            h.set_fault("hub-bogus", True)


def test_standalone_process_serves_and_stops_on_sigterm(tmp_path):
    url_file = tmp_path / "url"
    env = {**os.environ, "SIM_HUB_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator_sim.hub",
            "--data-dir",
            str(tmp_path / "data"),
            "--seed",
            "--url-file",
            str(url_file),
            "--fault-file",
            str(tmp_path / "faults.json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        while not line.startswith("HUB_URL="):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        url = line.strip().split("=", 1)[1]
        assert url_file.read_text().strip() == url
        u = urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.request("GET", f"/api/models/{EAGLE3_REPO}", headers={"Authorization": "Bearer x"})
        assert conn.getresponse().status == 401  # the token came from SIM_HUB_TOKEN
        conn.close()
        write_faults(tmp_path / "faults.json", {HUB_GATED: True})
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.request(
            "GET", f"/api/models/{EAGLE3_REPO}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert conn.getresponse().status == 200
        conn.close()
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
