"""scripts/sync_sglang.py (static flag extraction from SGLang wheels) and the files it generated.

No network: synthetic wheels built here mimic each way SGLang declares flags (add_argument with
ServerArgs.x defaults and module choice lists, extended lists, the dataclass-field style of
0.5.15+/0.5.20+, deprecated actions). The add_argument-style package is also imported and run
through the real argparse, so the extractor is checked against what argparse really builds.
The last tests read the committed orchestrator/sglang/releases/*.json for facts checked in the
real wheels' sources.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sglang import releases
from tests.e2e.scripts import REPO, load_script

sync = load_script("sync_sglang")

# ------------------------------------------------------------------------------ synthetic wheels

CHOICES_PY = """
KV_DTYPES = ["auto", "fp8_e5m2"]
KV_DTYPES += ["bf16"]
"""

PARSER_PY = """
class ReasoningParser:
    DetectorMap = {"deepseek-r1": object, "kimi_k2": object}
"""

OLD_STYLE = '''
"""Like 0.5.9 - 0.5.12: add_argument calls in ServerArgs.add_cli_args."""
import argparse
import dataclasses
import json
import os

from sglang.srt.choices import KV_DTYPES
from sglang.srt.parser import ReasoningParser

QUANTIZATION_CHOICES = ["awq", "fp8"]
QUANTIZATION_CHOICES.append("gguf")
DRAFT_QUANT_CHOICES = [*QUANTIZATION_CHOICES, "unquant"]
ATTENTION_BACKEND_CHOICES = ["fa3", "flashinfer"]
if os.environ.get("SYNTH_EXTRA"):
    ATTENTION_BACKEND_CHOICES.append("ascend")
SAMPLING = {"pytorch", "flashinfer"}


def add_quantization_method_choices(choices):
    QUANTIZATION_CHOICES.extend(choices)


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        pass


@dataclasses.dataclass
class ServerArgs:
    model_path: str = None
    tp_size: int = 1
    host: str = "127.0.0.1"
    attention_backend: str = ATTENTION_BACKEND_CHOICES[0]
    lora_paths: list = None
    pid: int = os.getpid()

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", type=str, required=True,
                            help="The path of the model weights.")
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int,
                            default=ServerArgs.tp_size, dest="tp_size",
                            help="The tensor "
                                 "parallelism size.")
        parser.add_argument("--host", type=str, default=ServerArgs.host)
        parser.add_argument("--quantization", type=str, choices=QUANTIZATION_CHOICES)
        parser.add_argument("--speculative-draft-model-quantization", type=str,
                            choices=DRAFT_QUANT_CHOICES)
        parser.add_argument("--attention-backend", type=str,
                            choices=ATTENTION_BACKEND_CHOICES,
                            default=ServerArgs.attention_backend)
        parser.add_argument("--kv-cache-dtype", type=str, default="auto", choices=KV_DTYPES)
        parser.add_argument("--sampling-backend", type=str, choices=SAMPLING)
        reasoning_choices = list(ReasoningParser.DetectorMap.keys())
        parser.add_argument("--reasoning-parser", type=str, choices=reasoning_choices,
                            help=f"Supported parsers: {reasoning_choices}.")
        parser.add_argument("--speculative-algorithm", type=str,
                            choices=["EAGLE", "EAGLE3", "NEXTN"])
        parser.add_argument("--disable-cuda-graph", action="store_true",
                            help="Disable cuda graph.")
        parser.add_argument("--cuda-graph-max-bs", type=int)
        parser.add_argument("--cuda-graph-bs", type=int, nargs="+")
        parser.add_argument("--lora-paths", type=str, nargs="*",
                            default=ServerArgs.lora_paths)
        parser.add_argument("--json-model-override-args", type=json.loads, default="{}")
        parser.add_argument("--pid", type=int, default=ServerArgs.pid)
        parser.add_argument("--enable-thing", action=argparse.BooleanOptionalAction)
        parser.add_argument("--hidden-knob", type=int, help=argparse.SUPPRESS)
        parser.add_argument("--hybrid-kvcache-ratio", type=float, action=DeprecatedAction,
                            help="Note: --hybrid-kvcache-ratio is deprecated now.")
        parser.add_argument("--enable-nan-detection", action="store_true",
                            help="[Deprecated] Use SGLANG_SPEC_NAN_DETECTION=1 instead.")
'''

ARG_UTILS = '''
"""A restatement of sglang's add_cli_args_from_dataclass rules (stdlib only)."""
import dataclasses
import typing
from typing import Annotated, Literal, Optional, Union, get_args, get_origin

A = Annotated


@dataclasses.dataclass(frozen=True)
class Arg:
    help: str = ""
    choices: Optional[list] = None
    aliases: Optional[list] = None
    cli_name: Optional[str] = None
    type_parser: Optional[typing.Callable] = None
    nargs: Optional[str] = None
    required: Optional[bool] = None
    action: Optional[typing.Any] = None
    action_kwargs: Optional[dict] = None
    const: Optional[typing.Any] = None
    no_cli: bool = False
'''

FIELDS_PY = '''
"""Like 0.5.20+: fields declared in arg_groups/fields/*.py."""
from __future__ import annotations

import argparse
import dataclasses
import json
from typing import List, Literal, Optional

from sglang.srt.arg_groups.arg_utils import A, Arg

BACKENDS = ["fa3", "triton"]
DEFAULT_DOMAINS = ("a.example",)


class Parallel:
    _NS_PATH = "parallel"

    tp_size: A[int, Arg(help="The tensor parallelism size.",
                        aliases=["--tensor-parallel-size"])] = 1
    enable_dp_attention: A[bool, Arg(no_cli=True)] = False
    dist_init_addr: A[Optional[str], Arg(help="Host:port.", aliases=["--nccl-init-addr"])] = None
    untouched: int = 3


class Exec:
    _NS_PATH = "exec"

    attention_backend: A[Optional[str], Arg(help="Kernel.", choices=BACKENDS)] = None
    cuda_graph_backend: A[Optional[Literal["full", "disabled"]], "Graph backend."] = None
    cuda_graph_bs_decode: A[Optional[List[int]], "Batch sizes."] = None
    cuda_graph_max_bs_decode: A[Optional[int], "Max batch size for decode."] = None
    cuda_graph_max_bs_prefill: A[Optional[int], "Max batch size for prefill."] = None
    trust_remote_code: A[bool, "Allow custom models."] = False
    json_model_override_args: A[str, Arg(help="JSON.", type_parser=json.loads)] = "{}"
    tokenizer_path: A[str, Arg(help="Tokenizer.", cli_name="--tokenizer")]
    enable_overlap: A[Optional[bool], Arg(help="Overlap.",
                                          action=argparse.BooleanOptionalAction)] = None
    sampling_backend: A[Optional[str], "Sampler."] = "pytorch"
    allowed_domains: A[Optional[List[str]], "Domains."] = dataclasses.field(
        default_factory=lambda: list(DEFAULT_DOMAINS))
'''

NEW_STYLE = '''
"""Like 0.5.20+: ServerArgs assembled from the namespace classes."""
import argparse

from sglang.srt.arg_groups.argparse_actions import DeprecatedStoreTrueAction
from sglang.srt.arg_groups.fields import collect_input_fields
from sglang.srt.arg_groups.fields.parallel import Exec, Parallel

_INPUT_NAMESPACES = [Parallel, Exec]


class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        sampling_choices = {"pytorch", "flashinfer"}
        if envs.TOKEN_ORACLE.get():
            sampling_choices.add("token_oracle")
        parser.add_argument("--sampling-backend-override", type=str, choices=sampling_choices,
                            default=_declared_default("sampling_backend"))
        parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction,
                            new_flag="--cuda-graph-backend=disabled",
                            help="Deprecated. Use --cuda-graph-backend=disabled instead.")


_annotations, _defaults, _namespaces = collect_input_fields(_INPUT_NAMESPACES)


def _declared_default(name):
    raise RuntimeError("only at run time")
'''

ACTIONS_PY = '''
import argparse


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False,
                 **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default,
                         **kwargs)
'''


def old_style_files() -> dict[str, str]:
    return {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/server_args.py": OLD_STYLE,
        "sglang/srt/choices.py": CHOICES_PY,
        "sglang/srt/parser.py": PARSER_PY,
    }


def new_style_files() -> dict[str, str]:
    return {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/server_args.py": NEW_STYLE,
        "sglang/srt/arg_groups/__init__.py": "",
        "sglang/srt/arg_groups/arg_utils.py": ARG_UTILS,
        "sglang/srt/arg_groups/argparse_actions.py": ACTIONS_PY,
        "sglang/srt/arg_groups/fields/__init__.py": "def collect_input_fields(x):\n    return x\n",
        "sglang/srt/arg_groups/fields/parallel.py": FIELDS_PY,
    }


def build_wheel(folder: Path, version: str, files: dict[str, str],
                tag: str = "py3-none-any") -> Path:
    """A wheel-shaped zip holding `files` (the extractor reads .py files under sglang/)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"sglang-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, textwrap.dedent(text))
        zf.writestr(f"sglang-{version}.dist-info/METADATA", f"Name: sglang\nVersion: {version}\n")
    return wheel


def extract(files: dict[str, str], tmp_path: Path) -> dict[str, dict[str, Any]]:
    flags, warnings = sync.extract(sync.Source.from_wheel(build_wheel(tmp_path, "0.0.1", files)))
    assert not [w for w in warnings if "arg_utils" not in w], warnings
    return {f["name"]: f for f in flags}


def by_option(flags: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o: f for f in flags for o in [f["name"], *f["aliases"]]}


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for a synthetic `sglang` package; its modules are dropped after."""
    root = tmp_path / "importable"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


# ------------------------------------------------------------------------------ add_argument style

def test_add_argument_style_resolves_server_args_defaults_and_choices(tmp_path: Path) -> None:
    flags = extract(old_style_files(), tmp_path)
    tp = flags["--tensor-parallel-size"]
    assert tp["aliases"] == ["--tp-size"] and tp["dest"] == "tp_size"
    assert (tp["type"], tp["default"], tp["action"], tp["nargs"]) == ("int", 1, "store", None)
    assert tp["help"] == "The tensor parallelism size."
    assert tp["source"] == "sglang/srt/server_args.py:45"
    assert flags["--model-path"]["required"] is True
    assert flags["--model-path"]["aliases"] == ["--model"]
    assert flags["--host"]["default"] == "127.0.0.1"
    # module list + a module-level append; a copy taken with *; an imported list with +=
    assert flags["--quantization"]["choices"] == ["awq", "fp8", "gguf"]
    assert flags["--speculative-draft-model-quantization"]["choices"] == [
        "awq", "fp8", "gguf", "unquant"]
    assert flags["--kv-cache-dtype"]["choices"] == ["auto", "fp8_e5m2", "bf16"]
    assert flags["--sampling-backend"]["choices"] == ["flashinfer", "pytorch"]  # a set: sorted
    assert flags["--reasoning-parser"]["choices"] == ["deepseek-r1", "kimi_k2"]
    assert flags["--reasoning-parser"]["help"] == "Supported parsers: ['deepseek-r1', 'kimi_k2']."
    # the `if` at module level is not applied; it is reported with the plugin hook
    backend = flags["--attention-backend"]
    assert backend["choices"] == ["fa3", "flashinfer"] and backend["default"] == "fa3"
    assert any("SYNTH_EXTRA" in hook for hook in backend["choices_hooks"])
    assert flags["--quantization"]["choices_hooks"] == ["add_quantization_method_choices"]


def test_add_argument_style_actions_nargs_and_unresolved(tmp_path: Path) -> None:
    flags = extract(old_style_files(), tmp_path)
    assert flags["--disable-cuda-graph"]["action"] == "store_true"
    assert (flags["--disable-cuda-graph"]["nargs"], flags["--disable-cuda-graph"]["default"]) == (
        0, False)
    assert flags["--cuda-graph-bs"]["nargs"] == "+"
    assert flags["--lora-paths"]["default"] is None
    assert flags["--json-model-override-args"]["type"] == "json"
    pid = flags["--pid"]
    assert pid["default"] is None and pid["default_expr"] == "ServerArgs.pid"
    thing = flags["--enable-thing"]
    assert (thing["action"], thing["aliases"], thing["nargs"]) == (
        "BooleanOptionalAction", ["--no-enable-thing"], 0)
    assert flags["--hidden-knob"]["hidden"] is True and flags["--hidden-knob"]["help"] == ""
    old = flags["--hybrid-kvcache-ratio"]
    assert old["action"] == "deprecated" and old["nargs"] == 0
    assert old["deprecated"].startswith("ignored with a warning")
    assert flags["--enable-nan-detection"]["deprecated"].startswith("[Deprecated]")
    assert flags["--speculative-algorithm"]["deprecated"] is None
    assert flags["--speculative-algorithm"]["choices"] == ["EAGLE", "EAGLE3", "NEXTN"]


def test_add_argument_style_matches_real_argparse(tmp_path: Path, importable: Path) -> None:
    """Import the synthetic package, let argparse build the parser, compare every action."""
    for name, text in old_style_files().items():
        (importable / name).parent.mkdir(parents=True, exist_ok=True)
        (importable / name).write_text(textwrap.dedent(text))
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    flags = extract(old_style_files(), tmp_path)
    real = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert sorted(a.option_strings[0] for a in real) == sorted(flags)
    for action in real:
        flag = flags[action.option_strings[0]]
        assert [flag["name"], *flag["aliases"]] == action.option_strings
        assert (flag["dest"], flag["nargs"], flag["required"]) == (
            action.dest, action.nargs, action.required)
        choices = None if action.choices is None else list(action.choices)
        if isinstance(action.choices, set):
            choices = sorted(action.choices)
        assert flag["choices"] == choices, action.option_strings
        if "default_expr" not in flag:
            assert flag["default"] == action.default, action.option_strings


# ------------------------------------------------------------------------------ dataclass style

def test_dataclass_fields_become_flags_as_arg_utils_builds_them(tmp_path: Path) -> None:
    flags = extract(new_style_files(), tmp_path)
    tp = flags["--tp-size"]  # field name first, then the aliases
    assert tp["aliases"] == ["--tensor-parallel-size"] and tp["dest"] == "tp_size"
    assert (tp["type"], tp["default"]) == ("int", 1)
    assert tp["source"] == "sglang/srt/arg_groups/fields/parallel.py:19"
    assert "--enable-dp-attention" not in flags  # no_cli=True
    assert "--untouched" not in flags  # no Annotated metadata
    assert flags["--dist-init-addr"]["aliases"] == ["--nccl-init-addr"]
    assert flags["--attention-backend"]["choices"] == ["fa3", "triton"]
    graph = flags["--cuda-graph-backend"]  # Literal -> choices
    assert (graph["choices"], graph["type"], graph["help"]) == (
        ["full", "disabled"], "str", "Graph backend.")
    bs = flags["--cuda-graph-bs-decode"]  # List[int] -> nargs "+"
    assert (bs["nargs"], bs["type"]) == ("+", "int")
    trust = flags["--trust-remote-code"]  # bool -> store_true
    assert (trust["action"], trust["nargs"], trust["default"]) == ("store_true", 0, False)
    assert flags["--json-model-override-args"]["type"] == "json"
    assert flags["--allowed-domains"]["default"] == ["a.example"]  # default_factory lambda
    tokenizer = flags["--tokenizer"]  # cli_name; no default -> required
    assert (tokenizer["dest"], tokenizer["required"]) == ("tokenizer_path", True)
    overlap = flags["--enable-overlap"]
    assert (overlap["action"], overlap["aliases"]) == (
        "BooleanOptionalAction", ["--no-enable-overlap"])


def test_dataclass_style_manual_flags_and_deprecation(tmp_path: Path) -> None:
    flags = extract(new_style_files(), tmp_path)
    graph = flags["--disable-cuda-graph"]
    assert graph["action"] == "DeprecatedStoreTrueAction"
    assert (graph["nargs"], graph["default"]) == (0, False)  # the Action class's own defaults
    assert graph["deprecated"] == (
        "still accepted with a warning; use --cuda-graph-backend=disabled")
    sampling = flags["--sampling-backend-override"]
    assert sampling["default"] == "pytorch"  # _declared_default("sampling_backend")
    assert sampling["choices"] == ["flashinfer", "pytorch"]  # the env-gated add is not applied
    assert any("token_oracle" in note for note in sampling["choices_hooks"])


def test_changed_arg_utils_rules_are_warned_about(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, "0.0.1", new_style_files())
    _, warnings = sync.extract(sync.Source.from_wheel(wheel))
    assert any("field-to-flag rules changed" in w for w in warnings)


# ------------------------------------------------------------------------------ removed, CLI, files

def test_removed_reports_last_release_and_prefix_matches() -> None:
    def flag(name: str, deprecated: str | None = None) -> dict[str, Any]:
        return {"name": name, "aliases": [], "deprecated": deprecated}

    data = {
        "0.5.9": {"flags": [flag("--cuda-graph-max-bs"), flag("--cuda-graph-bs"),
                            flag("--old-knob")]},
        "0.5.15": {"flags": [flag("--cuda-graph-max-bs", "use --cuda-graph-max-bs-decode"),
                             flag("--cuda-graph-bs")]},
        "0.5.20": {"flags": [flag("--cuda-graph-max-bs-decode"),
                             flag("--cuda-graph-max-bs-prefill"), flag("--cuda-graph-bs-decode")]},
    }
    removed = sync.removed_flags("0.5.20", data)
    assert set(removed) == {"--cuda-graph-max-bs", "--cuda-graph-bs", "--old-knob"}
    assert removed["--cuda-graph-max-bs"].startswith("in 0.5.15, not in 0.5.20")
    assert "ambiguous" in removed["--cuda-graph-max-bs"]
    assert "use --cuda-graph-max-bs-decode" in removed["--cuda-graph-max-bs"]
    assert "abbreviation of --cuda-graph-bs-decode" in removed["--cuda-graph-bs"]
    assert removed["--old-knob"] == "in 0.5.9, not in 0.5.20"
    assert sync.removed_flags("0.5.9", data) == {}


def test_main_writes_deterministic_files_and_check(tmp_path: Path) -> None:
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    build_wheel(wheels, "0.5.9", old_style_files())
    build_wheel(wheels, "0.5.20", new_style_files(), "cp311-cp311-manylinux_2_34_x86_64")
    argv = ["--wheels", str(wheels), "--out", str(out), "--releases", "0.5.9,0.5.20"]
    assert sync.main(argv) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(first) == {"0.5.9.json", "0.5.20.json", "index.json"}
    new = json.loads(first["0.5.20.json"])
    assert new["wheel"] == "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert len(new["wheel_sha256"]) == 64 and new["generated_by"] == "scripts/sync_sglang.py"
    assert "ambiguous" in new["removed"]["--cuda-graph-max-bs"]
    assert [f["name"] for f in new["flags"]] == sorted(f["name"] for f in new["flags"])
    index = json.loads(first["index.json"])
    assert [r["version"] for r in index["releases"]] == ["0.5.9", "0.5.20"]
    assert sync.main(argv + ["--check"]) == 0
    assert sync.main(argv) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    (out / "0.5.9.json").write_text("{}\n")
    assert sync.main(argv + ["--check"]) == 1
    assert sync.main(["--releases", "0.5.8", "--wheels", str(wheels)]) == 2


def test_check_names_releases_newer_than_the_newest_table(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    from orchestrator_sim.pkgindex import PackageIndex

    wheels, out, offered = tmp_path / "wheels", tmp_path / "out", tmp_path / "index"
    build_wheel(wheels, "0.5.9", old_style_files())
    argv = ["--wheels", str(wheels), "--out", str(out), "--releases", "0.5.9"]
    assert sync.main(argv) == 0
    newest = releases.RELEASES[-1]
    for version in ("0.5.9", newest, f"{newest}.post1", "9.0.0rc1"):
        build_wheel(offered, version, {})
    index = PackageIndex([offered])
    index.start()
    try:
        check = [*argv, "--check", "--index-url", index.url]
        assert sync.main(check) == 0, capsys.readouterr().err  # a .post and an rc: not newer
        build_wheel(offered, "9.0.1", {})
        assert sync.main(check) == 1
    finally:
        index.stop()
    err = capsys.readouterr().err
    assert f"newer on the index than the newest table ({newest}): 9.0.1:" in err
    assert "make sync-sglang" in err


def test_download_uses_pip_for_the_platform_wheel(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **_: Any) -> None:
        calls.append(cmd)
        build_wheel(Path(cmd[cmd.index("-d") + 1]), "0.5.23", {},
                    "cp311-cp311-manylinux_2_34_x86_64")

    monkeypatch.setattr(sync.subprocess, "run", fake_run)
    wheel = sync.download_wheel("0.5.23", tmp_path / "cache")
    assert wheel.name == "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"] and "sglang==0.5.23" in cmd
    assert "--no-deps" in cmd and "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--platform") + 1] == "manylinux_2_34_x86_64"
    assert cmd[cmd.index("--python-version") + 1] == "3.11"


# ------------------------------------------------------------------------------ the loader

def test_loader_exact_fallback_and_below_oldest() -> None:
    assert releases.RELEASES == ("0.5.9", "0.5.10", "0.5.12", "0.5.15", "0.5.19", "0.5.20",
                                 "0.5.21", "0.5.22", "0.5.23")
    exact = releases.load_release("0.5.12")
    assert (exact["version"], exact["release"], exact["exact"]) == ("0.5.12", "0.5.12", True)
    between = releases.load_release("0.5.11")
    assert (between["release"], between["requested"], between["exact"]) == (
        "0.5.10", "0.5.11", False)
    assert releases.load_release("0.5.23.post1")["release"] == "0.5.23"
    assert releases.load_release("0.6.0")["release"] == "0.5.23"
    with pytest.raises(KeyError):
        releases.load_release("0.5.8")
    with pytest.raises(KeyError):
        releases.load_release("latest")


def committed(version: str) -> dict[str, dict[str, Any]]:
    return by_option(releases.load_release(version)["flags"])


def test_committed_files_are_canonical_and_complete() -> None:
    folder = REPO / "orchestrator" / "sglang" / "releases"
    index = json.loads((folder / "index.json").read_text())
    assert [r["version"] for r in index["releases"]] == list(sync.RELEASES)
    for entry in index["releases"]:
        text = (folder / f"{entry['version']}.json").read_text()
        data = json.loads(text)
        assert text == json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
        assert data["version"] == entry["version"] and len(data["flags"]) == entry["flags"]
        assert data["wheel"].startswith(f"sglang-{entry['version']}-")
        names = [f["name"] for f in data["flags"]]
        assert names == sorted(names) and len(data["flags"]) > 300
        assert all(f["source"].startswith("sglang/srt/") for f in data["flags"])


def test_tp_size_option_order_flipped_between_0_5_9_and_0_5_23() -> None:
    old, new = committed("0.5.9")["--tp-size"], committed("0.5.23")["--tp-size"]
    assert (old["name"], old["aliases"]) == ("--tensor-parallel-size", ["--tp-size"])
    assert (new["name"], new["aliases"]) == ("--tp-size", ["--tensor-parallel-size"])
    # 0.5.9 stores it as tensor_parallel_size (from_cli_args copies it to tp_size)
    assert (old["dest"], new["dest"]) == ("tensor_parallel_size", "tp_size")


def test_cuda_graph_max_bs_lifecycle() -> None:
    for version in ("0.5.9", "0.5.10", "0.5.12"):
        assert committed(version)["--cuda-graph-max-bs"]["deprecated"] is None
    for version in ("0.5.15", "0.5.19"):
        flag = committed(version)["--cuda-graph-max-bs"]
        assert flag["action"] == "DeprecatedAliasStoreAction" and flag["deprecated"]
    for version in ("0.5.20", "0.5.23"):
        data = releases.load_release(version)
        flags = by_option(data["flags"])
        assert "--cuda-graph-max-bs" not in flags
        assert {"--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"} <= set(flags)
        note = data["removed"]["--cuda-graph-max-bs"]
        assert note.startswith("in 0.5.19, not in") and "ambiguous" in note


def test_speculative_algorithm_choices_only_in_0_5_9_and_0_5_10() -> None:
    for version in ("0.5.9", "0.5.10"):
        assert committed(version)["--speculative-algorithm"]["choices"] == [
            "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
    for version in ("0.5.12", "0.5.15", "0.5.19", "0.5.20", "0.5.23"):
        flag = committed(version)["--speculative-algorithm"]
        assert flag["choices"] is None and "choices_unresolved" not in flag


def test_kv_cache_dtype_and_attention_backend_choices() -> None:
    old = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
    for version in ("0.5.9", "0.5.10", "0.5.12", "0.5.15"):
        assert committed(version)["--kv-cache-dtype"]["choices"] == old
    for version in ("0.5.19", "0.5.20"):  # the new dtypes come in while fp4_e2m1 stays
        assert {"mxfp8", "nvfp4", "fp4_mx_block16", "fp4_e2m1"} <= set(
            committed(version)["--kv-cache-dtype"]["choices"])
    assert committed("0.5.23")["--kv-cache-dtype"]["choices"] == [
        "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]
    gone = {"cutlass_mla", "dual_chunk_flash_attn"}
    assert gone <= set(committed("0.5.19")["--attention-backend"]["choices"])
    for version in ("0.5.20", "0.5.23"):
        choices = set(committed(version)["--attention-backend"]["choices"])
        assert not gone & choices and {"fa3", "flashinfer", "triton"} <= choices


def test_deprecations_found_in_the_real_sources() -> None:
    assert committed("0.5.12")["--disable-cuda-graph"]["deprecated"] is None
    for version in ("0.5.15", "0.5.19", "0.5.20", "0.5.23"):
        assert committed(version)["--disable-cuda-graph"]["deprecated"]
    assert committed("0.5.20")["--enable-dp-attention"]["deprecated"] is None
    dp = committed("0.5.23")["--enable-dp-attention"]
    assert "--attn-dp-size" in dp["deprecated"] and dp["nargs"] == 0
    assert "--attn-dp-size" in committed("0.5.23")


def test_launch_flags_used_by_the_orchestrator_exist_everywhere() -> None:
    needed = ["--model-path", "--tokenizer-path", "--trust-remote-code", "--host", "--port",
              "--tp-size", "--mem-fraction-static", "--context-length", "--served-model-name",
              "--tool-call-parser", "--reasoning-parser", "--enable-metrics", "--api-key",
              "--speculative-algorithm", "--speculative-draft-model-path",
              "--speculative-num-steps", "--speculative-eagle-topk",
              "--speculative-num-draft-tokens", "--watchdog-timeout"]
    for version in releases.RELEASES:
        flags = committed(version)
        assert not [n for n in needed if n not in flags], version
        assert "kimi_k2" in flags["--tool-call-parser"]["choices"]
        assert "kimi_k2" in flags["--reasoning-parser"]["choices"]
        assert flags["--port"]["default"] == 30000 and flags["--watchdog-timeout"]["default"] == 300
