"""Path entry for the `stale-server` fault: an old `sglang` look-alike (only on that process's
PYTHONPATH, so `ps` shows `python3 -m sglang.launch_server ...`)."""
