"""End-to-end runs of the CLI against `connection: local` hosts: statuses, idempotency, dry-run,
failures, retries, exit codes, the run record and secrets."""

from __future__ import annotations

from pathlib import Path

from tests.runner.helpers import cli, local_inventory, write_yaml

REPO = Path(__file__).resolve().parents[2]


def test_hello_example_converges_and_second_run_changes_nothing(tmp_path: Path) -> None:
    work = tmp_path / "hello"
    args = ("deploy", str(REPO / "playbooks/examples/hello.yaml"),
            "-i", str(REPO / "configs/inventory/local.yaml"), "--var", f"workdir={work}")
    home = {"HOME": str(tmp_path / "home")}  # the host lock goes under ~/.orchestrator
    first = cli(*args, runs=tmp_path / "runs", env=home)
    assert first.code == 0, first.stderr
    st = first.statuses("localhost")
    assert len(st) >= 3 and "changed" in st.values() and "failed" not in st.values()
    second = cli(*args, runs=tmp_path / "runs", env=home)
    assert second.code == 0, second.stderr
    assert set(second.statuses("localhost").values()) == {"ok"}
    assert second.run_dir != first.run_dir


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "made"
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "dry", "vars": {"target": str(target)},
        "stages": [
            {"id": "mk", "run": "mkdir -p {{ target }}", "check": "test -d {{ target }}"},
            {"id": "file", "run": "echo hi > {{ target }}/f", "check": "test -f {{ target }}/f",
             "needs": ["mk"]},
        ],
    })
    inv = local_inventory(tmp_path / "inv.yaml")
    r = cli("deploy", str(pb), "-i", str(inv), "--dry-run", runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    assert r.statuses("localhost") == {"mk": "would-change", "file": "would-change"}
    assert not target.exists()
    assert r.summary["dry_run"] is True
    r = cli("plan", str(pb), "-i", str(inv), runs=tmp_path / "runs")
    assert r.code == 0 and not target.exists()


def test_failed_stage_skips_dependants_but_not_independent_stages(tmp_path: Path) -> None:
    marker = tmp_path / "independent"
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "fail", "stages": [
            {"id": "bad", "run": "echo to-stdout; echo boom >&2; exit 7"},
            {"id": "after-bad", "run": "true", "needs": ["bad"]},
            {"id": "after-after", "run": "true", "needs": ["after-bad"]},
            {"id": "independent", "run": f"touch {marker}"},
        ],
    })
    r = cli("deploy", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")),
            runs=tmp_path / "runs")
    assert r.code == 1
    st = r.statuses("localhost")
    assert st == {"bad": "failed", "after-bad": "skipped", "after-after": "skipped",
                  "independent": "changed"}
    assert marker.exists()
    err = r.summary["hosts"]["localhost"]["stages"]["bad"]["error"]
    assert "exit code 7" in err and "boom" in err and "echo to-stdout" in err
    cmd = [e for e in r.events if e["event"] == "command" and e.get("stage") == "bad"][0]
    assert cmd["exit_code"] == 7 and cmd["stderr_tail"] == "boom"
    assert cmd["stdout_tail"] == "to-stdout" and cmd["host"] == "localhost"
    assert "boom" in r.stderr  # the console shows the failure's output


def test_retry_on_exit_code_reruns_until_success(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "retry", "stages": [{
            "id": "flaky",
            "run": f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; "
                   "[ $n -ge 3 ] || exit 75",
            "retry": {"attempts": 4, "delay": "10ms", "on": [75]},
        }, {
            "id": "not-retried",
            "run": "exit 9",
            "retry": {"attempts": 3, "delay": 0, "on": [75]},
        }],
    })
    r = cli("deploy", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")),
            runs=tmp_path / "runs")
    stages = r.summary["hosts"]["localhost"]["stages"]
    assert stages["flaky"]["status"] == "changed" and stages["flaky"]["attempts"] == 3
    assert counter.read_text().strip() == "3"
    assert stages["not-retried"]["status"] == "failed"
    assert stages["not-retried"]["attempts"] == 1
    assert len([e for e in r.events if e["event"] == "stage.retry"]) == 2


def test_when_false_skips_and_vars_precedence_reaches_the_shell(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "vars", "vars": {"greeting": "from-playbook", "enabled": False},
        "stages": [
            {"id": "say", "run": "printf %s {{ greeting }} > " + str(out)},
            {"id": "maybe", "run": "exit 1", "when": "enabled"},
        ],
    })
    inv = write_yaml(tmp_path / "inv.yaml", {
        "hosts": {"localhost": {"connection": "local", "vars": {"greeting": "from host; id"}}},
    })
    r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    assert out.read_text() == "from host; id"  # quoted: the `; id` did not run
    assert r.statuses("localhost")["maybe"] == "skipped"
    r = cli("deploy", str(pb), "-i", str(inv), "--var", "greeting=from-cli", runs=tmp_path / "r2")
    assert out.read_text() == "from-cli"


def test_bad_input_exits_2_without_traceback(tmp_path: Path) -> None:
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "x", "stages": [
        {"id": "a", "run": "echo {{ nope }}"}]})
    r = cli("deploy", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")),
            runs=tmp_path / "runs")
    assert r.code == 2
    assert "nope" in r.stderr and "Traceback" not in r.stderr
    r = cli("deploy", str(tmp_path / "missing.yaml"), "-i", str(tmp_path / "inv.yaml"),
            runs=tmp_path / "runs")
    assert r.code == 2 and "Traceback" not in r.stderr
    r = cli("deploy", str(pb), runs=tmp_path / "runs")  # no -i: argparse error
    assert r.code == 2


def test_json_output_is_the_summary(tmp_path: Path) -> None:
    import json

    pb = write_yaml(tmp_path / "pb.yaml", {"name": "j", "stages": [{"id": "a", "run": "true"}]})
    r = cli("deploy", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")), "--json",
            runs=tmp_path / "runs")
    assert r.code == 0
    data = json.loads(r.stdout)
    assert data["hosts"]["localhost"]["stages"]["a"]["status"] == "changed"
    assert data["exit_code"] == 0 and data["run_id"] == r.summary["run_id"]


def test_secret_canary_never_written_or_printed(tmp_path: Path) -> None:
    canary = "CANARY-7f3a9c1e5b"
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "secret", "secrets": ["api_password"],
        "vars": {"api_password": canary},
        "stages": [
            {"id": "use", "run": "test -n \"$TOKEN_X\" && echo got {{ api_password }}",
             "env": {"TOKEN_X": "{{ api_password }}"}},
            {"id": "fail", "run": "echo {{ api_password }} >&2; exit 3"},
        ],
    })
    r = cli("deploy", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")), "-v",
            runs=tmp_path / "runs", env={"MY_API_KEY": "ENVCANARY-55aa"})
    assert r.code == 1
    assert r.statuses("localhost")["use"] == "changed"
    everything = r.stdout + r.stderr
    for f in (tmp_path / "runs").rglob("*"):
        if f.is_file():
            everything += f.read_bytes().decode("utf-8", "replace")
    assert canary not in everything
    assert "ENVCANARY-55aa" not in everything
    assert "***" in everything
