"""The CLI front: the malformed corpus gives exit 2 with file:line, help texts, schema output."""

from __future__ import annotations

import json
import re

import pytest

from orchestrator.cli.main import main
from tests.config.corpus import UNSET_ENV, CorpusCase, corpus_cases

CASES = corpus_cases()


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_each_malformed_file_exits_2_naming_its_line(
    case: CorpusCase, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in UNSET_ENV:
        monkeypatch.delenv(name, raising=False)
    argv = ["validate", str(case.playbook)]
    if case.inventory is not None:
        argv += ["-i", str(case.inventory)]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert re.search(rf"{re.escape(case.path.name)}:{case.line}:\d+", err), err
    for fragment in case.fragments:
        assert fragment in err


@pytest.mark.parametrize("sub", ["deploy", "plan", "validate", "schema", "sim"])
def test_every_subcommand_has_help(sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        main([sub, "--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: orchestrator " + sub)


def test_top_level_help_lists_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code in ("0 ", "1 ", "2 ", "3 ", "130"):
        assert code in out
    assert "deploy" in out and "sim" in out


def test_schema_is_json_with_stage_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "shell" in json.dumps(schema)
    assert main(["schema", "--kind", "inventory"]) == 0
    inv = json.loads(capsys.readouterr().out)
    assert "hosts" in inv["properties"]


def test_validate_without_an_inventory_reports_undefined_variables(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """A typo no inventory could fix is an error; a name only an inventory can define is a
    note that names it, with its file:line:column."""
    pb = tmp_path / "pb.yaml"
    pb.write_text("name: t\nvars: {workdir: /tmp/x}\nstages:\n  - id: a\n"
                  "    run: mkdir -p {{ workdri }}\n")
    assert main(["validate", str(pb)]) == 2
    err = capsys.readouterr().err
    assert f"{pb}:5:10: stage 'a', run: undefined variable 'workdri'" in err
    assert "did you mean 'workdir'?" in err
    pb.write_text("name: t\nvars: {workdir: /tmp/x}\nstages:\n  - id: a\n"
                  "    run: mkdir -p {{ workdir }}/{{ site }}\n")
    assert main(["validate", str(pb)]) == 0
    out = capsys.readouterr().out
    assert "the inventory (or --var) must define them: site" in out
    assert f"{pb}:5:10: site" in out
    assert main(["validate", str(pb), "--var", "site=a"]) == 0
    assert "note:" not in capsys.readouterr().out
