"""Prometheus metrics: the server's own and vLLM-named ones, and their histograms."""
