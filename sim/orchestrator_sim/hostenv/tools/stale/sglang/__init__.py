"""A leftover SGLang server from an earlier deploy (simulated; the `stale-server` fault)."""

__version__ = "0.4.6.post5"
