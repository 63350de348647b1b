import subprocess
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from orchestrator.config import (
    evaluate_condition,
    host_variables,
    load_all,
    load_inventory,
    load_playbook,
    parse_cli_vars,
    render_shell,
    validate_params,
)
from orchestrator.errors import ConfigError
from orchestrator.stages.base import Params, Stage

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "playbooks" / "examples" / "hello.yaml"
LOCAL = ROOT / "configs" / "inventory" / "local.yaml"
KIND = "config-test-kind"


class _Mount(BaseModel):
    src: str
    dst: str


class _TestParams(Params):
    """Params of a stage kind registered only for these tests."""

    port: int = Field(ge=1, le=65535)
    packages: list[str] = Field(default_factory=list)
    mounts: list[_Mount] = Field(default_factory=list)
    verbose: bool = False


@pytest.fixture(scope="module", autouse=True)
def test_kind():
    class _TestStage(Stage, kind=KIND):
        """A stage kind for loader tests."""

        Params = _TestParams

    yield _TestStage
    Stage.registry.pop(KIND, None)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(fn, *args, **kwargs):
    with pytest.raises(ConfigError) as exc:
        fn(*args, **kwargs)
    return exc.value.problems


# -- good files --------------------------------------------------------------------------------


def test_examples_load_cleanly():
    playbook, inventory = load_all(HELLO, LOCAL)
    assert [s.id for s in playbook.stages] == ["workdir", "greeting", "shout"]
    assert all(s.run and s.check for s in playbook.stages)
    assert playbook.source == str(HELLO)
    assert inventory.hosts["localhost"].connection == "local"
    assert inventory.hosts["localhost"].name == "localhost"


def run_stage(command: str) -> int:
    return subprocess.run(["bash", "-c", command], capture_output=True).returncode


def test_hello_is_idempotent_when_run(tmp_path):
    """Render hello.yaml as the runner would and run it twice with bash: the second changes
    nothing (every check passes before any run)."""
    playbook, inventory = load_all(HELLO, LOCAL)
    workdir = tmp_path / "hello dir"
    cli = parse_cli_vars([f"workdir={workdir}", "who=o'brien; rm -rf /"])
    variables = host_variables(playbook, inventory, "localhost", cli)

    def converge() -> list[str]:
        ran = []
        for stage in playbook.stages:
            if stage.when and not evaluate_condition(stage.when, variables, stage.location):
                continue
            if run_stage(render_shell(stage.check, variables)) == 0:
                continue
            assert run_stage(render_shell(stage.run, variables, stage.location_of("run"))) == 0
            assert run_stage(render_shell(stage.check, variables)) == 0, stage.id
            ran.append(stage.id)
        return ran

    assert converge() == ["workdir", "greeting", "shout"]
    greeting = (workdir / "greeting.txt").read_text()
    assert greeting == "Hello, o'brien; rm -rf /, from localhost!\n"
    assert (workdir / "shout.txt").read_text() == greeting.upper()
    assert converge() == []


# -- located problems, all at once -------------------------------------------------------------


def test_three_mistakes_reported_together(tmp_path):
    path = write(tmp_path, "p.yaml", """\
        name: three
        stages:
          - id: fetch
            run: curl -fsSO https://example.invalid/x
            tiemout: 30s
          - id: build
            needs: [fetc]
            run: make
          - id: test
            needs: build
            uses: config-test-kind
            with:
              port: not-a-port
    """)
    found = problems_of(load_playbook, path)
    assert [p.location.line for p in found] == [5, 7, 13]
    assert "unknown key 'tiemout'" in found[0].message
    assert found[0].hint == "did you mean 'timeout'?"
    assert "unknown stage 'fetc'" in found[1].message and found[1].hint == "did you mean 'fetch'?"
    assert "stage 'test', with.port: expected a whole number" in found[2].message
    assert all(p.location.file == str(path) for p in found)


def test_problems_of_both_files_in_one_error(tmp_path):
    pb = write(tmp_path, "p.yaml", """\
        name: both
        stages:
          - id: a
            run: echo {{ gpu_cnt }}
            hosts: gpus
    """)
    inv = write(tmp_path, "i.yaml", """\
        hosts:
          gpu1: {port: http, vars: {gpu_count: 8}}
        groups:
          gpu: {hosts: [gpu1, gpu2]}
    """)
    found = problems_of(load_all, pb, inv)
    # the error is ordered by file (playbook first), then line
    assert [(Path(p.location.file).name, p.location.line) for p in found] == [
        ("p.yaml", 4), ("p.yaml", 5), ("i.yaml", 2), ("i.yaml", 4)
    ]
    text = "\n".join(p.render() for p in found)
    assert "undefined variable 'gpu_cnt'" in text and "did you mean 'gpu_count'?" in text
    assert "unknown host or group 'gpus'" in text and "did you mean 'gpu'" in text
    assert "host 'gpu1', port: expected a whole number" in text
    assert "group 'gpu' lists unknown host 'gpu2'" in text


def test_missing_and_unreadable_files_are_problems(tmp_path):
    good = write(tmp_path, "p.yaml", "name: x\nstages: [{id: a, run: 'true'}]\n")
    found = problems_of(load_all, good, tmp_path / "missing.yaml")
    assert len(found) == 1 and "file not found" in found[0].message
    found = problems_of(load_all, tmp_path / "nope.yaml", tmp_path)
    assert len(found) == 2
    assert "file not found" in found[0].message and "is a directory" in found[1].message
    assert "empty" in problems_of(load_playbook, write(tmp_path, "e.yaml", "# x\n"))[0].message


def test_stage_shapes(tmp_path):
    path = write(tmp_path, "p.yaml", """\
        name: shapes
        stages:
          - id: a
            run: "true"
            needs: []
            tags: setup
            when: false
            env: {CUDA_VISIBLE_DEVICES: 0, FLAG: true}
            timeout: 10m
            retry: {attempts: 5, delay: 500ms, on: [connection, 255]}
          - id: b
            needs: a
            run: "true"
    """)
    playbook = load_playbook(path)
    a, b = playbook.stages
    assert a.tags == ["setup"] and a.when == "false" and a.timeout == 600
    assert a.env == {"CUDA_VISIBLE_DEVICES": "0", "FLAG": "true"}
    assert a.retry.delay == 0.5 and a.retry.on == ["connection", 255]
    assert b.needs == ["a"] and b.kind == "shell"


def test_retry_on_reports_one_problem_per_value(tmp_path):
    path = write(tmp_path, "p.yaml", """\
        name: retry
        stages:
          - id: a
            run: "true"
            retry: {on: [conection]}
    """)
    (p,) = problems_of(load_playbook, path)
    assert p.location.line == 5
    assert "retry.on[0]: expected 'connection' or a whole number, got 'conection'" in p.message


def test_locations_are_attached(tmp_path):
    pb = write(tmp_path, "p.yaml", """\
        name: loc
        stages:
          - id: a
            uses: config-test-kind
            with:
              port: 8080
              packages: [x]
            retry: {attempts: 2}
    """)
    inv = write(tmp_path, "i.yaml", """\
        defaults:
          user: ops
        hosts:
          gpu1:
            address: 10.0.0.1
    """)
    playbook, inventory = load_all(pb, inv)
    stage = playbook.stages[0]
    assert (playbook.location.line, stage.location.line) == (1, 3)
    assert stage.location_of("with", "port").line == 6
    assert stage.location_of("with", "packages", 0).line == 7
    assert stage.location_of("with", "nothing", "here").line == 5  # nearest parent
    assert stage.retry.location.line == 8
    host = inventory.hosts["gpu1"]
    assert (host.location.line, host.location.column) == (4, 3)
    assert host.location_of("address").line == 5
    assert host.location_of("user").line == 2  # came from defaults
    assert inventory.source == str(inv)


def test_inventory_defaults_and_names(tmp_path):
    inv = write(tmp_path, "i.yaml", """\
        defaults:
          user: ops
          port: 2222
          vars: {a: 1, b: 2}
        hosts:
          gpu1:
            port: 22
            vars: {b: 3}
          gpu2:
    """)
    inventory = load_inventory(inv)
    gpu1, gpu2 = inventory.hosts["gpu1"], inventory.hosts["gpu2"]
    assert (gpu1.name, gpu1.user, gpu1.port, gpu1.vars) == ("gpu1", "ops", 22, {"a": 1, "b": 3})
    assert (gpu2.name, gpu2.user, gpu2.port, gpu2.vars) == ("gpu2", "ops", 2222, {"a": 1, "b": 2})


def test_inventory_defaults_are_validated_where_written(tmp_path):
    inv = write(tmp_path, "i.yaml", """\
        defaults:
          usr: ops
        hosts:
          gpu1: {}
    """)
    (p,) = problems_of(load_inventory, inv)
    assert p.location.line == 2 and "unknown key 'usr'" in p.message
    assert p.hint == "did you mean 'user'?"


# -- stage kinds and params --------------------------------------------------------------------


def test_with_params_checked_against_kind(tmp_path):
    path = write(tmp_path, "p.yaml", """\
        name: params
        stages:
          - id: a
            uses: config-test-kind
            with:
              prot: 80
              packages: sglang
              mounts: [{src: /a}]
          - id: b
            uses: config-test-knd
    """)
    found = problems_of(load_playbook, path)
    by_line = {p.location.line: p for p in found}
    assert sorted(by_line) == [5, 6, 7, 8, 10]
    assert "missing required key 'port'" in by_line[5].message
    assert by_line[6].hint == "did you mean 'port'?"
    assert "with.packages: expected a list of texts, got 'sglang'" in by_line[7].message
    assert "with.mounts[0]: missing required key 'dst'" in by_line[8].message
    assert by_line[10].hint == f"did you mean '{KIND}'?"


def test_template_params_are_checked_later(tmp_path):
    pb = write(tmp_path, "p.yaml", """\
        name: params
        vars: {port: 8080, pkgs: [a, b]}
        stages:
          - id: a
            uses: config-test-kind
            with:
              port: "{{ port }}"
              packages: "{{ pkgs }}"
    """)
    inv = write(tmp_path, "i.yaml", "hosts: {gpu1: {port: 2222}}\n")
    playbook, inventory = load_all(pb, inv)
    stage = playbook.stages[0]
    from orchestrator.config import render_value

    rendered = render_value(stage.with_, host_variables(playbook, inventory, "gpu1"))
    params = validate_params(stage, rendered)
    assert (params.port, params.packages) == (8080, ["a", "b"])
    with pytest.raises(ConfigError) as exc:
        validate_params(stage, {**rendered, "port": 99999})
    (p,) = exc.value.problems
    assert (p.location.file, p.location.line) == (str(pb), 7)
    assert "stage 'a', with.port: must be less than or equal to 65535" in p.message


def test_secret_is_not_echoed_in_errors(tmp_path):
    pb = write(tmp_path, "p.yaml", """\
        name: s
        stages:
          - id: a
            uses: config-test-kind
            with:
              port: !env ORCH_TEST_API_KEY
    """)
    found = problems_of(load_playbook, pb, environ={"ORCH_TEST_API_KEY": "sk-live-abcdef"})
    assert "sk-live-abcdef" not in "\n".join(p.render() for p in found)
    assert "'***'" in found[0].message


def test_secret_values_attached(tmp_path):
    pb = write(tmp_path, "p.yaml", """\
        name: s
        vars: {tok: !env HF_TOKEN, home: !env HOME_DIR}
        stages: [{id: a, run: "true"}]
    """)
    playbook = load_playbook(pb, environ={"HF_TOKEN": "hf_value_1", "HOME_DIR": "/home/x"})
    assert playbook._secret_values == {"hf_value_1"}


# -- dependency checks -------------------------------------------------------------------------


def test_all_cycles_reported(tmp_path):
    path = write(tmp_path, "p.yaml", """\
        name: cycles
        stages:
          - {id: a, needs: [b], run: "true"}
          - {id: b, needs: [a], run: "true"}
          - {id: c, needs: [c], run: "true"}
          - {id: d, needs: [a], run: "true"}
    """)
    found = problems_of(load_playbook, path)
    assert len(found) == 2
    assert all("dependency cycle" in p.message for p in found)
    assert any("'c' needs itself" in p.message for p in found)


def test_undefined_in_every_templated_field(tmp_path):
    pb = write(tmp_path, "p.yaml", """\
        name: undefined
        vars:
          a: "{{ v1 }}"
        stages:
          - id: s
            run: echo {{ v2 }}
            check: test {{ v3 }}
            when: v4 > 1
            env: {X: "{{ v5 }}"}
          - id: t
            uses: config-test-kind
            with: {port: "{{ v6 }}"}
    """)
    inv = write(tmp_path, "i.yaml", """\
        vars: {b: "{{ v7 }}"}
        hosts:
          h: {vars: {ok: "{{ inventory_hostname }} {{ host.address }} {{ a }}"}}
    """)
    found = problems_of(load_all, pb, inv)
    names = [p.message.split("undefined variable ")[1] for p in found]
    assert names == ["'v1'", "'v2'", "'v3'", "'v4'", "'v5'", "'v6'", "'v7'"]
    assert [p.location.line for p in found] == [3, 6, 7, 8, 9, 12, 1]


def test_cli_vars_count_as_defined(tmp_path):
    pb = write(tmp_path, "p.yaml", "name: x\nstages: [{id: a, run: 'echo {{ tag }}'}]\n")
    inv = write(tmp_path, "i.yaml", "hosts: {h: {}}\n")
    assert problems_of(load_all, pb, inv)[0].message.endswith("undefined variable 'tag'")
    load_all(pb, inv, {"tag": "v1"})


def test_var_names_must_be_usable_in_templates(tmp_path):
    pb = write(tmp_path, "p.yaml", """\
        name: names
        vars: {my-dir: /x, loop: 1, group_names: [a], ok_name: 1}
        stages: [{id: a, run: "true"}]
    """)
    found = problems_of(load_playbook, pb)
    assert len(found) == 3
    assert "'my-dir' cannot be used in templates" in found[0].message
    assert "reserved" in found[1].message and "built-in" in found[2].message


def test_one_name_where_a_list_is_expected(tmp_path):
    inv = write(tmp_path, "i.yaml", """\
        hosts:
          gpu1: {groups: gpus}
        groups:
          all_gpus: {hosts: gpu1}
    """)
    inventory = load_inventory(inv)
    assert inventory.hosts["gpu1"].groups == ["gpus"]
    assert inventory.group_members("all_gpus") == ["gpu1"]
