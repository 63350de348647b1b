"""Host-side modules of the simulated GPU host (on every host command's PYTHONPATH)."""
