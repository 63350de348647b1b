"""Injection corpus: hostile variable values reach hosts as INERT DATA, in every stage kind.

Each payload below tries to run a command of its own (`; touch CANARY/pwned-N`, `$(...)`,
backticks, `&&`, `||`, pipes, redirections, newlines, quotes that close the ones around them,
glob characters, leading dashes, `{{ }}` and `{% %}` template syntax inside the value...). The
values come from the operator's environment (`!env`, so braces are data too) and from inventory
host vars, and go through the real CLI (`python -m orchestrator deploy`) into:

* shell stages (`run:`, `check:`, `env:`, `when:` and `uses: shell` with `with: command/check`)
  on a `connection: local` host and on a simulated host over SSH (OpenSSH's sshd): every value
  must arrive BYTE FOR BYTE (`printf '%s' {{ value }} > out` is compared with the value);
* the stage kinds' parameters that reach commands, on a simulated host: python_venv.path,
  pip_install.index_url/env (requirements that are not PEP 508 are refused at validation, exit
  2, before anything runs), hf_download repo/revision/local_dir, inspect_config.path,
  sglang_server model_path/state_dir/served_model_name/env/api_key/extra_args (the launched
  server's argv and environment are read from /proc and compared) and wait_ready url/api_key.

A clean failure of a stage is fine; execution of a payload is not: after every run no canary
file may exist. Two guards that need no host are tested too: a `{{ value }}` written inside
shell quotes in a command is refused at validation (its quoting would be undone), and the
systemd unit sglang_server writes on a systemd host keeps every value on its own line, with
`%` and `$` escaped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config.loader import load_inventory
from orchestrator.host import Host
from orchestrator.transports import make_transport
from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.hubrepos import EAGLE3_REPO, eagle3_config, kimi_files
from tests.runner.helpers import CliRun, cli, write_yaml
from tests.sim.conftest import assert_nothing_left
from tests.sshd import openssh_missing

SCALE = 0.001
_CONTROL = re.compile(r"[\x00-\x1f]")


def payloads(canary: Path) -> list[str]:
    """The corpus. Payload N tries to create CANARY/pwned-N (or run `touch` some other way)."""
    c = str(canary)
    return [
        f"; touch {c}/pwned-0",
        f"&& touch {c}/pwned-1",
        f"|| touch {c}/pwned-2",
        f"| touch {c}/pwned-3",
        f"$(touch {c}/pwned-4)",
        f"`touch {c}/pwned-5`",
        "$HOME ${PATH} $((6*7)) $0 $$ $? $1 ${IFS}",
        f"'; touch {c}/pwned-7; echo '",
        f"\"; touch {c}/pwned-8; echo \"",
        f"line one\ntouch {c}/pwned-9\n",
        f"* ? [a-z]* ~ ~root {{a,b}} {c}/*",
        "--help",
        "-rf",
        f"{c}/path with spaces/and  two",
        "{{ 7 * 7 }}",
        "{% raw %}{# not a comment {%",
        f"> {c}/pwned-16",
        f"& touch {c}/pwned-17 &",
        f"\\$(touch {c}/pwned-18)\\",
        "\r\t\x1b[31m\u202eRTL \u0645\u0631\u062d\u0628\u0627 \U0001F600",
        "!! #not a comment",
        f"\"$(touch {c}/pwned-21)\"",
        f"'$(touch {c}/pwned-22)'",
        f"\n; touch {c}/pwned-23 #",
        "x" * 5000 + f"; touch {c}/pwned-24",
        f"$'\\n' ;touch {c}/pwned-25",
        f"<(touch {c}/pwned-26)",
        "",
    ]


class Env(str):
    """Written as `!env NAME` by `dump`: the value comes from the operator's environment."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(Env, lambda d, v: d.represent_scalar("!env", str(v)))


def dump(path: Path, data: Any) -> Path:
    """Write YAML (every string escaped as YAML needs; Env values as !env tags)."""
    path.write_text(yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1 << 20))
    return path


def _is_template_text(value: str) -> bool:
    return any(t in value for t in ("{{", "{%", "{#"))


def assert_no_canary(canary: Path) -> None:
    left = sorted(p.name for p in canary.iterdir())
    assert left == [], f"payloads were EXECUTED: {left}"


def env_for(values: list[str]) -> dict[str, str]:
    return {f"INJ_P{i}": v for i, v in enumerate(values)}


# -- the shell kind ------------------------------------------------------------------------------


def shell_playbook(path: Path, indexes: list[int], out: Path, source: str) -> Path:
    """Stages writing every value with printf through run/check, `uses: shell` and env."""
    vars_: dict[str, Any] = {"out": str(out)}
    stages: list[dict[str, Any]] = []
    for i in indexes:
        name = f"p{i}"
        if source == "env":
            vars_[name] = Env(f"INJ_P{i}")
        stages += [
            {"id": f"run-{i}",
             "run": f"printf '%s' {{{{ {name} }}}} > {{{{ out }}}}/run-{i}",
             "check": f"printf '%s' {{{{ {name} }}}} > {{{{ out }}}}/check-{i} && "
                      f"test -e {{{{ out }}}}/run-{i}",
             "when": f"{name} | length >= 0"},
            {"id": f"with-{i}", "uses": "shell",
             "with": {"command": f"printf '%s' {{{{ {name} }}}} > {{{{ out }}}}/with-{i}",
                      "check": f"printf '%s' {{{{ {name} }}}} > {{{{ out }}}}/withcheck-{i} "
                               f"&& test -e {{{{ out }}}}/with-{i}"}},
            {"id": f"env-{i}", "run": f"printf '%s' \"$INJ\" > {{{{ out }}}}/env-{i}",
             "env": {"INJ": f"{{{{ {name} }}}}"}},
        ]
    return dump(path, {"name": "injection-shell", "vars": vars_, "stages": stages})


def check_shell_outputs(out: Path, values: list[str], indexes: list[int]) -> None:
    for i in indexes:
        want = values[i].encode()
        for kind in ("run", "check", "with", "withcheck", "env"):
            got = (out / f"{kind}-{i}").read_bytes()
            assert got == want, f"{kind}-{i}: sent {want[:80]!r}, the host got {got[:80]!r}"


def run_shell_corpus(tmp: Path, inventory: Path, source: str,
                     indexes: list[int] | None = None) -> tuple[CliRun, Path, list[int]]:
    canary = tmp / "canary"
    out = tmp / "out"
    canary.mkdir(parents=True, exist_ok=True)
    out.mkdir()
    values = payloads(canary)
    indexes = list(range(len(values))) if indexes is None else indexes
    pb = shell_playbook(tmp / "shell.yaml", indexes, out, source)
    r = cli("deploy", str(pb), "-i", str(inventory), runs=tmp / "runs", timeout=240,
            env=env_for(values) if source == "env" else None, cwd=tmp)
    assert_no_canary(canary)
    return r, out, indexes


@pytest.fixture
def local_inventory(tmp_path: Path) -> Path:
    return write_yaml(tmp_path / "local.yaml", {"hosts": {"localhost": {
        "connection": "local", "lock_path": str(tmp_path / "deploy.lock")}}})


def test_shell_values_from_the_environment_are_inert_on_a_local_host(
    tmp_path: Path, local_inventory: Path
) -> None:
    r, out, indexes = run_shell_corpus(tmp_path, local_inventory, "env")
    assert r.code == 0, r.stdout + r.stderr
    assert set(r.statuses("localhost").values()) == {"changed"}
    check_shell_outputs(out, payloads(tmp_path / "canary"), indexes)


def test_shell_values_from_inventory_vars_are_inert_on_a_local_host(tmp_path: Path) -> None:
    values = payloads(tmp_path / "canary")
    # template text in an inventory var IS a template (by design): the plain values here
    plain = [i for i, v in enumerate(values) if not _is_template_text(v)]
    inv = dump(tmp_path / "inv.yaml", {"hosts": {"localhost": {
        "connection": "local", "lock_path": str(tmp_path / "deploy.lock"),
        "vars": {f"p{i}": values[i] for i in plain}}}})
    r, out, _ = run_shell_corpus(tmp_path, inv, "inventory", plain)
    assert r.code == 0, r.stdout + r.stderr
    assert set(r.statuses("localhost").values()) == {"changed"}
    check_shell_outputs(out, values, plain)


# -- a simulated host over SSH (OpenSSH's sshd), with its hub and package index --------------------


class SimBox:
    """One simulated 8-GPU host reached over OpenSSH, with an SGLang venv built once."""

    def __init__(self, fleet: SimFleet, work: Path) -> None:
        self.fleet = fleet
        self.work = work
        self.inventory = fleet.inventory_path
        inv = load_inventory(self.inventory)
        self.spec = inv.hosts["gpu-1"].model_copy(update={"name": "gpu-1"})
        self.vars = dict(self.spec.vars)
        self.base = Path(self.vars["base_dir"])
        info = fleet.info()
        self.host_python = info["python"]
        self.index_url = info["index_url"]
        self._python: str | None = None

    @property
    def sglang_python(self) -> str:
        """A venv on the host with the SGLang stand-in (built once, from the sim's index)."""
        if self._python is None:
            root = self.base / "venvs" / "sglang"
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PIP_", "VIRTUAL_ENV", "SIM_"))}
            env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
                       NO_PROXY="127.0.0.1,localhost")
            subprocess.run([self.host_python, "-m", "venv", "--without-pip", str(root)],
                           check=True, env=env, capture_output=True, timeout=120)
            pip = subprocess.run(
                [self.host_python, "-m", "pip", "-q", "--python", str(root / "bin/python"),
                 "install", "--no-cache-dir", "--index-url", self.index_url,
                 "sglang==0.5.23", "compressed-tensors"],
                env=env, capture_output=True, text=True, timeout=300)
            assert pip.returncode == 0, pip.stderr
            self._python = str(root / "bin/python")
        return self._python

    def host(self) -> Host:
        t = make_transport(self.spec)
        t.connect(budget=30)
        return Host(self.spec, t, dict(self.vars))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimBox]:
    if openssh_missing():
        pytest.skip(openssh_missing())
    work = tmp_path_factory.mktemp("inj")
    fleet = SimFleet.up(work / "sim", hosts=1, time_scale=SCALE, sshd="openssh",
                        hypervisor=False, index=True, hub=True, load_seconds=300.0)
    try:
        yield SimBox(fleet, work)
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)


def test_shell_values_are_inert_over_ssh(tmp_path: Path, box: SimBox) -> None:
    r, out, indexes = run_shell_corpus(tmp_path, box.inventory, "env")
    assert r.code == 0, r.stdout + r.stderr
    assert set(r.statuses("gpu-1").values()) == {"changed"}
    check_shell_outputs(out, payloads(tmp_path / "canary"), indexes)


# -- stage kinds ----------------------------------------------------------------------------------


def combo(canary: Path) -> str:
    """One path component holding most of the corpus at once (no '/' except in canary paths)."""
    c = str(canary)
    return (f"inj ;&&|| $(touch {c}/pwned-c1) `touch {c}/pwned-c2` $HOME '\" * ? [x] "
            f"{{{{ 7*7 }}}} {{% raw %}} > {c}/pwned-c3 & \u202e !")


def test_stage_kind_parameters_are_inert(tmp_path: Path, box: SimBox) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    weird = combo(canary)
    values = payloads(canary)
    base = box.base / "inj"
    # an inspect_config target and two checkpoints at paths made of the payload
    inspect_dir = base / "inspect" / weird
    inspect_dir.mkdir(parents=True)
    (inspect_dir / "config.json").write_text('{"answer": 42}')
    target = base / "models" / f"target {weird}"
    drafter = base / "models" / f"drafter {weird}"
    for folder, data in ((target, kimi_files()["config.json"]),
                         (drafter, json.dumps(eagle3_config()).encode())):
        folder.mkdir(parents=True)
        (folder / "config.json").write_bytes(data)
    api_key = f"sk-{values[4]}{values[7]}{values[21]}"  # $(...), closing quotes
    name = f"model {values[0]} {values[5]} {values[8]}"
    env_value = values[9] + values[4]  # a newline and a command substitution
    state = f"{base}/state {weird}"
    py = box.sglang_python
    env = {"INJ_WEIRD": weird, "INJ_KEY": api_key, "INJ_NAME": name, "INJ_ENVV": env_value,
           "INJ_DASH": "--help", **env_for(values)}
    hv = box.vars
    playbook = {
        "name": "injection-kinds",
        "vars": {"base": str(base), "weird": Env("INJ_WEIRD"), "key": Env("INJ_KEY"),
                 "model_name": Env("INJ_NAME"), "envv": Env("INJ_ENVV"),
                 "dash": Env("INJ_DASH"), "p13": Env("INJ_P13"), "p11": Env("INJ_P11")},
        "secrets": ["key"],
        "stages": [
            {"id": "venv", "uses": "python_venv",
             "with": {"path": "{{ base }}/venvs/{{ weird }}", "python": "python3"}},
            {"id": "venv-dash", "uses": "python_venv",
             "with": {"path": "{{ dash }}", "python": "python3"}},
            {"id": "pip", "uses": "pip_install", "needs": ["venv"],
             "with": {"python": "{{ base }}/venvs/{{ weird }}/bin/python",
                      "requirements": ["inj-no-such-package==1.0"],
                      "index_url": f"{hv['pip_index_url']}{{{{ weird }}}}",
                      "env": {"PIP_TIMEOUT": "3", "INJ": "{{ weird }}"}}},
            {"id": "hf-dir", "uses": "hf_download",
             "with": {"python": "python3", "repo": EAGLE3_REPO, "revision": "main",
                      "local_dir": "{{ base }}/hf/{{ weird }}", "endpoint": hv["hf_endpoint"],
                      "max_workers": 2, "progress_interval": 0.5}},
            {"id": "hf-revision", "uses": "hf_download",
             "with": {"python": "python3", "repo": EAGLE3_REPO, "revision": "{{ weird }}",
                      "local_dir": "{{ base }}/hf-rev", "endpoint": hv["hf_endpoint"]}},
            {"id": "inspect", "uses": "inspect_config",
             "with": {"path": "{{ base }}/inspect/{{ weird }}/config.json",
                      "expect": {"answer": {"equals": 42}}}},
            {"id": "inspect-missing", "uses": "inspect_config",
             "with": {"path": "{{ base }}/{{ p13 }}/{{ weird }}",
                      "expect": {"answer": {"equals": 42}}}},
            {"id": "server", "uses": "sglang_server",
             "with": {"python": py, "model_path": "{{ base }}/models/target {{ weird }}",
                      "draft_model_path": "{{ base }}/models/drafter {{ weird }}",
                      "tp": 8, "speculative": {"algorithm": "EAGLE3", "num_steps": 3,
                                               "eagle_topk": 1, "num_draft_tokens": 4},
                      "host": hv["sglang_host"], "port": hv["sglang_port"],
                      "served_model_name": "{{ model_name }}", "api_key": "{{ key }}",
                      "mem_fraction_static": 0.88, "env": {"INJ_ENV": "{{ envv }}"},
                      "state_dir": "{{ base }}/state {{ weird }}", "verify_window": 0.3,
                      "stop_timeout": 5}},
            {"id": "server-extra", "uses": "sglang_server",
             "with": {"python": py, "model_path": "{{ base }}/models/target {{ weird }}",
                      "tp": 8,
                      "host": hv["sglang_host"], "port": int(hv["sglang_port"]) + 1,
                      "extra_args": ["{{ p11 }}", "{{ weird }}", "--log-level", "{{ weird }}"],
                      "state_dir": "{{ base }}/state {{ weird }}-extra",
                      "verify_window": 0.3}},
            {"id": "ready", "uses": "wait_ready", "needs": ["server"],
             "with": {"url": f"http://{hv['sglang_host']}:{hv['sglang_port']}",
                      "api_key": "{{ key }}", "timeout": 60, "poll_interval": 0.1,
                      "state_dir": "{{ base }}/state {{ weird }}",
                      "chat_model": "{{ model_name }}"}},
            {"id": "ready-url", "uses": "wait_ready", "needs": ["server"],
             "with": {"url": f"http://{hv['sglang_host']}:{hv['sglang_port']}/{{{{ weird }}}}",
                      "timeout": 1, "poll_interval": 0.1}},
            {"id": "ready-header", "uses": "wait_ready", "needs": ["server"],
             "with": {"url": f"http://{hv['sglang_host']}:{hv['sglang_port']}",
                      "api_key": "{{ envv }}", "timeout": 1, "poll_interval": 0.1,
                      "expect_architectures": ["KimiK25ForConditionalGeneration"]}},
        ],
    }
    pb = dump(tmp_path / "kinds.yaml", playbook)
    try:
        r = cli("deploy", str(pb), "-i", str(box.inventory), runs=tmp_path / "runs",
                env=env, timeout=300)
        assert_no_canary(canary)
        stages = r.summary["hosts"]["gpu-1"]["stages"]
        status = {k: v["status"] for k, v in stages.items()}
        errors = {k: v.get("error") or "" for k, v in stages.items()}
        report = json.dumps(status, indent=1) + "\n" + json.dumps(errors, indent=1)
        for stage in ("venv", "venv-dash", "hf-dir", "server", "ready"):
            assert status[stage] == "changed", report
        assert status["inspect"] == "ok", report
        for stage in ("pip", "hf-revision", "inspect-missing", "server-extra", "ready-url",
                      "ready-header"):
            assert status[stage] == "failed", report
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr

        # the values arrived as data: paths exist byte for byte, the server got them as argv
        # elements and environment values, verbatim
        assert (base / "venvs" / weird / "bin" / "python").exists()
        # `--help` is a (relative) path: the venv is in the host user's home
        assert list(Path(box.vars["sim_root"]).glob("*/--help/bin/python"))
        assert (base / "hf" / weird / "config.json").exists()
        pid = r.summary["hosts"]["gpu-1"]["facts"]["server"]["pid"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        assert argv[argv.index(b"--served-model-name") + 1] == name.encode()
        assert argv[argv.index(b"--model-path") + 1] == str(target).encode()
        assert api_key.encode() not in b" ".join(argv)  # the key is never on argv
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"INJ_ENV=" + env_value.encode() in environ
        assert weird in errors["hf-revision"] or "revision" in errors["hf-revision"], report
        assert "preflight" in errors["server-extra"], report
        assert "unexpected argument" in errors["server-extra"], report
        key_file = Path(state) / "api_key"
        assert key_file.read_text() == api_key + "\n"
        assert key_file.stat().st_mode & 0o777 == 0o600
    finally:
        host = box.host()
        try:
            for sd in (state, f"{state}-extra"):
                host.act("server_stop", state_dir=sd, grace=5)
        finally:
            host.transport.close()
    assert_no_canary(canary)


def test_values_that_are_not_requirements_or_repos_are_refused_before_anything_runs(
    tmp_path: Path, local_inventory: Path
) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    values = payloads(canary)
    plain = [i for i, v in enumerate(values) if not _is_template_text(v)]
    # written into the playbook: refused by `validate`, each one located
    literal = {"name": "literal", "stages": [
        {"id": f"pip-{i}", "uses": "pip_install",
         "with": {"python": "python3", "requirements": [values[i]]}} for i in plain
    ] + [{"id": f"hf-{i}", "uses": "hf_download",
          "with": {"repo": values[i], "local_dir": str(tmp_path / "hf")}} for i in plain]}
    pb = dump(tmp_path / "literal.yaml", literal)
    r = cli("validate", str(pb), runs=tmp_path / "runs")
    assert r.code == 2, r.stdout + r.stderr
    for i in plain:
        assert f"stage 'pip-{i}', with.requirements" in r.stderr, r.stderr
        assert f"stage 'hf-{i}', with.repo" in r.stderr, r.stderr
    # rendered from variables at deploy time (every value, braces included, from the
    # environment): refused with exit 2 before any host is touched
    every = range(len(values))
    templated = {
        "name": "templated", "vars": {f"p{i}": Env(f"INJ_P{i}") for i in every},
        "stages": [{"id": f"pip-{i}", "uses": "pip_install",
                    "with": {"python": "python3", "requirements": [f"{{{{ p{i} }}}}"]}}
                   for i in every]
        + [{"id": f"hf-{i}", "uses": "hf_download",
            "with": {"repo": f"{{{{ p{i} }}}}", "local_dir": str(tmp_path / "hf")}}
           for i in every]}
    pb2 = dump(tmp_path / "templated.yaml", templated)
    r = cli("deploy", str(pb2), "-i", str(local_inventory), runs=tmp_path / "runs2",
            env=env_for(values))
    assert r.code == 2, r.stdout + r.stderr
    for i in every:
        assert f"stage 'pip-{i}', with.requirements" in r.stderr, r.stderr
        assert f"stage 'hf-{i}', with.repo" in r.stderr, r.stderr
    assert r.summary["hosts"] == {} and r.summary["exit_code"] == 2  # nothing ran
    assert not r.events
    assert not (tmp_path / "hf").exists()
    assert_no_canary(canary)


def test_a_value_inside_shell_quotes_is_refused_at_validation(tmp_path: Path) -> None:
    # inside "..." the value's own quotes are literal ($(...) would run); inside '...' they
    # close the author's (; would run): both are refused with the line, `| raw` is on purpose
    pb = dump(tmp_path / "quoted.yaml", {"name": "quoted", "vars": {"v": "x"}, "stages": [
        {"id": "dq", "run": 'echo "{{ v }}"'},
        {"id": "sq", "run": "true", "check": "test -e '/tmp/{{ v }}'"},
        {"id": "in-subst", "run": 'x=$(cat "{{ v }}")'},
        {"id": "with", "uses": "shell", "with": {"command": 'echo "$HOME/{{ v }}"'}},
        {"id": "fine", "run": "printf '%s\\n' {{ v }} > /dev/null; echo \"it's\" {{ v }}"},
        {"id": "raw", "run": 'echo "{{ v | raw }}"'},
    ]})
    r = cli("validate", str(pb), runs=tmp_path / "runs")
    assert r.code == 2
    bad = [ln for ln in r.stderr.splitlines() if "is inside shell quotes" in ln]
    assert [ln.split("stage ")[1].split(",")[0] for ln in bad] == [
        "'dq'", "'sq'", "'in-subst'", "'with'"], r.stderr
    assert all(ln.startswith(f"  {pb}:") for ln in bad), r.stderr


def test_systemd_unit_values_are_data(tmp_path: Path) -> None:
    """The unit file the sglang_server kind writes where systemd runs the host (not on the
    simulator): a newline would add directives (ExecStartPre=... runs as root), `%` and `$`
    are expanded by systemd even inside quotes."""
    from orchestrator.errors import StageError
    from orchestrator.sglang import launch

    values = payloads(tmp_path / "canary")
    for value in values:
        one_line = _CONTROL.sub(" ", value)  # control characters in a path: refused, below
        text = launch.unit_file(
            unit="orchestrator-sglang.service", description=f"SGLang server {value}",
            python=f"/opt/v/{one_line}/bin/python",
            supervisor="/s/supervise.py", launch_file="/s/launch.json", state_dir="/s",
            stop_timeout=70)
        keys = [ln.split("=", 1)[0] for ln in text.splitlines()
                if ln and not ln.startswith(("#", "["))]
        assert keys == ["Description", "After", "Wants", "Type", "WorkingDirectory",
                        "ExecStart", "KillMode", "KillSignal", "TimeoutStopSec", "Restart",
                        "LimitNOFILE", "LimitMEMLOCK", "WantedBy"], text
        exec_start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
        assert "$" not in exec_start.replace("$$", "") and "%" not in exec_start.replace("%%", "")
    for field in ("state_dir", "python"):
        kwargs = {"unit": "u.service", "description": "d", "python": "/v/bin/python",
                  "supervisor": "/s/sup.py", "launch_file": "/s/l.json", "state_dir": "/s",
                  "stop_timeout": 5}
        kwargs[field] = "/s\nExecStartPre=/bin/touch /tmp/pwned"
        with pytest.raises(StageError, match="control character"):
            launch.unit_file(**kwargs)
    # the unit's name becomes a path under /etc/systemd/system: only a name is accepted
    pb = dump(tmp_path / "unit.yaml", {"name": "u", "stages": [
        {"id": "server", "uses": "sglang_server",
         "with": {"python": "/v/bin/python", "model_path": "/m", "state_dir": "/s",
                  "unit_name": "../../../etc/cron.d/evil"}}]})
    r = cli("validate", str(pb), runs=tmp_path / "runs")
    assert r.code == 2 and "unit_name" in r.stderr, r.stderr
