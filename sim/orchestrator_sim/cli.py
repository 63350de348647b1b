"""`orchestrator sim up|down|status|fault|ssh`: run the simulated GPU hosts.

The main CLI registers these through :func:`add_subcommands`; ``python -m orchestrator_sim.cli``
runs them standalone. Every handler returns an exit code: 0 ok, 1 the simulator refused or
failed (the message says why), 2 usage errors (argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from orchestrator_sim import faults as faultmod
from orchestrator_sim.fleet import DEFAULTS, SimError, SimFleet
from orchestrator_sim.state import PROFILES

DEFAULT_DIR = ".sim"


def _dir(args: argparse.Namespace) -> Path:
    return Path(args.dir or os.environ.get("ORCHESTRATOR_SIM_DIR") or DEFAULT_DIR)


def _err(msg: str) -> int:
    sys.stderr.write(f"error: {msg}\n")
    return 1


#: what the simulator needs beyond the product (the wheel's `sim` extra): import name -> pin
SIM_NEEDS = {"huggingface_hub": "huggingface_hub==2.4.0", "cryptography": "cryptography"}


def missing_needs() -> list[str]:
    """The requirements of the `sim` extra that this Python cannot import."""
    from importlib.util import find_spec

    return [req for mod, req in SIM_NEEDS.items() if find_spec(mod) is None]


def cmd_up(args: argparse.Namespace) -> int:
    missing = missing_needs()
    if missing:
        return _err(f"the simulator needs {', '.join(missing)}, which this Python lacks: "
                    "pip install 'sglang-orchestrator[sim]'")
    options: dict[str, Any] = {
        "hosts": args.hosts, "profile": args.profile, "sshd": args.sshd,
        "time_scale": args.time_scale, "hypervisor": args.hypervisor, "net": args.net,
        "load_seconds": args.load_seconds, "reboot_seconds": args.reboot_seconds,
        "index": args.index, "hub": args.hub, "cgroup": args.cgroup,
    }
    if args.user:
        options["user"] = args.user
    if args.hf_token_env:
        token = os.environ.get(args.hf_token_env)
        if not token:
            return _err(f"--hf-token-env {args.hf_token_env}: that variable is not set")
        options["hf_token"] = token
    try:
        fleet = SimFleet.up(_dir(args), timeout=args.timeout, **options)
    except SimError as exc:
        return _err(str(exc))
    info = fleet.info()
    print(f"simulator up in {fleet.simdir} (pid {info['pid']}, sshd {info['sshd']}, "
          f"time scale {info['time_scale']})")
    for h in info["hosts"]:
        print(f"  {h['name']:<8} {h['role']:<10} ssh {h['address']}:{h['port']}")
    if info.get("index_url"):
        print(f"  package index  {info['index_url']}")
    if info.get("hub_url"):
        print(f"  model hub      {info['hub_url']}")
    print(f"inventory: {fleet.inventory_path}")
    print(f"try: orchestrator sim ssh --dir {fleet.simdir} gpu-1 nvidia-smi -L")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    fleet = SimFleet(_dir(args))
    was = fleet.down()
    print(f"simulator in {fleet.simdir} stopped" if was else
          f"no simulator was running in {fleet.simdir} (left-over processes cleaned up)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    fleet = SimFleet(_dir(args))
    if not fleet.running():
        print(f"no simulator is running in {fleet.simdir}")
        return 3
    try:
        status = fleet.status()
    except SimError as exc:
        return _err(str(exc))
    if args.json:
        print(json.dumps(status, indent=1))
        return 0
    print(f"simulator pid {status['pid']}, net {status['net']}.x")
    print(f"{'HOST':<8} {'ROLE':<10} {'ADDRESS':<22} {'STATE':<8} {'GPUS':>4} "
          f"{'UVM k/node/ok':<16} FAULTS")
    for h in status["hosts"]:
        state = "up" if h["up"] else ("stopped" if not h["running"] else "down")
        uvm = h["uvm"]
        uvm_s = f"{uvm['kernel_major']}/{uvm['node_major']}/" + (
            "-" if uvm["allowed"] is None else ("yes" if uvm["allowed"] else "NO"))
        print(f"{h['name']:<8} {h['role']:<10} {h['address'] + ':' + str(h['port']):<22} "
              f"{state:<8} {h['gpus']:>4} {uvm_s:<16} {','.join(h['faults']) or '-'}")
    if status.get("index_url"):
        print(f"package index {status['index_url']}")
    if status.get("hub_url"):
        hub_faults = ",".join(status.get("hub_faults") or []) or "-"
        print(f"model hub     {status['hub_url']}  faults: {hub_faults}")
    return 0


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_fault(args: argparse.Namespace) -> int:
    fleet = SimFleet(_dir(args))
    params: dict[str, Any] = {}
    for key in ("down_seconds", "rate", "within", "gpu", "mib", "free_mib", "shm_mib"):
        value = getattr(args, key)
        if value is not None:
            params[key] = value
    if args.wait:
        params["wait"] = True
    for item in args.param or []:
        key, eq, value = item.partition("=")
        if not eq:
            return _err(f"--param wants KEY=VALUE, got {item!r}")
        params[key.replace("-", "_")] = _value(value)
    try:
        faultmod.get(args.name)
        result = fleet.fault(args.host, args.name, on=not args.off, **params)
    except (SimError, faultmod.FaultError) as exc:
        return _err(str(exc))
    state = "off" if args.off else "on"
    extra = f": {json.dumps(result)}" if result else ""
    print(f"{args.name} {state} for {args.host}{extra}")
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    fleet = SimFleet(_dir(args))
    try:
        argv = fleet.ssh_argv(args.host, " ".join(args.command) if args.command else None)
    except SimError as exc:
        return _err(str(exc))
    if args.print:
        print(" ".join(argv))
        return 0
    if not args.command:
        argv = [a for a in argv if a != "BatchMode=yes"]
        argv.insert(1, "-t")
    os.execvp(argv[0], argv)
    return 0  # not reached


def _fault_help() -> str:
    return "\n".join(f"  {f.name:<17} {f.help}" for f in faultmod.FAULTS.values())


def add_subcommands(subparsers: Any) -> None:
    """Register `sim` and its subcommands on the main CLI's subparsers."""
    sim = subparsers.add_parser(
        "sim", help="run simulated 8-GPU hosts (SSH, fake hardware, faults) for rehearsals",
        description="Simulated GPU hosts for rehearsals, demos and tests. Each host is a "
                    "loopback address with its own SSH endpoint; commands run as real "
                    "processes; only the GPU hardware, the hub and the index are simulated.")
    sub = sim.add_subparsers(dest="sim_command", metavar="COMMAND")
    sub.required = True

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--dir", default=None,
                       help=f"simulator directory (default $ORCHESTRATOR_SIM_DIR or {DEFAULT_DIR})")

    up = sub.add_parser("up", help="start the simulator daemon and wait until every host answers")
    common(up)
    up.add_argument("--hosts", type=int, default=DEFAULTS["hosts"],
                    help="number of GPU hosts (default 1)")
    up.add_argument("--profile", default=DEFAULTS["profile"], choices=sorted(PROFILES))
    up.add_argument("--sshd", default=DEFAULTS["sshd"], choices=["embedded", "openssh"],
                    help="SSH server: embedded paramiko (default) or a real OpenSSH sshd")
    up.add_argument("--time-scale", type=float, default=DEFAULTS["time_scale"],
                    help="multiply simulated durations (model load 960 s) by this "
                         "(default 0.005)")
    up.add_argument("--hypervisor", action=argparse.BooleanOptionalAction,
                    default=DEFAULTS["hypervisor"],
                    help="put each GPU host in a Proxmox container with a pve-N hypervisor host")
    up.add_argument("--net", default=DEFAULTS["net"],
                    help="loopback /24 to use, 127.X.Y (default: first free from 127.0.1)")
    up.add_argument("--user", default=None, help="SSH user (default: the current user)")
    up.add_argument("--load-seconds", type=float, default=DEFAULTS["load_seconds"],
                    help="nominal model load time before time scaling (default 960)")
    up.add_argument("--reboot-seconds", type=float, default=DEFAULTS["reboot_seconds"],
                    help="nominal reboot downtime before time scaling (default 300)")
    up.add_argument("--index", action=argparse.BooleanOptionalAction, default=True,
                    help="serve the simulated package index")
    up.add_argument("--hub", action=argparse.BooleanOptionalAction, default=True,
                    help="serve the simulated model hub")
    up.add_argument("--cgroup", type=int, choices=[1, 2], default=DEFAULTS["cgroup"],
                    help="cgroup version of the hosts: 1 has a readable devices.list, 2 "
                         "(default) only the EPERM of open() tells")
    up.add_argument("--hf-token-env", default=None, metavar="VAR",
                    help="the hub accepts only the token in this environment variable")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for start-up")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the daemon and every process of every host")
    common(down)
    down.set_defaults(func=cmd_down)

    status = sub.add_parser("status", help="hosts, addresses, ports, faults (exit 3: not running)")
    common(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    fault = sub.add_parser("fault", help="switch a fault on (or off with --off) on a host",
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="faults:\n" + _fault_help())
    common(fault)
    fault.add_argument("host", help="host name (gpu-N or pve-N; `hub` for hub faults)")
    fault.add_argument("name", help="fault name (listed below)")
    fault.add_argument("--off", action="store_true", help="clear the fault")
    fault.add_argument("--down-seconds", type=float, default=None, help="reboot: SSH downtime")
    fault.add_argument("--wait", action="store_true", help="reboot: return once it is back up")
    fault.add_argument("--rate", type=float, default=None, help="ssh-flaky: cut probability")
    fault.add_argument("--within", type=float, default=None, help="ssh-flaky: cut within seconds")
    fault.add_argument("--gpu", type=int, default=None, help="gpu-missing: which GPU (default 7)")
    fault.add_argument("--mib", type=int, default=None, help="stale-server: MiB held per GPU")
    fault.add_argument("--free-mib", type=int, default=None, help="disk-full: free space")
    fault.add_argument("--shm-mib", type=int, default=None, help="shm-small: /dev/shm size")
    fault.add_argument("--param", action="append", metavar="KEY=VALUE",
                       help="any other fault parameter (JSON values)")
    fault.set_defaults(func=cmd_fault)

    ssh = sub.add_parser("ssh", help="open OpenSSH to a simulated host (strict host keys)")
    common(ssh)
    ssh.add_argument("--print", action="store_true", help="print the ssh command instead")
    ssh.add_argument("host")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    ssh.set_defaults(func=cmd_ssh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator_sim.cli")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_subcommands(sub)
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
