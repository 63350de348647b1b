"""Hugging Face downloads ON the host: a stat probe, and a script for a python with huggingface_hub.

Two uses of this one file (stdlib only at import time, Python 3.8+):

* Shipped with the agent: the probes of a converged check, which start no interpreter:
  ``hf_files(root, files, verify)`` compares each file of the manifest (path, size, hash, mtime,
  inode) with the disk and hashes again only the files whose stat changed (all with ``verify``);
  ``hf_revision(endpoint, repo, revision, ...)`` asks the hub which commit a branch names.
* Run as a program by a python that has huggingface_hub (the venv's), as
  ``PY -c SOURCE OP ARGS_JSON``; OP is one of:

  - ``resolve``: the commit a revision names (a 40-hex revision is returned as is, no network).
  - ``download``: ``snapshot_download`` of the resolved commit into ``local_dir``: files
    complete on disk are skipped, so an interrupted download resumes file by file. A file cut in
    the middle starts again: huggingface_hub 2.4.0 names its partial files per process, so the
    partials a killed run left are deleted first (the host's deploy lock guarantees they are not
    in use). Prints ``ORCH_PROGRESS done total`` lines to stderr
    every ``progress_interval`` seconds.
  - ``verify``: list the commit's files on the hub (``list_repo_tree``, recursive, filtered by the
    same patterns), then check each local file's size and hash (sha256 for LFS files against
    ``lfs.sha256``, the git blob sha1 for small files against the blob id), hashing in parallel.
    A file with the wrong size or hash is DELETED (with huggingface_hub's bookkeeping for it) so
    the next download fetches it again.

  The last stdout line is ``ORCH_RESULT {json}``: the op's result, or ``{"error": {"kind",
  "status", "message"}}`` with exit code 2. Kinds: gated, unauthorized, repo_not_found,
  revision_not_found, entry_not_found, http, network, disk, missing_library, failed. The token
  comes from the environment (HF_TOKEN) and is never printed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

try:  # shipped with the agent: registered as a probe there
    from orchestrator.remote.probes import probe
except ImportError:  # run as a program by a python without the orchestrator package

    def probe(name):  # type: ignore[no-redef]
        """No-op stand-in when the probe registry is not available."""
        return lambda fn: fn


COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 8 * 1024 * 1024
BOOKKEEPING = (".cache", ".orchestrator")


#: hub API prefix per repo type (huggingface_hub 2.4.0 hf_api.py:3205 models, :3276 datasets,
#: :3416 spaces: `{endpoint}/api/{models|datasets|spaces}/{repo_id}/revision/{quote(rev)}`)
_API_KIND = {"model": "models", "dataset": "datasets", "space": "spaces"}


#: what urllib.parse.quote(text, safe="") leaves as is (CPython 3.11 Lib/urllib/parse.py:805)
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _quote(text: str) -> str:
    """urllib.parse.quote(text, safe=""), without importing urllib."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode("utf-8"))


def _plain_answer(url: str, headers: dict, proxies, timeout: float):
    """The hub's answer through the agent's socket `http` probe (remote/server.py
    _plain_http: no urllib, ssl or email to import) when urllib would go straight to the URL
    too: a plain http:// endpoint and no proxy at all, neither given nor in the environment
    (any `*_proxy` variable, as urllib.request.getproxies_environment reads them,
    Lib/urllib/request.py:2499-2528): the body text, or {"error", "status"}. None otherwise,
    or when not shipped with the agent."""
    if not url.startswith("http://") or proxies or \
            any(k.lower().endswith("_proxy") for k in os.environ):
        return None
    try:
        from orchestrator.remote.server import http
    except ImportError:
        return None
    answer = http(url, headers=headers, timeout=timeout)
    if answer["error"]:
        return {"error": answer["error"], "status": None}
    if not 200 <= answer["status"] < 300:  # urllib raises HTTPError for these
        return {"error": f"HTTP {answer['status']}", "status": answer["status"]}
    return answer["body"]


@probe("hf_revision")
def hf_revision(endpoint: str, repo: str, revision: str, repo_type: str = "model",
                token=None, proxies=None, timeout: float = 30.0) -> dict:
    """The commit a branch or tag names, asked of the hub with the stdlib (no huggingface_hub).

    The same request as huggingface_hub's `repo_info` (2.4.0 hf_api.py:3201-3216: GET
    .../revision/{quote(revision, safe='')} with `authorization: Bearer TOKEN`,
    utils/_headers.py:119; the answer's `sha` is the commit, hf_api.py:916). Returns
    {"commit"} or {"error": text, "status": HTTP status or None}: the stage then asks
    huggingface_hub itself, whose errors it knows how to explain.
    """
    url = "{}/api/{}/{}/revision/{}".format(
        endpoint.rstrip("/"), _API_KIND.get(repo_type, "models"), repo, _quote(revision))
    headers = {"authorization": "Bearer " + token} if token else {}
    plain = _plain_answer(url, headers, proxies, float(timeout))
    if isinstance(plain, dict):
        return plain
    try:
        body = plain if plain is not None else _urllib_get(url, headers, proxies, float(timeout))
        sha = json.loads(body).get("sha")
    except _HTTPStatus as exc:
        return {"error": f"HTTP {exc.status}", "status": exc.status}
    except Exception as exc:  # noqa: BLE001 - reported as data
        return {"error": f"{type(exc).__name__}: {exc}", "status": None}
    if not (isinstance(sha, str) and COMMIT_RE.match(sha)):
        return {"error": "no commit in the hub's answer", "status": None}
    return {"commit": sha}


class _HTTPStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _urllib_get(url: str, headers: dict, proxies, timeout: float) -> str:
    """GET URL with urllib through the environment's proxies and PROXIES; the body text
    (_HTTPStatus for an HTTP error status)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=headers)
    handlers = [urllib.request.ProxyHandler({**urllib.request.getproxies(),
                                             **dict(proxies or {})})]
    try:
        with urllib.request.build_opener(*handlers).open(req, timeout=timeout) as resp:
            return resp.read(4 << 20).decode("utf-8")
    except urllib.error.HTTPError as exc:
        raise _HTTPStatus(exc.code) from None


def _rehash(path: str, size: int, recorded: str) -> str:
    """The file's hash in the recorded one's algorithm ("sha256:HEX" or "git-sha1:HEX")."""
    algo = recorded.partition(":")[0]
    return algo + ":" + (_sha256(path) if algo == "sha256" else _git_blob_sha1(path, size))


@probe("hf_files")
def hf_files(root: str, files: list, verify: bool = False) -> dict:
    """Each manifest entry ``{path, size, hash, mtime_ns, ino}`` against the file under root.

    Only a file whose stat changed (size equal, but mtime or inode not: touched, copied over,
    replaced) is hashed again, and every file when ``verify``. Returns {path: [state, size,
    mtime_ns, ino]} with state one of "ok" (stat as recorded), "same" (hashed again: content as
    verified), "missing", "size", "hash" (content differs from the verified download).
    """
    out = {}
    for f in files:
        rel = f["path"]
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
        except OSError:
            out[rel] = ["missing", None, None, None]
            continue
        stat = [st.st_size, st.st_mtime_ns, st.st_ino]
        if st.st_size != f.get("size"):
            state = "size"
        elif (verify or not f.get("hash") or st.st_mtime_ns != f.get("mtime_ns")
              or f.get("ino") not in (None, st.st_ino)):
            same = bool(f.get("hash")) and _rehash(path, st.st_size, f["hash"]) == f["hash"]
            state = "same" if same else "hash"
        else:
            state = "ok"
        out[rel] = [state] + stat
    return out


# ------------------------------------------------------------------------ run as a program


class _Failure(Exception):
    def __init__(self, kind: str, message: str, status=None):
        super().__init__(message)
        self.kind = kind
        self.status = status


def _emit(obj: dict) -> None:
    sys.stdout.write("ORCH_RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _progress(*fields) -> None:
    sys.stderr.write("ORCH_PROGRESS " + " ".join(str(f) for f in fields) + "\n")
    sys.stderr.flush()


def _api(args: dict):
    from huggingface_hub import HfApi

    return HfApi(endpoint=args.get("endpoint") or None)


def _resolve(args: dict) -> str:
    rev = args["revision"]
    if COMMIT_RE.match(rev):
        return rev
    info = _api(args).repo_info(args["repo"], revision=rev, repo_type=args["repo_type"])
    return info.sha


def _listing(args: dict, commit: str) -> list:
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    entries = [
        e for e in _api(args).list_repo_tree(
            args["repo"], revision=commit, recursive=True, repo_type=args["repo_type"])
        if isinstance(e, RepoFile)
    ]
    keep = filter_repo_objects(entries, allow_patterns=args.get("allow_patterns"),
                               ignore_patterns=args.get("ignore_patterns"), key=lambda e: e.path)
    out = []
    for e in keep:
        lfs = getattr(e, "lfs", None)
        sha256 = None
        if lfs is not None:
            sha256 = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
        out.append({"path": e.path, "size": e.size, "blob_id": e.blob_id, "sha256": sha256})
    return out


def _local_bytes(local_dir: str, files: list) -> int:
    total = 0
    for f in files:
        try:
            total += os.stat(os.path.join(local_dir, f["path"])).st_size
        except OSError:
            pass
    partial = os.path.join(local_dir, ".cache", "huggingface", "download")
    for dirpath, _dirs, names in os.walk(partial):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_size
                except OSError:
                    pass
    return total


def _remove_stale_partials(local_dir: str) -> int:
    """Delete `*.incomplete` files left by an interrupted download; return the bytes freed."""
    freed = 0
    partial = os.path.join(local_dir, ".cache", "huggingface", "download")
    for dirpath, _dirs, names in os.walk(partial):
        for name in names:
            if name.endswith(".incomplete"):
                path = os.path.join(dirpath, name)
                try:
                    freed += os.stat(path).st_size
                    os.unlink(path)
                except OSError:
                    pass
    return freed


def _download(args: dict) -> dict:
    from huggingface_hub import snapshot_download

    stale = _remove_stale_partials(args["local_dir"])
    for rel in args.get("forget") or []:  # content changed since verified: fetch it again
        _forget(args["local_dir"], rel)
    commit = _resolve(args)
    files = _listing(args, commit)
    total = sum(f["size"] for f in files)
    done = threading.Event()

    def report() -> None:
        while not done.wait(args.get("progress_interval", 10.0)):
            _progress("download", _local_bytes(args["local_dir"], files), total, len(files))

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        snapshot_download(
            repo_id=args["repo"], repo_type=args["repo_type"], revision=commit,
            local_dir=args["local_dir"], allow_patterns=args.get("allow_patterns"),
            ignore_patterns=args.get("ignore_patterns"), max_workers=args.get("max_workers", 8),
        )
    finally:
        done.set()
    _progress("download", total, total, len(files))
    return {"commit": commit, "files": len(files), "bytes": total, "stale_partial_bytes": stale}


def _git_blob_sha1(path: str, size: int) -> str:
    import hashlib

    h = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _forget(local_dir: str, rel: str) -> None:
    """Delete a bad file and huggingface_hub's metadata about it, so it is fetched again."""
    for path in (os.path.join(local_dir, rel),
                 os.path.join(local_dir, ".cache", "huggingface", "download", rel + ".metadata")):
        try:
            os.unlink(path)
        except OSError:
            pass


def _verify(args: dict) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    commit = args.get("commit") or _resolve(args)
    files = _listing(args, commit)
    local_dir = args["local_dir"]
    total = sum(f["size"] for f in files)
    hashed = [0]
    lock = threading.Lock()
    last = [time.monotonic()]
    interval = args.get("progress_interval", 10.0)

    def check(f: dict) -> dict:
        path = os.path.join(local_dir, f["path"])
        try:
            st = os.stat(path)
        except OSError:
            return {"path": f["path"], "problem": "missing", "expected": f["size"]}
        if st.st_size != f["size"]:
            _forget(local_dir, f["path"])
            return {"path": f["path"], "problem": "size", "expected": f["size"],
                    "actual": st.st_size}
        if f["sha256"]:
            algo, expected, actual = "sha256", f["sha256"], _sha256(path)
        else:
            algo, expected, actual = "git-sha1", f["blob_id"], _git_blob_sha1(path, st.st_size)
        with lock:
            hashed[0] += st.st_size
            if time.monotonic() - last[0] >= interval:
                last[0] = time.monotonic()
                _progress("verify", hashed[0], total, len(files))
        if actual != expected:
            _forget(local_dir, f["path"])
            return {"path": f["path"], "problem": "hash", "algo": algo, "expected": expected,
                    "actual": actual}
        return {"path": f["path"], "size": st.st_size, "hash": algo + ":" + actual,
                "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}

    workers = max(1, min(int(args.get("max_workers", 8)), len(files) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(check, files))
    _progress("verify", total, total, len(files))
    return {
        "commit": commit,
        "files": [r for r in results if "problem" not in r],
        "problems": [r for r in results if "problem" in r],
        "bytes": total,
        "extra": _extra_files(local_dir, {f["path"] for f in files}),
    }


def _extra_files(local_dir: str, expected: set) -> list:
    """Files in local_dir that are not part of the commit (e.g. left by an older revision)."""
    extra = []
    for dirpath, dirs, names in os.walk(local_dir):
        rel_dir = os.path.relpath(dirpath, local_dir)
        if rel_dir == ".":
            dirs[:] = [d for d in dirs if d not in BOOKKEEPING]
            rel_dir = ""
        for name in names:
            rel = (rel_dir + "/" + name) if rel_dir else name
            if rel not in expected:
                extra.append(rel)
    return sorted(extra)[:100]


def _classify(exc: BaseException) -> _Failure:
    names = [c.__name__ for c in type(exc).__mro__]
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    message = str(exc).strip()[:800]
    if "GatedRepoError" in names:
        return _Failure("gated", message, status)
    if "RepositoryNotFoundError" in names:
        return _Failure("repo_not_found", message, status)
    if "RevisionNotFoundError" in names:
        return _Failure("revision_not_found", message, status)
    if "EntryNotFoundError" in names or "RemoteEntryNotFoundError" in names:
        return _Failure("entry_not_found", message, status)
    if "HfHubHTTPError" in names:
        if status in (401, 403):
            return _Failure("unauthorized", message, status)
        return _Failure("http", message, status)
    if ("LocalEntryNotFoundError" in names or "OfflineModeIsEnabled" in names
            or any("Connect" in n or "Timeout" in n or n == "NetworkError" for n in names)):
        return _Failure("network", message, status)
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return _Failure("disk", message, status)
    return _Failure("failed", f"{type(exc).__name__}: {message}", status)


def main(argv: list) -> int:
    """Run one op; print ORCH_RESULT; exit 0, or 2 with an error object."""
    op, args = argv[0], json.loads(argv[1])
    ops = {"resolve": lambda a: {"commit": _resolve(a)}, "download": _download,
           "verify": _verify}
    try:
        try:
            import huggingface_hub  # noqa: F401
        except ImportError as exc:
            raise _Failure("missing_library", f"huggingface_hub is not installed for "
                           f"{sys.executable}: {exc}") from None
        _emit(ops[op](args))
        return 0
    except _Failure as exc:
        _emit({"error": {"kind": exc.kind, "status": exc.status, "message": str(exc)}})
        return 2
    except Exception as exc:  # every failure becomes one JSON answer
        f = _classify(exc)
        _emit({"error": {"kind": f.kind, "status": f.status, "message": str(f)}})
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
