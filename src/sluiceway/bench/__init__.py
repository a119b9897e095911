"""Benchmarks that print numbers (never run as tests)."""
