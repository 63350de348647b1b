"""Code that runs ON the host: the stdlib-only agent and its probes (Python 3.8+)."""
