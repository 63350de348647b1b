"""A PEP 503 "simple" package index over local folders of wheels and sdists.

The simulated host installs its Python packages with real pip from this index. Every request
re-scans the folders, so a wheelhouse created after start is served too.

Routes:
  /simple/                 every project (normalized names)
  /simple/<project>/       one link per file, `#sha256=` fragment, `data-requires-python`
                           and PEP 658 `data-dist-info-metadata` for wheels
  /files/<filename>        the file itself; `/files/<wheel>.metadata` its METADATA (PEP 658)

A project name that is not normalized redirects to its normalized URL. An unknown project is a
404, or, when `upstream` is set, a redirect to `upstream/<project>/` ("falls through to the
normal index").

Usage:
    index = PackageIndex([wheel_dir])
    index.start()            # 127.0.0.1, free port
    pip install --index-url index.url sglang==0.5.23
    index.stop()

`python -m orchestrator_sim.pkgindex --dir WHEELS [--port N]` serves folders from a shell.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import html
import re
import threading
import time
import zipfile
from collections.abc import Iterable
from email.parser import HeaderParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_SDIST_RE = re.compile(r"^(?P<name>.+)-(?P<version>[0-9][^-]*)\.tar\.gz$")


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


class _FileInfo:
    """What the index knows about one distribution file (cached by path, size and mtime)."""

    __slots__ = ("path", "project", "sha256", "requires_python", "metadata", "metadata_sha256")

    def __init__(self, path: Path, project: str) -> None:
        self.path = path
        self.project = project
        data = path.read_bytes()
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.requires_python: str | None = None
        self.metadata: bytes | None = None
        self.metadata_sha256: str | None = None
        if path.name.endswith(".whl"):
            self._read_wheel_metadata()

    def _read_wheel_metadata(self) -> None:
        try:
            with zipfile.ZipFile(self.path) as zf:
                names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
                if len(names) != 1:
                    return
                meta = zf.read(names[0])
        except (OSError, zipfile.BadZipFile):
            return
        self.metadata = meta
        self.metadata_sha256 = hashlib.sha256(meta).hexdigest()
        headers = HeaderParser().parsestr(meta.decode("utf-8", "replace"))
        self.requires_python = headers.get("Requires-Python")


def _project_of(filename: str) -> str | None:
    match = _WHEEL_RE.match(filename) or _SDIST_RE.match(filename)
    return normalize(match.group("name")) if match else None


class PackageIndex:
    """PEP 503 simple index over `wheel_dirs`, served by a ThreadingHTTPServer in a thread."""

    def __init__(self, wheel_dirs: Iterable[Path | str], upstream: str | None = None) -> None:
        self.wheel_dirs = [Path(d) for d in wheel_dirs]
        self.upstream = upstream.rstrip("/") + "/" if upstream else None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._cache: dict[tuple[str, int, int], _FileInfo] = {}
        self._lock = threading.Lock()
        # (path, status) of recent requests, for tests and debugging
        self.requests: collections.deque[tuple[str, int]] = collections.deque(maxlen=2000)

    # ------------------------------------------------------------------ lifecycle
    def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Serve in a daemon thread; port 0 picks a free port (see `url`)."""
        if self._server is not None:
            raise RuntimeError("PackageIndex already started")
        index = self

        class Handler(_Handler):
            pass

        Handler.index = index
        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name="pkgindex",
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> PackageIndex:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("PackageIndex is not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """The `--index-url` for pip, e.g. http://127.0.0.1:PORT/simple/."""
        host, port = self.address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/simple/"

    # ------------------------------------------------------------------ content
    def scan(self) -> dict[str, list[_FileInfo]]:
        """Project -> files, from the folders as they are now (first folder wins on a name)."""
        projects: dict[str, list[_FileInfo]] = {}
        seen: set[str] = set()
        live: set[tuple[str, int, int]] = set()
        for folder in self.wheel_dirs:
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                name = path.name
                if name in seen or not (name.endswith(".whl") or name.endswith(".tar.gz")):
                    continue
                project = _project_of(name)
                if project is None or not path.is_file():
                    continue
                try:
                    st = path.stat()
                    key = (str(path), st.st_size, st.st_mtime_ns)
                    with self._lock:
                        info = self._cache.get(key)
                    if info is None:
                        info = _FileInfo(path, project)
                        with self._lock:
                            self._cache[key] = info
                except OSError:
                    continue  # vanished or unreadable mid-scan
                live.add(key)
                seen.add(name)
                projects.setdefault(project, []).append(info)
        with self._lock:
            for key in [k for k in self._cache if k not in live]:
                del self._cache[key]
        return projects

    def find_file(self, filename: str) -> _FileInfo | None:
        for files in self.scan().values():
            for info in files:
                if info.path.name == filename:
                    return info
        return None


class _Handler(BaseHTTPRequestHandler):
    """Request handler; `index` is set on a per-server subclass."""

    index: PackageIndex
    server_version = "orchestrator-sim-pkgindex"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - base class signature
        pass

    def _reply(self, status: int, body: bytes = b"", ctype: str = "text/plain",
               headers: dict[str, str] | None = None) -> None:
        self.index.requests.append((self.path, status))
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        if path in ("/", ""):
            self._reply(302, headers={"Location": "/simple/"})
        elif path == "/simple" or path == "/simple/":
            self._root()
        elif path.startswith("/simple/"):
            self._project(path[len("/simple/"):].strip("/"))
        elif path.startswith("/files/"):
            self._file(path[len("/files/"):])
        else:
            self._reply(404, b"not found\n")

    def _page(self, title: str, links: list[str]) -> bytes:
        body = "\n".join(
            [
                "<!DOCTYPE html>",
                "<html>",
                f"  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
                f"<title>{html.escape(title)}</title></head>",
                "  <body>",
                f"    <h1>{html.escape(title)}</h1>",
                *[f"    {link}<br/>" for link in links],
                "  </body>",
                "</html>",
                "",
            ]
        )
        return body.encode("utf-8")

    def _root(self) -> None:
        names = sorted(self.index.scan())
        links = [f'<a href="/simple/{quote(n)}/">{html.escape(n)}</a>' for n in names]
        self._reply(200, self._page("Simple index", links), "text/html; charset=utf-8")

    def _project(self, name: str) -> None:
        if not name or "/" in name:
            self._reply(404, b"not found\n")
            return
        wanted = normalize(name)
        if wanted != name:
            self._reply(301, headers={"Location": f"/simple/{quote(wanted)}/"})
            return
        files = self.index.scan().get(wanted)
        if not files:
            if self.index.upstream:
                self._reply(302, headers={"Location": f"{self.index.upstream}{quote(wanted)}/"})
            else:
                self._reply(404, f"no project named {wanted!r} in this index\n".encode())
            return
        links = []
        for info in sorted(files, key=lambda i: i.path.name):
            attrs = [f'href="/files/{quote(info.path.name)}#sha256={info.sha256}"']
            if info.requires_python:
                attrs.append(f'data-requires-python="{html.escape(info.requires_python)}"')
            if info.metadata_sha256:
                attrs.append(f'data-dist-info-metadata="sha256={info.metadata_sha256}"')
                attrs.append(f'data-core-metadata="sha256={info.metadata_sha256}"')
            links.append(f"<a {' '.join(attrs)}>{html.escape(info.path.name)}</a>")
        self._reply(200, self._page(f"Links for {wanted}", links), "text/html; charset=utf-8")

    def _file(self, filename: str) -> None:
        if "/" in filename or filename.startswith("."):
            self._reply(404, b"not found\n")
            return
        if filename.endswith(".whl.metadata"):
            info = self.index.find_file(filename[: -len(".metadata")])
            if info is None or info.metadata is None:
                self._reply(404, b"not found\n")
            else:
                self._reply(200, info.metadata, "text/plain; charset=utf-8")
            return
        info = self.index.find_file(filename)
        if info is None:
            self._reply(404, b"not found\n")
            return
        try:
            data = info.path.read_bytes()
        except OSError:
            self._reply(404, b"not found\n")
            return
        ctype = "application/octet-stream" if filename.endswith(".whl") else "application/x-tar"
        self._reply(200, data, ctype)


def main(argv: list[str] | None = None) -> int:
    """Serve folders of wheels until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", action="append", required=True, help="folder of wheels")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", default=None)
    args = parser.parse_args(argv)
    index = PackageIndex([Path(d) for d in args.dir], upstream=args.upstream)
    index.start(args.host, args.port)
    print(index.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        index.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
