"""Bad input never crashes: a property-based fuzzer over playbooks, inventories and vars files.

Every example is a mutated copy of a real file (playbooks/*.yaml, configs/inventory/*.yaml,
configs/models/kimi-k2.6.yaml, tests/config/corpus/*.yaml) or a generated hostile document
(alias bombs, 1000-level nesting, recursive aliases, huge scalars and numbers, random tags),
fed to the real CLI entry `orchestrator.cli.main.main(["validate", ...])`. Each must either
succeed (exit 0, "ok: ...") or fail cleanly (exit 2, a ConfigError whose EVERY problem starts
with file:line:column of an existing file, the line within that file) - never an internal error,
a traceback, or an exception out of `main`. stdout is a strict UTF-8 stream and stderr a
backslashreplace one, as on a terminal.

Per example the wall time and the peak RSS growth (VmHWM reset through /proc/self/clear_refs)
are measured and bounded generously (10 s, 200 MB); the worst cases are also measured with
tracemalloc. The figures are printed at the end of the module (`pytest -s`).

Mutations: delete/duplicate/swap/truncate lines, re-indent (spaces, tabs), replace scalars with
wrong types, huge ints and strings, template and shell junk, unicode (RTL, NUL, lone surrogates,
line separators), random and unsafe tags, anchors/aliases (billion laughs, recursive, undefined),
deep nesting, document markers and directives, raw binary bytes.

2,000 examples in total (derandomized: the same ones every run), deadline off.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli.main import main

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "configs/models/kimi-k2.6.yaml"
PLAYBOOK = REPO / "playbooks/kimi-k2.6-eagle3.yaml"
COMPANION_PLAYBOOK = REPO / "tests/config/corpus/_playbook.yaml"
COMPANION_INVENTORY = REPO / "tests/config/corpus/_inventory.yaml"

TIME_LIMIT_S = 30.0  # generous: a bound, not a speed goal (the figures are printed)
MEMORY_LIMIT_MB = 200.0
EXAMPLES = {"playbook": 1000, "inventory": 450, "vars": 150, "hostile": 400}
_LOCATED = re.compile(r"^  (/[^\n]*?\.yaml):(\d+):(\d+): ")
_HEAD = re.compile(r"^error: (\d+) problems? in configuration:$")


def _seeds() -> dict[str, list[Path]]:
    # alias-bomb.yaml costs 0.4 s per example (100,000 values built before the refusal): bombs
    # come from the m_bomb mutation and the hostile and worst-case tests instead
    corpus = sorted(p for p in (REPO / "tests/config/corpus").glob("*.yaml")
                    if p.name != "alias-bomb.yaml")
    inventories = sorted((REPO / "configs/inventory").glob("*.yaml")) + [
        p for p in corpus if p.name.endswith("inventory.yaml")]
    playbooks = sorted((REPO / "playbooks").glob("*.yaml")) + sorted(
        (REPO / "playbooks/examples").glob("*.yaml")) + [
        p for p in corpus if not p.name.endswith("inventory.yaml")]
    return {"playbook": playbooks, "inventory": inventories, "vars": [MODEL]}


SEEDS = _seeds()
SEED_LINES = {p: p.read_text().splitlines() for paths in SEEDS.values() for p in paths}


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Stats:
    """What the fuzzer saw: examples, exit codes, worst time and memory."""

    examples: int = 0
    total_s: float = 0.0
    codes: dict[int, int] = field(default_factory=dict)
    max_s: float = 0.0
    max_s_case: str = ""
    max_rss_mb: float = 0.0
    max_rss_case: str = ""
    tracemalloc_mb: dict[str, float] = field(default_factory=dict)


STATS: dict[str, Stats] = {}


def _status_kb(field_name: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)
        return True
    except OSError:
        return False


@dataclass
class Outcome:
    """One CLI run: exit code, output, and what it cost."""

    code: int
    out: str
    err: str
    seconds: float
    rss_mb: float
    tracemalloc_mb: float | None = None


def validate(args: list[str], *, trace: bool = False) -> Outcome:
    """Run `orchestrator validate ARGS` in-process with terminal-like output streams."""
    out_b, err_b = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_b, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_b, encoding="utf-8", errors="backslashreplace",
                           write_through=True)
    measured = _reset_peak()
    before = _status_kb("VmRSS") or 0
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", *args])
    finally:
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] / 1e6 if trace else None
        if trace:
            tracemalloc.stop()
    hwm = _status_kb("VmHWM") if measured else None
    rss_mb = max(0, (hwm or before) - before) / 1024
    return Outcome(code, out_b.getvalue().decode(), err_b.getvalue().decode(), seconds,
                   rss_mb, peak)


def yaml_lines(data: bytes) -> int:
    """Lines as YAML counts them (\\n, \\r, \\r\\n, NEL, LS, PS all break a line)."""
    text = data.decode("utf-8", "replace")
    return len(re.findall(r"\r\n|[\n\r\x85\u2028\u2029]", text)) + 1


def check(role: str, outcome: Outcome, case: str, fuzzed: Path, data: bytes) -> None:
    """The property: success, or a clean located ConfigError; bounded time and memory."""
    s = STATS.setdefault(role, Stats())
    s.examples += 1
    s.total_s += outcome.seconds
    s.codes[outcome.code] = s.codes.get(outcome.code, 0) + 1
    if outcome.seconds > s.max_s:
        s.max_s, s.max_s_case = outcome.seconds, case
    if outcome.rss_mb > s.max_rss_mb:
        s.max_rss_mb, s.max_rss_case = outcome.rss_mb, case
    report = f"case: {case}\nexit {outcome.code}\nstdout: {outcome.out}\nstderr: {outcome.err}"
    assert "internal error" not in outcome.err and "Traceback" not in outcome.err, report
    assert outcome.code in (0, 2), report
    if outcome.code == 0:
        assert outcome.out.startswith("ok: ") and outcome.err == "", report
    else:
        lines = outcome.err.splitlines()
        head = _HEAD.match(lines[0]) if lines else None
        assert head, report
        located = [m for m in map(_LOCATED.match, lines[1:]) if m]
        assert len(located) == int(head.group(1)), f"a problem without a location\n{report}"
        for m in located:
            path, line, column = Path(m.group(1)), int(m.group(2)), int(m.group(3))
            assert path.exists() and line >= 1 and column >= 1, report
            if path.resolve() == fuzzed.resolve():
                assert line <= yaml_lines(data) + 1, f"line {line} is past the end\n{report}"
    assert outcome.seconds < TIME_LIMIT_S, f"{outcome.seconds:.1f}s\n{report[:2000]}"
    assert outcome.rss_mb < MEMORY_LIMIT_MB, f"{outcome.rss_mb:.0f} MB\n{report[:2000]}"


# -- the workspace: real files next to the fuzzed one, so relative vars_files resolve ----------


@dataclass
class Workspace:
    """Folders where fuzzed files are written, next to pristine copies of their companions."""

    root: Path

    @property
    def playbook(self) -> Path:  # a fuzzed playbook; ../configs/models/ is pristine
        return self.root / "pb/playbooks/fuzzed.yaml"

    @property
    def inventory(self) -> Path:
        return self.root / "inv/fuzzed.inventory.yaml"

    @property
    def vars_file(self) -> Path:  # fuzzed; the playbook beside it is pristine
        return self.root / "vars/configs/models/kimi-k2.6.yaml"

    @property
    def vars_playbook(self) -> Path:
        return self.root / "vars/playbooks/kimi-k2.6-eagle3.yaml"

    @property
    def hostile(self) -> Path:
        return self.root / "hostile/fuzzed.yaml"

    @property
    def companion_inventory(self) -> Path:
        return self.root / "inv/_inventory.yaml"

    @property
    def companion_playbook(self) -> Path:
        return self.root / "inv/_playbook.yaml"


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    root = tmp_path_factory.mktemp("fuzz")
    w = Workspace(root)
    for folder in ("pb/playbooks", "pb/configs/models", "inv", "vars/playbooks",
                   "vars/configs/models", "hostile"):
        (root / folder).mkdir(parents=True)
    shutil.copy(MODEL, root / "pb/configs/models/kimi-k2.6.yaml")
    shutil.copy(PLAYBOOK, w.vars_playbook)
    shutil.copy(COMPANION_INVENTORY, w.companion_inventory)
    shutil.copy(COMPANION_PLAYBOOK, w.companion_playbook)
    yield w


@pytest.fixture(scope="module", autouse=True)
def print_figures() -> Iterator[None]:
    yield
    print("\nconfig fuzzer figures:")
    for role, s in STATS.items():
        print(f"  {role:9} {s.examples:5d} examples ({s.total_s:.1f}s in main), exit codes "
              f"{dict(sorted(s.codes.items()))}, max {s.max_s:.2f}s ({s.max_s_case[:60]!r}), "
              f"max RSS growth {s.max_rss_mb:.1f} MB ({s.max_rss_case[:60]!r})")
        for case, mb in s.tracemalloc_mb.items():
            print(f"      tracemalloc peak {mb:7.1f} MB  {case}")


# -- building blocks of mutations ----------------------------------------------------------------

UNICODE = [
    "\u202e", "\u200f", "\u202d", "\u0645\u0631\u062d\u0628\u0627", "\x00", "\x07", "\x1b[31m",
    "\x7f", "\u2028", "\u2029", "\x85", "\ufeff", "\U0001F600", "e\u0301", "\U0001D54F", "\t",
    "\r", "\r\n", "\ud800", "\udfff", "\uffff", "\ufffe", "\u00a0", "\u3000", "\u0000\u0000",
]
BYTES = [b"\xff", b"\xfe\xff", b"\x00", b"\xc3\x28", b"\xed\xa0\x80", b"\xef\xbb\xbf",
         b"\xf4\x90\x80\x80", b"\x80\x80", b"\xe2\x82", b"\x1b\x5b\x32\x4a"]
TAGS = [
    "!foo", "!!map", "!!seq", "!!str", "!!int", "!!float", "!!bool", "!!null", "!!binary",
    "!!timestamp", "!!set", "!!omap", "!!pairs", "!!merge", "!!value", "!!yaml",
    "!!python/tuple", "!!python/object:os.system", "!!python/object/apply:os.system",
    "!!python/name:os.system", "!<tag:yaml.org,2002:str>", "!<tag:example.com,2000:x>",
    "!env", "!env!", "!e%21nv", "!", "!!", "!<!>",
]
SCALARS = [
    "[]", "{}", "null", "~", "true", "false", "yes", "off", "-1", "0", "1.5", "1e999",
    "-1e999", ".nan", ".inf", "-.inf", "9" * 5000, "-" + "9" * 4301, "0x" + "f" * 4000,
    "0o" + "7" * 5000, "0b" + "1" * 15000, "1_000", "12:30:45", "1:" * 2000 + "1",
    "1." + "5" * 5000, "2001-12-14t21:59:43.10-05:00", "2020-13-45", "x" * 20_000,
    '"' + "y" * 20_000 + '"', "!!binary aGVsbG8=", "!!binary '%%%'", "!!int abc",
    "!!int " + "1" * 5000, "!!float abc", "!!float " + "1" * 5000, "!!bool maybe", "!!null x",
    "!!timestamp nope", "!!timestamp 2020-13-45", "!!str 5", "!!set {a, b}", "!!omap [a: 1]",
    "!!pairs [a: 1]", '!!python/object/apply:os.system ["touch /tmp/pwned"]',
    "!!python/name:os.system", "!custom x", "!<tag:example.com,2000:x> y", "!env",
    "!env NOPE_ORCHESTRATOR_FUZZ_UNSET", "!env HF_TOKEN:-", "!env 1BAD", "!env [a]",
    "!env {a: b}", "!env PATH", "*nope", "&anchor value", "&a [*a]", "&m {k: *m}",
    "'{{ undefined_var }}'", "'{{ x | nofilter }}'", "'{{ " + "[" * 1000 + "]" * 1000 + " }}'",
    "|\n  multi\n  line", ">-\n  folded\n  text", "|-", "|9\n x", "'; rm -rf /'",
    '"$(touch /tmp/pwned)"', "`id`", "'" + "a\\" * 50 + "'", '"\\x00\\ud800\\U0010ffff"',
    "[" * 200 + "]" * 200, "{" * 200 + "}" * 200, "- - - - - - - x",
    "{a: {b: {c: [1, {d: e}]}}}", "[a, [b, [c, {d: [e]}]]]", "? complex\n: key", "a: b: c",
    "- a\n- b", "'unterminated", '"unterminated', "[unterminated", "{a: ", "@reserved",
    "%", "--- x", "... x", "\\", "&", "*", "!", "|", ">", "#", ":", "-", "?", ",", "]", "}",
]
# Template text (Jinja) for the fields that hold templates: syntax errors, unknown names,
# sandbox escapes, huge values, and nesting deeper than Python's parser or compiler can take.
TEMPLATES = [
    "{{ undefined_var }}", "{{", "}}", "{{ }}", "{% for %}", "{% raw %}", "{# x", "{% endif %}",
    "{{ x | nofilter }}", "{{ x is notatest }}", "{{ ''.__class__.__mro__ }}",
    "{{ cycler.__init__.__globals__.os.system('touch /tmp/pwned') }}", "{{ 10 ** 100000 }}",
    '{{ "x" * 100000000 }}', "{{ range(10**9) | list }}", "{{ lipsum(10**9) }}",
    "{{ " + "(" * 300 + "1" + ")" * 300 + " }}", "{{ " + "[" * 1000 + "]" * 1000 + " }}",
    "{{ " + "{" * 500 + "}" * 500 + " }}", "{{ " + "not " * 2000 + "x }}",
    "{{ " + "x." * 3000 + "y }}", "{{ x" + " | lower" * 1500 + " }}", "{{ " + "-" * 3000 + "1 }}",
    "{{ " + "x[" * 800 + "0" + "]" * 800 + " }}", "{{ " + "+".join(["1"] * 5000) + " }}",
    "{{ f(" * 400 + ")" * 400 + " }}", "{% if x %}" * 200, "{% if x %}" * 200 + "{% endif %}" * 200,
    "{% for i in x %}" * 100 + "{% endfor %}" * 100, "{{ x }}" * 2000, "{% set x = x %}{{ x }}",
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "{{ x | raw }}", "{{ x | quote }}",
    "{{ \"\\u202e\\x00\" }}", "{{ 'a' ~ 'b' }}", "{{ [1, 2] | join(',') }}",
]
TEMPLATE_KEYS = ("run:", "check:", "when:", "command:", "- ", "env:", "path:", "url:", "repo:")


KEYS = [
    "? [complex, key]", "1", "null", "~", "true", "<<", '"\u202e"', "!!int 5", '!!int "abc"',
    '!!float "1e999"', '!!binary "aGk="', '!!null ""', "*nope", "&k key", "k" * 2000,
    "'{{ x }}'", "!env HF_TOKEN", "[a, b]", "{a: b}", "- x", '"\\0"', "\u0645", "id", "run",
    "uses", "with", "needs", "hosts", "vars", "stages", "name", "secrets", "vars_files",
    "connection", "port", "hypervisor", "groups", "defaults", "retry", "timeout", "when",
]
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6,
)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" "))]


def _put_value(line: str, value: str) -> str:
    """Replace the value of a `key: value` or `- value` line (continuation lines indented)."""
    indent = _indent(line)
    cont = "\n" + indent + "    "
    value = value.replace("\n", cont)
    body = line.strip()
    if body.startswith("- "):
        return f"{indent}- {value}"
    if ":" in body:
        key = body.split(":", 1)[0]
        return f"{indent}{key}: {value}"
    return f"{indent}{value}"


def _put_key(line: str, key: str) -> str:
    body = line.strip()
    rest = body.split(":", 1)[1] if ":" in body else " x"
    prefix = "- " if body.startswith("- ") else ""
    return f"{_indent(line)}{prefix}{key}:{rest}"


Draw = Callable[..., Any]


def _pick(draw: Draw, n: int) -> int:
    """An index below n. Drawn with fixed bounds, so that hypothesis can replay and mutate a
    choice sequence whatever earlier mutations did to the lengths (no invalid examples)."""
    return draw(st.integers(0, 2**20)) % max(1, n)


def _line(draw: Draw, lines: list[str]) -> int:
    return _pick(draw, len(lines))


def m_delete(draw: Draw, lines: list[str]) -> str:
    if lines:
        i = _line(draw, lines)
        del lines[i]
        return f"delete {i}"
    return "delete (empty)"


def m_duplicate(draw: Draw, lines: list[str]) -> str:
    if not lines:
        return "duplicate (empty)"
    i = _line(draw, lines)
    lines.insert(i, lines[i])
    return f"duplicate {i}"


def m_swap(draw: Draw, lines: list[str]) -> str:
    if not lines:
        return "swap (empty)"
    i, j = _line(draw, lines), _line(draw, lines)
    lines[i], lines[j] = lines[j], lines[i]
    return f"swap {i} {j}"


def m_indent(draw: Draw, lines: list[str]) -> str:
    if not lines:
        return "indent (empty)"
    i = _line(draw, lines)
    how = draw(st.sampled_from(["+1", "+2", "+4", "-1", "-2", "tab", "mixed", "flush"]))
    line = lines[i]
    if how.startswith("+"):
        lines[i] = " " * int(how[1:]) + line
    elif how.startswith("-"):
        lines[i] = line[min(int(how[1:]), len(_indent(line))):]
    elif how == "tab":
        lines[i] = "\t" + line
    elif how == "mixed":
        lines[i] = " \t " + line.lstrip(" ")
    else:
        lines[i] = line.lstrip(" ")
    return f"indent {how} {i}"


def m_scalar(draw: Draw, lines: list[str]) -> str:
    if not lines:
        return "scalar (empty)"
    i = _line(draw, lines)
    source = draw(st.sampled_from(["pool", "pool", "json", "int", "float", "text"]))
    if source == "pool":
        value = draw(st.sampled_from(SCALARS))
    elif source == "json":
        value = json.dumps(draw(JSONISH))
    elif source == "int":
        value = str(draw(st.integers()))
    elif source == "float":
        value = repr(draw(st.floats()))
    else:
        value = json.dumps(draw(st.text(max_size=40)))
    lines[i] = _put_value(lines[i], value)
    return f"scalar {i} {value[:40]!r}"


def m_template(draw: Draw, lines: list[str]) -> str:
    if not lines:
        return "template (empty)"
    fields = [i for i, ln in enumerate(lines) if ln.strip().startswith(TEMPLATE_KEYS)
              or (ln.startswith("  ") and ":" in ln and not ln.rstrip().endswith(":"))]
    i = fields[_pick(draw, len(fields))] if fields and draw(st.integers(0, 3)) else _line(
        draw, lines)
    template = draw(st.sampled_from(TEMPLATES))
    quoted = draw(st.sampled_from([json.dumps, lambda t: "'" + t.replace("'", "''") + "'"]))(
        template)
    lines[i] = _put_value(lines[i], quoted)
    return f"template {i} {template[:40]!r}"


def m_key(draw: Draw, lines: list[str]) -> str:
    if not lines:
        return "key (empty)"
    i = _line(draw, lines)
    key = draw(st.sampled_from(KEYS))
    lines[i] = _put_key(lines[i], key)
    return f"key {i} {key[:30]!r}"


def m_unicode(draw: Draw, lines: list[str]) -> str:
    if not lines:
        lines.append("")
    i = _line(draw, lines)
    junk = draw(st.sampled_from(UNICODE))
    at = _pick(draw, len(lines[i]) + 1)
    lines[i] = lines[i][:at] + junk + lines[i][at:]
    return f"unicode {i}:{at} {junk!r}"


def m_tag(draw: Draw, lines: list[str]) -> str:
    if not lines:
        return "tag (empty)"
    i = _line(draw, lines)
    tag = draw(st.sampled_from(TAGS) | st.text(
        st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8).map(
        lambda t: "!" + t))
    line = lines[i]
    body = line.strip()
    if ":" in body and not body.endswith(":"):
        key, value = line.split(":", 1)
        lines[i] = f"{key}: {tag}{value}"
    elif body.startswith("- "):
        lines[i] = f"{_indent(line)}- {tag} {body[2:]}"
    else:
        lines[i] = f"{line} {tag}" if body.endswith(":") else f"{tag} {line}"
    return f"tag {i} {tag!r}"


def bomb_lines(width: int, depth: int, shape: str, key: str = "bomb") -> list[str]:
    """A billion-laughs block: `key0: &b0 [...]`, each level `width` aliases of the previous."""
    out = [f"{key}0: &b0 [{', '.join(['lol'] * width)}]" if shape != "map"
           else f"{key}0: &b0 {{{', '.join(f'k{j}: lol' for j in range(width))}}}"]
    for d in range(1, depth + 1):
        if shape == "list":
            items = ", ".join([f"*b{d - 1}"] * width)
            out.append(f"{key}{d}: &b{d} [{items}]")
        elif shape == "map":
            items = ", ".join(f"k{j}: *b{d - 1}" for j in range(width))
            out.append(f"{key}{d}: &b{d} {{{items}}}")
        else:  # merge keys: each level merges the previous one and adds its own keys
            items = ", ".join(f"l{d}k{j}: *b{d - 1}" for j in range(width))
            out.append(f"{key}{d}: &b{d} {{<<: *b{d - 1}, {items}}}")
    return out


def m_bomb(draw: Draw, lines: list[str]) -> str:
    shape = draw(st.sampled_from(["list", "map", "merge"]))
    if draw(st.integers(0, 4)):  # mostly anchors used within reason (< 2,000 values)
        width, depth = draw(st.integers(2, 6)), draw(st.integers(1, 4))
    else:  # sometimes a real bomb: past the 100,000-value limit
        width, depth = draw(st.integers(8, 12)), draw(st.integers(6, 12))
    lines[0:0] = bomb_lines(width, depth, shape)
    if len(lines) > depth + 1 and draw(st.booleans()):
        i = depth + 1 + _pick(draw, len(lines) - depth - 1)
        lines[i] = _put_value(lines[i], f"*b{depth}")
    return f"bomb {shape} {width}^{depth}"


def deep_value(kind: str, n: int) -> str:
    if kind == "flow-list":
        return "[" * n + "]" * n
    if kind == "flow-map":
        return "{a: " * n + "1" + "}" * n
    if kind == "dash":
        return "- " * n + "x"
    if kind == "mixed":
        return "[{a: " * (n // 2) + "1" + "}]" * (n // 2)
    return "{a: [" * (n // 2) + "]}" * (n // 2)


def m_deep(draw: Draw, lines: list[str]) -> str:
    n = draw(st.sampled_from([10, 63, 64, 65, 100, 1000]))
    kind = draw(st.sampled_from(["flow-list", "flow-map", "dash", "mixed", "block", "other"]))
    if kind == "block":  # 1,000 block levels are the hostile test's: ~500 kB of indentation
        n = min(n, 100)
        block = [" " * d + f"k{d}:" for d in range(n)]
        at = _line(draw, lines) if lines else 0
        lines[at:at] = block
        return f"deep block {n} at {at}"
    if not lines:
        lines.append("x:")
    i = _line(draw, lines)
    lines[i] = _put_value(lines[i], deep_value(kind, n))
    return f"deep {kind} {n} at {i}"


def m_markers(draw: Draw, lines: list[str]) -> str:
    marker = draw(st.sampled_from(["---", "...", "%YAML 1.1", "%YAML 1.2", "%YAML 9.9",
                                   "%TAG ! tag:example.com,2000:", "%TAG !! tag:evil:",
                                   "%FOO bar", "--- !!map", "--- |", "# comment"]))
    at = _pick(draw, len(lines) + 1)
    lines.insert(at, marker)
    return f"marker {marker!r} at {at}"


def m_truncate(draw: Draw, lines: list[str]) -> str:
    text = "\n".join(lines)
    at = _pick(draw, len(text) + 1)
    lines[:] = text[:at].split("\n")
    return f"truncate at {at}"


# Cheap mutations often, expensive ones (a bomb costs up to 100,000 values) rarely.
MUTATIONS = [*[m_delete, m_duplicate, m_swap, m_indent, m_key, m_unicode, m_tag, m_markers,
               m_truncate, m_template] * 3, *[m_scalar] * 6, m_deep, m_deep, m_bomb]


def mutate(draw: Draw, seed_lines: list[str]) -> tuple[bytes, str]:
    """Apply 1-4 mutations to the lines, then maybe splice raw bytes in; returns (bytes, log)."""
    lines = list(seed_lines)
    log = []
    for fn in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)):
        log.append(fn(draw, lines))
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 0:
        junk = draw(st.sampled_from(BYTES) | st.binary(min_size=1, max_size=12))
        at = _pick(draw, len(data) + 1)
        data = data[:at] + junk + data[at:]
        log.append(f"bytes {junk!r} at {at}")
    return data, "; ".join(log)


FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))


# -- properties ------------------------------------------------------------------------------


@settings(FUZZ, max_examples=EXAMPLES["playbook"])
@given(data=st.data())
def test_mutated_playbooks_load_or_fail_cleanly(ws: Workspace, data: st.DataObject) -> None:
    seed = data.draw(st.sampled_from(SEEDS["playbook"]), label="seed")
    raw, log = mutate(data.draw, SEED_LINES[seed])
    ws.playbook.write_bytes(raw)
    args = [str(ws.playbook)]
    if data.draw(st.integers(0, 3), label="with inventory") == 0:
        args += ["-i", str(ws.companion_inventory)]
    outcome = validate(args)
    check("playbook", outcome, f"{seed.name}: {log}", ws.playbook, raw)


@settings(FUZZ, max_examples=EXAMPLES["inventory"])
@given(data=st.data())
def test_mutated_inventories_load_or_fail_cleanly(ws: Workspace, data: st.DataObject) -> None:
    seed = data.draw(st.sampled_from(SEEDS["inventory"]), label="seed")
    raw, log = mutate(data.draw, SEED_LINES[seed])
    ws.inventory.write_bytes(raw)
    outcome = validate([str(ws.companion_playbook), "-i", str(ws.inventory)])
    check("inventory", outcome, f"{seed.name}: {log}", ws.inventory, raw)


@settings(FUZZ, max_examples=EXAMPLES["vars"])
@given(data=st.data())
def test_mutated_model_vars_files_load_or_fail_cleanly(ws: Workspace,
                                                       data: st.DataObject) -> None:
    raw, log = mutate(data.draw, SEED_LINES[MODEL])
    ws.vars_file.write_bytes(raw)
    outcome = validate([str(ws.vars_playbook)])
    check("vars", outcome, f"{MODEL.name}: {log}", ws.vars_file, raw)


# -- generated hostile documents ----------------------------------------------------------------


# Weighted by cost: a bomb or 5,000-level nesting costs ~0.3 s, most others milliseconds.
HOSTILE_KINDS = ["bomb", "deep", "huge", "many", *["recursive", "number", "tags", "unicode",
                                                   "json"] * 4]


def hostile_payload(draw: Draw) -> tuple[list[str], str]:
    """A value (as YAML lines, first line inline) built to exhaust a loader, and its name."""
    kind = draw(st.sampled_from(HOSTILE_KINDS))
    if kind == "bomb":
        width, depth = draw(st.integers(2, 16)), draw(st.integers(2, 16))
        shape = draw(st.sampled_from(["list", "map", "merge"]))
        return ["&top [" + ", ".join(f"*b{depth}" for _ in range(2)) + "]",
                *bomb_lines(width, depth, shape, key="  bomb")], f"bomb {shape} {width}^{depth}"
    if kind == "deep":
        n = draw(st.sampled_from([64, 65, 500, 1000, 1001]))
        shape = draw(st.sampled_from(["flow-list", "flow-map", "dash", "mixed", "other"]))
        return [deep_value(shape, n)], f"deep {shape} {n}"
    if kind == "recursive":
        text = draw(st.sampled_from([
            "&a [*a]", "&a {k: *a}", "&a {<<: *a}", "&a [1, [2, [3, *a]]]",
            "&a {k: [&b {j: *a}, *b]}", "[&a x, *a, *a, *b]", "{<<: [*undefined]}",
            "{<<: 5}", "{<<: [1, 2]}", "&a {<<: {<<: *a}}",
        ]))
        return [text], f"recursive {text}"
    if kind == "huge":
        size = draw(st.sampled_from([1000, 20_000, 100_000]))
        style = draw(st.sampled_from(["plain", "single", "double", "block", "key"]))
        body = draw(st.sampled_from(["x", "\u202e", "\U0001F600", "ab ", "{{ x }}"])) * (
            size // 4)
        if style == "plain":
            return ["pl" + body.replace("{", "(")], f"huge plain {size}"
        if style == "single":
            return ["'" + body + "'"], f"huge single {size}"
        if style == "double":
            return ['"' + body + '"'], f"huge double {size}"
        if style == "block":
            return ["|", *["  " + body[i:i + 80] for i in range(0, len(body), 80)]], \
                f"huge block {size}"
        return ["{" + json.dumps(body) + ": 1}"], f"huge key {size}"
    if kind == "number":
        digits = draw(st.sampled_from([1, 20, 4300, 4301, 10_000, 50_000]))
        form = draw(st.sampled_from(["dec", "neg", "hex", "oct", "bin", "float", "exp",
                                     "sexagesimal", "tagged-int", "tagged-float", "quoted"]))
        d = "7" * digits
        text = {"dec": d, "neg": "-" + d, "hex": "0x" + d, "oct": "0o" + d,
                "bin": "0b1" + "0" * digits, "float": d + "." + d, "exp": "1e" + d,
                "sexagesimal": "1" + ":5" * min(digits, 5000), "tagged-int": "!!int " + d,
                "tagged-float": "!!float " + d, "quoted": '"' + d + '"'}[form]
        return [text], f"number {form} {digits}"
    if kind == "many":
        n = draw(st.sampled_from([1000, 5000]))  # 100,001: test_worst_cases
        return ["[" + ",".join("1" for _ in range(n)) + "]"], f"many {n}"
    if kind == "tags":
        tags = draw(st.lists(st.sampled_from(TAGS) | st.text(
            st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=",[]{}"),
            min_size=1, max_size=10).map(lambda t: "!" + t), min_size=1, max_size=4))
        return ["[" + ", ".join(f"{t} v{i}" for i, t in enumerate(tags)) + "]"], f"tags {tags}"
    if kind == "unicode":
        junk = "".join(draw(st.lists(st.sampled_from(UNICODE), min_size=1, max_size=5)))
        return [json.dumps({junk: junk}, ensure_ascii=draw(st.booleans()))], f"unicode {junk!r}"
    value = draw(JSONISH)
    return [json.dumps(value)], f"json {json.dumps(value)[:40]}"


@settings(FUZZ, max_examples=EXAMPLES["hostile"])
@given(data=st.data())
def test_hostile_documents_are_refused_in_bounded_time_and_memory(
    ws: Workspace, data: st.DataObject
) -> None:
    payload, name = hostile_payload(data.draw)
    where = data.draw(st.sampled_from(["var", "with", "env", "top", "document", "host"]))
    first, rest = payload[0], payload[1:]
    if where == "document":
        lines = [first, *rest]
    elif where == "host":
        lines = ["hosts:", "  gpu1:", "    address: 127.0.0.1", "    vars:",
                 f"      x: {first}", *("      " + r for r in rest)]
        ws.hostile.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
        outcome = validate([str(ws.companion_playbook), "-i", str(ws.hostile)])
        check("hostile", outcome, f"{name} in {where}", ws.hostile,
              ws.hostile.read_bytes())
        return
    else:
        lines = ["name: fuzz", "vars:", "  x: 1"]
        if where == "top":
            lines += [f"extra: {first}", *rest]
        elif where == "var":
            lines += [f"  y: {first}", *("  " + r for r in rest)]
        lines += ["stages:", "  - id: a", "    run: echo {{ x }}"]
        if where == "with":
            lines += ["  - id: b", "    uses: sglang_server", f"    with: {first}",
                      *("    " + r for r in rest)]
        elif where == "env":
            lines += ["  - id: c", "    run: env", f"    env: {first}", *("    " + r for r in rest)]
    raw = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    ws.hostile.write_bytes(raw)
    outcome = validate([str(ws.hostile)])
    check("hostile", outcome, f"{name} in {where}", ws.hostile, raw)


# -- the worst cases, measured with tracemalloc too ---------------------------------------------

_VARS_BOMB = ["name: x", "stages: [{id: a, run: echo}]", "vars:"]
WORST: dict[str, tuple[str, bool]] = {  # name: (document, loads without problems)
    "alias bomb 9^9 (387M values if expanded)": ("\n".join(
        [*_VARS_BOMB, *("  " + ln for ln in bomb_lines(9, 9, "list"))]), False),
    "merge-key bomb 16^16": ("\n".join(
        [*_VARS_BOMB, *("  " + ln for ln in bomb_lines(16, 16, "merge"))]), False),
    "1000 levels of flow nesting": ("name: x\nstages: " + deep_value("flow-list", 1000), False),
    "1000 levels of block nesting": ("name: x\nvars:\n" + "\n".join(
        "  " * (d + 1) + f"k{d}:" for d in range(1000)), False),
    "100,001 values": ("name: x\nstages: [" + ",".join("1" for _ in range(100_001)) + "]",
                       False),
    "1 MB scalar": ("name: " + "x" * 1_000_000 + "\nstages: [{id: a, run: echo}]", True),
    "50,000-digit integer": ("name: x\nstages: [{id: a, run: echo, timeout: " + "9" * 50_000
                             + "}]", False),
    "template 1000 brackets deep": ("name: x\nstages: [{id: a, run: '{{ " + "[" * 1000
                                    + "]" * 1000 + " }}'}]", False),
}
# tracemalloc makes pure-Python parsing ~5x slower: these are measured by RSS growth only
_NO_TRACE = {"100,001 values", "1 MB scalar", "merge-key bomb 16^16"}


@pytest.mark.parametrize("name", list(WORST))
def test_worst_cases_are_bounded(ws: Workspace, name: str) -> None:
    text, loads = WORST[name]
    raw = text.encode()
    ws.hostile.write_bytes(raw)
    outcome = validate([str(ws.hostile)], trace=name not in _NO_TRACE)
    check("worst", outcome, name, ws.hostile, raw)
    assert outcome.code == (0 if loads else 2), outcome.err
    if outcome.tracemalloc_mb is not None:
        STATS["worst"].tracemalloc_mb[name] = outcome.tracemalloc_mb
        assert outcome.tracemalloc_mb < MEMORY_LIMIT_MB


# What this fuzzer found: crashes ("internal error ... please report it" before the fix) and a
# `.nan` timeout that was accepted (it never expires).
REGRESSIONS = {
    "NUL byte": ("name: x\nstages: [{id: a, run: 'echo \x00'}]\n", 2, 29,
                 "character YAML does not allow here (#x00"),
    "control character": ("name: x\x07\nstages: []\n", 1, 8, "(#x07"),
    "!!int on text": ("name: !!int abc\nstages: []\n", 1, 7, "'abc': not a valid int"),
    "!!float on text": ("name: x\nvars: {t: !!float abc}\n", 2, 11, "not a valid float"),
    "5,000-digit integer": ("name: x\nstages:\n  - id: " + "1" * 5000 + "\n", 3, 9,
                            "is too large (more than 256 bits)"),
    "300-bit hex integer": ("name: x\nvars:\n  n: 0x" + "f" * 75 + "\n", 3, 6,
                            "is too large"),
    "template 300 parentheses deep": ("name: x\nstages:\n  - id: a\n    run: echo {{ " + "("
                                      * 300 + "1" + ")" * 300 + " }}\n", 4, 10,
                                      "nested too deeply to compile"),
    "condition 2,000 `not` deep": ("name: x\nstages:\n  - id: a\n    run: echo\n    when: "
                                   + "not " * 2000 + "x\n", 5, 11, "nested too deeply"),
    "timeout .nan (never expired)": ("name: x\nstages: [{id: a, run: echo, timeout: .nan}]\n",
                                     2, 38, "a duration must be a number of seconds"),
    "var template 1,000 brackets deep": ("name: x\nvars:\n  v: '{{ " + "[" * 1000 + "]" * 1000
                                         + " }}'\nstages: [{id: a, run: echo}]\n", 3, 6,
                                         "nested too deeply"),
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_crashes_found_by_the_fuzzer_are_located_problems(ws: Workspace, name: str) -> None:
    text, line, column, fragment = REGRESSIONS[name]
    raw = text.encode()
    ws.hostile.write_bytes(raw)
    outcome = validate([str(ws.hostile)])
    check("regressions", outcome, name, ws.hostile, raw)
    assert outcome.code == 2
    assert f"{ws.hostile}:{line}:{column}: " in outcome.err and fragment in outcome.err, \
        outcome.err


def test_a_file_over_the_size_limit_is_refused_without_reading_it(ws: Workspace) -> None:
    big = ws.root / "hostile/big.yaml"
    with open(big, "wb") as f:
        f.write(b"name: x\nvars:\n  pad: '")
        f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of NUL bytes after the header
    outcome = validate([str(big)], trace=True)
    assert outcome.code == 2 and "file is too large" in outcome.err, outcome.err
    assert outcome.seconds < 1 and outcome.rss_mb < 20, (outcome.seconds, outcome.rss_mb)


def test_the_fuzzer_ran_every_example() -> None:
    ran = {role: s.examples for role, s in STATS.items()}
    if not set(EXAMPLES) <= set(ran):
        pytest.skip("some properties were deselected: run the whole module")
    for role, wanted in EXAMPLES.items():
        assert ran.get(role, 0) >= wanted, ran
    assert sum(EXAMPLES.values()) == 2000
