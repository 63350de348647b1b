"""`python -m sglang.launch_server ARGS`: parse, validate, load, serve (stand-in)."""

import sys

from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.server_args import prepare_server_args


def main(argv=None) -> int:
    """Run the server with `argv` (default: the process arguments); return the exit code."""
    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    return launch_server(server_args)


if __name__ == "__main__":
    sys.exit(main())
