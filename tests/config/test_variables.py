import textwrap

import pytest

from orchestrator.config import (
    host_variables,
    load_all,
    parse_cli_vars,
    secret_values,
)
from orchestrator.errors import ConfigError
from orchestrator.redact import Redactor


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


PLAYBOOK = """\
    name: layers
    vars:
      level: playbook
      only_playbook: p
      base_dir: /srv
      venv: "{{ base_dir }}/venv"
      python: "{{ venv }}/bin/python"
      gpus: "{{ gpu_count }}"
    stages:
      - id: a
        run: echo {{ level }}
"""

INVENTORY = """\
    vars:
      level: inventory
      only_inventory: i
      gpu_count: 0
    groups:
      first:
        hosts: [gpu1]
        vars: {level: group-first, from_first: f}
      second:
        hosts: [gpu1, gpu2]
        vars: {level: group-second, gpu_count: 8}
    hosts:
      gpu1:
        address: 10.0.0.1
        port: 2222
        user: ops
        vars: {level: host, base_dir: /data}
      gpu2:
        groups: [extra]
      gpu3: {}
"""


@pytest.fixture
def loaded(tmp_path):
    return load_all(write(tmp_path, "p.yaml", PLAYBOOK), write(tmp_path, "i.yaml", INVENTORY))


def test_precedence_each_layer(loaded):
    pb, inv = loaded
    gpu1 = host_variables(pb, inv, "gpu1")
    gpu2 = host_variables(pb, inv, "gpu2")
    gpu3 = host_variables(pb, inv, "gpu3")
    assert gpu1["level"] == "host"  # host vars beat group vars
    assert gpu2["level"] == "group-second"  # group vars beat inventory vars
    assert gpu3["level"] == "inventory"  # inventory vars beat playbook vars
    assert gpu1["from_first"] == "f" and "from_first" not in gpu2
    assert (gpu1["only_playbook"], gpu1["only_inventory"]) == ("p", "i")
    assert host_variables(pb, inv, "gpu1", {"level": "cli"})["level"] == "cli"  # CLI beats all


def test_later_group_overrides_earlier(tmp_path):
    inv = INVENTORY.replace("vars: {level: host, base_dir: /data}", "vars: {base_dir: /data}")
    pb, inventory = load_all(write(tmp_path, "p.yaml", PLAYBOOK), write(tmp_path, "i.yaml", inv))
    assert host_variables(pb, inventory, "gpu1")["level"] == "group-second"
    lines = inv.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.strip() == "first:")
    block = lines[start:start + 3]
    del lines[start:start + 3]
    end = next(i for i, ln in enumerate(lines) if ln.strip() == "hosts:" and ln.startswith("    h"))
    swapped = "".join(lines[:end] + block + lines[end:])
    assert swapped.index("second:") < swapped.index("first:")
    pb, inventory = load_all(write(tmp_path, "p.yaml", PLAYBOOK),
                             write(tmp_path, "i2.yaml", swapped))
    assert host_variables(pb, inventory, "gpu1")["level"] == "group-first"  # now written last


def test_references_resolve_across_layers_with_native_types(loaded):
    pb, inv = loaded
    gpu1 = host_variables(pb, inv, "gpu1")
    assert gpu1["venv"] == "/data/venv"  # playbook var using a host var
    assert gpu1["python"] == "/data/venv/bin/python"
    assert gpu1["gpus"] == 8  # a single expression keeps its type
    assert host_variables(pb, inv, "gpu3")["gpus"] == 0
    cli = host_variables(pb, inv, "gpu3", parse_cli_vars(["base_dir=/opt", "gpu_count=4"]))
    assert (cli["python"], cli["gpus"]) == ("/opt/venv/bin/python", 4)


def test_builtins(loaded):
    pb, inv = loaded
    gpu1 = host_variables(pb, inv, "gpu1")
    assert gpu1["inventory_hostname"] == "gpu1"
    assert gpu1["host"] == {"name": "gpu1", "address": "10.0.0.1", "port": 2222, "user": "ops"}
    assert gpu1["group_names"] == ["first", "second"]
    gpu2 = host_variables(pb, inv, "gpu2")
    assert gpu2["group_names"] == ["second", "extra"]
    assert gpu2["host"]["address"] == "gpu2" and gpu2["host"]["port"] is None


def test_variable_cycle_is_located(tmp_path):
    pb_text = PLAYBOOK.replace("base_dir: /srv", 'base_dir: "{{ python }}/.."')
    inv_text = INVENTORY.replace("vars: {level: host, base_dir: /data}", "vars: {level: host}")
    pb, inv = load_all(write(tmp_path, "p.yaml", pb_text), write(tmp_path, "i.yaml", inv_text))
    with pytest.raises(ConfigError) as exc:
        host_variables(pb, inv, "gpu3")
    (p,) = exc.value.problems
    assert "cycle" in p.message
    assert all(name in p.message for name in ("base_dir", "venv", "python"))
    assert p.location.file.endswith("p.yaml") and p.location.line in (5, 6, 7)


def test_undefined_reference_in_var_is_located(tmp_path):
    pb_text = PLAYBOOK.replace("{{ base_dir }}/venv", "{{ base_dri }}/venv")
    # load_all already refuses it (no host defines base_dri):
    with pytest.raises(ConfigError) as exc:
        load_all(write(tmp_path, "p.yaml", pb_text), write(tmp_path, "i.yaml", INVENTORY))
    (p,) = exc.value.problems
    assert "undefined variable 'base_dri'" in p.message and p.hint == "did you mean 'base_dir'?"
    assert p.location.line == 6  # venv: "{{ base_dri }}/venv"


def test_undefined_reference_for_one_host_only(tmp_path):
    # model_dir is a group var of `second`: defined for gpu1/gpu2, so load_all accepts it, but
    # gpu3 cannot render it
    pb_text = PLAYBOOK.replace("only_playbook: p", 'only_playbook: "{{ from_first }}"')
    pb, inv = load_all(write(tmp_path, "p.yaml", pb_text), write(tmp_path, "i.yaml", INVENTORY))
    assert host_variables(pb, inv, "gpu1")["only_playbook"] == "f"
    with pytest.raises(ConfigError) as exc:
        host_variables(pb, inv, "gpu3")
    (p,) = exc.value.problems
    assert "undefined variable 'from_first'" in p.message
    assert (p.location.file, p.location.line) == (str(tmp_path / "p.yaml"), 4)


def test_unknown_host(loaded):
    pb, inv = loaded
    with pytest.raises(ConfigError, match="unknown host 'gpu9'"):
        host_variables(pb, inv, "gpu9")


def test_parse_cli_vars():
    assert parse_cli_vars(["n=8", "flag=true", "name=big world", "eq=a=b", "empty=", "z=null"]) == {
        "n": 8, "flag": True, "name": "big world", "eq": "a=b", "empty": "", "z": None,
    }
    with pytest.raises(ConfigError) as exc:
        parse_cli_vars(["novalue", "bad name=1", "host=x", "ok=1"])
    messages = [p.message for p in exc.value.problems]
    assert len(messages) == 3
    assert "expected NAME=VALUE" in messages[0]
    assert "not a variable name" in messages[1]
    assert "built-in" in messages[2]


SECRET_PLAYBOOK = """\
    name: s
    secrets: [db_pass_phrase]
    vars:
      db_pass_phrase: correct-horse
      hf_token: !env ORCH_TEST_HF_TOKEN
      public: not-a-secret
      service:
        url: http://x
        api_key: sk-nested-1234
    stages:
      - id: a
        run: "true"
"""
SECRET_INVENTORY = """\
    secrets: [license]
    vars:
      license: LIC-9999
    hosts:
      gpu1:
        become_password: sudo-pass-1
        vars:
          ssh_password: hunter22
"""


def test_secret_values(tmp_path):
    pb, inv = load_all(write(tmp_path, "p.yaml", SECRET_PLAYBOOK),
                       write(tmp_path, "i.yaml", SECRET_INVENTORY),
                       environ={"ORCH_TEST_HF_TOKEN": "hf_abcdef"})
    expected = {"correct-horse", "hf_abcdef", "sk-nested-1234", "LIC-9999", "sudo-pass-1",
                "hunter22"}
    variables = host_variables(pb, inv, "gpu1")
    assert secret_values(pb, inv, variables) == expected
    assert secret_values(pb, inv) == expected  # raw layers when no host is given
    redacted = Redactor(secret_values(pb, inv, variables)).redact(
        f"token {variables['hf_token']} key {variables['service']['api_key']} ok"
    )
    assert redacted == "token *** key *** ok"


def test_secret_from_env_under_innocent_name(tmp_path):
    pb_text = SECRET_PLAYBOOK.replace("hf_token: !env ORCH_TEST_HF_TOKEN",
                                      "download_auth: !env ORCH_TEST_HF_TOKEN")
    pb, inv = load_all(write(tmp_path, "p.yaml", pb_text),
                       write(tmp_path, "i.yaml", SECRET_INVENTORY),
                       environ={"ORCH_TEST_HF_TOKEN": "hf_zyxwvu"})
    # the var name is innocent, but the environment variable's name says TOKEN
    assert "hf_zyxwvu" in secret_values(pb, inv, host_variables(pb, inv, "gpu1"))
