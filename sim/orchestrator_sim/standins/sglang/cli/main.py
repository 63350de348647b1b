"""The `sglang` console command of the stand-in: `sglang serve ARGS` = launch_server ARGS."""

import sys


def main(argv=None) -> int:
    """Dispatch `sglang serve ...` (the only sub-command the stand-in offers)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("version", "--version"):
        from sglang.version import __version__

        print(__version__)
        return 0
    if not args or args[0] != "serve":
        sys.stderr.write("usage: sglang serve --model-path PATH [SERVER ARGS...]\n")
        return 2
    from sglang.launch_server import main as launch

    return launch(args[1:])


if __name__ == "__main__":
    sys.exit(main())
