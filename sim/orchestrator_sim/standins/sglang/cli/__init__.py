"""The `sglang` command (stand-in)."""
