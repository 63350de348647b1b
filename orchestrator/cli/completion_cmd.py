"""`orchestrator completion bash|zsh`: the shell completion script, generated from the
argument parser by shtab (every subcommand and option, file names where a path is asked).

    orchestrator completion bash > ~/.local/share/bash-completion/completions/orchestrator
    orchestrator completion zsh > "${fpath[1]}/_orchestrator"
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_subcommands(sub: Any) -> None:
    """Register `completion`."""
    p = sub.add_parser("completion", help="print the bash or zsh completion script",
                       description=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    from orchestrator.cli.main import build_parser

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0
