"""Server entry points (stand-in)."""
