"""The launch command: server arguments, the API-key wrapper (run for real), fingerprint, unit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.sglang import launch
from orchestrator.stages.sglang_server import SGLangServerParams

KEY = "sk-wrapper-canary-51f0"


def params(**over) -> SGLangServerParams:
    base = {
        "python": "/v/bin/python", "model_path": "/m/k26", "draft_model_path": "/m/d", "tp": 8,
        "speculative": {"algorithm": "eagle3", "num_steps": 3, "eagle_topk": 1,
                        "num_draft_tokens": 4},
        "served_model_name": "kimi-k2.6", "mem_fraction_static": 0.88, "api_key": KEY,
        "env": {"NCCL_P2P_LEVEL": "SYS"}, "state_dir": "/s", "extra_args": "--watchdog-timeout 600",
    }
    base.update(over)
    return SGLangServerParams.model_validate(base)


def test_build_args_uses_full_flag_names_and_no_key() -> None:
    args = launch.build_args(params())
    assert args[:4] == ["--model-path", "/m/k26", "--tp-size", "8"]
    assert "--tp" not in args
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert args[args.index("--speculative-draft-model-path") + 1] == "/m/d"
    assert args[args.index("--mem-fraction-static") + 1] == "0.88"
    assert "--enable-metrics" in args and "--trust-remote-code" not in args
    assert args[-2:] == ["--watchdog-timeout", "600"]
    assert KEY not in " ".join(args) and "--api-key" not in args
    plain = launch.build_args(params(speculative=None, enable_metrics=False, port=30001))
    assert "--speculative-algorithm" not in plain and "--speculative-draft-model-path" not in plain
    assert plain[plain.index("--port") + 1] == "30001" and "--enable-metrics" not in plain


def test_wrapper_passes_the_key_in_process_only(tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    out = tmp_path / "seen.json"
    (pkg / "launch_server.py").write_text(
        "import json, sys\n"
        "if __name__ == '__main__':\n"
        f"    cmd = open('/proc/self/cmdline', 'rb').read().decode()\n"
        f"    json.dump({{'argv': sys.argv[1:], 'cmdline': cmd, 'name': __name__}}, "
        f"open({str(out)!r}, 'w'))\n")
    keyfile = tmp_path / "api_key"
    keyfile.write_text(KEY + "\n")
    keyfile.chmod(0o600)
    argv = launch.server_argv(sys.executable, str(keyfile), ["--model-path", "/m", "--tp-size",
                                                             "8"])
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    subprocess.run(argv, env=env, check=True, timeout=60)
    seen = json.loads(out.read_text())
    assert seen["name"] == "__main__"
    assert seen["argv"] == ["--model-path", "/m", "--tp-size", "8", "--api-key", KEY]
    assert KEY not in seen["cmdline"]
    # without a key nothing is added
    subprocess.run(launch.server_argv(sys.executable, None, ["--port", "1"]), env=env,
                   check=True, timeout=60)
    assert json.loads(out.read_text())["argv"] == ["--port", "1"]


def test_fingerprint_changes_with_each_part_and_says_what_changed() -> None:
    args = launch.build_args(params())
    env = launch.launch_env("/s/cache", {"NCCL_P2P_LEVEL": "SYS"})
    assert env["TRITON_CACHE_DIR"] == "/s/cache/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/s/cache/torchinductor"

    def fp(args=args, env=env, **over):
        kw = {"sglang_version": "0.5.23", "model_identity": "commit:abc",
              "draft_identity": "config:123", "api_key": KEY, "python": "/v/bin/python"}
        kw.update(over)
        return launch.fingerprint(args, env, **kw)

    base = fp()
    assert base == fp()
    assert KEY not in json.dumps(base)
    cases = {
        "args": (launch.build_args(params(mem_fraction_static=0.85)),
                 "--mem-fraction-static 0.88 -> 0.85"),
        "env": ({**env, "NCCL_P2P_LEVEL": "NVL"}, "env NCCL_P2P_LEVEL changed"),
        "sglang_version": ("0.5.24", "sglang version 0.5.23 -> 0.5.24"),
        "model_identity": ("commit:def", "model commit:abc -> commit:def"),
        "api_key": ("sk-other-000000", "api key changed"),
    }
    for name, (value, text) in cases.items():
        other = fp(**{name: value})
        assert other["fingerprint"] != base["fingerprint"], name
        changes = launch.diff_fingerprints(base, other)
        assert text in changes, (name, changes)
        assert "sk-other" not in " ".join(changes)
    assert launch.diff_fingerprints(None, base) == ["no fingerprint recorded"]


def test_unit_file() -> None:
    text = launch.unit_file(unit="orchestrator-sglang.service", description="SGLang kimi",
                            python="/v/bin/python", supervisor="/s/supervise.py",
                            launch_file="/s/launch.json", state_dir="/s", stop_timeout=70)
    assert "ExecStart=/v/bin/python /s/supervise.py /s/launch.json" in text
    assert "KillMode=control-group" in text and "TimeoutStopSec=70" in text
    assert "WantedBy=multi-user.target" in text
    assert launch.unit_name("x") == "x.service" and launch.unit_name("y.service") == "y.service"


def test_unit_file_restarts_the_supervisor_only_with_a_restart_policy() -> None:
    kwargs = dict(unit="orchestrator-sglang.service", description="SGLang kimi",
                  python="/v/bin/python", supervisor="/s/supervise.py",
                  launch_file="/s/launch.json", state_dir="/s", stop_timeout=70)
    plain = launch.unit_file(**kwargs)
    assert "Restart=no\n" in plain and "StartLimit" not in plain
    text = launch.unit_file(**kwargs, restart=launch.RESTART_ON_FAILURE)
    unit, service = text.split("[Service]")
    assert "StartLimitIntervalSec=300\n" in unit and "StartLimitBurst=5\n" in unit
    assert "Restart=on-failure\n" in service and "RestartSec=1\n" in service
    assert "RestartPreventExitStatus=3 127\n" in service and "Restart=no" not in service
    from orchestrator.remote import supervisor
    assert launch.SUPERVISOR_FINAL_STATUSES == (supervisor.GAVE_UP, supervisor.CANNOT_START)


def test_a_restart_policy_changes_the_fingerprint_only_when_set() -> None:
    kw = dict(sglang_version="0.5.23", model_identity="m", draft_identity=None, api_key=None,
              python="/v/bin/python")
    off = launch.fingerprint(["--port", "1"], {}, **kw)
    assert launch.fingerprint(["--port", "1"], {}, restart=None, **kw) == off
    on = launch.fingerprint(["--port", "1"], {}, restart=launch.RESTART_ON_FAILURE, **kw)
    assert on["fingerprint"] != off["fingerprint"]
    assert launch.diff_fingerprints(off, on) == [
        f"restart on failure off -> {launch.RESTART_ON_FAILURE}"]
