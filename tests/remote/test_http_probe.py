"""The agent's `http` probe answers plain http:// GETs over a socket of its own (so a converged
host never imports urllib); these tests hold that path to urllib's answers, server by server:
every response below is asked both ways from a real loopback server and must read the same."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from orchestrator.remote import server

Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@contextmanager
def serving(respond: Handler, protocol: str = "HTTP/1.1") -> Iterator[str]:
    """A real http.server on 127.0.0.1 answering every GET/HEAD with RESPOND; yields its URL."""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = protocol

        def do_GET(self) -> None:  # noqa: N802
            respond(self)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _fixed(status: int, body: bytes, ctype: str = "application/json") -> Handler:
    def respond(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
    return respond


def _chunked(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for part in (b'{"data": [', b'{"id": "kimi-k2.6"}', b"]}"):
        h.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
    h.wfile.write(b"0\r\n\r\n")


def _until_close(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Connection", "close")
    h.end_headers()
    h.wfile.write("no length: read until the server closes \u00e9\n".encode() * 50)
    h.close_connection = True


def _redirect(h: http.server.BaseHTTPRequestHandler) -> None:
    if h.path.startswith("/old"):
        h.send_response(307)
        h.send_header("Location", "/new?x=1")
        h.send_header("Content-Length", "0")
        h.end_headers()
        return
    _fixed(200, f'{{"path": "{h.path}"}}'.encode())(h)


def _echo_headers(h: http.server.BaseHTTPRequestHandler) -> None:
    seen = {k.lower(): v for k, v in h.headers.items() if k.lower() not in ("host",)}
    _fixed(200, repr(sorted(seen.items())).encode(), "text/plain")(h)


CASES = {
    "json 200": (_fixed(200, b'{"ok": true}'), "/health"),
    "503 with a body": (_fixed(503, b'{"error": "loading"}'), "/health"),
    "401": (_fixed(401, b'{"error": "Unauthorized"}'), "/v1/models"),
    "204": (_fixed(204, b""), "/x"),
    "chunked": (_chunked, "/v1/models"),
    "until close": (_until_close, "/metrics?x=1"),
    "redirect followed": (_redirect, "/old"),
    "request headers": (_echo_headers, "/h"),
}


def _both(url: str, **kw: object) -> tuple[dict, dict]:
    """(the probe's answer, urllib's answer) for one URL, `elapsed` left out."""
    plain = server.http(url, **kw)
    via = {"status": None, "headers": {}, "body": "", "error": None}
    headers = dict(kw.get("headers") or {})  # type: ignore[call-overload]
    server._urllib_http(url, str(kw.get("method", "GET")), headers, None, 5.0,
                        int(kw.get("max_bytes", 4 << 20)), via)  # type: ignore[call-overload]
    plain.pop("elapsed")
    return plain, via


def _comparable(answer: dict) -> dict:
    """Headers compared case-blind and without Date (a second may tick between the two)."""
    headers = {k.lower(): v for k, v in answer["headers"].items() if k.lower() != "date"}
    return {**answer, "headers": headers}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_plain_http_answers_as_urllib_does(case: str, method: str) -> None:
    respond, path = CASES[case]
    with serving(respond) as base:
        plain, via = _both(base + path, method=method, headers={"Authorization": "Bearer k"})
    assert via["status"] is not None  # the server answered urllib
    assert _comparable(plain) == _comparable(via)


def test_max_bytes_cuts_the_body_the_same_way() -> None:
    for respond in (_chunked, _until_close, _fixed(200, b"x" * 5000)):
        with serving(respond) as base:
            plain, via = _both(base + "/", max_bytes=7)
        assert len(plain["body"]) == 7 and plain["body"] == via["body"]


def test_plain_http_takes_no_urllib_import() -> None:
    """The point of the socket path: a converged host's health check imports neither urllib
    nor http.client (a fresh interpreter, the probe as the agent calls it)."""
    with serving(_fixed(200, b'{"ok": true}')) as base:
        code = ("import sys, json; from orchestrator.remote import server; "
                f"a = server.http({base + '/health'!r}); "
                "print(json.dumps([a['status'], a['body'], "
                "sorted(m for m in sys.modules if m in "
                "('urllib.request', 'http.client', 'ssl', 'email.parser'))]))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    assert out.strip() == '[200, "{\\"ok\\": true}", []]'


def _raw_server(reply: bytes) -> tuple[socket.socket, str]:
    """A socket server that reads the request and answers REPLY, then closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}/health"


@pytest.mark.parametrize(("reply", "error"), [
    (b"", "connection reset"),
    (b"garbage\r\n\r\n", "BadStatusLine: garbage"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "IncompleteRead:"),
    (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", "HTTPException: got more than 100"),
])
def test_broken_answers_are_errors_not_exceptions(reply: bytes, error: str) -> None:
    srv, url = _raw_server(reply)
    try:
        answer = server.http(url, timeout=5)
    finally:
        srv.close()
    assert answer["error"] is not None and answer["error"].startswith(error)


def test_refused_and_timed_out() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert server.http(f"http://127.0.0.1:{free}/health", timeout=2)["error"] == \
        "connection refused"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts (the kernel does), never answers
    try:
        answer = server.http(f"http://127.0.0.1:{silent.getsockname()[1]}/", timeout=0.3)
    finally:
        silent.close()
    assert answer["status"] is None and answer["error"] == "timed out"


@pytest.mark.parametrize(("url", "split"), [
    ("http://127.0.0.1:30000/health", ("127.0.0.1", 30000, "127.0.0.1:30000", "/health")),
    ("http://h", ("h", 80, "h", "/")),
    ("http://[::1]:8000/v1/models?x=1#frag", ("::1", 8000, "[::1]:8000", "/v1/models?x=1")),
    ("http://h?q", ("h", 80, "h", "/?q")),
    ("https://h/", None),
    ("http://user@h/", None),
    ("http://h:port/", None),
    ("http://[::1]x/", None),
])
def test_url_split(url: str, split: tuple | None) -> None:
    assert server._split_http_url(url) == split
