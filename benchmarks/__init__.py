"""Benchmarks (not tests): `python -m benchmarks.attention`."""
