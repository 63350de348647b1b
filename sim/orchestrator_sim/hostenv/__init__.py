"""Files installed into every simulated host (copied to SIMDIR/hostenv at `sim up`).

`site/` goes on each host command's PYTHONPATH (simhw, sitecustomize, the pynvml stand-in);
`tools/` holds the fake hardware commands (nvidia-smi, dmesg, pct, nvidia-modprobe, ...) that the
per-host `bin/` wrappers run. Everything here is stdlib-only Python 3.8+ and never imports the
rest of the package.
"""
