"""orchestrator/remote/gateway_launch.py, imported: key files refused unless ours and 0600, the
key flags as single tokens, the probe's argv (spare loopback ports, no workers), a verdict as
data where smg does not import; and the supervisor masking every key of `key_files`. The real
smg runs it in tests/stages/test_gateway.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.remote import gateway_launch as gl
from orchestrator.remote import supervisor


def test_key_files_must_be_ours_and_0600(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_text("s3cret\n")
    key.chmod(0o600)
    assert gl.read_key(str(key)) == "s3cret"
    key.chmod(0o640)
    with pytest.raises(gl.KeyFileError, match="mode 0640; it must be 0600") as err:
        gl.read_key(str(key))
    assert "s3cret" not in str(err.value)
    key.chmod(0o600)
    link = tmp_path / "l"
    link.symlink_to(key)
    with pytest.raises(gl.KeyFileError, match="cannot open"):
        gl.read_key(str(link))  # O_NOFOLLOW: a link is not our file
    with pytest.raises(gl.KeyFileError, match="cannot open"):
        gl.read_key(str(tmp_path / "missing"))
    empty = tmp_path / "e"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(gl.KeyFileError, match="is empty"):
        gl.read_key(str(empty))


def test_run_refuses_a_loose_key_file_before_importing_smg(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    key = tmp_path / "api_key"
    key.write_text("s3cret\n")
    key.chmod(0o644)
    spec = tmp_path / "gateway.json"
    spec.write_text(f'{{"args": [], "api_key_file": "{key}"}}')
    assert gl.main(["run", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "refused: the key file" in err and "s3cret" not in err


def test_arguments_and_the_probe_argv() -> None:
    spec = {"args": ["--host", "0.0.0.0", "--port", "30080", "--policy", "random"],
            "worker_urls": ["http://a:1", "http://b:1"]}
    argv = gl.full_args(spec, "-dash-key", "c:d")
    assert argv == ["--host", "0.0.0.0", "--port", "30080", "--policy", "random",
                    "--worker-urls", "http://a:1", "http://b:1", "--api-key=-dash-key",
                    "--control-plane-api-keys=orchestrator:orchestrator:admin:c:d"]
    probe = gl.probe_argv(argv)
    assert "http://a:1" not in probe and "--worker-urls" not in probe
    assert probe[probe.index("--host") + 1] == "127.0.0.1"
    assert probe[probe.index("--prometheus-host") + 1] == "127.0.0.1"
    assert probe[probe.index("--port") + 1] != "30080"
    assert "--api-key=-dash-key" in probe and "random" in probe


def test_check_without_smg_is_data() -> None:
    verdict = gl.check({"args": ["--policy", "round_robin"]})
    assert verdict["available"] is False and verdict["kind"] == "ModuleNotFoundError"


def test_the_supervisor_masks_every_key() -> None:
    keys = [b"alpha-key-1", b"beta-key-22"]
    text = b"start alpha-key-1 mid beta-key-22 end alpha-key-1"
    for cut in range(1, len(text)):
        m = supervisor.Maskers(keys)
        out = m.feed(text[:cut]) + m.feed(text[cut:]) + m.flush()
        assert out == b"start *** mid *** end ***", cut
    assert supervisor.Maskers([]).feed(b"x") == b"x"


def test_the_supervisor_reads_key_file_and_key_files(tmp_path: Path) -> None:
    paths = []
    for i, k in enumerate((b"one", b"two", b"three")):
        p = tmp_path / str(i)
        p.write_bytes(k + b"\n")
        paths.append(str(p))
    spec = {"key_file": paths[0], "key_files": paths[1:] + [str(tmp_path / "gone")]}
    assert supervisor._read_keys(spec) == [b"one", b"two", b"three"]
    assert supervisor._read_keys({}) == []
    assert os.path.exists(paths[0])
