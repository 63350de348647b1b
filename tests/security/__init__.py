"""Reliability and security suites: config fuzzing, shell injection corpus, secret leaks."""
