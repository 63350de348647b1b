"""Host-side commands of the simulated GPU host (run through the generated bin/ wrappers)."""
