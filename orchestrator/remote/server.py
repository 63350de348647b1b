"""On-host reads about a long-running server process (stdlib only, Python 3.8+).

Read-only probes shipped with the agent (see `orchestrator.remote.probes`); what starts and stops
the server is in `orchestrator.remote.actions`, the supervisor in `orchestrator.remote.supervisor`:

    http            one HTTP request (no proxies): status, headers, body; a refused
                    connection is reported as error "connection refused", never raised
    server_status   pid file + liveness (not a recycled pid: start time compared), exit record,
                    who listens on host:port (ours or not), /health, fingerprint, log tail
    log_tail        the last lines of a log file
    log_read        bytes of a log file from an offset (for `logs -f`), rotation aware
    systemd         whether systemd runs this host (PID 1) and systemctl exists

Files in the state dir (written by the stage, the actions and the supervisor):

    launch.json     what to run: argv, env, log path, key file (0600)
    supervise.py    the supervisor (the text of orchestrator/remote/supervisor.py)
    server.pid      JSON: pid, pgid, supervisor_pid, starttime (clock ticks since boot),
                    started_at (epoch), boot_id, fingerprint, restarts (rewritten by the
                    supervisor at each restart: a new pid, the same fingerprint)
    server.exit     JSON written by the supervisor when the server exits: code or signal;
                    restarting + restart_in_s while it waits to restart it, gave_up + reason
    server.log      stdout+stderr of the server (the previous run's log is server.log.1);
                    the API key is masked before a byte reaches the file
    stop_requested  marker written by server_stop (so a stop is not reported as a crash)

The /proc helpers here (pid_alive, starttime, cmdline, group_alive, ...) serve the actions too.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

from orchestrator.remote.probes import probe
from orchestrator.remote.supervisor import boot_id, starttime

PID_FILE = "server.pid"
EXIT_FILE = "server.exit"
LOG_FILE = "server.log"
LAUNCH_FILE = "launch.json"
STOP_MARKER = "stop_requested"
SUPERVISOR_FILE = "supervise.py"


# ---------------------------------------------------------------------------- /proc helpers


def read_bytes(path: str, limit: int = 1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _stat_fields(pid: int):
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, ...] or None."""
    data = read_bytes(f"/proc/{int(pid)}/stat")
    if not data:
        return None
    try:
        return data.rsplit(b")", 1)[1].split()
    except IndexError:
        return None


def pid_alive(pid) -> bool:
    """True when PID exists and is not a zombie."""
    if not pid:
        return False
    fields = _stat_fields(int(pid))
    return bool(fields) and fields[0] not in (b"Z", b"X")


def cmdline(pid) -> list:
    """The argv of PID (empty when unreadable)."""
    data = read_bytes(f"/proc/{int(pid)}/cmdline")
    if not data:
        return []
    return [p.decode("utf-8", "replace") for p in data.rstrip(b"\0").split(b"\0")]


def pgrp(pid: int):
    fields = _stat_fields(pid)
    try:
        return int(fields[2]) if fields else None
    except (IndexError, ValueError):
        return None


def _all_pids() -> list:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def live_in_group(pgid: int):
    """Yield (pid, state) of each live (non-zombie) process in process group PGID."""
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields and len(fields) > 2 and fields[0] not in (b"Z", b"X"):
            try:
                if int(fields[2]) == pgid:
                    yield pid, fields[0].decode()
            except ValueError:
                continue


def group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process is in process group PGID."""
    return any(True for _ in live_in_group(pgid))


def load_json(path: str):
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None


def _hex_ipv4(text: str) -> str:
    raw = bytes.fromhex(text)
    return socket.inet_ntop(socket.AF_INET, raw[::-1])


def _hex_ipv6(text: str) -> str:
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


# Who listens: asked of the kernel's sock_diag netlink (what `ss -ltn` does), /proc/net/tcp and
# tcp6 only where that is refused (kernel lines: Debian's linux-source-6.1, 6.1.192). Reading
# /proc/net/tcp walks every bucket of the established hash (net/ipv4/tcp_ipv4.c:2410-2436,
# established_get_first), a table sized by the machine's memory: 3.5 ms per file on a 2-core
# box with 262144 buckets, more on a GPU server. A dump asking for LISTEN alone walks only the
# listening hash (net/ipv4/inet_diag.c:1028-1029 walk it, :1080-1081 end before the
# established hash), keeps to the asker's network namespace (:1042, as /proc/net/tcp does) and
# matches the source port in the kernel (:1054-1056).
NETLINK_SOCK_DIAG = 4  # include/uapi/linux/netlink.h:13
SOCK_DIAG_BY_FAMILY = 20  # include/uapi/linux/sock_diag.h:7
_NLM_REQUEST_DUMP = 0x01 | 0x100 | 0x200  # NLM_F_REQUEST | NLM_F_DUMP, netlink.h:62,70-73
_NLMSG_ERROR, _NLMSG_DONE = 2, 3  # netlink.h:113-114
_NLM_F_DUMP_INTR = 0x10  # netlink.h:66: the dump was inconsistent (af_netlink.c:2158)
_TCP_LISTEN = 10
_NLMSGHDR = "=IHHII"  # struct nlmsghdr: len, type, flags, seq, pid (netlink.h:52-58)


def _diag_request(family: int, port: int) -> bytes:
    """A SOCK_DIAG_BY_FAMILY dump request for TCP LISTEN sockets on PORT: struct
    inet_diag_req_v2 (include/uapi/linux/inet_diag.h:38-45) with the port in its struct
    inet_diag_sockid (:14-22, network order); the rest of the sockid zero."""
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
    req += struct.pack(">H", port) + bytes(46)
    return struct.pack(_NLMSGHDR, 16 + len(req), SOCK_DIAG_BY_FAMILY, _NLM_REQUEST_DUMP, 1,
                       0) + req


def _diag_listeners(port: int) -> list:
    """LISTEN sockets on PORT from sock_diag; raises OSError when the kernel will not answer."""
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(5.0)
            nl.sendto(_diag_request(family, int(port)), (0, 0))
            while True:
                data = nl.recv(65536)
                if not data:
                    raise OSError("sock_diag: the netlink socket closed mid-dump")
                if _diag_parse(data, int(port), out):
                    break
    return out


def _diag_parse(data: bytes, port: int, out: list) -> bool:
    """Add to OUT the LISTEN sockets on PORT of one netlink read; True at the dump's end.
    OSError for an error answer, a dump that ended in error or one the kernel marks as
    inconsistent (the table changed under it)."""
    off = 0
    while off + 16 <= len(data):
        length, kind, flags = struct.unpack_from("=IHH", data, off)
        if length < 16:
            raise OSError("sock_diag: a netlink message shorter than its header")
        if flags & _NLM_F_DUMP_INTR:
            raise OSError("sock_diag: the socket table changed during the dump")
        if kind in (_NLMSG_DONE, _NLMSG_ERROR):
            # both carry an errno first: the dump's own one for DONE
            # (net/netlink/af_netlink.c:2153-2159), the request's for ERROR
            err = -struct.unpack_from("=i", data, off + 16)[0] if length >= 20 else 0
            if err > 0 or kind == _NLMSG_ERROR:
                raise OSError(err, "sock_diag: " + (os.strerror(err) if err else "error"))
            return True
        if kind == SOCK_DIAG_BY_FAMILY and length >= 16 + 72:
            # struct inet_diag_msg (inet_diag.h:117-130): family, state, timer, retrans, the
            # sockid (sport at +4, src at +8), then expires, rqueue, wqueue, uid, inode (+68)
            fam, state = data[off + 16], data[off + 17]
            sport = struct.unpack_from(">H", data, off + 20)[0]
            if state == _TCP_LISTEN and sport == port:
                raw = data[off + 24:off + (28 if fam == socket.AF_INET else 40)]
                out.append({"address": socket.inet_ntop(fam, raw),
                            "inode": struct.unpack_from("=I", data, off + 84)[0]})
        off += (length + 3) & ~3
    return False


def _proc_listeners(port: int) -> list:
    """LISTEN sockets on PORT from /proc/net/tcp and tcp6."""
    out = []
    for name, conv in (("/proc/net/tcp", _hex_ipv4), ("/proc/net/tcp6", _hex_ipv6)):
        data = read_bytes(name, 64 << 20)
        if not data:
            continue
        for line in data.decode("ascii", "replace").splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != "0A":
                continue
            addr, _, hexport = parts[1].partition(":")
            try:
                if int(hexport, 16) != int(port):
                    continue
                out.append({"address": conv(addr), "inode": int(parts[9])})
            except ValueError:
                continue
    return out


def listening_sockets(port: int, via: str = "") -> list:
    """LISTEN sockets on PORT: [{"address", "inode"}], IPv4 first. VIA "netlink" or "proc"
    forces one source; by default sock_diag, and /proc/net/tcp where the kernel refuses it
    (no inet_diag module, a seccomp filter, a kernel without AF_NETLINK)."""
    if via != "proc":
        try:
            return _diag_listeners(port)
        except OSError:
            if via == "netlink":
                raise
    return _proc_listeners(port)


def _address_matches(bound: str, wanted) -> bool:
    if not wanted or wanted in ("0.0.0.0", "::"):
        return True
    if bound in ("0.0.0.0", "::", wanted):
        return True
    return bound.startswith("::ffff:") and bound[7:] == wanted


def socket_owners(inodes, candidates=None) -> dict:
    """{inode: pid} for sockets held by processes (CANDIDATES first, then every process)."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    found = {}
    seen = set()
    for group in (list(candidates or []), None):
        pids = group if group is not None else _all_pids()
        for pid in pids:
            if pid in seen:
                continue
            seen.add(pid)
            fd_dir = f"/proc/{pid}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd_dir + "/" + fd)
                except OSError:
                    continue
                if target in wanted and wanted[target] not in found:
                    found[wanted[target]] = pid
            if len(found) == len(wanted):
                return found
    return found


def _tree(pid) -> list:
    """PID and its descendants, from /proc/PID/task/*/children (no scan of every process)."""
    out, todo = [], [int(pid)] if pid else []
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            raw = read_bytes(f"/proc/{p}/task/{tid}/children") or b""
            todo.extend(int(c) for c in raw.split() if c.isdigit() and int(c) not in out)
    return out


def _group_pids(pgid) -> list:
    """Our server's processes to look at first: the group leader's process tree (the group's
    leader is the supervisor's child, pid == pgid); its other members only if that fails."""
    if not pgid:
        return []
    tree = _tree(pgid)
    return tree if len(tree) > 1 or os.path.exists(f"/proc/{int(pgid)}") else [
        pid for pid, _ in live_in_group(int(pgid))]


def port_listener(host, port, ours_pgid=None) -> dict | None:
    """Who listens on host:port: {"pid", "cmdline", "address", "ours"} or None when free."""
    socks = [s for s in listening_sockets(port) if _address_matches(s["address"], host)]
    if not socks:
        return None
    owners = socket_owners([s["inode"] for s in socks], _group_pids(ours_pgid))
    sock = socks[0]
    pid = None
    for s in socks:
        if s["inode"] in owners:
            sock, pid = s, owners[s["inode"]]
            break
    return {
        "pid": pid,
        "cmdline": cmdline(pid) if pid else [],
        "address": sock["address"],
        "ours": bool(pid and ours_pgid and pgrp(pid) == ours_pgid),
    }


# ---------------------------------------------------------------------------- http


def _no_proxy_opener():
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _error_text(exc) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(reason, ConnectionResetError):
        return "connection reset"
    name = type(reason).__name__
    if name == "RemoteDisconnected":
        return "connection closed by the server"
    return f"{name}: {reason}"


class BadStatusLine(Exception):
    """The answer did not start with an HTTP status line (named as http.client's error)."""


class HTTPException(Exception):
    """An answer http.client would refuse (named as its error)."""


class IncompleteRead(Exception):
    """The server closed the connection before the body it announced had come."""


#: what urllib.request sends with every request (CPython 3.11 Lib/urllib/request.py:428-429 the
#: OpenerDirector's User-agent, :1333 Connection: close; Lib/http/client.py:1207
#: Accept-Encoding: identity)
_URLLIB_HEADERS = {"User-Agent": "Python-urllib/{}.{}".format(*sys.version_info[:2]),
                   "Accept-Encoding": "identity", "Connection": "close"}
_MAXLINE = 65536  # http.client's line limit (Lib/http/client.py:111)


def _split_http_url(url: str):
    """(host, port, Host header, request target) of a plain http:// URL; None for anything the
    few lines below do not handle (https, user info, non-ASCII, a bad port): urllib does."""
    if not url.startswith("http://") or not url.isascii():
        return None
    rest = url[len("http://"):].split("#", 1)[0]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, target = rest[:cut], rest[cut:]
    if not netloc or "@" in netloc:
        return None
    if netloc.startswith("["):  # an IPv6 literal: [::1]:8000
        host, _, after = netloc[1:].partition("]")
        if after and not after.startswith(":"):
            return None
        port = after[1:]
    else:
        host, _, port = netloc.partition(":")
    if not host or (port and not port.isdigit()):
        return None
    target = target if target.startswith("/") else "/" + target
    return host, int(port or 80), netloc, target


def _read_head(fp):
    """Status and headers of an HTTP/1.x answer, skipping `100 Continue` as http.client does
    (Lib/http/client.py:285-315 _read_status, :318-334 begin)."""
    while True:
        line = fp.readline(_MAXLINE + 1)
        if not line:
            raise ConnectionResetError("Remote end closed connection without response")
        parts = line.decode("iso-8859-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit() \
                or not 100 <= int(parts[1]) <= 999:
            raise BadStatusLine(line.decode("iso-8859-1").strip())
        headers, count = {}, 0
        while True:
            field = fp.readline(_MAXLINE + 1)
            if field in (b"\r\n", b"\n", b""):
                break
            count += 1
            if count > 100:  # as http.client (Lib/http/client.py:112, :225-226)
                raise HTTPException("got more than 100 headers")
            name, _, value = field.decode("iso-8859-1").partition(":")
            headers[name.strip()] = value.strip()
        if int(parts[1]) != 100:
            return int(parts[1]), headers


def _read_body(fp, status: int, headers: dict, method: str, max_bytes: int) -> bytes:
    """Up to MAX_BYTES of the body, framed as RFC 9112 section 6.3 says and http.client reads
    it (Lib/http/client.py:350-379): none for HEAD, 1xx, 204 and 304; chunked; Content-Length;
    else until the server closes."""
    lower = {k.lower(): v for k, v in headers.items()}
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return b""
    if lower.get("transfer-encoding", "").lower() == "chunked":
        parts, total = [], 0
        while total < max_bytes:
            size = int(fp.readline(_MAXLINE + 1).split(b";", 1)[0], 16)
            if size == 0:
                break
            chunk = fp.read(size)
            if len(chunk) < size:
                raise IncompleteRead(f"{len(chunk)} bytes read, {size - len(chunk)} more expected")
            parts.append(chunk)
            total += size
            fp.readline(_MAXLINE + 1)  # the CRLF after each chunk
        return b"".join(parts)[:max_bytes]
    length = lower.get("content-length", "")
    if not length.strip().isdigit():
        return fp.read(max_bytes)
    want = min(int(length), max_bytes)
    data = fp.read(want)
    if len(data) < want:
        raise IncompleteRead(f"{len(data)} bytes read, {want - len(data)} more expected")
    return data


def _plain_http(url: str, method: str, headers: dict, data, timeout: float, max_bytes: int,
                out: dict) -> bool:
    """A GET or HEAD of a plain http:// URL over one socket, filling OUT as `http` does; False
    (OUT untouched) when urllib must do it: another method or URL, or a redirect (urllib
    follows 301/302/303/307/308 for GET and HEAD: Lib/urllib/request.py:653-670).

    The agent's health and model checks are such requests. Importing urllib.request and
    http.client (email, ssl, calendar, base64) costs the agent ~35 ms of CPU, a fifth of what
    it spends on a converged host; this costs a socket."""
    parts = _split_http_url(url) if method in ("GET", "HEAD") and data is None else None
    if parts is None:
        return False
    host, port, netloc, target = parts
    send = dict(_URLLIB_HEADERS, Host=netloc)
    send.update(headers)
    fields = "".join(f"{name}: {value}\r\n" for name, value in send.items())
    head = f"{method} {target} HTTP/1.1\r\n{fields}\r\n"
    # bytes, not str: socket.getaddrinfo would encode a str host with the idna codec
    # (Modules/socketmodule.c socket_getaddrinfo), importing unicodedata
    with socket.create_connection((host.encode("ascii"), port), timeout=timeout) as sock:
        sock.sendall(head.encode("iso-8859-1"))
        with sock.makefile("rb") as fp:
            status, got = _read_head(fp)
            if status in (301, 302, 303, 307, 308):
                return False
            out["status"], out["headers"] = status, got
            out["body"] = _read_body(fp, status, got, method, max_bytes).decode(
                "utf-8", "replace")
    return True


def _urllib_http(url: str, method: str, headers: dict, data, timeout: float, max_bytes: int,
                 out: dict) -> None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with _no_proxy_opener().open(req, timeout=timeout) as resp:
            out["status"] = resp.status
            out["headers"] = dict(resp.headers.items())
            out["body"] = resp.read(max_bytes).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        out["status"] = exc.code
        out["headers"] = dict(exc.headers.items()) if exc.headers else {}
        try:
            out["body"] = exc.read(max_bytes).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - the status is what matters
            out["body"] = ""


@probe("http")
def http(url: str, method: str = "GET", headers=None, body=None, timeout: float = 10.0,
         max_bytes: int = 4 << 20, until_ok: float = 0.0) -> dict:
    """One HTTP request; never raises for HTTP or connection errors. Plain http:// GETs go
    over a socket (`_plain_http`), anything else through urllib (no proxies). With UNTIL_OK
    seconds, the request is repeated every 0.1 s until it answers 200 or that time is up
    (a readiness wait that notices the server within 0.1 s at one round trip per poll).

    Returns {"status": int | None, "headers": {...}, "body": text, "error": None | "connection
    refused" | "timed out" | ..., "elapsed": seconds}.
    """
    deadline = time.monotonic() + float(until_ok)
    while True:
        out = _http_once(url, method, headers, body, timeout, max_bytes)
        if out["status"] == 200 or time.monotonic() + 0.1 >= deadline:
            return out
        time.sleep(0.1)


def _http_once(url: str, method: str, headers, body, timeout: float, max_bytes: int) -> dict:
    data = None
    if body is not None:
        data = body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode()
    headers = dict(headers or {})
    if data is not None and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    t0 = time.monotonic()
    out = {"status": None, "headers": {}, "body": "", "error": None}
    try:
        if not _plain_http(url, method, headers, data, float(timeout), max_bytes, out):
            _urllib_http(url, method, headers, data, float(timeout), max_bytes, out)
    except Exception as exc:  # noqa: BLE001 - reported as data, never raised
        out["error"] = _error_text(exc)
    out["elapsed"] = round(time.monotonic() - t0, 4)
    return out


# ---------------------------------------------------------------------------- logs


def _tail(path: str, lines: int, max_bytes: int = 256 * 1024, complete: bool = False):
    """(the last LINES lines, the offset just after them, the file's inode); with COMPLETE, a
    last line still being written (no newline yet) is left out, for the next read."""
    try:
        with open(path, "rb") as fh:
            inode = os.fstat(fh.fileno()).st_ino
            fh.seek(0, 2)
            start = max(0, fh.tell() - max_bytes)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return [], 0, None
    end = data.rfind(b"\n") + 1 if complete else len(data)
    text = data[:end].decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    got = [ln for ln in text.split("\n") if ln.strip()]
    return (got[-int(lines):] if lines > 0 else []), start + end, inode


def tail_lines(path: str, lines: int, max_bytes: int = 256 * 1024) -> list:
    return _tail(path, lines, max_bytes)[0]


@probe("log_tail")
def log_tail(path: str, lines: int = 50, complete: bool = False) -> dict:
    """The last LINES non-empty lines of PATH (progress bars' \\r updates count as lines).

    "offset" and "inode" say where they end: with COMPLETE (only whole lines), `log_read` from
    there misses no line and repeats none (logs -f).
    """
    exists = os.path.exists(path)
    got, offset, inode = _tail(path, lines, complete=complete) if exists else ([], 0, None)
    return {"path": path, "exists": exists, "lines": got, "offset": offset, "inode": inode}


@probe("log_read")
def log_read(path: str, offset: int = 0, inode=None, max_bytes: int = 1 << 20,
             from_end: bool = False) -> dict:
    """Bytes of PATH from OFFSET (restarting at 0 when the file was rotated or truncated).

    With FROM_END, no data: just the current end offset and inode (where following starts).
    """
    try:
        st = os.stat(path)
    except OSError:
        return {"exists": False, "data": "", "offset": 0, "inode": None, "rotated": False}
    if from_end:
        return {"exists": True, "data": "", "offset": st.st_size, "inode": st.st_ino,
                "rotated": False}
    rotated = inode is not None and st.st_ino != inode
    if rotated or st.st_size < offset:
        offset = 0
        rotated = True
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(max_bytes)
    return {"exists": True, "data": data.decode("utf-8", "replace"),
            "offset": offset + len(data), "inode": st.st_ino, "rotated": rotated}


# ---------------------------------------------------------------------------- status


def state_paths(state_dir: str) -> dict:
    d = os.path.abspath(os.path.expanduser(state_dir))
    return {
        "dir": d, "pid": os.path.join(d, PID_FILE), "exit": os.path.join(d, EXIT_FILE),
        "log": os.path.join(d, LOG_FILE), "launch": os.path.join(d, LAUNCH_FILE),
        "stop": os.path.join(d, STOP_MARKER), "fingerprint": os.path.join(d, "fingerprint.json"),
    }


def process_view(pidfile) -> dict:
    """Liveness of the recorded server: alive and the very process we started?"""
    out = {"pid": None, "alive": False, "same_process": False, "supervisor_alive": False,
           "cmdline": [], "uptime_s": None}
    if not isinstance(pidfile, dict) or not pidfile.get("pid"):
        return out
    pid = int(pidfile["pid"])
    out["pid"] = pid
    out["alive"] = pid_alive(pid)
    boot = boot_id()
    same_boot = not pidfile.get("boot_id") or not boot or pidfile.get("boot_id") == boot
    out["same_process"] = bool(out["alive"] and same_boot and pidfile.get("starttime") is not None
                               and starttime(pid) == pidfile.get("starttime"))
    if out["same_process"]:
        out["cmdline"] = cmdline(pid)
        if pidfile.get("started_at"):
            out["uptime_s"] = round(time.time() - float(pidfile["started_at"]), 1)
    sup = pidfile.get("supervisor_pid")
    out["supervisor_alive"] = bool(sup and pid_alive(sup) and same_boot)
    return out


@probe("server_status")
def server_status(state_dir: str, host=None, port=None, health_path: str = "/health",
                  health_timeout: float = 5.0, log_lines: int = 0) -> dict:
    """Everything `check()` needs about the server of STATE_DIR, in one round trip."""
    p = state_paths(state_dir)
    pidfile = load_json(p["pid"])
    proc = process_view(pidfile)
    exit_rec = load_json(p["exit"])
    if isinstance(exit_rec, dict) and isinstance(pidfile, dict) and exit_rec.get("pid") not in (
            None, pidfile.get("pid")):
        exit_rec = None  # an older run's exit record
    out = {
        "state_dir": p["dir"], "pidfile": pidfile, "process": proc, "exit": exit_rec,
        "stop_requested": os.path.exists(p["stop"]),
        "fingerprint": load_json(p["fingerprint"]), "launch_exists": os.path.exists(p["launch"]),
        "log_path": p["log"], "listener": None, "health": None, "log_tail": [],
    }
    if port:
        ours = pidfile.get("pgid") if proc["same_process"] and isinstance(pidfile, dict) else None
        out["listener"] = port_listener(host, int(port), ours)
        if out["listener"] is not None and health_path:
            target = host if host and host not in ("0.0.0.0", "::") else "127.0.0.1"
            if ":" in target:
                target = "[" + target + "]"
            out["health"] = http(f"http://{target}:{int(port)}{health_path}",
                                 timeout=health_timeout)
    if log_lines:
        out["log_tail"] = tail_lines(p["log"], log_lines)
    return out



@probe("systemd")
def systemd_info() -> dict:
    """Whether systemd manages this host: PID 1 is systemd and systemctl is on PATH."""
    import shutil

    comm = read_bytes("/proc/1/comm")
    return {
        "booted": os.path.isdir("/run/systemd/system"),
        "pid1": comm.decode().strip() if comm else None,
        "systemctl": shutil.which("systemctl"),
        "uid": os.getuid(),
        "python": sys.executable,
    }
