"""A simulated Hugging Face Hub: enough of the protocol for ``huggingface_hub.snapshot_download``.

Checked against huggingface_hub 2.4.0 (the pinned client). Routes served, for repos seeded by
:func:`orchestrator_sim.hubrepos.seed_repos` (model repos only, ids ``org/name``):

* ``GET /api/models/{repo}`` and ``GET /api/models/{repo}/revision/{rev}``: model info JSON
  (``id``, ``sha`` = commit, ``siblings`` ``[{"rfilename"}]``; with ``?blobs=true`` also sizes,
  blob ids and LFS info).
* ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=true|false``: entries
  ``{type, path, size, oid[, lfs: {oid, size, pointerSize}]}`` (directories ``{type, path, oid}``),
  ``tree_page_size`` entries per page, the next page named by ``Link: <...>; rel="next"``
  (query ``cursor=N``).
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (git blob sha1 for a
  small file, sha256 for an LFS file, which also gets ``X-Linked-Etag``/``X-Linked-Size``),
  ``Content-Length``, ``Accept-Ranges``. GET honours one ``Range: bytes=A-B`` (206 +
  ``Content-Range``; 416 when unsatisfiable). No Xet headers are ever sent, so the client uses
  plain HTTP downloads.
* Errors: 404 with ``X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound`` and a JSON
  ``{"error": ...}`` body; 401 (see faults and tokens below). A revision is a branch name (a file
  under ``refs/``) or a 40-hex commit.

Tokens: when the hub is given a ``token``, a request that carries ``Authorization: Bearer X``
with a different X gets 401 ``Invalid credentials in Authorization header`` (the client raises
``HfHubHTTPError`` 401). Without a configured token every bearer token is accepted.

Faults (names in :data:`HUB_FAULTS`), switched by :meth:`ModelHub.set_fault` or by any process
writing the fault file with :func:`write_faults` (re-read whenever its stat signature changes):

* ``hub-gated``: every repo route answers 401 ``X-Error-Code: GatedRepo`` (client:
  ``GatedRepoError``) unless the request carries the right bearer token.
* ``hub-down``: every route answers 503 with the HTML page of the CDN in front of the hub, as
  during an outage (the client raises ``HfHubHTTPError`` 503: huggingface_hub 2.4.0
  utils/_http.py:826 hf_raise_for_status falls through to the generic HTTP error).
* ``hub-unreachable``: the hub's listening socket is closed while the fault is on, so every
  connection is refused (the client raises ``httpx.ConnectError``, as for a host that is down
  or a name that does not resolve). Switched in the hub's own process (``set_fault``; the
  simulator's daemon owns the hub), not through the fault file.
* ``hub-flaky``: deterministic mid-body drop. The FIRST GET of each LFS file (keyed by repo,
  commit and path) after the fault is switched on sends the headers, with the full
  ``Content-Length``, then exactly half of the body bytes it promised, then closes the socket.
  Every later GET of that file is served in full, so a client that resumes with ``Range``
  (huggingface_hub's ``http_get`` does, after 1 s) or retries succeeds. Switching the fault off
  and on again re-arms it for every file. What huggingface_hub 2.4.0 does with it: ``http_get``
  retries within the same ``snapshot_download`` call after 1 s; it reads in 10 MiB chunks, so a
  cut inside the first 10 MiB (every seeded file) is retried as a plain full GET, and a cut
  after a full chunk is resumed with ``Range: bytes=N-`` (206).

Every request is recorded (:attr:`ModelHub.requests`: method, path, status, body bytes sent, the
``Range`` header, whether an Authorization header came; never the token itself).

Run standalone: ``python -m orchestrator_sim.hub --data-dir DIR --seed --port 0``; the token, if
any, comes from the environment variable named by ``--token-env`` (default ``SIM_HUB_TOKEN``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from orchestrator_sim.hubrepos import LFS_THRESHOLD, git_blob_sha1, lfs_pointer, seed_repos
from orchestrator_sim.signals import set_on_signals

log = logging.getLogger(__name__)

HUB_FLAKY = "hub-flaky"
HUB_GATED = "hub-gated"
HUB_DOWN = "hub-down"
HUB_UNREACHABLE = "hub-unreachable"
HUB_FAULTS = (HUB_FLAKY, HUB_GATED, HUB_DOWN, HUB_UNREACHABLE)

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 64 * 1024


# --------------------------------------------------------------------------- fault file helpers


def read_faults(path: Path) -> dict[str, bool]:
    """Read a fault file (a JSON object of name -> bool). A missing file means no faults."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError(f"fault file {path} must hold a JSON object, got {type(data).__name__}")
    return {str(k): bool(v) for k, v in data.items()}


def write_faults(path: Path, faults: dict[str, bool]) -> None:
    """Atomically replace the fault file with ``faults`` (temp file + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        json.dump({k: bool(v) for k, v in faults.items()}, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- repo store


@dataclass(frozen=True)
class HubFile:
    """One file of a commit as the hub serves it."""

    path: str
    disk_path: Path
    size: int
    blob_id: str  # git object id (of the LFS pointer for LFS files)
    sha256: str | None  # set for LFS files only

    @property
    def is_lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def etag(self) -> str:
        if self.sha256 is not None:
            return self.sha256
        return self.blob_id

    def tree_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "type": "file",
            "oid": self.blob_id,
            "size": self.size,
            "path": self.path,
        }
        if self.sha256 is not None:
            pointer_size = len(
                f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
                f"size {self.size}\n"
            )
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": pointer_size}
        return entry


class _HubError(Exception):
    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        commit: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit
        self.headers = headers or {}


class _RepoStore:
    """Reads the layout written by ``seed_repos``; commit contents are cached (immutable)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._files: dict[tuple[str, str], dict[str, HubFile]] = {}
        self._lock = threading.Lock()

    def repo_dir(self, repo_id: str) -> Path:
        parts = repo_id.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise _HubError(404, "RepoNotFound", f"Repository {repo_id!r} not found")
        path = self.data_dir / parts[0] / parts[1]
        if not (path / "refs").is_dir():
            raise _HubError(404, "RepoNotFound", f"Repository {repo_id!r} not found")
        return path

    def resolve(self, repo_id: str, revision: str) -> str:
        repo = self.repo_dir(repo_id)
        if _COMMIT_RE.match(revision) and (repo / "commits" / revision).is_dir():
            return revision
        name = revision.removeprefix("refs/heads/")
        if "/" not in name and not name.startswith("."):
            ref = repo / "refs" / name
            if ref.is_file():
                return ref.read_text().strip()
        raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def files(self, repo_id: str, commit: str) -> dict[str, HubFile]:
        key = (repo_id, commit)
        with self._lock:
            cached = self._files.get(key)
        if cached is not None:
            return cached
        root = self.repo_dir(repo_id) / "commits" / commit
        result: dict[str, HubFile] = {}
        for disk_path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = disk_path.relative_to(root).as_posix()
            content = disk_path.read_bytes()
            if len(content) >= LFS_THRESHOLD:
                result[rel] = HubFile(
                    rel,
                    disk_path,
                    len(content),
                    git_blob_sha1(lfs_pointer(content)),
                    hashlib.sha256(content).hexdigest(),
                )
            else:
                result[rel] = HubFile(rel, disk_path, len(content), git_blob_sha1(content), None)
        with self._lock:
            self._files[key] = result
        return result

    def commit_time(self, repo_id: str, commit: str) -> str:
        mtime = (self.repo_dir(repo_id) / "commits" / commit).stat().st_mtime
        return datetime.fromtimestamp(mtime, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# --------------------------------------------------------------------------- request log


@dataclass
class RequestRecord:
    """One request the hub answered."""

    method: str
    path: str
    status: int
    bytes_sent: int
    range: str | None = None
    authorized: bool = False
    cut: bool = False  # the body was deliberately cut short (hub-flaky)
    time: float = field(default_factory=time.time)


# --------------------------------------------------------------------------- the hub


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], hub: ModelHub) -> None:
        self.hub = hub
        self.live: set[socket.socket] = set()
        self.live_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def get_request(self):  # type: ignore[override]
        sock, addr = super().get_request()
        with self.live_lock:
            self.live.add(sock)
        return sock, addr

    def shutdown_request(self, request):  # type: ignore[override]
        with self.live_lock:
            self.live.discard(request)
        super().shutdown_request(request)


class ModelHub:
    """A simulated Hugging Face Hub serving the repos under ``data_dir`` over HTTP on loopback.

    Usage::

        hub = ModelHub(data_dir, token="hf_x", fault_file=tmp / "faults.json")
        hub.start()              # then HF_ENDPOINT=hub.url for the client
        hub.set_fault("hub-flaky", True)
        ...
        hub.stop()
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        token: str | None = None,
        fault_file: Path | None = None,
        tree_page_size: int = 8,
    ) -> None:
        if tree_page_size < 1:
            raise ValueError("tree_page_size must be at least 1")
        self.store = _RepoStore(Path(data_dir))
        self.token = token
        self.fault_file = Path(fault_file) if fault_file is not None else None
        self.tree_page_size = tree_page_size
        self._faults: dict[str, bool] = {}
        self._fault_sig: tuple[int, int, int] | None = None
        self._fault_lock = threading.Lock()
        self._cut_done: set[tuple[str, str, str]] = set()
        self._log: list[RequestRecord] = []
        self._log_lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._refresh_faults()

    # ----------------------------------------------------------------- lifecycle

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve in a daemon thread; return :attr:`url`."""
        if self._server is not None:
            raise RuntimeError("ModelHub already started")
        self._server = _Server((host, port), self)
        self._addr = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"sim-hub-{self._server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        log.info("sim hub listening on %s (data %s)", self.url, self.store.data_dir)
        return self.url

    @property
    def url(self) -> str:
        """Base URL of the running hub, e.g. ``http://127.0.0.1:40123`` (use as HF_ENDPOINT)."""
        addr = getattr(self, "_addr", None)
        if addr is None:
            raise RuntimeError("ModelHub is not started: call start() first")
        host, port = addr
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop serving, drop open connections and release the port. Safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        with server.live_lock:
            live = list(server.live)
        for sock in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _listen(self, on: bool) -> None:
        """Open (again, on the same address) or close the listening socket: hub-unreachable."""
        addr = getattr(self, "_addr", None)
        if on and self._server is None and addr is not None:
            self.start(*addr)
        elif not on and self._server is not None:
            self.stop()
            self._addr = addr  # the URL stays what clients were given

    def __enter__(self) -> ModelHub:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- faults

    def set_fault(self, name: str, enabled: bool) -> None:
        """Switch a fault on or off (through the fault file when there is one)."""
        if name not in HUB_FAULTS:
            raise ValueError(f"unknown hub fault {name!r}; known: {', '.join(HUB_FAULTS)}")
        if name == HUB_UNREACHABLE:
            self._listen(not enabled)
        if self.fault_file is None:
            with self._fault_lock:
                new = dict(self._faults)
                new[name] = bool(enabled)
                self._apply_faults(new)
            return
        with self._fault_lock:
            current = read_faults(self.fault_file)
            current[name] = bool(enabled)
            write_faults(self.fault_file, current)
        self._refresh_faults()

    def faults(self) -> dict[str, bool]:
        """The hub faults in force now (re-reading the fault file if it changed)."""
        self._refresh_faults()
        with self._fault_lock:
            return {name: self._faults.get(name, False) for name in HUB_FAULTS}

    def _fault(self, name: str) -> bool:
        with self._fault_lock:
            return self._faults.get(name, False)

    def _apply_faults(self, new: dict[str, bool]) -> None:
        # caller holds _fault_lock
        if new.get(HUB_FLAKY, False) and not self._faults.get(HUB_FLAKY, False):
            self._cut_done.clear()  # re-arm: first GET of each large file is cut again
        self._faults = new

    def _refresh_faults(self) -> None:
        if self.fault_file is None:
            return
        try:
            st = self.fault_file.stat()
            sig: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            sig = None
        with self._fault_lock:
            if sig == self._fault_sig and sig is not None:
                return
            try:
                new = read_faults(self.fault_file) if sig is not None else {}
            except (OSError, ValueError) as exc:
                log.warning("sim hub: ignoring unreadable fault file %s: %s", self.fault_file, exc)
                return
            self._fault_sig = sig
            self._apply_faults(new)

    def _take_cut(self, key: tuple[str, str, str]) -> bool:
        """True if this GET must be cut (hub-flaky on and the file not cut yet)."""
        with self._fault_lock:
            if not self._faults.get(HUB_FLAKY, False) or key in self._cut_done:
                return False
            self._cut_done.add(key)
            return True

    # ----------------------------------------------------------------- request log

    @property
    def requests(self) -> list[RequestRecord]:
        """A copy of the request log, oldest first."""
        with self._log_lock:
            return list(self._log)

    def clear_requests(self) -> None:
        """Forget the request log."""
        with self._log_lock:
            self._log.clear()

    def _record(self, rec: RequestRecord) -> None:
        with self._log_lock:
            self._log.append(rec)
        log.debug(
            "sim hub %s %s -> %s (%d bytes)", rec.method, rec.path, rec.status, rec.bytes_sent
        )

    # ----------------------------------------------------------------- auth

    def _check_auth(self, authorization: str | None, repo_id: str) -> None:
        bearer = None
        if authorization and authorization.lower().startswith("bearer "):
            bearer = authorization[7:].strip() or None
        if bearer is not None and self.token is not None and bearer != self.token:
            raise _HubError(401, None, "Invalid credentials in Authorization header")
        if self._fault(HUB_GATED) and bearer is None:
            raise _HubError(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sim-hub/1.0"
    timeout = 60  # idle keep-alive connections are dropped after this
    server: _Server

    # silence the default stderr access log; we keep our own
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    @property
    def hub(self) -> ModelHub:
        return self.server.hub

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    # ----------------------------------------------------------------- plumbing

    def _dispatch(self, *, head: bool) -> None:
        self._sent = 0
        self._headers_sent = False
        self._cut = False
        self._status = 500
        self.hub._refresh_faults()
        if self.hub._fault(HUB_DOWN):
            self._send_down(head)
            return
        split = urlsplit(self.path)
        segments = split.path.split("/")[1:]
        query = parse_qs(split.query)
        try:
            if len(segments) >= 3 and segments[0] == "api" and segments[1] == "models":
                if head:
                    raise _HubError(405, None, "HEAD is not supported on API routes")
                self._api_models([unquote(s) for s in segments[2:4]], segments[4:], query)
            elif len(segments) >= 5 and segments[2] == "resolve":
                repo_id = f"{unquote(segments[0])}/{unquote(segments[1])}"
                revision = unquote(segments[3])
                filename = unquote("/".join(segments[4:]))
                self._resolve(repo_id, revision, filename, head=head)
            else:
                raise _HubError(404, None, f"Not found: {split.path}")
        except _HubError as err:
            self._send_error(err, head=head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:
            log.exception("sim hub: error while answering %s %s", self.command, self.path)
            self.close_connection = True
            if not self._headers_sent:
                self._send_error(
                    _HubError(500, None, "internal error in the simulated hub"), head=head
                )
        finally:
            self.hub._record(
                RequestRecord(
                    method=self.command,
                    path=self.path,
                    status=self._status,
                    bytes_sent=self._sent,
                    range=self.headers.get("Range"),
                    authorized=self.headers.get("Authorization") is not None,
                    cut=self._cut,
                )
            )

    def _start(self, status: int, headers: dict[str, str]) -> None:
        self._status = status
        self._headers_sent = True
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()

    def _send_json(
        self, obj: Any, *, head: bool, status: int = 200, extra: dict[str, str] | None = None
    ) -> None:
        body = json.dumps(obj).encode()
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "Content-Length": str(len(body)),
        }
        headers.update(extra or {})
        self._start(status, headers)
        if not head:
            self.wfile.write(body)
            self._sent = len(body)

    def _send_error(self, err: _HubError, *, head: bool) -> None:
        extra = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            extra["X-Error-Code"] = err.code
        if err.commit:
            extra["X-Repo-Commit"] = err.commit
        self._send_json({"error": err.message}, head=head, status=err.status, extra=extra)

    def _send_down(self, head: bool) -> None:
        """hub-down: 503 and an HTML body, as the CDN in front of the hub answers in an outage."""
        body = b"<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>"
        self._start(503, {"Content-Type": "text/html", "Content-Length": str(len(body))})
        if not head:
            self.wfile.write(body)
            self._sent = len(body)
        self.hub._record(RequestRecord(method=self.command, path=self.path, status=503,
                                       bytes_sent=self._sent, range=self.headers.get("Range"),
                                       authorized=self.headers.get("Authorization") is not None,
                                       cut=False))

    def _base_url(self) -> str:
        host = self.headers.get("Host")
        if not host:
            h, p = self.server.server_address[:2]
            host = f"{h}:{p}"
        return f"http://{host}"

    # ----------------------------------------------------------------- /api/models

    def _api_models(self, repo_parts: list[str], rest: list[str], query: dict) -> None:
        if len(repo_parts) != 2:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        repo_id = "/".join(repo_parts)
        self.hub._check_auth(self.headers.get("Authorization"), repo_id)
        store = self.hub.store
        if not rest or rest == [""]:
            self._model_info(repo_id, store.resolve(repo_id, "main"), query)
        elif rest[0] == "revision" and len(rest) >= 2:
            revision = unquote("/".join(rest[1:]))
            self._model_info(repo_id, store.resolve(repo_id, revision), query)
        elif rest[0] == "tree" and len(rest) >= 2:
            revision = unquote(rest[1])
            path = unquote("/".join(rest[2:])).strip("/")
            self._tree(repo_id, revision, path, query)
        else:
            raise _HubError(404, None, f"Not found: {self.path}")

    def _model_info(self, repo_id: str, commit: str, query: dict) -> None:
        files = self.hub.store.files(repo_id, commit)
        blobs = query.get("blobs", ["false"])[-1].lower() in ("1", "true")
        siblings: list[dict[str, Any]] = []
        for f in files.values():
            sib: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sib["size"] = f.size
                sib["blobId"] = f.blob_id
                if f.sha256 is not None:
                    sib["lfs"] = {
                        "sha256": f.sha256,
                        "size": f.size,
                        "pointerSize": f.tree_entry()["lfs"]["pointerSize"],
                    }
            siblings.append(sib)
        config: dict[str, Any] = {}
        if "config.json" in files:
            try:
                raw = json.loads(files["config.json"].disk_path.read_text())
                config = {k: raw[k] for k in ("architectures", "model_type") if k in raw}
            except (OSError, ValueError):
                config = {}
        when = self.hub.store.commit_time(repo_id, commit)
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit,
            "lastModified": when,
            "createdAt": when,
            "private": False,
            "gated": "manual" if self.hub._fault(HUB_GATED) else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "library_name": "transformers",
            "tags": ["transformers", "safetensors", "simulated"],
            "pipeline_tag": "text-generation",
            "config": config,
            "siblings": siblings,
            "usedStorage": sum(f.size for f in files.values()),
        }
        self._send_json(info, head=False)

    def _tree(self, repo_id: str, revision: str, path: str, query: dict) -> None:
        store = self.hub.store
        commit = store.resolve(repo_id, revision)
        files = store.files(repo_id, commit)
        recursive = query.get("recursive", ["false"])[-1].lower() in ("1", "true")
        prefix = f"{path}/" if path else ""
        if path and path in files:
            raise _HubError(
                404, "EntryNotFound", f"{path} is a file, not a directory", commit=commit
            )
        below = [f for f in files.values() if f.path.startswith(prefix)]
        if path and not below:
            raise _HubError(
                404, "EntryNotFound", f"Path {path} not found at revision {commit}", commit=commit
            )
        dirs: dict[str, list[HubFile]] = {}
        entries: list[dict[str, Any]] = []
        for f in below:
            rest = f.path[len(prefix) :]
            parts = rest.split("/")
            # every ancestor directory (below `path`) of this file
            for depth in range(1, len(parts)):
                dirs.setdefault(prefix + "/".join(parts[:depth]), []).append(f)
            if recursive or len(parts) == 1:
                entries.append(f.tree_entry())
        for d, members in dirs.items():
            if recursive or "/" not in d[len(prefix) :]:
                oid = hashlib.sha1("".join(sorted(m.blob_id for m in members)).encode())
                entries.append({"type": "directory", "oid": oid.hexdigest(), "path": d})
        entries.sort(key=lambda e: (e["type"] != "directory", e["path"]))

        try:
            cursor = int(query.get("cursor", ["0"])[-1])
        except ValueError as exc:
            raise _HubError(400, None, "cursor must be an integer") from exc
        size = self.hub.tree_page_size
        page = entries[cursor : cursor + size]
        extra: dict[str, str] = {"X-Repo-Commit": commit}
        if cursor + size < len(entries):
            params = {k: v[-1] for k, v in query.items() if k != "cursor"}
            params["cursor"] = str(cursor + size)
            tail = f"/{quote(path, safe='')}" if path else ""
            nxt = (
                f"{self._base_url()}/api/models/{repo_id}/tree/{quote(revision, safe='')}"
                f"{tail}?{urlencode(params)}"
            )
            extra["Link"] = f'<{nxt}>; rel="next"'
        self._send_json(page, head=False, extra=extra)

    # ----------------------------------------------------------------- /resolve

    def _resolve(self, repo_id: str, revision: str, filename: str, *, head: bool) -> None:
        hub = self.hub
        hub._check_auth(self.headers.get("Authorization"), repo_id)
        commit = hub.store.resolve(repo_id, revision)
        f = hub.store.files(repo_id, commit).get(filename)
        if f is None:
            raise _HubError(
                404,
                "EntryNotFound",
                f"{filename} does not exist at revision {commit}",
                commit=commit,
            )
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{f.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'inline; filename="{filename.rsplit("/", 1)[-1]}"',
        }
        if f.is_lfs:
            headers["X-Linked-Etag"] = f'"{f.etag}"'
            headers["X-Linked-Size"] = str(f.size)
        start, end, status = 0, f.size - 1, 200
        range_header = self.headers.get("Range")
        if range_header:
            m = _RANGE_RE.match(range_header.strip())
            if m and (m.group(1) or m.group(2)):
                if m.group(1):
                    start = int(m.group(1))
                    end = min(int(m.group(2)), f.size - 1) if m.group(2) else f.size - 1
                else:  # suffix range: the last N bytes
                    start = max(f.size - int(m.group(2)), 0)
                if start >= f.size or start > end:
                    raise _HubError(
                        416,
                        None,
                        f"Range {range_header} not satisfiable",
                        commit=commit,
                        headers={"Content-Range": f"bytes */{f.size}"},
                    )
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        length = end - start + 1 if f.size else 0
        headers["Content-Length"] = str(length)
        cut = not head and f.is_lfs and hub._take_cut((repo_id, commit, filename))
        self._start(status, headers)
        if head:
            return
        limit = length // 2 if cut else length
        with open(f.disk_path, "rb") as fh:
            fh.seek(start)
            remaining = limit
            while remaining > 0:
                chunk = fh.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                self.wfile.write(chunk)
                self._sent += len(chunk)
                remaining -= len(chunk)
        if cut:
            self._cut = True
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """Serve a simulated hub until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator_sim.hub",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--seed", action="store_true", help="seed the simulated repos first")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fault-file", type=Path, default=None)
    parser.add_argument(
        "--token-env",
        default="SIM_HUB_TOKEN",
        help="environment variable holding the accepted token (unset: any)",
    )
    parser.add_argument(
        "--url-file", type=Path, default=None, help="write the hub URL to this file once listening"
    )
    args = parser.parse_args(argv)
    if args.seed:
        for repo, sha in seed_repos(args.data_dir).items():
            print(f"seeded {repo} {sha}", flush=True)
    hub = ModelHub(
        args.data_dir, token=os.environ.get(args.token_env) or None, fault_file=args.fault_file
    )
    url = hub.start(args.host, args.port)
    if args.url_file is not None:
        tmp = args.url_file.with_name(args.url_file.name + ".tmp")
        tmp.write_text(url + "\n")
        tmp.replace(args.url_file)
    print(f"HUB_URL={url}", flush=True)
    done = threading.Event()
    set_on_signals(done, (signal.SIGTERM, signal.SIGINT))
    done.wait()
    hub.stop()
    return 0


__all__ = [
    "HUB_FAULTS",
    "HUB_FLAKY",
    "HUB_DOWN",
    "HUB_GATED",
    "HUB_UNREACHABLE",
    "HubFile",
    "ModelHub",
    "RequestRecord",
    "main",
    "read_faults",
    "write_faults",
]

if __name__ == "__main__":
    sys.exit(main())
