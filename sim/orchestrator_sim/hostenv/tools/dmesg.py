"""``dmesg`` of a simulated host: the box's simulated kernel ring buffer."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site"))

import simhw  # noqa: E402


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-C" in argv or "--clear" in argv or "-c" in argv:
        simhw.update(lambda s: s.__setitem__("kmsg", []))
        return 0
    for line in simhw.kernel_messages():
        sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
