"""Benchmarks: each measures on every rank (one process per GPU) and is judged against the profile."""
