import subprocess

import pytest

from orchestrator.config.templating import (
    Raw,
    evaluate_condition,
    render_shell,
    render_value,
    undeclared,
)
from orchestrator.errors import ConfigError, Location

LOC = Location("play.yaml", 12, 10)
VARS = {
    "n": 8,
    "pkgs": ["sglang[all]>=0.5.9", "huggingface_hub==2.4.0"],
    "workdir": "/tmp/my dir",
    "host": {"name": "gpu1", "address": "10.0.0.1"},
    "enabled": True,
    "evil": "x'; touch /tmp/pwned; echo '",
}


def error(fn, *args):
    with pytest.raises(ConfigError) as exc:
        fn(*args)
    (problem,) = exc.value.problems
    return problem


def test_single_expression_keeps_native_type():
    out = render_value(
        {"a": "{{ n }}", "b": ["{{ pkgs }}", "n={{ n }}"], "c": "{{ n > 4 }}",
         "d": "{{ host }}", "e": " {{ n }}", "f": 3, "g": "{{ {'k': n} }}"},
        VARS,
    )
    assert out == {"a": 8, "b": [VARS["pkgs"], "n=8"], "c": True, "d": VARS["host"],
                   "e": " 8", "f": 3, "g": {"k": 8}}


def test_filters_producing_generators_become_lists():
    assert render_value("{{ pkgs | reject('equalto', pkgs[1]) }}", VARS) == [VARS["pkgs"][0]]


def test_undefined_variable_is_located_with_hint():
    p = error(render_value, "{{ workdri }}/venv", VARS, LOC)
    assert p.location == LOC
    assert "undefined variable 'workdri'" in p.message
    assert p.hint == "did you mean 'workdir'?"
    # also inside a native expression's list
    p = error(render_value, "{{ [n, nope] }}", VARS, LOC)
    assert "'nope'" in p.message and "--var nope=" in p.hint


def test_missing_attribute_hint():
    p = error(render_value, "{{ host.adress }}", VARS, LOC)
    assert "adress" in p.message and p.hint == "did you mean 'address'?"


def test_sandbox_blocks_internals_and_huge_values():
    p = error(render_value, "{{ ''.__class__.__mro__ }}", VARS, LOC)
    assert "unsafe" in p.message and p.location == LOC
    p = error(render_shell, "echo {{ 'a' * 100000000 }}", VARS, LOC)
    assert "repetition" in p.message


def test_syntax_error_and_unknown_filter():
    p = error(render_value, "{{ n }", VARS, LOC)
    assert "template syntax error" in p.message
    p = error(render_value, "{{ n | defualt(1) }}", VARS, LOC)
    assert p.hint == "did you mean 'default'?"


def sh(command: str) -> str:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          check=True).stdout


def test_render_shell_quotes_every_output(tmp_path):
    variables = {**VARS, "target": str(tmp_path / "a b")}
    cmd = render_shell("printf '%s\\n' {{ evil }} {{ workdir }} {{ pkgs }} {{ n }}", variables)
    assert sh(cmd).splitlines() == [VARS["evil"], "/tmp/my dir", *VARS["pkgs"], "8"]
    cmd = render_shell("mkdir -p {{ target }} && cd {{ target }}", variables)
    subprocess.run(["bash", "-c", cmd], check=True, capture_output=True)
    assert (tmp_path / "a b").is_dir()
    assert not (tmp_path / "pwned").exists()


def test_raw_and_quote_filters():
    assert render_shell("echo {{ '$HOME' | raw }}", {}) == "echo $HOME"
    assert render_shell("echo {{ '$HOME' | quote }}", {}) == "echo '$HOME'"  # not twice
    assert render_value("{{ 'a b' | quote }}", {}) == "'a b'"
    assert type(render_value("{{ 'x' | raw }}", {})) is str
    assert isinstance(Raw("x"), str)
    # a {% raw %} block is template text, not an output: not quoted
    assert render_shell("echo {% raw %}{{ x }}{% endraw %}", {}) == "echo {{ x }}"


def test_shell_undefined_is_an_error():
    p = error(render_shell, "rm -rf {{ workdri }}/cache", VARS, LOC)
    assert "undefined variable 'workdri'" in p.message and p.location == LOC


@pytest.mark.parametrize(
    ("expr", "expected"),
    [("n > 4", True), ("{{ n > 40 }}", False), ("enabled and n == 8", True),
     ("{{ 'yes' }}", True), ("'off'", False), ("pkgs", True), (True, True), ("none", False)],
)
def test_conditions(expr, expected):
    assert evaluate_condition(expr, {**VARS, "none": None}, LOC) is expected


def test_condition_errors():
    p = error(evaluate_condition, "gpu_count > 4", VARS, LOC)
    assert "undefined variable 'gpu_count'" in p.message and p.location == LOC
    p = error(evaluate_condition, "workdir", VARS, LOC)
    assert "not true or false" in p.message


def test_undeclared():
    assert undeclared("{% for p in pkgs %}{{ p }} {{ q.x }}{% endfor %}") == {"pkgs", "q"}
    assert undeclared("gpu_count > 4 and x", expression=True) == {"gpu_count", "x"}
    assert undeclared("{{ a }} b") == {"a"}
    with pytest.raises(ConfigError):
        undeclared("{{ a }")
