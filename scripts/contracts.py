"""ARCHITECTURE.md's layer table -> import-linter contracts (`.importlinter`).

    python scripts/contracts.py            # write .importlinter
    python scripts/contracts.py --check    # exit 1 when .importlinter differs from the table

Each row of the table is one `forbidden` contract: the row's part may import, directly, only the
parts named (backquoted) in its "may import" column; every other part of the product is
forbidden to it. The `cli/` row ("everything") is the other way round: nothing but `__main__`
imports `cli`. One more contract keeps the product off the simulator (`orchestrator_sim`).
Only direct imports are checked (allow_indirect_imports): the table says who may import whom.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "ARCHITECTURE.md"
CONTRACTS = REPO / ".importlinter"
ROW = re.compile(r"^\| `([^`]+)` \| (.+) \| (.+) \|$")


def layers(text: str) -> dict[str, list[str] | None]:
    """Part -> the parts it may import (None: everything), from the layer table's rows."""
    rows: dict[str, list[str] | None] = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        part = m.group(1).removesuffix("/").removesuffix(".py")
        may = m.group(3)
        rows[part] = None if may.startswith("everything") else [
            name.removesuffix("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", may)]
    return rows


def _contract(key: str, name: str, sources: list[str], forbidden: list[str]) -> str:
    def listed(parts: list[str]) -> str:
        return "".join(f"\n    {p}" for p in parts)

    return (f"[importlinter:contract:{key}]\nname = {name}\ntype = forbidden\n"
            f"source_modules ={listed(sources)}\nforbidden_modules ={listed(forbidden)}\n"
            "allow_indirect_imports = True\n")


def render(rows: dict[str, list[str] | None]) -> str:
    """The .importlinter text for these rows."""
    full = {p: f"orchestrator.{p}" for p in rows}
    out = ["# Generated from ARCHITECTURE.md's layer table by scripts/contracts.py: edit the",
           "# table, then run `python scripts/contracts.py`.",
           "[importlinter]\nroot_packages =\n    orchestrator\n    orchestrator_sim\n"]
    for part, may in rows.items():
        if may is None:
            others = [full[p] for p in rows if p not in (part, "__main__")]
            out.append(_contract(part, f"nothing imports {part} (but __main__)", others,
                                 [full[part]]))
            continue
        unknown = [p for p in may if p not in rows]
        if unknown:
            raise SystemExit(f"ARCHITECTURE.md: {part} may import {unknown}: not in the table")
        forbidden = [full[p] for p in rows if p != part and p not in may]
        out.append(_contract(part, f"{part} imports only: {', '.join(may) or 'nothing of ours'}",
                             [full[part]], forbidden))
    out.append(_contract("sim", "the product never imports the simulator", ["orchestrator"],
                         ["orchestrator_sim"]))
    return "\n".join(out)


def main() -> int:
    """Write .importlinter, or with --check say whether it matches the table."""
    text = render(layers(TABLE.read_text()))
    if "--check" in sys.argv[1:]:
        if CONTRACTS.exists() and CONTRACTS.read_text() == text:
            return 0
        print(".importlinter differs from ARCHITECTURE.md's table: run "
              "`python scripts/contracts.py`", file=sys.stderr)
        return 1
    CONTRACTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
