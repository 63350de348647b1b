"""Compression configuration (stand-in)."""

from compressed_tensors.config.base import *  # noqa: F401,F403
