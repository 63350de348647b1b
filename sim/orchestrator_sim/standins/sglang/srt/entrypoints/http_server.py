"""HTTP server of the stand-in: SGLang's routes on a stdlib ThreadingHTTPServer.

Start-up order as in SGLang: parse and validate the arguments, load (port closed), bind, warm up
(`/health` answers 503), then log `The server is fired up and ready to roll!`. SIGTERM or SIGINT
turns `/health` to 503, lets running requests finish briefly, stops and gives the GPU memory back.

Each behaviour cites the real source (paths relative to sglang/, `hs` = srt/entrypoints/
http_server.py, `tm` = srt/managers/tokenizer_manager.py, `oai` = srt/entrypoints/openai/).
Bodies are compact JSON, as FastAPI's ORJSONResponse and pydantic's model_dump_json write them.

What the gateway (SMG 1.13.0, the sdist's model_gateway/src/) asks a replica, answered here as
SGLang answers it: GET /health every health-check interval (wheel smg/router_args.py:166,
worker/worker.rs:3137-3138 with the Bearer key); on registration GET /v1/models, whose
`owned_by: "sglang"` makes it an SGLang worker (workflow/steps/local/detect_backend.rs:83-128),
then /server_info and /model_info (discover_metadata.rs:173-205); for loads GET
/v1/loads?include=... first (worker/monitor.rs:249-257), then /metrics with the gauges
sglang:token_usage, num_running_reqs, num_queue_reqs (monitor.rs:1081-1100). Known gap: real
0.5.23 serves /v1/loads (srt/entrypoints/v1_loads.py:96, included at hs:519-523) and this
stand-in does not (404), so SMG takes its /metrics fallback; only load-aware policies see the
difference, not round_robin nor the orchestrator's drain proof (which reads /metrics itself).
"""

from __future__ import annotations

import json
import math
import os
import queue
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from sglang.srt import hardware, sim_faults
from sglang.srt.engine import Req, Scheduler
from sglang.srt.hf_config import KIMI_K25_ARCHITECTURES
from sglang.srt.model_loader import ModelLoader, Stopped
from sglang.srt.utils import at_least, log, set_on_signals, uvicorn
from sglang.version import __version__

HEALTH_TIMEOUT = 20.0
_PHRASES = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 503: "Service Unavailable"}


class BadRequest(Exception):
    """A request the OpenAI-compatible API answers with 400."""

    def __init__(self, message: str, err_type: str = "") -> None:
        super().__init__(message)
        self.err_type = err_type


class App:
    """Shared state of the running server."""

    def __init__(self, server_args, loaded, scheduler, dummy: bool = False) -> None:
        self.args = server_args
        self.loaded = loaded
        self.scheduler = scheduler
        self.dummy = dummy
        self.state = "starting"  # starting -> ready -> shutting_down
        # ServerStatus: Up after the warm-up, UnHealthy after a /health that timed out, Up again
        # after one that answered (0.5.20 hs:670-740)
        self.unhealthy = False
        self.created = int(time.time())
        self.startup_time = None
        self.inflight = 0
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ requests
    def new_request(self, prompt_tokens: int, max_new_tokens, seed: int,
                    ignore_eos: bool = False) -> Req:
        ctx = self.loaded.context_len
        if prompt_tokens >= ctx:
            raise BadRequest(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({ctx} tokens)."
            )
        if max_new_tokens is None:
            if ignore_eos:
                max_new, reason = 128, "length"
            else:
                max_new, reason = 16 + seed % 48, "stop"
        else:
            try:
                max_new = int(max_new_tokens)
            except (TypeError, ValueError):
                raise BadRequest("max_tokens must be an integer") from None
            if max_new < 1:
                raise BadRequest(f"max_tokens must be at least 1, got {max_new}.")
            reason = "length"
            if prompt_tokens + max_new > ctx:
                raise BadRequest(
                    f"Requested token count exceeds the model's maximum context length of {ctx} "
                    f"tokens. You requested a total of {prompt_tokens + max_new} tokens: "
                    f"{prompt_tokens} tokens from the input messages and {max_new} tokens for the "
                    "completion. Please reduce the number of tokens in the input messages or the "
                    "completion to fit within the limit."
                )
        if self.scheduler is None:
            raise BadRequest("this node does not serve requests")
        return self.scheduler.submit(Req(prompt_tokens, max_new, reason, seed))

    def run_to_end(self, req: Req, timeout: float = 3600.0) -> dict:
        """Wait for `req` to finish; return text, counts and virtual timings."""
        pieces = []
        while True:
            kind, value, vtime = req.out.get(timeout=timeout)
            if kind == "tokens":
                pieces.append(req.words(*value))
            elif kind == "finish":
                return {"text": "".join(pieces), "finish_reason": value, "vtime": vtime}
            else:
                raise RuntimeError(value)

    def model_info(self) -> dict:
        """/model_info: 0.5.9 hs:553-569 (model_path, tokenizer_path, is_generation,
        preferred_sampling_params, weight_version, has_*_understanding, model_type,
        architectures); 0.5.19 hs:753-788 and 0.5.20 hs:760 add served_model_name, load_format,
        reasoning_parser, tool_call_parser; 0.5.23 hs:812-848 also disaggregation_mode."""
        cfg = self.loaded.hf_config
        args = self.args
        new = at_least(0, 5, 19)
        info = {"model_path": args.model_path}
        if new:
            info["served_model_name"] = args.served_model_name
        info.update({
            "tokenizer_path": args.tokenizer_path,
            "is_generation": not getattr(args, "is_embedding", False),
            "preferred_sampling_params": getattr(args, "preferred_sampling_params", None),
            "weight_version": getattr(args, "weight_version", "default"),
        })
        if new:
            for key in ("load_format", "reasoning_parser", "tool_call_parser"):
                info[key] = getattr(args, key, None)
            if at_least(0, 5, 21):  # hs:812-813 (0.5.21), :818 (0.5.22), :834 (0.5.23)
                info["disaggregation_mode"] = getattr(args, "disaggregation_mode", "null")
        info.update({
            "has_image_understanding": cfg.arch in KIMI_K25_ARCHITECTURES,
            "has_audio_understanding": False,
            "model_type": cfg.model_type,
            "architectures": cfg.architectures,
        })
        return info

    def server_info(self) -> dict:
        """/server_info: {**server_args, **scheduler_info, internal_states, version}
        (0.5.9 hs:593-611). `launch_command` (the launcher's argv, 0.5.20 server_args.py:736)
        and startup_time from 0.5.20 (hs:836-849), kv_events too; frontend "python" in 0.5.23
        (hs:880-890, utils/common.py:3584-3590). last_gen_throughput and the accept length
        live inside internal_states[i] only."""
        info = self.args.to_dict()
        if at_least(0, 5, 20):
            info["launch_command"] = getattr(self.args, "_launch_command", None)
        info.update({
            "status": "ready",
            "max_total_num_tokens": self.loaded.max_total_num_tokens,
            "max_req_input_len": self.loaded.context_len - 1,
        })
        if at_least(0, 5, 20):
            info["kv_events"] = None
            info["startup_time"] = self.startup_time
        internal = self.scheduler.internal_state() if self.scheduler else None
        info["internal_states"] = [internal] if internal is not None else []
        info["version"] = __version__
        if at_least(0, 5, 21):  # hs:868 (0.5.21), :873 (0.5.22), :889 (0.5.23)
            info["frontend"] = "python"
        return info

    def metrics(self) -> str:
        s = self.scheduler
        name = self.args.served_model_name.replace('"', '\\"')
        labels = '{model_name="' + name + '",engine_type="unified",tp_rank="0",pp_rank="0"}'
        rows = [
            ("gauge", "num_running_reqs", "The number of running requests.", len(s.running)),
            ("gauge", "num_queue_reqs", "The number of requests in the waiting queue.",
             len(s.waiting)),
            ("gauge", "gen_throughput", "The generation throughput (token/s).",
             s.last_gen_throughput),
            ("gauge", "token_usage", "The token usage.", s._usage()),
            ("gauge", "cache_hit_rate", "The prefix cache hit rate.", 0.0),
            # gauges set at decode-log time from that window (0.5.9
            # managers/scheduler_metrics_mixin.py:420-437, srt/metrics/collector.py:387-398)
            ("gauge", "spec_accept_length", "The average acceptance length of speculative "
             "decoding.", s.last_spec_accept_length),
            ("gauge", "spec_accept_rate", "The average acceptance rate of speculative decoding "
             "(accepted tokens / draft tokens).", s.last_spec_accept_rate),
            ("counter", "prompt_tokens_total", "Number of prefill tokens processed.",
             s.prompt_tokens_total),
            ("counter", "generation_tokens_total", "Number of generation tokens processed.",
             s.generation_tokens_total),
            ("counter", "num_requests_total", "Number of requests processed.", s.num_requests),
        ]
        out = []
        for kind, name, doc, value in rows:
            out.append(f"# HELP sglang:{name} {doc}")
            out.append(f"# TYPE sglang:{name} {kind}")
            out.append(f"sglang:{name}{labels} {float(value)}")
        return "\n".join(out) + "\n"


def spec_meta(req: Req, num_draft_tokens: int) -> dict:
    """The speculation fields of a finished request's meta_info (only when it verified at
    least once). spec_accept_length = completion_tokens / spec_verify_ct in every release.

    0.5.9/0.5.10: spec_accept_rate (accepted drafts / (verify_ct x (num_draft_tokens - 1))),
    spec_accept_length, spec_accept_token_num, spec_draft_token_num, spec_verify_ct,
    spec_accept_histogram (tm 0.5.9:1825-1867, 0.5.10:1902-1941).
    0.5.12-0.5.20: spec_accept_rate, spec_accept_length, spec_num_correct_drafts,
    spec_num_proposed_drafts, spec_verify_ct, the aliases spec_accepted_drafts /
    spec_proposed_drafts, spec_correct_drafts_histogram and its alias spec_accept_histogram
    (tm 0.5.12:2103-2155, 0.5.15:2334-2386, 0.5.19:2785-2862, 0.5.20:2922-2999).
    0.5.23: the same without the aliases (tm 0.5.23:3138-3210).
    """
    meta = {}
    verify = req.steps
    proposed = verify * (num_draft_tokens - 1)
    if verify <= 0:
        return meta
    if proposed > 0:
        meta["spec_accept_rate"] = req.correct_drafts / float(proposed)
        meta["spec_accept_length"] = req.generated / float(verify)
        if at_least(0, 5, 12):
            meta["spec_num_correct_drafts"] = req.correct_drafts
            meta["spec_num_proposed_drafts"] = proposed
            meta["spec_verify_ct"] = verify
            if not at_least(0, 5, 21):  # aliases: tm:2978-2991 (0.5.20); gone in 0.5.21
                meta["spec_accepted_drafts"] = req.correct_drafts
                meta["spec_proposed_drafts"] = proposed
        else:
            meta["spec_accept_token_num"] = req.correct_drafts
            meta["spec_draft_token_num"] = proposed
            meta["spec_verify_ct"] = verify
    if req.histogram:
        if at_least(0, 5, 12):
            meta["spec_correct_drafts_histogram"] = list(req.histogram)
            if not at_least(0, 5, 21):
                meta["spec_accept_histogram"] = list(req.histogram)
        else:
            meta["spec_accept_histogram"] = list(req.histogram)
    return meta


def spec_tokens_details(meta: dict):
    """SpecTokensDetails from a meta_info, or None when it has no speculation field
    (0.5.19 oai/utils.py:158-189, oai/protocol.py:418-429)."""
    keys = ("spec_accept_rate", "spec_accept_length", "spec_cap_length",
            "spec_block_accept_length", "spec_num_correct_drafts", "spec_num_proposed_drafts",
            "spec_verify_ct", "spec_correct_drafts_histogram", "spec_cap_lens_histogram")
    if not any(k in meta for k in keys):
        return None
    return {
        "spec_accept_rate": meta.get("spec_accept_rate") or 0.0,
        "spec_accept_length": meta.get("spec_accept_length") or 0.0,
        "spec_cap_length": meta.get("spec_cap_length") or 0.0,
        "spec_block_accept_length": meta.get("spec_block_accept_length") or 0.0,
        "spec_num_correct_drafts": meta.get("spec_num_correct_drafts") or 0,
        "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts") or 0,
        "spec_verify_ct": meta.get("spec_verify_ct") or 0,
        "spec_correct_drafts_histogram": meta.get("spec_correct_drafts_histogram") or [],
        "spec_cap_lens_histogram": meta.get("spec_cap_lens_histogram") or [],
    }


def auth_allowed(method: str, path: str, authorization, api_key, admin_api_key,
                 admin_optional: bool = False) -> bool:
    """SGLang's decide_request_auth for NORMAL and ADMIN_OPTIONAL routes.

    OPTIONS and the path prefixes /health and /metrics always pass (0.5.9-0.5.19
    srt/utils/auth.py:97-101), /ready too from 0.5.20 (0.5.20/0.5.23 auth.py:98-106). Else a
    `Bearer <key>` header ("bearer" in any case, constant-time compare, auth.py:103-112):
    ADMIN_OPTIONAL routes want the admin key when one is set, else the api key; normal routes
    want the api key when one is set (auth.py:123-145).
    """
    if method == "OPTIONS":
        return True
    if path.startswith("/health") or path.startswith("/metrics"):
        return True
    if at_least(0, 5, 20) and path.startswith("/ready"):
        return True

    def bearer(expected: str) -> bool:
        if not authorization:
            return False
        parts = authorization.split(" ", 1)
        if len(parts) != 2 or parts[0].lower() != "bearer":
            return False
        return secrets.compare_digest(parts[1].encode(), expected.encode())

    if admin_optional:
        if admin_api_key:
            return bearer(admin_api_key)
        if api_key:
            return bearer(api_key)
        return True
    if api_key:
        return bearer(api_key)
    return True


def _count_tokens(text: str) -> int:
    return max(1, int(math.ceil(len(text) / 4.0)))


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict)
        )
    return ""


def _seed(obj) -> int:
    return zlib.crc32(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"))


class Handler(BaseHTTPRequestHandler):
    """Routes of SGLang's HTTP server (OpenAI-compatible and native)."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    # ------------------------------------------------------------------ plumbing
    @property
    def app(self) -> App:
        return self.server.app  # type: ignore[attr-defined]

    def log_request(self, code="-", size="-") -> None:
        code = int(code) if str(code).isdigit() else 0
        host, port = self.client_address[:2]
        line = f'{host}:{port} - "{self.requestline}" {code} {_PHRASES.get(code, "")}'
        uvicorn("INFO", line.rstrip(), access=True)

    def log_message(self, format, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        if ctype:
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj, separators=(",", ":")).encode("utf-8"))

    def _error(self, status: int, message: str, err_type: str = "") -> None:
        # ErrorResponse (oai/serving_base.py 0.5.15:209-225)
        self._json(status, {"object": "error", "message": message,
                            "type": err_type or ("BadRequestError" if status == 400 else "Error"),
                            "param": None, "code": status})

    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _sse(self, payload) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        chunk = ("data: " + data + "\n\n").encode("utf-8")
        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.flush()

    def _sse_end(self) -> None:
        self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # ------------------------------------------------------------------ dispatch
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_OPTIONS(self) -> None:
        if self.headers.get("Origin") and self.headers.get("Access-Control-Request-Method"):
            # a CORS preflight, answered by CORSMiddleware(allow_origins=["*"]) (0.5.9 hs:366-372)
            self._read_body()
            self.send_response(200)
            self.send_header("access-control-allow-origin", "*")
            self.send_header("access-control-allow-methods",
                             "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT")
            self.send_header("access-control-allow-credentials", "true")
            self.send_header("access-control-max-age", "600")
            self.send_header("content-type", "text/plain; charset=utf-8")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"OK")
            return
        self._dispatch("OPTIONS")

    def _dispatch(self, method: str) -> None:
        raw = self._read_body()
        path = urlsplit(self.path).path
        app = self.app
        if app.dummy:  # utils/common.py:2665-2677 (0.5.9), :3635-3648 (0.5.23)
            if path in ("/health", "/health_generate", "/ping"):
                self._send(200, b"", "")
            else:
                self._json(404, {"detail": "Not Found"})
            return
        # the API-key middleware runs before routing: a missing route answers 401 without a key
        # and 404 with one (0.5.9 srt/utils/auth.py:160-199; hs:1939-1950)
        api_key = app.args.api_key
        admin_key = getattr(app.args, "admin_api_key", None)
        if (api_key or admin_key) and not auth_allowed(
                method, path, self.headers.get("Authorization"), api_key, admin_key,
                admin_optional=path in ("/flush_cache",)):
            self._json(401, {"error": "Unauthorized"})  # auth.py:187-199, ORJSONResponse
            return
        routes = {
            "/health": (("GET",), self._health),
            "/health_generate": (("GET",), self._health),
            "/model_info": (("GET",), lambda b: self._json(200, app.model_info())),
            "/get_model_info": (("GET",), self._get_model_info),
            "/server_info": (("GET",), lambda b: self._json(200, app.server_info())),
            "/get_server_info": (("GET",), self._get_server_info),
            "/version": (("GET",), lambda b: self._json(200, {"version": __version__})),
            "/v1/models": (("GET",), self._models),
            "/flush_cache": (("GET", "POST"), self._flush_cache),
            "/generate": (("POST", "PUT"), self._generate),
            "/v1/completions": (("POST",), self._completions),
            "/v1/chat/completions": (("POST",), self._chat),
        }
        if at_least(0, 5, 20):  # /ready: 0.5.20 hs:662-666, 0.5.23 hs:714-718; absent before
            routes["/ready"] = (("GET",), self._ready)
        if app.args.enable_metrics:  # a Prometheus mount only with --enable-metrics (hs:263-264)
            routes["/metrics"] = (("GET",), self._metrics)
        if path.startswith("/v1/models/") and path not in routes:
            routes[path] = (("GET",), lambda b: self._model_card(path[len("/v1/models/"):]))
        if path not in routes:
            self._json(404, {"detail": "Not Found"})
            return
        methods, fn = routes[path]
        if method == "HEAD" and "GET" in methods:
            method = "GET"
        if method not in methods:
            self._json(405, {"detail": "Method Not Allowed"})
            return
        body = None
        if method in ("POST", "PUT") and path not in ("/flush_cache",):
            try:
                body = json.loads(raw.decode("utf-8") or "null")
            except ValueError:
                self._error(400, "Invalid JSON body")
                return
            if not isinstance(body, dict):
                self._error(400, "The request body must be a JSON object")
                return
        with app.lock:
            app.inflight += 1
        try:
            fn(body)
        except BadRequest as exc:
            self._error(400, str(exc), exc.err_type)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # like uvicorn: log it, answer 500/503 if still possible
            traceback.print_exc()
            self.close_connection = True
            status = 503 if app.state == "shutting_down" else 500
            try:
                self._error(status, f"{type(exc).__name__}: {exc}")
            except OSError:
                pass
        finally:
            with app.lock:
                app.inflight -= 1

    # ------------------------------------------------------------------ routes
    def _health(self, body) -> None:
        app = self.app
        if app.state != "ready":
            self._send(503, b"", "")
            return
        if urlsplit(self.path).path == "/health" and not _health_generates():
            # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false: /health answers 200 without
            # generating, /health_generate still generates (hs:481-485 (0.5.9), :745-749
            # (0.5.23))
            self._send(200, b"", "")
            return
        req = app.scheduler.submit(Req(1, 1, "length", 0, health=True))
        try:
            app.run_to_end(req, timeout=HEALTH_TIMEOUT)
        except (queue.Empty, RuntimeError):
            req.aborted = True
            app.unhealthy = True  # ServerStatus.UnHealthy (0.5.20 hs:746)
            self._send(503, b"", "")
            return
        app.unhealthy = False  # ServerStatus.Up (0.5.20 hs:732)
        self._send(200, b"", "")

    def _ready(self, body) -> None:
        """200 when the server takes requests, else 503; empty body (0.5.20 hs:662-666,
        is_ready tm 0.5.20:672-678; 0.5.23 hs:714-718, tm:728-734)."""
        app = self.app
        ok = app.state == "ready" and not app.unhealthy
        self._send(200 if ok else 503, b"", "")

    def _get_model_info(self, body) -> None:
        # deprecated alias, logged in every release (0.5.9 hs:543-550; 0.5.23 hs:802-809)
        log("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
            "Please use '/model_info' instead.")
        self._json(200, self.app.model_info())

    def _get_server_info(self, body) -> None:
        # deprecated alias, logged in every release (0.5.9 hs:583-590; 0.5.23 hs:853-860)
        log("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead.")
        self._json(200, self.app.server_info())

    def _card(self, name: str) -> dict:
        # ModelCard (0.5.9 oai/protocol.py:53-62; 0.5.23 :87-96): `created` is the answer's time
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": name, "parent": None, "max_model_len": self.app.loaded.context_len}

    def _models(self, body) -> None:
        # id and root = served_model_name, max_model_len = context_len (0.5.9 hs:1421-1450)
        self._json(200, {"object": "list", "data": [self._card(self.app.args.served_model_name)]})

    def _model_card(self, name: str) -> None:
        # /v1/models/{model:path} (0.5.9 hs:1453-1476)
        if name != self.app.args.served_model_name:
            self._json(404, {"error": {"message": f"The model '{name}' does not exist",
                                       "type": "invalid_request_error", "param": "model",
                                       "code": "model_not_found"}})
            return
        self._json(200, self._card(name))

    def _flush_cache(self, body) -> None:
        """Flushes (and resets the speculation totals) only when idle (0.5.9 hs:710-718,
        scheduler.py:2623-2648); the failure text is "Flush cache failed." from 0.5.10
        (hs 0.5.10:729)."""
        ok = self.app.scheduler.call(self.app.scheduler.flush_cache)
        if ok is True or not at_least(0, 5, 10):
            text = (b"Cache flushed.\nPlease check backend logs for more details. (When "
                    b"there are running or waiting requests, the operation will not be "
                    b"performed.)\n")
        else:
            text = b"Flush cache failed.\n"
        self._send(200 if ok is True else 400, text, "text/plain; charset=utf-8")

    def _metrics(self, body) -> None:
        self._send(200, self.app.metrics().encode("utf-8"), "text/plain; version=0.0.4")

    def _generate(self, body) -> None:
        app = self.app
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        text, ids = body.get("text"), body.get("input_ids")
        if text is None and ids is None:
            raise BadRequest("Either text or input_ids should be provided.")
        batch = isinstance(text, list) or (isinstance(ids, list) and ids and
                                           isinstance(ids[0], list))
        prompts = (text if isinstance(text, list) else ids) if batch else [
            text if text is not None else ids]
        reqs = []
        for p in prompts:
            n = len(p) if isinstance(p, list) else _count_tokens(str(p))
            reqs.append(app.new_request(n, params.get("max_new_tokens"), _seed(p),
                                        bool(params.get("ignore_eos"))))
        if body.get("stream") and not batch:
            req = reqs[0]
            self._sse_start()
            text_so_far = ""
            try:
                while True:
                    kind, value, vtime = req.out.get(timeout=3600)
                    if kind == "tokens":
                        text_so_far += req.words(*value)
                        self._sse({"text": text_so_far, "meta_info": self._meta(req, None, vtime)})
                    elif kind == "finish":
                        self._sse({"text": text_so_far, "meta_info": self._meta(req, value, vtime)})
                        break
                    else:
                        break
                self._sse_end()
            except (BrokenPipeError, ConnectionResetError):
                req.aborted = True
                raise
            return
        results = []
        for req in reqs:
            done = app.run_to_end(req)
            results.append({"text": done["text"],
                            "meta_info": self._meta(req, done["finish_reason"], done["vtime"])})
        self._json(200, results if batch else results[0])

    def _meta(self, req: Req, finish, vtime: float) -> dict:
        meta = {
            "id": req.rid,
            "finish_reason": None if finish is None else (
                {"type": "length", "length": req.generated} if finish == "length"
                else {"type": "stop", "matched": 163586}),
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.generated,
            "cached_tokens": 0,
            "e2e_latency": round(vtime - req.vstart, 6),
            "sim_time": round(vtime, 6),
        }
        spec = self.app.scheduler.spec
        if finish is not None and spec.enabled:
            # finished requests only, whenever a speculative algorithm is set (tm 0.5.9:1597-1598,
            # 0.5.23:2755-2756)
            meta.update(spec_meta(req, spec.num_draft_tokens))
        return meta

    def _openai_request(self, body, prompt_tokens: int, seed: int) -> Req:
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        return self.app.new_request(prompt_tokens, max_tokens, seed, bool(body.get("ignore_eos")))

    def _completions(self, body) -> None:
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest("prompt is required")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            tokens = len(prompt)
        elif isinstance(prompt, list):
            tokens = sum(_count_tokens(str(p)) for p in prompt)
        else:
            tokens = _count_tokens(str(prompt))
        req = self._openai_request(body, tokens, _seed(prompt))
        self._openai_reply(body, req, chat=False)

    def _chat(self, body) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        if at_least(0, 5, 15) and body.get("stream") and _flag(body, "return_meta_info"):
            # raised while converting the request, before anything runs (oai/serving_chat.py
            # 0.5.15:560-564, 0.5.19:996-1000); a ValueError becomes 400 "BadRequest"
            # (oai/serving_base.py 0.5.15:114-119)
            raise BadRequest("return_meta_info is not supported with streaming. Please set "
                             "stream=false when using return_meta_info=true.", "BadRequest")
        tokens = 3 + sum(5 + _count_tokens(_content_text(m.get("content")))
                         for m in messages if isinstance(m, dict))
        req = self._openai_request(body, tokens, _seed(messages))
        self._openai_reply(body, req, chat=True)

    def _openai_reply(self, body, req: Req, chat: bool) -> None:
        """OpenAI-compatible answers. Request fields a release does not know are ignored, as
        its pydantic request models (plain BaseModel, extra="ignore") do (oai/protocol.py
        0.5.9:236/529, 0.5.23:365/909).

        - `return_meta_info` (ChatCompletionRequest, 0.5.15+, oai/protocol.py 0.5.15:696):
          choices[i].meta_info = the native meta_info (oai/serving_chat.py 0.5.15:1370-1372,
          0.5.19:1951), omitted when not asked (protocol.py 0.5.15:979-989).
        - `return_spec_tokens_details` (ChatCompletionRequest and CompletionRequest, 0.5.19+,
          oai/protocol.py 0.5.19:356/864): response-level `sglext.spec_tokens_details`
          (SpecTokensDetails, an object for n=1), oai/serving_chat.py 0.5.19:1857-1885; when
          streaming an extra chunk with `choices: []` and `sglext` after the finish chunk and
          before the usage chunk (serving_chat.py 0.5.19:1735-1766, serving_completions.py
          0.5.19:440-472). No speculation fields, no sglext (SglExt drops None fields,
          protocol.py 0.5.19:432-449).
        """
        app = self.app
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        model = app.args.served_model_name
        created = int(time.time())
        want_meta = chat and at_least(0, 5, 15) and _flag(body, "return_meta_info")
        want_spec = at_least(0, 5, 19) and _flag(body, "return_spec_tokens_details")

        def usage() -> dict:
            return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.generated,
                    "total_tokens": req.prompt_tokens + req.generated,
                    "prompt_tokens_details": None, "reasoning_tokens": 0}

        if not body.get("stream"):
            done = app.run_to_end(req)
            meta = self._meta(req, done["finish_reason"], done["vtime"])
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": done["text"],
                                                  "reasoning_content": None, "tool_calls": None},
                          "logprobs": None, "finish_reason": done["finish_reason"],
                          "matched_stop": None}
                if want_meta:
                    choice["meta_info"] = meta
            else:
                choice = {"index": 0, "text": done["text"], "logprobs": None,
                          "finish_reason": done["finish_reason"], "matched_stop": None}
            reply = {"id": rid, "object": obj, "created": created, "model": model,
                     "choices": [choice], "usage": usage(), "metadata": None}
            details = spec_tokens_details(meta) if want_spec else None
            if details is not None:
                reply["sglext"] = {"spec_tokens_details": details}
            self._json(200, reply)
            return

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta_text, finish, role=False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": delta_text} if role else {
                    "content": delta_text}
                if finish is not None and not delta_text:
                    delta = {}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                          "matched_stop": None}
            else:
                choice = {"index": 0, "text": delta_text, "logprobs": None,
                          "finish_reason": finish, "matched_stop": None}
            return {"id": rid, "object": chunk_obj, "created": created, "model": model,
                    "choices": [choice], "usage": None}

        self._sse_start()
        try:
            if chat:
                self._sse(chunk("", None, role=True))
            meta = None
            while True:
                kind, value, vtime = req.out.get(timeout=3600)
                if kind == "tokens":
                    self._sse(chunk(req.words(*value), None))
                elif kind == "finish":
                    meta = self._meta(req, value, vtime)
                    self._sse(chunk("", value))
                    break
                else:
                    break
            details = spec_tokens_details(meta) if (want_spec and meta) else None
            if details is not None:
                self._sse({"id": rid, "object": chunk_obj, "created": int(time.time()),
                           "model": model, "choices": [], "usage": None,
                           "sglext": {"spec_tokens_details": details}})
            if include_usage:
                self._sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                           "choices": [], "usage": usage()})
            self._sse_end()
        except (BrokenPipeError, ConnectionResetError):
            req.aborted = True
            raise


def _health_generates() -> bool:
    """envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.get(): an EnvBool, default true
    (environ.py:462 (0.5.9), :344 (0.5.23)); true/1/yes/y and false/0/no/n in any case, anything
    else warns and counts as the default (environ.py:66-86, :143-150 (0.5.23))."""
    value = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION")
    return value is None or value.lower() not in ("false", "0", "no", "n")


def _flag(body: dict, name: str) -> bool:
    """A pydantic `bool` field: true/false, 0/1 and their usual strings."""
    value = body.get(name, False)
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "t", "yes", "y", "on")
    return bool(value) if isinstance(value, (bool, int, float)) else False


class HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with uvicorn-like socket options."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, address, app: App) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.app = app
        super().__init__(address, Handler)


def _nominal(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def launch_server(server_args) -> int:
    """Run the server until SIGTERM/SIGINT; return the process exit code."""
    stop = threading.Event()
    set_on_signals(stop, (signal.SIGTERM, signal.SIGINT))
    log(f"server_args={server_args!r}")
    scale = hardware.time_scale()
    started = time.monotonic()
    try:
        crash = os.environ.get("SGLANG_SIM_CRASH")
        if crash:
            # a server that dies at start every time (a crash loop): a scheduler's exception
            # reaches the launcher, which logs it and exits 1, as real SGLang's
            # launch_server ends on a failed scheduler (engine.py _launch_subprocesses raises
            # "Initialization failed. ..." after the child's traceback)
            sys.stdout.write("Traceback (most recent call last):\n"
                             '  File "sglang/srt/managers/scheduler.py", in run_scheduler_process'
                             f"\nRuntimeError: {crash}\n")
            return 1
        try:
            faults = sim_faults.from_env()
        except ValueError as exc:  # a simulator knob, not SGLang: refuse before anything loads
            sys.stderr.write(f"sglang stand-in: {exc}\n")
            return 2
        try:
            loaded = ModelLoader(server_args, stop).run()
        except Stopped:
            log("Received SIGTERM while loading; exiting.")
            return 143
        dummy = server_args.node_rank > 0
        scheduler = None if dummy else Scheduler(server_args, loaded, scale, faults)
        app = App(server_args, loaded, scheduler, dummy=dummy)
        # startup_time of /server_info from 0.5.20 (observability/startup_time.py 0.5.20:11-69),
        # in simulated seconds
        loaded_s = (time.monotonic() - started) / max(scale, 1e-9)
        app.startup_time = {"load_weight": round(loaded_s, 3), "kv_cache_allocation": 0.0,
                            "scheduler_e2e": round(loaded_s, 3), "cuda_graph": {},
                            "tokenizer_e2e": round(loaded_s, 3)}
        host, port = server_args.host, server_args.port
        try:
            httpd = HTTPServer((host, port), app)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            uvicorn("ERROR", f"[Errno {exc.errno}] error while attempting to bind on address "
                    f"{(host, port)!r}: {reason}")
            return 1
        server_thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                         name="http", daemon=True)
        if dummy:
            # node rank >= 1: no tokenizer or API, a dummy health server (/ping, /health,
            # /health_generate: 200) until the schedulers exit (engine.py:1040-1061 (0.5.9),
            # :1234-1290 (0.5.23); utils/common.py:2656-2712 (0.5.9), :3624-3685 (0.5.23))
            server_thread.start()
            log(f"Dummy health check server started in background thread at {host}:{port}")
            app.state = "ready"
            stop.wait()
            if at_least(0, 5, 21):  # engine.py:1195 (0.5.21), :1263 (0.5.22)
                # SIGTERM is ignored: rank 0's ShutdownReq (here: the group link closing) or
                # the caller's SIGKILL ends this rank (engine.py:1259-1271 (0.5.23))
                log(f"SIGTERM received on node_rank {server_args.node_rank}; waiting for the "
                    "rank-0 ShutdownReq broadcast to stop the schedulers.")
                threading.Event().wait()
        else:
            scheduler.start()
            uvicorn("INFO", f"Started server process [{os.getpid()}]")
            uvicorn("INFO", "Waiting for application startup.")
            uvicorn("INFO", "Application startup complete.")
            server_thread.start()
            uvicorn("INFO", f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
            if not server_args.skip_server_warmup:
                if stop.wait(_nominal("SGLANG_SIM_WARMUP_SECONDS", 2.0) * scale):
                    pass
                else:
                    loaded.first_forward()  # what the first batch raises kills the server
                    warm = app.new_request(6, 8, 0)
                    app.run_to_end(warm)
                    uvicorn("INFO", f'127.0.0.1:{port + 1000} - "POST /generate HTTP/1.1" 200 OK',
                            access=True)
            if not stop.is_set():
                scheduler.serving_started()  # SGLANG_SIM_FAULT faults that strike once ready
                app.state = "ready"
                log("The server is fired up and ready to roll!")
            stop.wait()
        # graceful shutdown
        app.state = "shutting_down"
        uvicorn("INFO", "Shutting down")
        deadline = time.monotonic() + max(0.05, 5.0 * scale)
        while app.inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        httpd.shutdown()
        httpd.server_close()
        if scheduler is not None:
            scheduler.shutdown()
        uvicorn("INFO", "Waiting for application shutdown.")
        uvicorn("INFO", "Application shutdown complete.")
        uvicorn("INFO", f"Finished server process [{os.getpid()}]")
        return 0
    finally:
        hardware.release()
        sys.stdout.flush()
        sys.stderr.flush()
