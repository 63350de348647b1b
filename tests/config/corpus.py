"""The corpus of malformed configuration files and what loading each must report.

Each `corpus/*.yaml` whose name does not start with '_' is a case. Its leading comment lines
declare the expectations:

    # expect-line: 7                      the line of the problem (in this file)
    # expect: did you mean 'needs'        a fragment the problem's text must contain (repeatable)
    # inventory: _inventory.yaml          load together with this inventory (playbook cases)
    # playbook: _playbook.yaml            for inventory cases (files named *.inventory.yaml)

A playbook case with no `# inventory:` is loaded alone (`load_playbook`). An inventory case is
loaded with its companion playbook (`load_all(playbook, case)`), so a CLI test can run every case
as `orchestrator validate PLAYBOOK -i INVENTORY`. Files named `_*.yaml` are helpers, not cases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

CORPUS_DIR = Path(__file__).parent / "corpus"
_HEADER = re.compile(r"^#\s*([a-z-]+)\s*:\s*(.*?)\s*$")

#: environment variables the corpus expects to be unset (the `!env` case)
UNSET_ENV = ("ORCH_CORPUS_SURELY_UNSET_VARIABLE",)


@dataclass(frozen=True)
class CorpusCase:
    """One malformed file and the problem loading it must report."""

    path: Path  # the malformed file; `line` is in this file
    inventory: Path | None  # the inventory to load with the playbook, or None
    line: int
    fragments: tuple[str, ...]
    playbook: Path = field(default=Path())  # the playbook to load (== path for playbook cases)

    @property
    def is_inventory(self) -> bool:
        """True when the malformed file is the inventory."""
        return self.inventory == self.path

    @property
    def id(self) -> str:
        """A short name for test ids."""
        return self.path.stem

    def __iter__(self):  # (path, inventory, line, fragments), as in the brief
        return iter((self.path, self.inventory, self.line, self.fragments))


def parse_header(path: Path) -> dict[str, list[str]]:
    """The `# key: value` lines at the top of a file (until the first other line)."""
    header: dict[str, list[str]] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = _HEADER.match(line)
            if not m:
                if line.startswith("#"):
                    continue
                break
            header.setdefault(m.group(1), []).append(m.group(2))
    return header


def corpus_cases(directory: Path = CORPUS_DIR) -> list[CorpusCase]:
    """Every case of the corpus, sorted by file name."""
    cases = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name.startswith("_"):
            continue
        header = parse_header(path)
        if "expect-line" not in header:
            raise ValueError(f"{path}: corpus file without '# expect-line: N'")
        line = int(header["expect-line"][0])
        fragments = tuple(header.get("expect", []))
        if path.name.endswith(".inventory.yaml"):
            companion = header.get("playbook", ["_playbook.yaml"])[0]
            cases.append(CorpusCase(path, path, line, fragments, directory / companion))
        else:
            inv = header.get("inventory")
            inventory = directory / inv[0] if inv else None
            cases.append(CorpusCase(path, inventory, line, fragments, path))
    return cases
