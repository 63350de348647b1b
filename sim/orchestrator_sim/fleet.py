"""The simulator daemon (one process serving every simulated host) and its client API.

``SimFleet.up(simdir, hosts=2)`` starts a background daemon (``python -m orchestrator_sim.fleet
--serve SIMDIR``, its own session; pid in SIMDIR/sim.pid, log in SIMDIR/sim.log) and returns once
every host answers on SSH. The daemon:

* gives box i a GPU host ``gpu-i`` on ``NET.i`` and (unless ``hypervisor=False``) a Proxmox host
  ``pve-i`` on ``NET.(100+i)``, NET being a free 127.x.y (default first free from 127.0.1), so
  every host has its own loopback address and port 30000;
* lays out SIMDIR/hosts/<name>/root (HOME, tmp, opt, var/log, etc/pve), host keys, the box state
  (SIMDIR/hosts/gpu-i/state.json), the client key SIMDIR/id_ed25519, SIMDIR/known_hosts and
  SIMDIR/inventory.yaml (strict host-key checking);
* makes the host ``python3`` a venv (SIMDIR/python) of the simulator's interpreter that also sees
  the simulator's site-packages (huggingface_hub...) but installs into itself;
* serves the package index and model hub of the other sim modules when they are importable;
* answers a control channel (127.0.0.1, token in SIMDIR/sim.json) for faults, `pct`, status and
  shutdown.

``SimFleet(simdir).down()`` stops the daemon and every process any simulated host started.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import getpass
import hashlib
import hmac
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator_sim import faults as faultmod
from orchestrator_sim import hypervisor as hv
from orchestrator_sim import procs
from orchestrator_sim.hostenv.site import simhw
from orchestrator_sim.hostenv.tools import simctl
from orchestrator_sim.hosts import SimHost
from orchestrator_sim.signals import set_on_signals
from orchestrator_sim.sshserver import EmbeddedEndpoint, OpenSSHEndpoint
from orchestrator_sim.state import Profile, get_profile, new_state, reboot_kernel

log = logging.getLogger("orchestrator_sim")

HOSTENV_SRC = Path(__file__).resolve().parent / "hostenv"
MAX_HOSTS = 99
SGLANG_PORT = 30000

DEFAULTS: dict[str, Any] = {
    "hosts": 1,
    "profile": "rtx-pro-6000x8",
    "sshd": "embedded",
    "time_scale": 0.005,
    "hypervisor": True,
    "net": "auto",
    "user": None,
    "load_seconds": 960.0,
    "reboot_seconds": 300.0,
    "index": True,
    "hub": True,
    "hf_token": None,
    "cgroup": 2,
}


class SimError(Exception):
    """The simulator cannot do what was asked; the message says why and what to do."""


def dir_hash(simdir: Path) -> str:
    """The marker prefix of the hosts of the simulator in SIMDIR (see `procs`)."""
    return hashlib.sha1(str(Path(simdir).resolve()).encode()).hexdigest()[:12]


def host_pids(simdir: Path) -> list[int]:
    """Live (non-zombie) processes of every host of the simulator in SIMDIR (by their marker)."""
    return [p for p in procs.marked(prefix=f"{dir_hash(simdir)}:") if procs.alive(p)]


# ------------------------------------------------------------------------------ keys, files


def generate_key(path: Path) -> str:
    """Write an OpenSSH ed25519 private key (0600) and .pub; return the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                        serialization.PublicFormat.OpenSSH).decode()
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(priv)
    path.with_name(path.name + ".pub").write_text(pub + "\n")
    return pub


def ensure_key(path: Path, comment: str = "") -> str:
    pub_path = path.with_name(path.name + ".pub")
    if path.exists() and pub_path.exists():
        return pub_path.read_text().strip()
    pub = generate_key(path)
    if comment:
        pub = f"{pub} {comment}"
        pub_path.write_text(pub + "\n")
    return pub


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "orchestrator-sim-nets"
    if not d.is_dir():
        d.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            d.chmod(0o1777)  # shared by every user's simulators
    return d


def _addr_free(address: str, port: int) -> bool:
    """True when nothing listens on address:port. SO_REUSEADDR, as the servers themselves
    bind: a port whose last connections linger in TIME_WAIT (right after `sim down`) is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


def choose_net(requested: str) -> tuple[str, int]:
    """A 127.x.y net nobody else's simulator holds; returns (net, lock fd kept open)."""
    if requested != "auto":
        parts = requested.split(".")
        if len(parts) != 3 or parts[0] != "127" or not all(p.isdigit() and int(p) < 256
                                                            for p in parts):
            raise SimError(f"--net must look like 127.X.Y (a loopback /24), got {requested!r}")
        candidates = [requested]
    else:
        candidates = [f"127.0.{b}" for b in range(1, 255)] + [
            f"127.{a}.{b}" for a in range(1, 255) for b in range(1, 255)]
    for net in candidates:
        fd = os.open(str(_lock_dir() / f"{net}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _addr_free(f"{net}.1", SGLANG_PORT):
            return net, fd
        os.close(fd)
    raise SimError(f"no free loopback net for the simulator (asked: {requested}); another "
                   "simulator holds it: stop it with `orchestrator sim down --dir ...`")


def validate(cfg: dict[str, Any]) -> None:
    """Raise SimError naming the first bad option of a simulator configuration."""
    unknown = set(cfg) - set(DEFAULTS)
    if unknown:
        raise SimError(f"unknown simulator option(s): {', '.join(sorted(unknown))}; known: "
                       f"{', '.join(DEFAULTS)}")
    n = cfg.get("hosts", DEFAULTS["hosts"])
    if not isinstance(n, int) or not 1 <= n <= MAX_HOSTS:
        raise SimError(f"--hosts must be between 1 and {MAX_HOSTS}, got {n!r}")
    if cfg.get("sshd", "embedded") not in ("embedded", "openssh"):
        raise SimError(f"--sshd must be embedded or openssh, got {cfg['sshd']!r}")
    if int(cfg.get("cgroup", 2)) not in (1, 2):
        raise SimError(f"--cgroup must be 1 or 2, got {cfg['cgroup']!r}")
    if float(cfg.get("time_scale", 1.0)) <= 0:
        raise SimError(f"--time-scale must be > 0, got {cfg['time_scale']!r}")
    try:
        get_profile(str(cfg.get("profile", DEFAULTS["profile"])))
    except ValueError as exc:
        raise SimError(str(exc)) from None


# ------------------------------------------------------------------------------ the daemon


@dataclass
class Box:
    """One physical box: the GPU host (container or bare) and its hypervisor, sharing state."""

    index: int
    container: SimHost
    hypervisor: SimHost | None
    state_path: Path
    conf_path: Path | None
    powered: bool = True
    reboot_timer: threading.Timer | None = None

    @property
    def hosts(self) -> list[SimHost]:
        return [self.container] + ([self.hypervisor] if self.hypervisor else [])


class Daemon:
    """Serves the simulated hosts of one SIMDIR until shut down."""

    def __init__(self, simdir: Path, cfg: dict[str, Any]):
        self.simdir = simdir.resolve()
        self.cfg = dict(DEFAULTS, **cfg)
        self.cfg["user"] = self.cfg["user"] or getpass.getuser()
        self.hash = dir_hash(self.simdir)
        self.profile: Profile = get_profile(self.cfg["profile"])
        self.hostenv = self.simdir / "hostenv"
        self.host_python = self.simdir / "python" / "bin" / "python3"
        self.boxes: list[Box] = []
        self.hosts: dict[str, SimHost] = {}
        self.endpoints: dict[str, Any] = {}
        self.hub = None
        self.index = None
        self.urls: dict[str, str | None] = {"index": None, "hub": None}
        self.token = secrets.token_hex(16)
        self.stop_event = threading.Event()
        self.lock = threading.RLock()
        self.control: socketserver.ThreadingTCPServer | None = None
        self.net = ""
        self._net_fd: int | None = None

    # -------------------------------------------------------------- setup

    def _install_hostenv(self) -> None:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for sub in ("site", "tools"):
            shutil.copytree(HOSTENV_SRC / sub, self.hostenv / sub, dirs_exist_ok=True,
                            ignore=ignore)
        tools = self.hostenv / "tools"
        py = shlex.quote(str(self.host_python))
        wrappers = {
            "bin": {"nvidia-smi": "nvidia_smi.py"},
            "bin-hv": {"pct": "hvtools.py pct", "nvidia-modprobe": "hvtools.py nvidia-modprobe",
                       "mknod": "hvtools.py mknod"},
        }
        for sub, table in wrappers.items():
            (self.hostenv / sub).mkdir(parents=True, exist_ok=True)
            for name, target in table.items():
                script, *args = target.split()
                line = " ".join([py, "-S", shlex.quote(str(tools / script))] + args)
                path = self.hostenv / sub / name
                path.write_text(f"#!/bin/sh\n# simulated {name}\nexec {line} \"$@\"\n")
                path.chmod(0o755)
        # dmesg prints the ring buffer simhw.write_state keeps as text beside the host's state
        # (a C program on a real host: a Python one cost each host check ~25 ms of CPU)
        dmesg = self.hostenv / "bin" / "dmesg"
        dmesg.write_text(
            "#!/bin/sh\n# simulated dmesg\n"
            "case \" $* \" in *\" -C \"*|*\" -c \"*|*\" --clear \"*)\n"
            f"  exec {py} -S {shlex.quote(str(tools / 'dmesg.py'))} \"$@\" ;;\nesac\n"
            "exec cat \"${SIM_HOST_STATE%/*}/kmsg\"\n")
        dmesg.chmod(0o755)
        sudo = self.hostenv / "bin" / "sudo"
        sudo.write_text(
            "#!/bin/sh\n# simulated sudo: commands already run as the SSH user\n"
            "while [ $# -gt 0 ]; do\n  case \"$1\" in\n"
            "    -S) read -r _pw || true; shift ;;\n"
            "    -u|-g|-p|-C|-h|-U) shift 2 ;;\n"
            "    --) shift; break ;;\n    -*) shift ;;\n    *) break ;;\n  esac\ndone\n"
            "[ $# -gt 0 ] || exit 0\nexec \"$@\"\n")
        sudo.chmod(0o755)

    def _install_python(self) -> None:
        """SIMDIR/python: a venv of the simulator's interpreter that also sees its packages."""
        if not self.host_python.exists():
            venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(
                str(self.simdir / "python"))
        out = subprocess.run([str(self.host_python), "-I", "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True)
        purelib = Path(out.stdout.strip())
        if not purelib.is_relative_to(self.simdir / "python"):
            raise SimError(f"the host python's site-packages {purelib} is not inside "
                           f"{self.simdir / 'python'}; delete that directory and retry")
        mine = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        # on sys.path, without running that site-packages' own .pth files: they would hand
        # every Python on a simulated host this checkout's editable `orchestrator` (which no
        # real host has) and cost ~15 ms per interpreter start (its import finder)
        lines = [f"import sys; {p!r} in sys.path or sys.path.append({p!r})" for p in sorted(mine)
                 if p and Path(p) != purelib]
        purelib.mkdir(parents=True, exist_ok=True)
        (purelib / "_orchestrator_sim_host.pth").write_text("\n".join(lines) + "\n")

    def _make_host(self, name: str, role: str, box: int, address: str,
                   ctid: int | None, state_path: Path) -> SimHost:
        host_dir = self.simdir / "hosts" / name
        root = host_dir / "root"
        port_file = host_dir / "ssh_port"
        port = 0
        with contextlib.suppress(OSError, ValueError):
            port = int(port_file.read_text())  # same port as last time: known_hosts stays valid
        if port and not _addr_free(address, port):
            port = 0
        bin_dirs = [self.hostenv / "bin-hv", self.hostenv / "bin"] if role == "hypervisor" \
            else [self.hostenv / "bin"]
        host = SimHost(
            name=name, role=role, box=box, address=address, port=port, root=root,
            user=self.cfg["user"], state_path=state_path,
            key_path=host_dir / "ssh_host_ed25519_key", marker=f"{self.hash}:{name}",
            site_dir=self.hostenv / "site", bin_dirs=bin_dirs,
            python_bin_dir=self.host_python.parent, ctid=ctid,
        )
        for sub in ("tmp", "opt", "var/log", "etc", "usr/local/bin"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        host.home.mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        ensure_key(host.key_path, f"root@{name}")
        return host

    def _make_box(self, i: int) -> Box:
        with_hv = bool(self.cfg["hypervisor"])
        name = f"gpu-{i}"
        state_path = self.simdir / "hosts" / name / "state.json"
        state_path.parent.mkdir(parents=True, exist_ok=True)
        ctid = 100 + i if with_hv else None
        cont = self._make_host(name, "container" if with_hv else "bare", i, f"{self.net}.{i}",
                               ctid, state_path)
        hyp = None
        conf_path = None
        if with_hv:
            hyp = self._make_host(f"pve-{i}", "hypervisor", i, f"{self.net}.{100 + i}", ctid,
                                  state_path)
            assert self.control is not None
            hyp.control = f"127.0.0.1:{self.control.server_address[1]}:{self.token}"
            hyp.container = name
            cont.hypervisor = hyp.name
            conf_path = hyp.root / "etc" / "pve" / "lxc" / f"{ctid}.conf"
            conf_path.parent.mkdir(parents=True, exist_ok=True)
        roots = {h.name: str(h.root) for h in ([cont] + ([hyp] if hyp else []))}
        state = new_state(seed=f"{self.hash}:{name}", box=name, profile=self.profile,
                          roots=roots, hypervisor=hyp.name if hyp else None, ctid=ctid,
                          time_scale=float(self.cfg["time_scale"]),
                          load_seconds=float(self.cfg["load_seconds"]), conf_rules=None)
        state["container"]["cgroup_version"] = int(self.cfg["cgroup"])
        if conf_path is not None:
            conf = hv.conf_text(name, ctid, state["kernel"]["uvm_major"], self.profile.gpu_count)
            _atomic_write(conf_path, conf)
            hv.start_container(state, conf)
        for h in [cont] + ([hyp] if hyp else []):
            (h.root / "var" / "log" / "kern.log").write_text("")
        kmsg = state["kmsg"]
        state["kmsg"] = []
        state["kernel"]["booted_at"] = time.time()
        for _, line in kmsg:
            simhw.log_kernel(state, line)
        lock = Path(str(state_path) + ".lock")
        lock.touch()
        simhw.write_state(state, str(state_path))
        return Box(index=i, container=cont, hypervisor=hyp, state_path=state_path,
                   conf_path=conf_path)

    def _start_services(self) -> None:
        if self.cfg["index"]:
            try:
                from orchestrator_sim.pkgindex import PackageIndex
                from orchestrator_sim.wheels import build_standin_wheels
            except ImportError as exc:
                log.warning("package index not available (%s): hosts get no pip_index_url", exc)
            else:
                wheel_dir = self.simdir / "wheels"
                wheel_dir.mkdir(exist_ok=True)
                build_standin_wheels(wheel_dir)
                from orchestrator_sim.mirror import DEFAULT_PROJECTS, mirror_wheels

                mirror_wheels(DEFAULT_PROJECTS, wheel_dir)
                self.index = PackageIndex([wheel_dir], upstream=None)
                self.index.start("127.0.0.1", 0)
                self.urls["index"] = self.index.url
        if self.cfg["hub"]:
            try:
                from orchestrator_sim.hub import ModelHub
                from orchestrator_sim.hubrepos import seed_repos
            except ImportError as exc:
                log.warning("model hub not available (%s): hosts get no hf_endpoint", exc)
            else:
                data = self.simdir / "hub"
                data.mkdir(exist_ok=True)
                seed_repos(data)
                self.hub = ModelHub(data, token=self.cfg["hf_token"],
                                    fault_file=self.simdir / "hub-faults.json")
                self.hub.start("127.0.0.1", 0)
                self.urls["hub"] = self.hub.url

    def _endpoint(self, host: SimHost):
        if self.cfg["sshd"] == "openssh":
            return OpenSSHEndpoint(host, self.simdir / "authorized_keys")

        def flaky(host: SimHost = host) -> tuple[float, float] | None:
            try:
                f = simhw.fault("ssh-flaky", simhw.read_state(str(host.state_path)))
            except simhw.SimHWError:
                return None
            return None if f is None else (float(f["rate"]), float(f["within"]))

        return EmbeddedEndpoint(host, self.simdir / "authorized_keys", flaky)

    def _start_control(self) -> None:
        daemon = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    line = self.rfile.readline(1 << 20)
                    msg = json.loads(line or b"{}")
                    if not hmac.compare_digest(str(msg.get("token", "")), daemon.token):
                        answer: dict[str, Any] = {"ok": False, "error": "bad control token"}
                    else:
                        answer = daemon.handle(msg)
                except Exception as exc:  # report, never kill the daemon
                    log.exception("control request failed")
                    answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                self.wfile.write(json.dumps(answer).encode() + b"\n")

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.control = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.control.serve_forever, daemon=True,
                         name="sim-control").start()

    def _write_outputs(self) -> None:
        lines = []
        for host in self.hosts.values():
            pub = host.key_path.with_name(host.key_path.name + ".pub").read_text().split()
            lines.append(f"[{host.address}]:{host.port} {pub[0]} {pub[1]}")
            (host.host_dir / "ssh_port").write_text(f"{host.port}\n")
        _atomic_write(self.simdir / "known_hosts", "\n".join(lines) + "\n")
        _atomic_write(self.simdir / "inventory.yaml", self.inventory_yaml())

    def inventory_yaml(self) -> str:
        import yaml

        hosts: dict[str, Any] = {}
        for box in self.boxes:
            for host in box.hosts:
                spec: dict[str, Any] = {
                    "address": host.address, "port": host.port, "user": host.user,
                    "identity_file": str(self.simdir / "id_ed25519"),
                    "known_hosts": str(self.simdir / "known_hosts"),
                    "host_key_policy": "strict", "connect_timeout": 10,
                }
                hvars: dict[str, Any] = {"sim_root": str(host.root)}
                if host.role != "hypervisor":
                    hvars.update({
                        "base_dir": str(host.root / "opt" / "orchestrator"),
                        "sglang_host": host.address, "sglang_port": SGLANG_PORT,
                    })
                    if self.urls["index"]:
                        hvars["pip_index_url"] = self.urls["index"]
                    if self.urls["hub"]:
                        hvars["hf_endpoint"] = self.urls["hub"]
                    if box.hypervisor is not None:
                        spec["hypervisor"] = {"host": box.hypervisor.name, "ctid": host.ctid}
                else:
                    hvars["ctid"] = host.ctid
                    hvars["container"] = host.container
                spec["vars"] = hvars
                hosts[host.name] = spec
        groups = {"gpu": {"hosts": [b.container.name for b in self.boxes]}}
        if any(b.hypervisor for b in self.boxes):
            groups["hypervisors"] = {"hosts": [b.hypervisor.name for b in self.boxes
                                               if b.hypervisor]}
        doc = {"hosts": hosts, "groups": groups}
        head = (f"# Inventory of the simulated hosts in {self.simdir}\n"
                "# Generated by `orchestrator sim up`; rewritten at every start.\n")
        return head + yaml.safe_dump(doc, sort_keys=False)

    def info(self) -> dict[str, Any]:
        assert self.control is not None
        return {
            "pid": os.getpid(), "dir": str(self.simdir), "hash": self.hash, "net": self.net,
            "sshd": self.cfg["sshd"], "user": self.cfg["user"], "profile": self.profile.name,
            "time_scale": self.cfg["time_scale"], "hypervisor": bool(self.cfg["hypervisor"]),
            "control": {"host": "127.0.0.1", "port": self.control.server_address[1],
                        "token": self.token},
            "hosts": [h.describe() for h in self.hosts.values()],
            "index_url": self.urls["index"], "hub_url": self.urls["hub"],
            "identity_file": str(self.simdir / "id_ed25519"),
            "known_hosts": str(self.simdir / "known_hosts"),
            "inventory": str(self.simdir / "inventory.yaml"),
            "python": str(self.host_python), "started_at": time.time(), "ready": True,
        }

    def start(self) -> None:
        t0 = time.monotonic()
        validate({k: v for k, v in self.cfg.items() if k in DEFAULTS})
        n = int(self.cfg["hosts"])
        self.net, self._net_fd = choose_net(str(self.cfg["net"]))
        self._install_hostenv()
        self._install_python()
        pub = ensure_key(self.simdir / "id_ed25519", "orchestrator-sim-client")
        _atomic_write(self.simdir / "authorized_keys", pub + "\n", 0o600)
        self._start_control()
        assert self.control is not None
        for i in range(1, n + 1):
            box = self._make_box(i)
            self.boxes.append(box)
            for h in box.hosts:
                self.hosts[h.name] = h
        self._start_services()
        for name, host in self.hosts.items():
            self.endpoints[name] = self._endpoint(host)
        errors: list[BaseException] = []

        def start_one(ep: Any) -> None:
            try:
                ep.start()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start_one, args=(ep,)) for ep in
                   self.endpoints.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        self._write_outputs()
        _atomic_write(self.simdir / "sim.json", json.dumps(self.info(), indent=1), 0o600)
        log.info("simulator up: %d hosts on %s.x in %.2fs (sshd=%s)", len(self.hosts),
                 self.net, time.monotonic() - t0, self.cfg["sshd"])

    # -------------------------------------------------------------- box operations

    def update_state(self, box: Box, fn) -> Any:
        return simhw.update(fn, str(box.state_path))

    def box_of(self, name: str) -> Box:
        for box in self.boxes:
            if name in (h.name for h in box.hosts):
                return box
        raise faultmod.FaultError(f"no simulated host named {name!r}; hosts: "
                                  f"{', '.join(self.hosts)}")

    def _box_by_ctid(self, hypervisor: str, ctid: int) -> Box:
        for box in self.boxes:
            if box.hypervisor and box.hypervisor.name == hypervisor and \
                    box.container.ctid == ctid:
                return box
        raise faultmod.FaultError(f"Configuration file 'nodes/{hypervisor}/lxc/{ctid}.conf' "
                                  "does not exist")

    def kill_host_processes(self, host: SimHost) -> int:
        return procs.kill_marked(value=host.marker)

    def flaky_changed(self, box: Box) -> None:
        if self.cfg["sshd"] != "openssh":
            return
        f = simhw.fault("ssh-flaky", simhw.read_state(str(box.state_path)))
        params = None if f is None else (float(f["rate"]), float(f["within"]))
        for h in box.hosts:
            self.endpoints[h.name].set_flaky(params)

    def container_stop(self, box: Box) -> None:
        self.endpoints[box.container.name].stop()
        self.kill_host_processes(box.container)
        self.update_state(box, hv.stop_container)

    def container_start(self, box: Box) -> None:
        assert box.conf_path is not None
        conf = box.conf_path.read_text()
        self.update_state(box, lambda s: hv.start_container(s, conf))
        if box.powered:
            self.endpoints[box.container.name].start()

    def container_op(self, op: str, hypervisor: str, ctid: int) -> dict[str, Any]:
        with self.lock:
            box = self._box_by_ctid(hypervisor, ctid)
            running = simhw.read_state(str(box.state_path))["container"]["running"]
            if op == "container_start":
                if running:
                    return {"ok": False, "error": f"CT {ctid} already running"}
                self.container_start(box)
            elif op == "container_stop":
                if not running:
                    return {"ok": False, "error": f"CT {ctid} not running"}
                self.container_stop(box)
            else:
                if not running:
                    return {"ok": False, "error": f"CT {ctid} not running"}
                self.container_stop(box)
                self.container_start(box)
            return {"ok": True}

    def reboot(self, box: Box, down_seconds: float, wait: bool = False) -> dict[str, Any]:
        with self.lock:
            if box.reboot_timer is not None:
                box.reboot_timer.cancel()
            box.powered = False
            for h in box.hosts:
                self.endpoints[h.name].stop()
            for h in box.hosts:
                self.kill_host_processes(h)
                if h.tmp.is_dir():
                    for child in h.tmp.iterdir():
                        if child.is_dir() and not child.is_symlink():
                            shutil.rmtree(child, ignore_errors=True)
                        else:
                            with contextlib.suppress(OSError):
                                child.unlink()
            conf = box.conf_path.read_text() if box.conf_path is not None else None

            def apply(state: dict) -> int:
                old = int(state["kernel"]["uvm_major"])
                new = reboot_kernel(state)
                state.get("faults", {}).pop("stale-server", None)
                lines = [line for _, line in state["kmsg"]]
                state["kmsg"] = []
                for line in lines:
                    simhw.log_kernel(state, line)
                if conf is not None:
                    hv.start_container(state, conf)
                else:
                    state["container"]["node_major"] = state["kernel"]["host_node_major"]
                log.info("%s rebooted: uvm major %d -> %d", box.container.name, old, new)
                return new

            new_major = self.update_state(box, apply)
            until = time.time() + down_seconds
            timer = threading.Timer(down_seconds, self._power_up, args=(box,))
            timer.daemon = True
            box.reboot_timer = timer
            timer.start()
        if wait:
            timer.join()
        return {"uvm_major": new_major, "down_seconds": down_seconds, "up_at": until}

    def _power_up(self, box: Box) -> None:
        with self.lock:
            box.reboot_timer = None
            box.powered = True
            running = simhw.read_state(str(box.state_path))["container"]["running"]
            if box.hypervisor is not None:
                self.endpoints[box.hypervisor.name].start()
            if running:
                self.endpoints[box.container.name].start()

    def fault(self, host: str, name: str, on: bool, params: dict[str, Any]) -> Any:
        fault = faultmod.get(name)
        log.info("fault %s %s on %s %s", name, "on" if on else "off", host, params or "")
        if host in ("hub", "*") and name.startswith("hub-"):
            box = self.boxes[0]
        else:
            box = self.box_of(host)
        if not on and fault.off is None:
            raise faultmod.FaultError(f"{name} is an event, not a state: there is nothing to "
                                      "switch off")
        if name == "reboot":  # takes the lock itself, and may wait for the box to come back
            merged = {k: v for k, v in params.items() if v is not None}
            return fault.on(self, box, merged)
        with self.lock:
            if on:
                merged = {k: v for k, v in fault.params.items() if v is not None}
                merged.update({k: v for k, v in params.items() if v is not None})
                return fault.on(self, box, merged)
            assert fault.off is not None
            return fault.off(self, box, params)

    # -------------------------------------------------------------- status / control

    def status(self) -> dict[str, Any]:
        out = []
        for box in self.boxes:
            state = simhw.read_state(str(box.state_path))
            for h in box.hosts:
                uvm = simhw.uvm_status(state, h.role)
                out.append({
                    **h.describe(), "up": bool(self.endpoints[h.name].up),
                    "powered": box.powered,
                    "running": state["container"]["running"] if h.role != "hypervisor" else True,
                    "faults": sorted(state.get("faults", {})),
                    "uvm": uvm, "gpus": len(simhw.gpu_info(state)),
                    "allocations": len(state.get("allocations", {})),
                })
        hub_faults: list[str] = []
        if self.hub is not None:
            current = self.hub.faults
            current = current() if callable(current) else current
            hub_faults = sorted(k for k, v in current.items() if v)
        return {"hosts": out, "hub_faults": hub_faults, "index_url": self.urls["index"],
                "hub_url": self.urls["hub"], "net": self.net, "pid": os.getpid()}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        try:
            if op == "ping":
                return {"ok": True, "pid": os.getpid()}
            if op == "status":
                return {"ok": True, "status": self.status()}
            if op == "fault":
                result = self.fault(str(msg["host"]), str(msg["name"]), bool(msg.get("on", True)),
                                    dict(msg.get("params") or {}))
                return {"ok": True, "result": result}
            if op in ("container_start", "container_stop", "container_reboot"):
                return self.container_op(op, str(msg["hypervisor"]), int(msg["ctid"]))
            if op == "shutdown":
                self.stop_event.set()
                return {"ok": True}
        except (faultmod.FaultError, simhw.SimHWError, KeyError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": False, "error": f"unknown control op {op!r}"}

    # -------------------------------------------------------------- lifecycle

    def shutdown(self) -> None:
        for box in self.boxes:
            if box.reboot_timer is not None:
                box.reboot_timer.cancel()
        for ep in self.endpoints.values():
            with contextlib.suppress(Exception):
                ep.close()
        procs.kill_marked(prefix=f"{self.hash}:")
        for svc in (self.index, self.hub):
            if svc is not None:
                with contextlib.suppress(Exception):
                    svc.stop()
        if self.control is not None:
            self.control.shutdown()
            self.control.server_close()
        if self._net_fd is not None:
            os.close(self._net_fd)
            self._net_fd = None

    def serve(self) -> int:
        set_on_signals(self.stop_event, (signal.SIGTERM, signal.SIGINT))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            self.start()
        except BaseException as exc:
            log.exception("simulator failed to start")
            _atomic_write(self.simdir / "sim.json", json.dumps(
                {"pid": os.getpid(), "ready": False, "error": f"{type(exc).__name__}: {exc}"}),
                0o600)
            self.shutdown()
            return 1
        while not self.stop_event.wait(1.0):
            pass
        log.info("simulator shutting down")
        self.shutdown()
        with contextlib.suppress(OSError):
            info = json.loads((self.simdir / "sim.json").read_text())
            info["ready"] = False
            info["stopped_at"] = time.time()
            _atomic_write(self.simdir / "sim.json", json.dumps(info, indent=1), 0o600)
        with contextlib.suppress(OSError):
            (self.simdir / "sim.pid").unlink()
        return 0


# ------------------------------------------------------------------------------ client API


def _pid_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class SimFleet:
    """Handle on the simulator of one SIMDIR: start, inspect, inject faults, stop."""

    def __init__(self, simdir: str | os.PathLike[str]):
        self.simdir = Path(simdir).resolve()
        self._proc: subprocess.Popen | None = None

    # paths
    @property
    def inventory_path(self) -> Path:
        return self.simdir / "inventory.yaml"

    @property
    def known_hosts(self) -> Path:
        return self.simdir / "known_hosts"

    @property
    def identity_file(self) -> Path:
        return self.simdir / "id_ed25519"

    def info(self) -> dict[str, Any]:
        try:
            return json.loads((self.simdir / "sim.json").read_text())
        except (OSError, ValueError):
            return {}

    def daemon_pid(self) -> int | None:
        try:
            pid = int((self.simdir / "sim.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        cmd = _pid_cmdline(pid)
        if procs.alive(pid) and "orchestrator_sim.fleet" in cmd and str(self.simdir) in cmd:
            return pid
        return None

    def running(self) -> bool:
        return self.daemon_pid() is not None

    @classmethod
    def up(cls, simdir: str | os.PathLike[str], *, timeout: float = 60.0,
           **options: Any) -> SimFleet:
        """Start the daemon for `simdir` with the given options (see DEFAULTS); wait until ready."""
        fleet = cls(simdir)
        validate(options)
        if fleet.running():
            raise SimError(f"a simulator is already running in {fleet.simdir} (pid "
                           f"{fleet.daemon_pid()}); stop it with `orchestrator sim down --dir "
                           f"{fleet.simdir}` first")
        fleet.simdir.mkdir(parents=True, exist_ok=True)
        cfg = dict(DEFAULTS, **options)
        _atomic_write(fleet.simdir / "sim-config.json", json.dumps(cfg, indent=1), 0o600)
        with contextlib.suppress(FileNotFoundError):
            (fleet.simdir / "sim.json").unlink()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIM_")}
        logf = open(fleet.simdir / "sim.log", "ab")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator_sim.fleet", "--serve", str(fleet.simdir)],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=str(fleet.simdir))
        finally:
            logf.close()
        fleet._proc = proc
        _atomic_write(fleet.simdir / "sim.pid", f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while True:
            info = fleet.info()
            if info.get("pid") == proc.pid and info.get("ready"):
                break
            if proc.poll() is not None or (info.get("pid") == proc.pid and "error" in info):
                proc.wait(timeout=10)
                raise SimError(f"the simulator failed to start: {info.get('error', '')}\n"
                               f"--- last lines of {fleet.simdir / 'sim.log'}:\n"
                               f"{fleet.log_tail()}")
            if time.monotonic() > deadline:
                fleet.down()
                raise SimError(f"the simulator did not come up within {timeout:.0f}s; see "
                               f"{fleet.simdir / 'sim.log'}:\n{fleet.log_tail()}")
            time.sleep(0.02)
        for host in info["hosts"]:
            fleet._wait_port(host["address"], host["port"], deadline)
        return fleet

    @staticmethod
    def _wait_port(address: str, port: int, deadline: float) -> None:
        while True:
            try:
                with socket.create_connection((address, port), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SimError(f"simulated host {address}:{port} does not answer SSH")
            time.sleep(0.02)

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = (self.simdir / "sim.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def request(self, op: str, timeout: float = 120.0, **args: Any) -> dict[str, Any]:
        if not self.running():
            raise SimError(f"no simulator is running in {self.simdir}; start one with "
                           f"`orchestrator sim up --dir {self.simdir}`")
        ctl = self.info()["control"]
        try:
            answer = simctl.request((ctl["host"], ctl["port"]), ctl["token"], op,
                                    timeout=timeout, **args)
        except simctl.ControlError as exc:
            raise SimError(str(exc)) from None
        if not answer.get("ok"):
            raise SimError(str(answer.get("error", "the simulator refused the request")))
        return answer

    def status(self) -> dict[str, Any]:
        return self.request("status")["status"]

    def fault(self, host: str, name: str, on: bool = True, **params: Any) -> Any:
        """Switch fault `name` on (or off) for `host`; returns what the fault reports."""
        return self.request("fault", host=host, name=name, on=on, params=params).get("result")

    def host(self, name: str) -> dict[str, Any]:
        for h in self.info().get("hosts", []):
            if h["name"] == name:
                return h
        raise SimError(f"no simulated host named {name!r} in {self.simdir}")

    def ssh_argv(self, name: str, command: str | None = None) -> list[str]:
        """OpenSSH client command line for a host (strict host-key checking)."""
        h = self.host(name)
        argv = ["ssh", "-i", str(self.identity_file), "-p", str(h["port"]),
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
                f"{self.info()['user']}@{h['address']}"]
        if command is not None:
            argv += ["--", command]
        return argv

    def ssh(self, name: str, command: str, timeout: float = 30.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command on a host through the real OpenSSH client."""
        return subprocess.run(self.ssh_argv(name, command), capture_output=True, text=True,
                              timeout=timeout, input=input, stdin=None if input is not None
                              else subprocess.DEVNULL)

    def down(self, timeout: float = 20.0) -> bool:
        """Stop the daemon and every process of every simulated host; True if one was running."""
        pid = self.daemon_pid()
        info = self.info()
        if pid is not None:
            with contextlib.suppress(SimError):
                self.request("shutdown", timeout=10)
            deadline = time.monotonic() + timeout
            while procs.alive(pid) and time.monotonic() < deadline:
                if self._proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=0.05)
                else:
                    time.sleep(0.05)
            if procs.alive(pid):
                procs.kill_tree(pid)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
        # leftovers, whatever happened to the daemon: marked processes and sshd listeners
        procs.kill_marked(prefix=f"{dir_hash(self.simdir)}:")
        for pidfile in self.simdir.glob("hosts/*/sshd.pid"):
            with contextlib.suppress(OSError, ValueError):
                spid = int(pidfile.read_text().split()[0])
                if str(pidfile.parent / "sshd_config") in _pid_cmdline(spid):
                    procs.kill_tree(spid)
        with contextlib.suppress(OSError):
            (self.simdir / "sim.pid").unlink()
        return pid is not None or bool(info.get("ready"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator_sim.fleet")
    parser.add_argument("--serve", required=True, metavar="SIMDIR",
                        help="run the daemon for SIMDIR (reads SIMDIR/sim-config.json)")
    args = parser.parse_args(argv)
    simdir = Path(args.serve)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # probes and cut sessions
    cfg = json.loads((simdir / "sim-config.json").read_text())
    _atomic_write(simdir / "sim.pid", f"{os.getpid()}\n")
    return Daemon(simdir, cfg).serve()


if __name__ == "__main__":
    sys.exit(main())
