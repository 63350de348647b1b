"""Code that runs ON the host: the stdlib-only agent, its probes and actions, and the programs
other pythons run there (Python 3.8+). Nothing here imports the rest of the package.

`source(name)` is, on this side, the text of one of these modules: how a program is shipped (sent
as `python -c TEXT`, or written to a file on the host), never kept as a string constant.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def source(name: str) -> str:
    """The text of orchestrator/remote/NAME.py, as shipped to hosts."""
    return (_HERE / f"{name}.py").read_text(encoding="utf-8")
