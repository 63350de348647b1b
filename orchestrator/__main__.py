"""Allow `python -m orchestrator`."""

from orchestrator.cli.main import entry

entry()
