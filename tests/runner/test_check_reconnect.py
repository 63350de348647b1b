"""A stage's check is asked again after a dropped connection, without spending an attempt of
its `retry:` policy (a check only reads). Found by the soak (scripts/soak.py): on a flaky link
the converged checks of every deploy spent the retry budget that an interrupted apply needs.

The drop is real: the check command hangs up its own agent (SIGHUP, as sshd does when a
session drops) the first time it runs; the agent exits and the connection is lost."""

from __future__ import annotations

from pathlib import Path

from tests.runner.helpers import cli, local_inventory, write_yaml


def playbook(tmp_path: Path, check: str, retry: dict | None = None) -> Path:
    stage: dict = {"id": "probe", "run": f"touch {tmp_path / 'applied'}", "check": check}
    if retry is not None:
        stage["retry"] = retry
    return write_yaml(tmp_path / "pb.yaml", {"name": "check-reconnect", "hosts": "localhost",
                                             "stages": [stage]})


def hang_up_once(marker: Path) -> str:
    # the first run: leave a mark, hang up the agent that runs us, never answer
    return (f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; kill -HUP $PPID; "
            "sleep 30; exit 0")


def test_a_check_cut_once_is_asked_again_and_converges(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml")
    pb = playbook(tmp_path, hang_up_once(tmp_path / "cut"))  # no retry: policy at all
    r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs")
    assert r.code == 0, r.stdout + r.stderr
    assert r.statuses("localhost") == {"probe": "ok"}
    end = next(e for e in r.events if e["event"] == "stage.end")
    assert end["attempts"] == 1
    again = [e for e in r.events if e["event"] == "stage.check_retry"]
    assert len(again) == 1 and "connection lost" in again[0]["error"]
    assert "[localhost] probe check cut (" in r.stdout + r.stderr  # the operator sees it
    assert not (tmp_path / "applied").exists()  # converged: nothing was applied


def test_a_check_that_keeps_losing_its_connection_fails_after_a_few_tries(
        tmp_path: Path) -> None:
    inv = local_inventory(tmp_path / "inv.yaml")
    pb = playbook(tmp_path, "kill -HUP $PPID; sleep 30")
    r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs")
    assert r.code == 1
    assert r.statuses("localhost") == {"probe": "failed"}
    assert "connection lost" in r.summary["hosts"]["localhost"]["stages"]["probe"]["error"]
    assert len([e for e in r.events if e["event"] == "stage.check_retry"]) == 2
    assert not (tmp_path / "applied").exists()
