import time

import pytest

from orchestrator.config.yamlsrc import load_yaml, load_yaml_text, parse_scalar
from orchestrator.errors import ConfigError, Location


def problems(text, **kw):
    with pytest.raises(ConfigError) as exc:
        load_yaml_text(text, "f.yaml", **kw)
    return exc.value.problems


def test_values_and_locations():
    doc = load_yaml_text("name: x\nstages:\n  - id: a\n    needs: [b, c]\n", "f.yaml")
    assert doc.data == {"name": "x", "stages": [{"id": "a", "needs": ["b", "c"]}]}
    assert doc.locations[("name",)] == Location("f.yaml", 1, 7)
    assert doc.locations[("stages", 0)] == Location("f.yaml", 3, 5)
    assert doc.locations[("stages", 0, "needs", 1)] == Location("f.yaml", 4, 16)
    assert doc.key_locations[("stages", 0, "needs")] == Location("f.yaml", 4, 5)
    # nearest existing parent for a path that is not there
    assert doc.loc(("stages", 0, "missing", 3)) == Location("f.yaml", 3, 5)
    # a block list under a key: point at the key
    assert doc.best_loc(("stages",)) == Location("f.yaml", 2, 1)


def test_duplicate_keys_all_reported_at_the_duplicate():
    found = problems("a: 1\nb:\n  x: 1\n  x: 2\na: 3\n")
    assert [(p.location.line, p.location.column) for p in found] == [(4, 3), (5, 1)]
    assert "duplicate key 'x' (first written on line 3)" in found[0].message


def test_syntax_error_is_located():
    (p,) = problems("a: 1\nb: [1, 2\n")
    assert p.location.line == 2 and p.location.column == 4
    assert "YAML syntax error" in p.message and "never closed" in p.message


def test_tab_indentation_has_its_own_hint():
    (p,) = problems("a:\n  b: 1\n\tc: 2\n")
    assert p.location.line == 3 and p.location.column == 1
    assert "tabs" in p.hint


def test_alias_bomb_fails_fast():
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    start = time.monotonic()
    (p,) = problems("\n".join(lines) + "\n")
    assert time.monotonic() - start < 20  # bounded, not exponential
    assert "alias bomb" in p.message
    assert p.location.line == 5  # `e:` is the first value that expands past the limit


def test_node_limit_is_configurable_and_small_documents_pass():
    text = "a: &a [1, 2, 3]\nb: [*a, *a]\n"
    assert load_yaml_text(text).data["b"] == [[1, 2, 3], [1, 2, 3]]
    assert "more than 5 values" in problems(text, max_nodes=5)[0].message


def test_big_documents_stop_while_composing():
    start = time.monotonic()
    (p,) = problems("x: [" + ",".join(["1"] * 500_000) + "]\n")
    assert time.monotonic() - start < 30  # stops early, does not build it
    assert "holds more than 100000 values" in p.message


def test_recursive_alias_is_rejected():
    (p,) = problems("a: &a [1, *a]\n")
    assert "recursive alias" in p.message


def test_nesting_depth_limit():
    (p,) = problems("x: " + "[" * 70 + "]" * 70 + "\n")
    assert "nested more than 64 levels" in p.message
    assert p.location.line == 1
    load_yaml_text("x: " + "[" * 40 + "]" * 40 + "\n")


def test_file_limits_and_unreadable_files(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * 200 + "\n")
    with pytest.raises(ConfigError, match="too large"):
        load_yaml(big, max_bytes=100)
    with pytest.raises(ConfigError, match="file not found") as exc:
        load_yaml(tmp_path / "nope.yaml")
    assert exc.value.problems[0].hint
    with pytest.raises(ConfigError, match="is a directory"):
        load_yaml(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: 1\nb: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not valid UTF-8") as exc:
        load_yaml(bad)
    assert exc.value.problems[0].location.line == 2


def test_env_tag_required_and_optional_forms():
    env = {"HOME_DIR": "/home/op", "HF_TOKEN": "hf_secret_value", "EMPTY": ""}
    doc = load_yaml_text(
        "home: !env HOME_DIR\ntoken: !env HF_TOKEN\n"
        "port: !env PORT:-8080\nempty: !env EMPTY:-fallback\nnone: !env NOPE:-\n",
        environ=env,
    )
    assert doc.data == {
        "home": "/home/op", "token": "hf_secret_value", "port": "8080",
        "empty": "fallback", "none": "",
    }
    assert doc.secrets == {"hf_secret_value"}


def test_env_tag_errors_are_located_and_all_reported():
    found = problems("a: 1\nb: !env NOT_SET_X\nc: !env 'bad name'\nd: !env [A]\n", environ={})
    assert [p.location.line for p in found] == [2, 3, 4]
    assert "NOT_SET_X is not set" in found[0].message
    assert "`!env NOT_SET_X:-VALUE`" in found[0].hint
    assert "not an environment variable name" in found[1].message


def test_yaml_11_oddities_stay_text():
    doc = load_yaml_text("on: [connection]\ncountry: no\nflag: true\nday: 2024-01-01\n1: x\n")
    assert doc.data == {
        "on": ["connection"], "country": "no", "flag": True, "day": "2024-01-01", "1": "x"
    }


def test_merge_keys():
    doc = load_yaml_text("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n", "f.yaml")
    assert doc.data["d"] == {"y": 3, "x": 1}
    assert doc.locations[("d", "x")].line == 1  # where the merged value was written


def test_unsupported_tag():
    (p,) = problems("a: !python/object:os.system echo\n")
    assert "unsupported tag" in p.message


def test_empty_document():
    assert load_yaml_text("# only a comment\n").data is None


def test_parse_scalar():
    assert parse_scalar("8") == 8
    assert parse_scalar("1.5") == 1.5
    assert parse_scalar("true") is True
    assert parse_scalar("null") is None
    assert parse_scalar("yes") == "yes"
    assert parse_scalar("a: b") == "a: b"
    assert parse_scalar("[1, 2]") == "[1, 2]"
    assert parse_scalar("") == ""
    assert parse_scalar("2024-01-01") == "2024-01-01"
