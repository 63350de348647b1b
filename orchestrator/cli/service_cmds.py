"""`orchestrator status|logs|stop -i INV`: look after the deployed SGLang servers and gateway.

    orchestrator status -i INV [--limit H] [--json] [--state-dir DIR] [--var api_key=...]
    orchestrator logs   -i INV [--limit H] [-n 50] [-f]
    orchestrator stop   -i INV [--limit H] [--timeout 60s]

Where each host's server lives is decided by `orchestrator.service` (host variable base_dir ->
BASE_DIR/run, sglang_host, sglang_port; the API key from --var api_key, the host variable, or
$SGLANG_API_KEY). Exit codes: status 0 when every selected server is running and ready, 1
otherwise; stop 0 when every server is stopped; 3 when a host could not be reached; 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from orchestrator.config.model import parse_duration
from orchestrator.errors import ConfigError
from orchestrator.redact import REDACTOR

_RULE = (
    "Hosts: those whose variables give a state dir (sglang_state_dir, else BASE_DIR/run from "
    "base_dir), or all selected hosts with --state-dir. API at "
    "http://SGLANG_HOST:SGLANG_PORT (default 127.0.0.1:30000), reached from the host itself. "
    "A gateway (inventory group `gateway`, or gateway_state_dir): BASE_DIR/gateway, "
    "http://GATEWAY_HOST:GATEWAY_PORT (default 127.0.0.1:30080), shown as HOST:gateway. "
    "API key: --var api_key=..., the host variable api_key, or $SGLANG_API_KEY; the "
    "gateway's control-plane key: gateway_admin_key or $ORCHESTRATOR_GATEWAY_ADMIN_KEY."
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--inventory", required=True, help="inventory YAML file")
    p.add_argument("--limit", action="append", metavar="HOSTS",
                   help="only these hosts/groups/patterns (comma separated, repeatable)")
    p.add_argument("--state-dir", help="the server's state dir on every selected host "
                   "(default: BASE_DIR/run from the host variable base_dir)")
    p.add_argument("--var", "-e", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable (e.g. api_key=..., sglang_port=30001)")
    p.add_argument("--wait-for-host", default="10s", metavar="DURATION",
                   help="how long to wait for a host's SSH (default 10s)")


def add_subcommands(sub: Any) -> None:
    """Register `status`, `logs` and `stop` on the CLI's subparsers."""
    status = sub.add_parser(
        "status", help="show the SGLang server (and gateway) of each host (state, pid, model, "
        "readiness, a gateway's members)",
        description="Per host: service state (running/stopped/dead), pid, uptime, model, "
        "speculative algorithm, ready (/health), accept length (/server_info). " + _RULE,
    )
    _common(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--verify", action="store_true",
                        help="prove readiness with one chat completion through the API "
                        "(after a restart on failure), not only /health")
    status.set_defaults(func=cmd_status)

    logs = sub.add_parser(
        "logs", help="print the server log of each host (prefixed by host); -f follows",
        description="The last N lines of STATE_DIR/server.log on each host. " + _RULE,
    )
    _common(logs)
    logs.add_argument("-n", "--lines", type=int, default=50, help="lines per host (default 50)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new lines until Ctrl-C")
    logs.set_defaults(func=cmd_logs)

    stop = sub.add_parser(
        "stop", help="stop the SGLang server (and gateway) of each host gracefully",
        description="SIGTERM to the server's process group (or `systemctl stop` for a systemd "
        "unit), SIGKILL after --timeout. Exit 0 when every server is stopped. " + _RULE,
    )
    _common(stop)
    stop.add_argument("--timeout", default="60s", metavar="DURATION",
                      help="grace before SIGKILL (default 60s)")
    stop.set_defaults(func=cmd_stop)


def _targets(args: argparse.Namespace) -> tuple[list[Any], float]:
    from orchestrator.config import parse_cli_vars
    from orchestrator.logs import configure
    from orchestrator.service import resolve_targets

    configure(None)  # warnings and worse to stderr; stdout stays clean for --json
    try:
        budget = parse_duration(args.wait_for_host)
    except ValueError as exc:
        raise ConfigError(f"--wait-for-host: {exc}") from None
    cli_vars = parse_cli_vars(args.var)
    if cli_vars.get("api_key"):
        REDACTOR.add(str(cli_vars["api_key"]))
    targets = resolve_targets(args.inventory, limit=args.limit, cli_vars=cli_vars,
                              state_dir=args.state_dir)
    return targets, budget


def _out(text: str) -> None:
    sys.stdout.write(REDACTOR.redact(text) + "\n")
    sys.stdout.flush()


def _fmt_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{(s % 86400) // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def render_status(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of status rows (orchestrator.service.collect_status)."""
    head = ["HOST", "STATE", "PID", "UPTIME", "RESTARTS", "MODEL", "SPEC", "READY", "ACCEPT",
            "DETAIL"]
    table = [head]
    for r in rows:
        acc = r.get("accept_length")
        table.append([
            str(r.get("host")), str(r.get("state")), str(r.get("pid") or "-"),
            _fmt_uptime(r.get("uptime_s")), str(r.get("restarts") or 0),
            str(r.get("model") or "-"),
            str(r.get("speculative_algorithm") or "-"),
            "yes" if r.get("ready") else "no",
            f"{acc:.2f}" if isinstance(acc, (int, float)) else "-",
            str(r.get("detail") or r.get("error") or ""),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    lines = []
    for row, r in zip(table, [None, *rows], strict=True):
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
        if r and r.get("restarts") and r.get("last_cause") and r.get("state") == "running":
            lines.append(f"  restarted {r['restarts']}x by its supervisor; last exit: "
                         f"{r['last_cause']}")
        if r and r.get("load"):
            lines.append(f"  load: {r['load']}")
        for m in (r or {}).get("members") or []:  # a gateway: one line per worker
            lines.append(f"  member {m.get('url')}  {m.get('status')}  "
                         + ("healthy" if m.get("healthy") else "unhealthy"))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.service import collect_status, status_exit_code

    targets, budget = _targets(args)
    rows = collect_status(targets, budget=budget, verify=args.verify)
    if args.json:
        _out(json.dumps(rows, indent=2, default=str))
    else:
        _out(render_status(rows))
    return status_exit_code(rows)


def cmd_logs(args: argparse.Namespace) -> int:
    from orchestrator.service import follow_logs, tail_logs

    targets, budget = _targets(args)
    if args.follow:
        with contextlib.suppress(KeyboardInterrupt):
            follow_logs(targets, _out, lines=args.lines, budget=budget)
        return 0
    code = 0
    for res in tail_logs(targets, args.lines, budget=budget):
        if "error" in res:
            _out(f"{res['host']} | error: {res['error']}")
            code = max(code, int(res.get("exit_code") or 1))
            continue
        if res.get("missing"):
            _out(f"{res['host']} | (no log at {res['missing']})")
        for line in res["lines"]:
            _out(f"{res['host']} | {line}")
    return code


def _stopped_line(res: dict[str, Any]) -> str:
    """"HOST: stopped pid N in Ss", with what ignored SIGTERM when it was forced."""
    how = ""
    if res.get("forced"):
        left = ", ".join(f"{h['comm']} pid {h['pid']} ({h['state']}"
                         + (f" in {h['wchan']}" if h.get("wchan") not in ("", "0") else "")
                         + ")" for h in res.get("holdouts") or [])
        how = " (SIGKILL after the grace period" + (
            f"; still running then: {left}" if left else "") + ")"
    return f"{res['host']}: stopped pid {res.get('pid')} in {res.get('seconds')}s{how}"


def cmd_stop(args: argparse.Namespace) -> int:
    from orchestrator.service import stop_all

    try:
        grace = parse_duration(args.timeout)
    except ValueError as exc:
        raise ConfigError(f"--timeout: {exc}") from None
    targets, budget = _targets(args)
    code = 0
    for res in stop_all(targets, grace=grace, budget=budget):
        host = res["host"]
        if "error" in res and not res.get("stopped"):
            _out(f"{host}: could not stop: {res['error']}")
            code = max(code, int(res.get("exit_code") or 1))
        elif not res.get("was_running"):
            _out(f"{host}: not running")
        else:
            _out(_stopped_line(res))
    return code
